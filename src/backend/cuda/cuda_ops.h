// The launches of the CUDA backend: each is a plain function that issues stream work from a POD
// parameter block. CudaBackend records (function, parameters) per op instead of launching at
// once, so a run of ops between two host synchronisations can be compared with the last run and
// replayed as a CUDA graph (cuda_backend.cpp). Everything a parameter block points to is device
// memory; values that change from one decode step to the next (token ids, positions, row lists)
// are read by the kernels from device memory, never baked into the parameters.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace substrate::cuda {

// Kernel type ids: DType's numeric values (format/dtype.h), the GGUF type ids.
enum : int {
  kTypeF32 = 0,
  kTypeF16 = 1,
  kTypeQ4_0 = 2,
  kTypeQ4_1 = 3,
  kTypeQ5_0 = 6,
  kTypeQ5_1 = 7,
  kTypeQ8_0 = 8,
  kTypeQ2_K = 10,
  kTypeQ3_K = 11,
  kTypeQ4_K = 12,
  kTypeQ5_K = 13,
  kTypeQ6_K = 14,
  kTypeIQ4_NL = 20,
  kTypeIQ4_XS = 23,
  kTypeBF16 = 30,
};

// Weights repacked at upload (AdoptResidentWeight) into the device's own row layout: each row's
// block fields split into planes (quants, then scales), each plane 16-byte aligned and the row
// padded to a multiple of 16 bytes, so a warp streams a row's quants as whole 16-byte words that
// are exactly the words one lane computes with (the GGUF blocks of 18, 34 or 210 bytes straddle
// words). The type id is the GGUF id with this flag. Rows stay rows: a slice of rows of a
// repacked matrix is still a repacked matrix. The host keeps its own layout.
constexpr int kRepacked = 0x100;
//   Q4_0: [qs 16 x nb][d 2 x nb]          Q8_0: [qs 32 x nb][d 2 x nb]
//   Q4_K: [qs 128 x nsb][d, dmin, scales: 16 x nsb]
//   Q6_K: [ql 128 x nsb][qh 64 x nsb][scales 16 x nsb][d 2 x nsb]
// (nb blocks of 32, nsb super-blocks of 256 per row; within a plane the GGUF byte order.)
// Device row bytes of `type` repacked for rows of `cols`, or 0 when it is not repacked.
int64_t RepackedRowBytes(int type, int64_t cols);
// Rewrites `rows` GGUF rows of `cols` (row_bytes apart at src) into the repacked layout at dst
// (RepackedRowBytes apart). Host memory.
void RepackRows(int type, int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst);

using LaunchFn = void (*)(const void* params, cudaStream_t stream);

// Whether kernels are launched with programmatic dependent launch (launch.cuh).
bool PdlEnabled();

// ---- matrix-vector products (decode: a few tokens) ----

constexpr int kGemvMaxJobs = 8;
constexpr int kGemvRowsPerBlock = 4;      // float path: one warp per row
constexpr int kGemvFastRowsPerBlock = 4;  // int8 path: one row per warp (two measured slower)

// Top-k routing of logits [n, E] on the device, the arithmetic of kernels/routing.cpp (softmax
// or sigmoid gating, the selection bias, top-k by selection score with the lowest index among
// equals, normalisation and scale; no groups, no cached bonus): sel/weight [n, k].
struct RouteTopKParams {
  const float* logits = nullptr;
  const float* bias = nullptr;  // [E] or null
  int32_t n = 0, n_expert = 0, k = 0;
  int32_t sigmoid = 0, normalize = 0;
  float scale = 1;
  int32_t* sel = nullptr;
  float* weight = nullptr;
  // [E] or null: bytes each expert's products read from host memory (experts the device does
  // not hold, read in place), added to *link_counter for each choice.
  const unsigned long long* link_bytes = nullptr;
  unsigned long long* link_counter = nullptr;
};

// One product y[t, :rows] (=|+=) W[rows, cols] . x[t, :cols] for the pass's tokens.
struct GemvJob {
  const uint8_t* w = nullptr;  // row 0 (device)
  int64_t row_bytes = 0;
  const void* x = nullptr;     // fast path: int8 activations [ntok, cols]; else float
  const float2* xs = nullptr;  // fast path: per 32 activations (scale d, d * sum of q)
  float* y = nullptr;
  int64_t ldy = 0;  // elements between token rows of y
  int32_t rows = 0;
  int32_t accumulate = 0;   // add to y (a residual tier) instead of writing it
  float* add_to = nullptr;  // also add the result here (the residual stream: y + Add fused)
  // Routed experts (one token per launch, ntok = 1): the job's rows are slots of slot_rows rows
  // each (a multiple of 4); slot s computes the matrix of expert slot_expert[s] (written by the
  // routing kernel before), at expert_w[slot_expert[s]], against activation row s / x_div
  // (x_div = k: the k slots of a token share its input). y is indexed by the job's row.
  const int32_t* slot_expert = nullptr;      // device, null: a plain product
  const uint8_t* const* expert_w = nullptr;  // device [E]
  int32_t slot_rows = 0;
  int32_t x_div = 1;
};

// Jobs of one weight type, one width and one token count, in one launch.
struct GemvParams {
  int32_t type = 0;
  int32_t fast = 0;  // int8 dot products over Q8 activations (else float)
  int32_t nt = 1;    // tokens per block (1, 2, 4 or 8); gridDim.y = ceil(ntok / nt)
  int32_t ntok = 0;
  int64_t cols = 0;
  int32_t n_jobs = 0;
  int32_t variant = 0;  // repacked types: the kernel shape (gemv.cu, kRpShapes)
  int32_t block_start[kGemvMaxJobs + 1] = {};
  GemvJob jobs[kGemvMaxJobs];
  // SwiGLU joined to the product (repacked weights, one token, jobs 0 and 1 the gate and up
  // products of equal rows, a multiple of 32): glu_out = silu(gate) * up, quantized to glu_xq /
  // glu_xs when those are set. The warp that writes the last of each 32 rows of both computes
  // them (glu_counters: one per 32 rows, zero between launches; each launch leaves them zero).
  float* glu_out = nullptr;
  int8_t* glu_xq = nullptr;
  float2* glu_xs = nullptr;
  uint32_t* glu_counters = nullptr;
  // The router's top-k joined to its product (the float path, one token, one job of n_expert
  // rows): the warp that writes the last row routes them (route.logits set: joined;
  // route_counter zero between launches, each launch leaves it zero).
  RouteTopKParams route;
  uint32_t* route_counter = nullptr;
  // The one-row RMSNorm whose output the router reads, joined into the router's launch (route
  // joined, norm_y set; jobs[0].x is then the norm's input): every block sums the squares of
  // the input with its product, so it scales its logit by the norm's scale itself; its warps
  // write groups of 32 of the norm's output, and their quantization where norm_xq is set (the
  // experts' products read it).
  const float* norm_w = nullptr;
  float* norm_y = nullptr;
  int8_t* norm_xq = nullptr;
  float2* norm_xs = nullptr;
  float norm_eps = 0;
};
void LaunchGemv(const void* params, cudaStream_t stream);
// Rows per launch block of the product `type` takes (`fast`: the int8 path), variant 0.
int GemvRowsPerBlock(int type, bool fast, int variant = 0);
constexpr int kGemvVariants = 6;
// The kernel shape a repacked product of `rows` rows takes by default.
int GemvDefaultVariant(int type, int64_t rows);
// Whether the int8 path exists for `type` with rows of `row_bytes` at `w` (alignment).
bool GemvFastType(int type, int64_t cols, int64_t row_bytes, const void* w);

// x [n, cols] -> int8 blocks of 32 with (d, d * sum q) per block (NaN scales for a block holding
// a NaN or infinity, so it reaches the products).
struct QuantizeQ8Params {
  const float* x = nullptr;
  int64_t n = 0, cols = 0;
  int8_t* xq = nullptr;
  float2* xs = nullptr;
};
void LaunchQuantizeQ8(const void* params, cudaStream_t stream);

// ---- dequantization (embeddings, vector weights, the prefill GEMM's operand) ----

struct DequantPart {
  int32_t type = 0;
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
};
// out[i, :cols] = sum over parts of row (ids ? ids[i] : r0 + i), for i < n; float or half.
struct DequantParams {
  int32_t n_parts = 0;
  int32_t out_half = 0;
  DequantPart parts[3];
  int64_t cols = 0;
  const int32_t* ids = nullptr;  // device
  int64_t r0 = 0, n = 0;
  void* out = nullptr;
  int64_t ldo = 0;
};
void LaunchDequant(const void* params, cudaStream_t stream);

// x [n, cols] float -> half, each row divided by a power of two when its largest value would
// overflow half (scales[t], 1 otherwise); ScaleRows multiplies the product's rows back.
struct ToHalfParams {
  const float* x = nullptr;
  int64_t n = 0, cols = 0;
  void* xh = nullptr;
  float* scales = nullptr;
};
void LaunchToHalf(const void* params, cudaStream_t stream);
struct ScaleRowsParams {
  float* y = nullptr;
  int64_t n = 0, cols = 0, ld = 0;
  const float* scales = nullptr;
};
void LaunchScaleRows(const void* params, cudaStream_t stream);

// ---- elementwise ----

struct RmsNormParams {
  const float* x = nullptr;
  float* y = nullptr;
  const float* w = nullptr;
  int64_t rows = 0, cols = 0;
  float eps = 0;
  int8_t* xq = nullptr;  // when set: y quantized as by LaunchQuantizeQ8 too (cols % 32 == 0)
  float2* xs = nullptr;
  // A second norm of the same width and eps in the launch (blocks after `rows`; no xq): the
  // keys' head norm joined to the queries'.
  const float* x2 = nullptr;
  float* y2 = nullptr;
  const float* w2 = nullptr;
  int64_t rows2 = 0;
};
void LaunchRmsNorm(const void* params, cudaStream_t stream);

// kind: y += b per row / y = v / y += x / out = silu(g) * u / y[t] *= sigmoid(g[t * gs])
enum ElementwiseKind : int32_t { kAddBias, kFill, kAdd, kSwiGlu, kScaleSigmoid };
struct ElementwiseParams {
  int32_t kind = 0;
  float value = 0;
  float* y = nullptr;
  const float* a = nullptr;  // bias, x, gate or g
  const float* b = nullptr;  // up
  int64_t rows = 0, cols = 0;
  int64_t a_stride = 0;  // g's row stride for kScaleSigmoid
  int8_t* xq = nullptr;  // kSwiGlu: y quantized too (cols % 32 == 0)
  float2* xs = nullptr;
};
void LaunchElementwise(const void* params, cudaStream_t stream);

struct CopyColumnsParams {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t rows = 0, src_stride = 0, src_col = 0, dst_stride = 0, dst_col = 0, n_cols = 0;
};
void LaunchCopyColumns(const void* params, cudaStream_t stream);

struct RopeParamsDev {
  float* x = nullptr;  // first rotated element of row 0, head 0
  int64_t rows = 0;
  int32_t n_heads = 0, head_dim = 0, n_rot = 0, neox = 0;
  const int32_t* pos = nullptr;  // device [rows]
  float freq_base = 0, freq_scale = 1, attn_factor = 1;
  int32_t yarn = 0;
  float yarn_factor = 0, corr_lo = 0, corr_hi = 0;
  float* x2 = nullptr;  // a second tensor rotated alike (q and k of one layer: one launch)
  int32_t n_heads2 = 0;
  // The KV store of x2 (k, every column rotated) and v joined to the launch (StoreKv right
  // after the rotation): kc set when joined.
  void* kc = nullptr;
  void* vc = nullptr;
  const float* v = nullptr;
  int64_t v_cols = 0, k_stride = 0, v_stride = 0;
  int32_t f16 = 0;
  const int64_t* pos0 = nullptr;  // device
  // The heads' RMSNorm joined (qwen3's q and k norms, in place, every column rotated, n_rot / 2
  // a power of two up to kRopeThreads): each head of x (x2) normed by norm_w (norm_w2) before it
  // turns.
  const float* norm_w = nullptr;
  const float* norm_w2 = nullptr;
  float norm_eps = 0;
};
void LaunchRope(const void* params, cudaStream_t stream);
constexpr int kRopeThreads = 128;  // a rotation's block: a joined head norm's pairs lie in one

// ---- KV cache and attention ----

struct StoreKvParams {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t rows = 0, k_cols = 0, v_cols = 0;
  void* kc = nullptr;
  void* vc = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  int32_t f16 = 0;
  const int64_t* pos0 = nullptr;  // device
};
void LaunchStoreKv(const void* params, cudaStream_t stream);

struct StoreMlaKvParams {
  const float* kvb = nullptr;
  const float* latent = nullptr;
  int64_t rows = 0, kvb_cols = 0, lat_cols = 0, rope_col = 0;
  int32_t n_head = 0, nope = 0, rot = 0, dv = 0;
  void* kc = nullptr;
  void* vc = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  int32_t f16 = 0;
  const int64_t* pos0 = nullptr;
};
void LaunchStoreMlaKv(const void* params, cudaStream_t stream);

struct AttentionParams {
  const float* q = nullptr;
  float* out = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  int32_t f16 = 0;
  int32_t n_tok = 0, n_head = 0, n_head_kv = 0, dk = 0, dv = 0;
  int32_t heads_per_block = 0;  // query heads of one KV head per block (gridDim.y chunks)
  int32_t q_per_block = 1;      // query tokens per block (gridDim.x = ceil(n_tok / it))
  int32_t splits = 1;           // blocks sharing one (token, head chunk)'s positions (then
                                // q_per_block == 1)
  float scale = 1;
  const int64_t* pos0 = nullptr;  // device
  float* partial = nullptr;       // splits > 1: per block (m, l, acc) of its positions
  uint32_t* counters = nullptr;   // splits > 1: per (token, kv head, chunk), zero between uses
  int32_t smem_bytes = 0;
  int32_t vec = 0;  // 16-byte loads (dk, dv, strides and head offsets multiples of 8, q aligned)
  int32_t mma = 0;  // the tensor-core kernel (attention_mma.cu): AttentionMmaFits, vec,
                    // q_per_block = kAttentionMmaRows / group, heads_per_block = group,
                    // splits = AttentionMmaSplits
  int8_t* xq = nullptr;  // when set (dv % 32 == 0): out quantized as by LaunchQuantizeQ8 too
  float2* xs = nullptr;
  // One token's decode (n_tok == 1, vec): the position and the first tile's history
  // (positions below pos0, which no recent kernel writes) are read before the wait for the
  // kernel before, the token's own K/V row (position pos0, stored by that kernel) after it.
  int32_t early = 0;
};
void LaunchAttention(const void* params, cudaStream_t stream);
// Dynamic shared memory an attention launch of `rows` (q_per_block * heads_per_block) rows
// needs; launches above 48 KiB need AllowAttentionSmem(bytes) first.
int AttentionSmemBytes(int rows, int dk, int dv);
void AllowAttentionSmem(int bytes);
// The tensor-core prefill kernel: query rows (tokens x the group's heads) a block, whether it
// takes a shape, and its shared memory limit raised (once per process and device; compute
// capability 8.0 or later).
constexpr int kAttentionMmaRows = 64;
bool AttentionMmaFits(int dk, int dv, int group);
void AllowAttentionMmaSmem();
void LaunchAttentionMma(const AttentionParams& p, cudaStream_t stream);
constexpr int kAttentionMaxAcc = 16;     // accumulators per thread: rows * dv <= 2048
constexpr int kAttentionMaxSplits = 64;  // blocks sharing one cell's positions
// Decode merges up to kMergeOneLevel splits' partials in one block (at 16 splits one block took
// 9.5 us where two levels took 11.3, llama3-8b on the H200); more, in groups of kMergeGroup
// first, then the groups.
constexpr int kMergeOneLevel = 16;
constexpr int kMergeGroup = 8;
constexpr int kMergeGroups = kAttentionMaxSplits / kMergeGroup;
constexpr int MergeGroups(int splits) {
  return splits > kMergeOneLevel ? (splits + kMergeGroup - 1) / kMergeGroup : 1;
}
// Partials a cell of `splits` keeps: each split's, then each group's. The launch's counters:
// one a cell, then kMergeGroups a cell.
constexpr int64_t AttentionPartials(int splits) {
  return splits + (MergeGroups(splits) > 1 ? MergeGroups(splits) : 0);
}
constexpr int kAttentionTile = 32;     // positions a block scores at a time
constexpr int kAttentionMmaTile = 64;  // the same, on tensor cores
// The tensor-core kernel's splits for `cells` blocks (token groups x KV heads) over a history
// of n_kv positions: blocks for fewer than half the multiprocessors (a short prompt, a verify
// window) split their kAttentionMmaTile-position tiles to about two blocks a multiprocessor,
// as far as the tiles go. Above that the merge costs more than it gains (H200: 512 tokens of
// the 8B, 256 blocks, took 88 us from an empty cache split in two, 43 us whole).
inline int AttentionMmaSplits(int64_t cells, int sm_count, int64_t n_kv) {
  if (cells <= 0 || 2 * cells > sm_count) return 1;
  int64_t want = (2 * static_cast<int64_t>(sm_count) + cells - 1) / cells;
  const int64_t tiles = (n_kv + kAttentionMmaTile - 1) / kAttentionMmaTile;
  want = want < tiles ? want : tiles;
  return static_cast<int>(want > kAttentionMaxSplits ? kAttentionMaxSplits : want < 1 ? 1 : want);
}
// Decode's splits for `cells` (token, KV head, head chunk) cells over a history of `tiles`
// tiles: enough blocks for four per multiprocessor, since a block walks its tiles one round
// trip after another and only other blocks hide that latency; but no more than the history's
// tiles rounded up to a multiple of 8, since every block of a launch is scheduled (early, under
// programmatic dependent launch, taking room from the kernel before) even if it then finds no
// tile. The rounding keeps the launches of 256 successive tokens alike, so their graphs are
// reused.
inline int DecodeAttentionSplits(int64_t cells, int sm_count, int64_t tiles) {
  int64_t want = (4 * static_cast<int64_t>(sm_count) + cells - 1) / (cells > 0 ? cells : 1);
  const int64_t rounded = (tiles + 7) / 8 * 8;
  want = want < rounded ? want : rounded;
  return static_cast<int>(want < 1 ? 1 : want > kAttentionMaxSplits ? kAttentionMaxSplits : want);
}

// ---- mixture of experts ----

void LaunchRouteTopK(const void* params, cudaStream_t stream);
constexpr int kRouteMaxExperts = 1024;

// The routed slots of many tokens (prefill) grouped by expert: sel [n_slots] (slot s = token
// s / k's choice s % k) counting-sorted by expert, stable, into tiles of up to kMoeTileSlots
// slots of one expert, {expert, first sorted position, slots, 0}, n_tiles of them; row_src
// [sorted position] = the slot's token, pos [slot] = its sorted position. One block; at most
// kMoeSortMaxSlots slots of kMoeSortMaxExperts experts.
constexpr int kMoeTileSlots = 8;
constexpr int kMoeMmaTileSlots = 32;  // tiles of LaunchGemvTilesMma
constexpr int kMoeSortMaxSlots = 8192;
constexpr int kMoeSortMaxExperts = 256;
struct MoeSortParams {
  const int32_t* sel = nullptr;
  int32_t n_slots = 0, n_expert = 0, k = 0;
  int32_t tile_slots = kMoeTileSlots;  // or kMoeMmaTileSlots
  int4* tiles = nullptr;               // [n_slots / tile_slots + n_expert] at most
  int32_t* n_tiles = nullptr;
  int32_t* row_src = nullptr;
  int32_t* pos = nullptr;
};
void LaunchMoeSort(const void* params, cudaStream_t stream);

// The products of sorted slots: for each tile (LaunchMoeSort) and job, y[p, :rows] = W_e .
// x[row_src[p]] (row_src null: x[p]) for the tile's positions p, W_e the tile's expert's
// matrix in a repacked layout (kRepacked type), x int8 activations. Blocks of a tile are
// consecutive, so an expert's rows are read from memory about once per layer, the tiles after
// the first finding them in L2.
struct GemvTilesParams {
  int32_t type = 0;    // a kRepacked type
  int32_t n_jobs = 1;  // 1, or 2: the gate and up products (same tiles and input)
  int64_t cols = 0;
  int32_t rows = 0;        // of one expert's matrix
  int32_t row_blocks = 0;  // blocks per tile and job
  int32_t grid = 0;        // blocks: for the most tiles the sort can make (the rest return at once)
  const uint8_t* const* expert_w[2] = {};
  int64_t row_bytes[2] = {};
  float* y[2] = {};
  const int8_t* xq = nullptr;
  const float2* xs = nullptr;
  const int32_t* row_src = nullptr;
  const int4* tiles = nullptr;
  const int32_t* n_tiles = nullptr;
};
void LaunchGemvTiles(const void* params, cudaStream_t stream);
// The same products on int8 tensor cores (moe_mma.cu; compute capability 8.0 and later), over
// tiles of kMoeMmaTileSlots slots; its shared memory limit raised once per process and device.
void LaunchGemvTilesMma(const void* params, cudaStream_t stream);
void AllowGemvTilesMmaSmem();
// Rows of one expert's matrix a block of LaunchGemvTiles (and LaunchGemvTilesMma) computes; the
// widest rows they take.
constexpr int kGemvTilesRowsPerBlock = 128;
int64_t GemvTilesMaxCols();

// acc[t, :] = sum over j < k of weight[t k + j] * out[pos[t k + j], :] (pos null: t k + j):
// the routed experts' outputs, summed in the order chosen; also added to add_to when set (the
// residual stream: acc + Add fused).
struct MoeCombineParams {
  const float* out = nullptr;
  const float* weight = nullptr;
  const int32_t* pos = nullptr;
  const float* plus = nullptr;  // [n, cols] added to the sum (the hybrid's CPU experts), or null
  float* acc = nullptr;
  float* add_to = nullptr;
  int64_t n = 0, cols = 0;
  int32_t k = 0;
};
void LaunchMoeCombine(const void* params, cudaStream_t stream);

struct GatherParams {
  const float* src = nullptr;
  float* dst = nullptr;
  const int32_t* rows = nullptr;  // device
  int64_t n = 0, cols = 0;
};
void LaunchGather(const void* params, cudaStream_t stream);

struct ScatterAddParams {
  const float* src = nullptr;
  float* dst = nullptr;
  const int32_t* rows = nullptr;  // device
  const float* weight = nullptr;  // device
  int64_t n = 0, cols = 0;
};
void LaunchScatterAdd(const void* params, cudaStream_t stream);

// ---- issued directly (not recorded) ----

// *flag = 1 when any of x[0..n) is NaN or infinite (the caller zeroes it first).
void AllFiniteAsync(const float* x, int64_t n, int* flag, cudaStream_t stream);
// Read bandwidth of device memory: best of `reps` full reads of a `bytes` buffer, bytes/s.
double MeasureReadBandwidth(uint64_t bytes, int reps, cudaStream_t stream);

}  // namespace substrate::cuda
