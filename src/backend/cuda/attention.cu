// KV-cache stores and causal attention. A block takes one token and the query heads of one KV
// head (GQA: the group shares every K/V tile it loads) and walks the token's positions in tiles
// of 32 with an online softmax. Decode has few tokens, so the positions are also split over
// `splits` blocks; the last of them to finish merges their partial softmax sums (no second
// launch). The position of the first token is read from device memory, so one launch serves
// every decode step (CUDA graphs).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_device.cuh"

namespace substrate::cuda {
namespace {

constexpr int kTile = kAttentionTile;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Blocks a multiprocessor must hold at once (so at most 128 registers a thread): decode aims its
// splits at four blocks a multiprocessor, all resident in one wave.
constexpr int kBlocksPerSm = 4;
static_assert(kTile == 32, "a warp's lanes take a tile's positions");

// Floats of a K tile row in shared memory, padded against bank conflicts: by one for the scalar
// path; by four for 16-byte reads (dk a multiple of 8, so rows start 4 banks apart mod 32).
__host__ __device__ constexpr int KRow(int dk, int vec) {
  return dk + (vec ? 4 : 1);
}
__host__ __device__ constexpr int KSize(int dk) {
  return kTile * (dk + 4);
}

__device__ __forceinline__ float LoadKv(const void* base, int f16, int64_t i) {
  return f16 ? __half2float(static_cast<const __half*>(base)[i])
             : static_cast<const float*>(base)[i];
}
__device__ __forceinline__ void StoreKvValue(void* base, int f16, int64_t i, float v) {
  if (f16) {
    static_cast<__half*>(base)[i] = __float2half_rn(v);
  } else {
    static_cast<float*>(base)[i] = v;
  }
}

__global__ void StoreKvKernel(const __grid_constant__ StoreKvParams p) {
  PdlStart();
  const int64_t per = p.k_cols + p.v_cols;
  const int64_t pos0 = *p.pos0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.rows * per;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per, c = i % per;
    if (c < p.k_cols) {
      StoreKvValue(p.kc, p.f16, (pos0 + t) * p.k_stride + c, p.k[t * p.k_cols + c]);
    } else {
      StoreKvValue(p.vc, p.f16, (pos0 + t) * p.v_stride + (c - p.k_cols),
                   p.v[t * p.v_cols + (c - p.k_cols)]);
    }
  }
}

__global__ void StoreMlaKvKernel(const __grid_constant__ StoreMlaKvParams p) {
  PdlStart();
  const int dk = p.nope + p.rot, per_head = p.nope + p.dv;
  const int64_t per_tok = static_cast<int64_t>(p.n_head) * (dk + p.dv);
  const int64_t pos0 = *p.pos0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < p.rows * per_tok; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_tok;
    const int64_t r = i % per_tok;
    const float* kvb = p.kvb + t * p.kvb_cols;
    if (r < static_cast<int64_t>(p.n_head) * dk) {
      const int h = static_cast<int>(r / dk), e = static_cast<int>(r % dk);
      const float v =
          e < p.nope ? kvb[h * per_head + e] : p.latent[t * p.lat_cols + p.rope_col + (e - p.nope)];
      StoreKvValue(p.kc, p.f16, (pos0 + t) * p.k_stride + r, v);
    } else {
      const int64_t rv = r - static_cast<int64_t>(p.n_head) * dk;
      const int h = static_cast<int>(rv / p.dv), e = static_cast<int>(rv % p.dv);
      StoreKvValue(p.vc, p.f16, (pos0 + t) * p.v_stride + rv, kvb[h * per_head + p.nope + e]);
    }
  }
}

// One side (K or V) of a tile: kTile cache rows, columns [col, col + width) of each, into shared
// memory rows of `ld` floats.
struct TileSide {
  const void* base;
  int64_t stride, col;
  int width;
  float* dst;
  int ld;
};

constexpr int kSideLoads = 4;  // 16-byte loads in flight per thread and side, each round

// Round i0 of a side's 16-byte loads (4 floats or 8 halves each), zeros past n_kv.
__device__ __forceinline__ void IssueSide(const TileSide& t, int f16, int64_t p0, int64_t n_kv,
                                          int i0, uint4 (&val)[kSideLoads]) {
  const int per = f16 ? 8 : 4, vecs = t.width / per, total = kTile * vecs;
#pragma unroll
  for (int u = 0; u < kSideLoads; ++u) {
    const int i = i0 + u * kThreads, r = i / vecs, c = i % vecs;
    val[u] = make_uint4(0, 0, 0, 0);
    if (i < total && p0 + r < n_kv) {
      const int64_t e = (p0 + r) * t.stride + t.col + static_cast<int64_t>(c) * per;
      val[u] = f16 ? *reinterpret_cast<const uint4*>(static_cast<const __half*>(t.base) + e)
                   : *reinterpret_cast<const uint4*>(static_cast<const float*>(t.base) + e);
    }
  }
}

// Round i0's values into the side's shared memory rows, as 16-byte stores.
__device__ __forceinline__ void StoreSide(const TileSide& t, int f16, int i0,
                                          const uint4 (&val)[kSideLoads]) {
  const int per = f16 ? 8 : 4, vecs = t.width / per, total = kTile * vecs;
#pragma unroll
  for (int u = 0; u < kSideLoads; ++u) {
    const int i = i0 + u * kThreads;
    if (i >= total) break;
    float4* o = reinterpret_cast<float4*>(t.dst + (i / vecs) * t.ld + (i % vecs) * per);
    if (f16) {
      const __half2* h = reinterpret_cast<const __half2*>(&val[u]);
      const float2 a = __half22float2(h[0]), b = __half22float2(h[1]);
      const float2 c = __half22float2(h[2]), d = __half22float2(h[3]);
      o[0] = make_float4(a.x, a.y, b.x, b.y);
      o[1] = make_float4(c.x, c.y, d.x, d.y);
    } else {
      o[0] = make_float4(__uint_as_float(val[u].x), __uint_as_float(val[u].y),
                         __uint_as_float(val[u].z), __uint_as_float(val[u].w));
    }
  }
}

// The K and V sides of the tile at position p0 into shared memory: each round issues both sides'
// loads before it stores either, so a tile costs one memory round trip when a round holds it.
// Needs widths, strides and columns multiples of 8 (checked by the host); shared rows are
// multiples of 4 floats (KRow, dv), so the 16-byte stores are aligned.
__device__ __forceinline__ void LoadTiles(const TileSide k, const TileSide v, int f16, int64_t p0,
                                          int64_t n_kv) {
  const int per = f16 ? 8 : 4;
  const int total = kTile * max(k.width, v.width) / per;
  for (int i0 = threadIdx.x; i0 < total; i0 += kSideLoads * kThreads) {
    uint4 kr[kSideLoads], vr[kSideLoads];
    IssueSide(k, f16, p0, n_kv, i0, kr);
    IssueSide(v, f16, p0, n_kv, i0, vr);
    StoreSide(k, f16, i0, kr);
    StoreSide(v, f16, i0, vr);
  }
}

// The block's outputs o_s [nr][dv] (row r: token t0 + r / nh, head h0 + r % nh), divided by
// l[r] where l is given, into p.out after a barrier; with xq (dv % 32 == 0, so a warp's 32 elements
// are one quantization block of one head, all stored or none) also quantized for the product that
// reads them.
__device__ __forceinline__ void StoreOutputs(const AttentionParams& p, const float* o_s,
                                             const float* l, int nr, int dv, int t0, int nt, int nh,
                                             int h0) {
  __syncthreads();
  // Rows by columns (a row's dv elements are a head's), so no index is divided: an integer
  // division is a chain of ~20 steps, and with one warp a scheduler each step waits. Code that
  // runs once a launch costs more than its steps (it is fetched as it runs), so the division by
  // l is here, in a loop, and not in the unrolled loop over the accumulators.
  const int per = kThreads % dv == 0 ? kThreads / dv : 0;  // rows a pass (0: a column loop)
  for (int r = per ? static_cast<int>(threadIdx.x) / dv : 0; r < nr; r += per ? per : 1) {
    const int tok = nt == 1 ? 0 : r / nh, head = r - tok * nh;
    const int64_t row = (static_cast<int64_t>(t0 + tok) * p.n_head + h0 + head) * dv;
    for (int d = per ? static_cast<int>(threadIdx.x) % dv : static_cast<int>(threadIdx.x); d < dv;
         d += per ? dv : kThreads) {
      const float v = l ? o_s[r * dv + d] / l[r] : o_s[r * dv + d];
      p.out[row + d] = v;
      if (p.xq) QuantizeWarpStore(v, row + d, p.xq, p.xs);
    }
  }
}

// A block takes tokens [t0, t0 + q_per_block) and query heads [h0, h0 + heads_per_block) of one
// KV head: its "rows" are (token, head) pairs, all scored against each K/V tile it loads.
// kVec: p.vec; kF16: p.f16; kAcc: accumulators a thread needs (rows * dv <= kAcc * kThreads).
// All compile-time, so a launch runs only its own code: built for 16 accumulators, the unrolled
// row loops took a decode tile's scores and mix 3.2 us for 4 rows and 3.8 for 8 (an H200; 1.4
// and 2.0 built for 4 and 8): predicated-off instructions are still fetched and issued.
template <bool kVec, bool kF16, int kAcc>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    AttentionKernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ float smem[];
  const int hb = p.heads_per_block, qb = p.q_per_block, dk = p.dk, dv = p.dv;
  const int group = p.n_head / p.n_head_kv;
  const int chunks = (group + hb - 1) / hb;
  const int t0 = blockIdx.x * qb;
  const int hk = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  const int h0 = hk * group + chunk * hb;      // first query head of the block
  const int nh = min(hb, group - chunk * hb);  // heads it has
  const int nt = min(qb, p.n_tok - t0);        // tokens it has
  const int nr = nt * nh;                      // rows: r = token * nh + head
  const int rmax = qb * hb;
  const int split = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kld = KRow(dk, kVec);
  // Rows a warp takes together in the scores and the merge: one in decode (a loop's second
  // pass costs less than a second copy of its body), four in the prefill kernel.
  constexpr int kPass = kAcc >= 16 ? 4 : 1;

  float* q_s = smem;                      // [rmax][dk]
  float* k_s = q_s + rmax * max(dk, dv);  // [kTile][kld] (q_s also holds the outputs)
  float* v_s = k_s + KSize(dk);           // [kTile][dv]
  float* p_s = v_s + kTile * dv;          // [rmax][kTile]
  float* m_s = p_s + rmax * kTile;        // [rmax]
  float* l_s = m_s + rmax;                // [rmax]
  float* a_s = l_s + rmax;                // [rmax] rescale of the accumulators
  float* w_s = a_s + rmax;                // [rmax][kAttentionMaxSplits] each split's merge weight
  // The K and V tile at position p0 into k_s and v_s (the 16-byte path), rows from `end` on
  // zeros.
  auto load_tile = [&](int64_t p0, int64_t end) {
    LoadTiles(TileSide{p.k, p.k_stride, static_cast<int64_t>(hk) * dk, dk, k_s, kld},
              TileSide{p.v, p.v_stride, static_cast<int64_t>(hk) * dv, dv, v_s, dv}, kF16, p0,
              end);
  };

  // Early (one token's decode, kVec): the position, the splits and the first tile's history
  // before the wait. The position comes from the argument copy ahead of the whole chain; cache
  // rows below pos0 were stored by earlier steps, which had completed before the kernel before
  // this one could let it launch. Only position pos0 is the kernel before's to store.
  const bool early = kVec && p.early;
  int64_t pos0 = 0, tile_now = -1;  // tile_now: the tile of pos0 where this block takes it
  if (early) {
    pos0 = *p.pos0;
    const int64_t n_tiles = pos0 / kTile + 1;
    const int splits = static_cast<int>(min(static_cast<int64_t>(p.splits), n_tiles));
    if (split < splits) {
      load_tile(static_cast<int64_t>(split) * kTile, pos0);
      if ((n_tiles - 1) % splits == split) tile_now = n_tiles - 1;
    }
    PdlStart();
    if (split >= splits) return;
  } else {
    PdlStart();
    // The position is read here and used after the query loads, so both round trips overlap.
    pos0 = *p.pos0;
  }
  // The token's own K/V row, where this block takes its tile: a thread's first elements are
  // requested with the queries (one round trip) and go into the tile when it is in.
  const int64_t k_at = pos0 * p.k_stride + static_cast<int64_t>(hk) * dk;
  const int64_t v_at = pos0 * p.v_stride + static_cast<int64_t>(hk) * dv;
  float k_first[2] = {0.0f, 0.0f}, v_first = 0.0f;  // a thread's first elements of each
  if (tile_now >= 0) {
    if (tid < dk) k_first[0] = LoadKv(p.k, kF16, k_at + tid);
    if (tid + kThreads < dk) k_first[1] = LoadKv(p.k, kF16, k_at + tid + kThreads);
    if (tid < dv) v_first = LoadKv(p.v, kF16, v_at + tid);
  }
  // The block's query rows (row r: token r / nh, head r % nh; each row's dk floats contiguous).
  auto q_at = [&](int i) {
    const int r = i / dk, d = i % dk;
    return (static_cast<int64_t>(t0 + r / nh) * p.n_head + h0 + r % nh) * dk + d;
  };
  if (kVec) {
    // 16-byte reads, several in flight per thread before the first store.
    constexpr int kLoads = 4;
    const int n4 = nr * dk / 4;
    for (int i0 = tid; i0 < n4; i0 += kLoads * kThreads) {
      float4 v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = i0 + u * kThreads;
        if (i < n4) v[u] = *reinterpret_cast<const float4*>(p.q + q_at(4 * i));
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = i0 + u * kThreads;
        if (i < n4) reinterpret_cast<float4*>(q_s)[i] = v[u];
      }
    }
  } else {
    for (int i = tid; i < nr * dk; i += kThreads) q_s[i] = p.q[q_at(i)];
  }
  const int64_t n_kv_max = pos0 + t0 + nt;  // the last token's history
  const int64_t n_tiles = (n_kv_max + kTile - 1) / kTile;
  // Decode over a short history: only as many splits as there are tiles take part (the rest
  // leave now); with one, its block writes the output without the partials' round trip.
  const int splits = static_cast<int>(min(static_cast<int64_t>(p.splits), n_tiles));
  if (split >= splits) return;
  for (int r = tid; r < rmax; r += kThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  // The row of a thread's element i (tid + i * kThreads), without a division where dv divides
  // the block (unrolled code runs once per element: each division is a chain of ~20 steps).
  auto row_of = [&](int i) {
    return kThreads % dv == 0 ? tid / dv + i * (kThreads / dv) : (tid + i * kThreads) / dv;
  };
  __syncthreads();

  for (int64_t tile = split; tile < n_tiles; tile += splits) {
    const int64_t p0 = tile * kTile;
    if (kVec) {
      // (Early: the first tile is in already, and no tile reads position pos0 from the cache.)
      if (!early || tile != split) load_tile(p0, early ? pos0 : n_kv_max);
    } else {
      for (int i = tid; i < kTile * dk; i += kThreads) {
        const int r = i / dk, d = i % dk;
        const int64_t pos = p0 + r;
        k_s[r * kld + d] =
            pos < n_kv_max ? LoadKv(p.k, kF16, pos * p.k_stride + static_cast<int64_t>(hk) * dk + d)
                           : 0.0f;
      }
      for (int i = tid; i < kTile * dv; i += kThreads) {
        const int r = i / dv, d = i % dv;
        const int64_t pos = p0 + r;
        v_s[i] = pos < n_kv_max
                     ? LoadKv(p.v, kF16, pos * p.v_stride + static_cast<int64_t>(hk) * dv + d)
                     : 0.0f;
      }
    }
    __syncthreads();
    if (tile == tile_now) {  // the token's own row
      const int64_t r = pos0 - p0;
      for (int d = tid; d < dk; d += kThreads)
        k_s[r * kld + d] = d < kThreads       ? k_first[0]
                           : d < 2 * kThreads ? k_first[1]
                                              : LoadKv(p.k, kF16, k_at + d);
      for (int d = tid; d < dv; d += kThreads)
        v_s[r * dv + d] = d < kThreads ? v_first : LoadKv(p.v, kF16, v_at + d);
      __syncthreads();
    }
    if (kVec) {
      // A warp's lanes take the tile's positions, the warp every kWarps-th row (kPass of them a
      // pass): each K row is read once for all of a thread's rows, whose queries are
      // broadcasts, and the rows' sums are independent chains.
      const float4* k4 = reinterpret_cast<const float4*>(k_s + lane * kld);
      for (int r0 = warp; r0 < nr; r0 += kPass * kWarps) {
        float dot[kPass][2] = {};
        for (int d = 0; d < dk / 4; d += 2) {
          const float4 b = k4[d], e = k4[d + 1];
#pragma unroll
          for (int k = 0; k < kPass; ++k) {
            const int r = r0 + k * kWarps;
            if (r < nr) {
              const float4* q4 = reinterpret_cast<const float4*>(q_s + r * dk);
              const float4 a = q4[d], c = q4[d + 1];
              dot[k][0] = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot[k][0]))));
              dot[k][1] = fmaf(c.x, e.x, fmaf(c.y, e.y, fmaf(c.z, e.z, fmaf(c.w, e.w, dot[k][1]))));
            }
          }
        }
#pragma unroll
        for (int k = 0; k < kPass; ++k) {
          const int r = r0 + k * kWarps;
          if (r < nr) {
            const int64_t n_kv = pos0 + t0 + r / nh + 1;  // this row's token sees [0, n_kv)
            p_s[r * kTile + lane] =
                p0 + lane < n_kv ? (dot[k][0] + dot[k][1]) * p.scale : -INFINITY;
          }
        }
      }
    } else {
      for (int i = tid; i < nr * kTile; i += kThreads) {
        const int r = i / kTile, pp = i % kTile;
        const int64_t n_kv = pos0 + t0 + r / nh + 1;
        const float* qh = q_s + r * dk;
        const float* kr = k_s + pp * kld;
        float dot = 0.0f;
        for (int d = 0; d < dk; ++d) dot = fmaf(qh[d], kr[d], dot);
        p_s[r * kTile + pp] = p0 + pp < n_kv ? dot * p.scale : -INFINITY;
      }
    }
    __syncthreads();
    for (int r = warp; r < nr; r += kThreads / 32) {
      const float sc = p_s[r * kTile + lane];
      float mx = sc;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, mx);
      // A NaN score is not the max, so exp(NaN - m) carries it into the sum and the output.
      // A row with no position in this tile (a later token's tile) keeps its state.
      const float e = sc == -INFINITY ? 0.0f : expf(sc - m_new);
      float sum = e;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      p_s[r * kTile + lane] = e;
      __syncwarp();
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        a_s[r] = m_new == -INFINITY ? 1.0f : alpha;
        m_s[r] = m_new;
        l_s[r] = l_s[r] * a_s[r] + sum;
      }
    }
    __syncthreads();
    // Accumulator i of a thread is output element tid + i * kThreads: row r = idx / dv, column
    // d = idx % dv.
    if (kVec && kThreads % dv == 0) {
      // The thread's column is the same for all its rows (every G-th from tid / dv): each V
      // value is read once for them all, the weights four at a time.
      const int d = tid % dv, rg = tid / dv, g = kThreads / dv;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        if (rg + i * g < nr) acc[i] *= a_s[rg + i * g];
      }
#pragma unroll 2
      for (int j = 0; j < kTile; j += 4) {
        const float v0 = v_s[j * dv + d], v1 = v_s[(j + 1) * dv + d];
        const float v2 = v_s[(j + 2) * dv + d], v3 = v_s[(j + 3) * dv + d];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          const int r = rg + i * g;
          if (r < nr) {
            const float4 w = *reinterpret_cast<const float4*>(p_s + r * kTile + j);
            acc[i] = fmaf(w.w, v3, fmaf(w.z, v2, fmaf(w.y, v1, fmaf(w.x, v0, acc[i]))));
          }
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int idx = tid + i * kThreads;
        if (idx < nr * dv) {
          const int r = idx / dv, d = idx % dv;
          float a = acc[i] * a_s[r];
          const float* pr = p_s + r * kTile;
#pragma unroll 8
          for (int j = 0; j < kTile; ++j) a = fmaf(pr[j], v_s[j * dv + d], a);
          acc[i] = a;
        }
      }
    }
    __syncthreads();
  }

  // The outputs go through shared memory (o_s, over the query rows: rows * max(dk, dv) floats)
  // and are stored by one loop, so the store, and with xq the quantization, is one copy of code
  // rather than one per accumulator (unrolled, they made the kernel 180 KB of instructions).
  float* o_s = q_s;
  if (splits == 1) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int idx = tid + i * kThreads;
      if (idx < nr * dv) o_s[idx] = acc[i];
    }
    StoreOutputs(p, o_s, l_s, nr, dv, t0, nt, nh, h0);
    return;
  }

  // Splits (decode: one token per block, q_per_block == 1): partial results of this split,
  // acc[hb * dv], m[hb], l[hb]. Up to kMergeOneLevel splits, the last of them to finish merges
  // them; over that, the last of each group of kMergeGroup merges its group into a partial of
  // the same form, and the last group merger merges the groups. (One block merging 64 splits
  // took 8-17 us on the H200: its reads wait on L2 round after round; two levels spread them
  // over several multiprocessors.)
  const int64_t cell = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
  const int64_t stride = static_cast<int64_t>(hb) * (dv + 2);
  const int m_at = hb * dv, l_at = hb * dv + hb;
  const int groups = MergeGroups(splits);
  float* parts = p.partial + cell * AttentionPartials(p.splits) * stride;  // the cell's
  float* part = parts + split * stride;
  if (tid < nr) {
    part[m_at + tid] = m_s[tid];
    part[l_at + tid] = l_s[tid];
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int idx = tid + i * kThreads;
    if (idx < nr * dv) part[idx] = acc[i];
  }

  // Merges partials [0, n) at `parts` into the outputs (out == nullptr) or, unnormalised, into
  // the partial `out` (a group's).
  auto merge = [&](const float* parts, int n, float* out) {
    // Every output element sums the partial accumulators: kE of a thread's elements at a time,
    // kU partials of each, all 32 reads in flight at once (not one L2 round trip after another).
    // The first round's reads are issued here, so that their round trip and the (m, l) reads'
    // overlap.
    constexpr int kE = kAcc < 8 ? kAcc : 8, kU = 32 / kE;
    float a[kE][kU];
    auto issue = [&](int i0, int s0) {
#pragma unroll
      for (int i = 0; i < kE; ++i) {
        const int idx = tid + (i0 + i) * kThreads;
#pragma unroll
        for (int u = 0; u < kU; ++u)
          a[i][u] = idx < nr * dv && s0 + u < n ? __ldcg(parts + (s0 + u) * stride + idx) : 0.0f;
      }
    };
    issue(0, 0);
    // Each head's weight per partial, exp(m_s - m) (over l for the outputs), into shared
    // memory: a warp per head (its heads every kWarps-th, kPass at a time), a lane per partial
    // (two for over 32), every (m, l) of the pass read at once. Partials past n weigh zero.
    static_assert(kAttentionMaxSplits <= 64, "a lane takes at most two splits");
    for (int r0 = warp; r0 < nr; r0 += kPass * kWarps) {
      float ms[kPass][2], ls[kPass][2];
#pragma unroll
      for (int k = 0; k < kPass; ++k) {
        const int r = r0 + k * kWarps;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int sp = lane + 32 * j;
          const bool in = r < nr && sp < n;
          ms[k][j] = in ? __ldcg(parts + sp * stride + m_at + r) : -INFINITY;
          ls[k][j] = in ? __ldcg(parts + sp * stride + l_at + r) : 0.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < kPass; ++k) {
        const int r = r0 + k * kWarps;
        if (r >= nr) break;  // the warp's rows, so the shuffles below see every lane
        float m = fmaxf(ms[k][0], ms[k][1]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        // A partial with no positions (m = -inf, l = 0) weighs nothing; a NaN l (a NaN score)
        // is kept, and so reaches the output.
        float l = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          ms[k][j] = ms[k][j] == -INFINITY && !(ls[k][j] != ls[k][j]) ? 0.0f : expf(ms[k][j] - m);
          l += ls[k][j] * ms[k][j];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
#pragma unroll
        for (int j = 0; j < 2; ++j)
          w_s[r * kAttentionMaxSplits + lane + 32 * j] = out ? ms[k][j] : ms[k][j] / l;
        if (out && lane == 0) {
          out[m_at + r] = m;
          out[l_at + r] = l;
        }
      }
    }
    __syncthreads();
    for (int i0 = 0; i0 < kAcc && tid + i0 * kThreads < nr * dv; i0 += kE) {
      float o[kE];
#pragma unroll
      for (int i = 0; i < kE; ++i) o[i] = 0.0f;
      for (int s0 = 0; s0 < n; s0 += kU) {
        if (i0 + s0 > 0) issue(i0, s0);
#pragma unroll
        for (int i = 0; i < kE; ++i) {
          const int idx = tid + (i0 + i) * kThreads;
          if (idx < nr * dv) {
            const float* w = w_s + row_of(i0 + i) * kAttentionMaxSplits + s0;
#pragma unroll
            for (int u = 0; u < kU; ++u) o[i] = fmaf(a[i][u], w[u], o[i]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kE; ++i) {
        const int idx = tid + (i0 + i) * kThreads;
        if (idx < nr * dv) (out ? out : o_s)[idx] = o[i];
      }
    }
    if (!out) StoreOutputs(p, o_s, nullptr, nr, dv, t0, nt, nh, h0);
  };

  // What the cell's last arrival merges: the splits', or the groups' partials.
  const float* last = parts;
  int n_last = splits;
  if (groups > 1) {
    // The group counters follow the cells' (the host sizes the counters for both).
    const int g = split / kMergeGroup, g0 = g * kMergeGroup, gn = min(kMergeGroup, splits - g0);
    uint32_t* group_counter =
        p.counters + static_cast<int64_t>(gridDim.x) * gridDim.y + cell * kMergeGroups + g;
    if (!ArrivesLast(group_counter, gn)) return;
    merge(parts + g0 * stride, gn, parts + (p.splits + g) * stride);
    if (tid == 0) *group_counter = 0;
    last = parts + p.splits * stride;
    n_last = groups;
  }
  if (!ArrivesLast(p.counters + cell, n_last)) return;
  merge(last, n_last, nullptr);
  if (tid == 0) p.counters[cell] = 0;
}

using AttentionKernelFn = void (*)(AttentionParams);

// The instance for a launch: the 16-bit cache's, the 16-byte loads', and the fewest accumulators
// that hold `acc` (vectorised launches only; the scalar path is the rare one).
AttentionKernelFn AttentionKernelFor(bool vec, bool f16, int acc) {
  if (!vec)
    return f16 ? AttentionKernel<false, true, kAttentionMaxAcc>
               : AttentionKernel<false, false, kAttentionMaxAcc>;
  if (acc <= 4) return f16 ? AttentionKernel<true, true, 4> : AttentionKernel<true, false, 4>;
  if (acc <= 8) return f16 ? AttentionKernel<true, true, 8> : AttentionKernel<true, false, 8>;
  return f16 ? AttentionKernel<true, true, kAttentionMaxAcc>
             : AttentionKernel<true, false, kAttentionMaxAcc>;
}

}  // namespace

void LaunchStoreKv(const void* params, cudaStream_t stream) {
  const StoreKvParams& p = *static_cast<const StoreKvParams*>(params);
  const int64_t n = p.rows * (p.k_cols + p.v_cols);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  LaunchKernel(StoreKvKernel, dim3(std::max(1u, blocks)), dim3(256), 0, stream, p);
}

void LaunchStoreMlaKv(const void* params, cudaStream_t stream) {
  const StoreMlaKvParams& p = *static_cast<const StoreMlaKvParams*>(params);
  const int64_t n = p.rows * p.n_head * (p.nope + p.rot + p.dv);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  LaunchKernel(StoreMlaKvKernel, dim3(std::max(1u, blocks)), dim3(256), 0, stream, p);
}

int AttentionSmemBytes(int rows, int dk, int dv) {
  const int floats = rows * std::max(dk, dv) + KSize(dk) + kTile * dv + rows * kTile +
                     rows * (3 + kAttentionMaxSplits);
  return floats * 4;
}

void LaunchAttention(const void* params, cudaStream_t stream) {
  const AttentionParams& p = *static_cast<const AttentionParams*>(params);
  if (p.mma) return LaunchAttentionMma(p, stream);
  const int group = p.n_head / p.n_head_kv;
  const int chunks = (group + p.heads_per_block - 1) / p.heads_per_block;
  const dim3 grid(static_cast<unsigned>((p.n_tok + p.q_per_block - 1) / p.q_per_block),
                  static_cast<unsigned>(p.n_head_kv * chunks), static_cast<unsigned>(p.splits));
  auto kernel = AttentionKernelFor(
      p.vec, p.f16, (p.q_per_block * p.heads_per_block * p.dv + kThreads - 1) / kThreads);
  LaunchKernel(kernel, grid, dim3(kThreads), static_cast<size_t>(p.smem_bytes), stream, p);
}

// Raises the kernel's dynamic shared memory limit (once per process and device).
void AllowAttentionSmem(int bytes) {
  for (int vec = 0; vec < 2; ++vec)
    for (int f16 = 0; f16 < 2; ++f16)
      for (int acc : {4, 8, 16}) {
        if (!vec && acc != kAttentionMaxAcc) continue;  // the scalar path has one instance
        SUBSTRATE_CUDA_CHECK(cudaFuncSetAttribute(
            AttentionKernelFor(vec, f16, acc), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      }
}

}  // namespace substrate::cuda
