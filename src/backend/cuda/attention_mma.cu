// Prefill attention on tensor cores, for head sizes 64 and 128 (keys and values alike). A block
// takes 64 query rows of one KV head, (token, head) pairs of the GQA group, 16 to a warp, and walks
// the positions in tiles of 64: S = Q K^T and O += P V run as m16n8k16 MMAs (f16 inputs, f32 sums)
// with the online softmax between them in registers, the probabilities turned into the second
// product's operand without a trip through shared memory. The next tile's K and V are copied in
// (cp.async) while this one is computed. A short prompt over a long history also splits its
// positions over blocks, merged as decode's are.
//
// The queries, the probabilities and (from an F32 cache) the keys and values are rounded to
// f16 for the products, as the GPU's prefill GEMMs round their activations (cuBLAS on halves);
// an F32 cache's tiles are converted as they are loaded, without the copy's overlap.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_device.cuh"

namespace substrate::cuda {
namespace {

constexpr int kRows = kAttentionMmaRows;  // query rows a block
constexpr int kWarps = kRows / 16;        // a warp's MMA rows are 16
constexpr int kThreads = 32 * kWarps;
constexpr int kPos = kAttentionMmaTile;  // positions a tile

// Shared memory, in halves: the block's queries, then two stages of a K and a V tile. Rows are
// padded by 16 bytes, so the eight rows one ldmatrix reads start in eight different bank
// quads.
template <int D>
struct MmaSmem {
  static constexpr int kLd = D + 8;
  static constexpr int kTile = kPos * kLd;
  static constexpr int kBytes = (kRows * kLd + 4 * kTile) * 2;
  static constexpr int kOutLd = D + 4;  // floats a row of the output's staging
  static_assert((kRows * kOutLd + kRows * kAttentionMaxSplits) * 4 <= 4 * kTile * 2,
                "the output's staging and the merge weights fit the tiles");
};

// 8 floats from global memory into 8 halves of shared memory (zeros when !in).
__device__ __forceinline__ void StoreHalves(__half* dst, const float* src, bool in) {
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
  if (in) {
    a = *reinterpret_cast<const float4*>(src);
    b = *reinterpret_cast<const float4*>(src + 4);
  }
  const __half2 h[4] = {__floats2half2_rn(a.x, a.y), __floats2half2_rn(a.z, a.w),
                        __floats2half2_rn(b.x, b.y), __floats2half2_rn(b.z, b.w)};
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(h);
}

__device__ __forceinline__ uint32_t PackHalves(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Block (x, y): tokens [x * q_per_block, ...) and all heads of KV head y; row r is token
// r / group, head r % group. Fragment layout of m16n8k16 (PTX ISA): lane = 4 g + c holds rows
// g and g + 8 of a 16-row operand or result, columns 2c and 2c + 1 of each 8-column tile.
template <int D, bool kF32Cache>
__global__ void __launch_bounds__(kThreads, 2)
    AttentionMmaKernel(const __grid_constant__ AttentionParams p) {
  using S = MmaSmem<D>;
  constexpr int kSteps = D / 16;  // k-steps of S = Q K^T
  PdlStart();
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  __half* q_s = reinterpret_cast<__half*>(smem_bytes);
  __half* tiles = q_s + kRows * S::kLd;  // [stage][K, V][kPos][kLd]

  const int group = p.n_head / p.n_head_kv;
  const int t0 = blockIdx.x * p.q_per_block;
  const int hk = blockIdx.y, h0 = hk * group;
  const int nt = min(p.q_per_block, p.n_tok - t0);
  const int nr = nt * group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t pos0 = *p.pos0;
  const int64_t n_kv_max = pos0 + t0 + nt;  // the block's last token's history
  const int n_tiles = static_cast<int>((n_kv_max + kPos - 1) / kPos);
  // A short prompt over a long history: the positions are split over blocks (every splits-th
  // tile from `split`), as in decode; only as many as there are tiles take part.
  const int splits = min(p.splits, n_tiles), split = blockIdx.z;
  if (split >= splits) return;

  using Elem = std::conditional_t<kF32Cache, float, __half>;
  const Elem* k_base = static_cast<const Elem*>(p.k) + static_cast<int64_t>(hk) * D;
  const Elem* v_base = static_cast<const Elem*>(p.v) + static_cast<int64_t>(hk) * D;
  auto load_tile = [&](int tile, int stage) {
    __half* ks = tiles + stage * 2 * S::kTile;
    __half* vs = ks + S::kTile;
    constexpr int kChunks = kPos * D / 8;  // 8-element chunks a side
#pragma unroll 4
    for (int i = tid; i < kChunks; i += kThreads) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      const int64_t pos = static_cast<int64_t>(tile) * kPos + r;
      // Past the history: zeros (garbage V times a zero probability may be NaN).
      const bool in = pos < n_kv_max;
      const int64_t at = in ? pos : 0;
      if constexpr (kF32Cache) {
        StoreHalves(ks + r * S::kLd + c, k_base + at * p.k_stride + c, in);
        StoreHalves(vs + r * S::kLd + c, v_base + at * p.v_stride + c, in);
      } else {
        CopyAsync16(SmemAddress(ks + r * S::kLd + c), k_base + at * p.k_stride + c, in);
        CopyAsync16(SmemAddress(vs + r * S::kLd + c), v_base + at * p.v_stride + c, in);
      }
    }
    CopyAsyncCommit();  // (an empty group for an F32 cache, so the waits below stay the same)
  };
  load_tile(split, 0);  // first, so its round trip overlaps the queries'

  // The queries, scaled by scale * log2(e) (the softmax runs on exp2), as halves; rows past
  // the block's are zeros.
  const float q_scale = p.scale * 1.4426950408889634f;
  for (int i = tid; i < kRows * D / 2; i += kThreads) {
    const int r = i / (D / 2), d = (i % (D / 2)) * 2;
    float a = 0.0f, b = 0.0f;
    if (r < nr) {
      const float* src =
          p.q + (static_cast<int64_t>(t0 + r / group) * p.n_head + h0 + r % group) * D + d;
      a = src[0] * q_scale;
      b = src[1] * q_scale;
    }
    *reinterpret_cast<__half2*>(q_s + r * S::kLd + d) = __floats2half2_rn(a, b);
  }
  __syncthreads();
  // This warp's 16 query rows as the A operand of every k-step.
  uint32_t qf[kSteps][4];
  {
    const int m = lane >> 3;
    const int r = warp * 16 + (m & 1) * 8 + (lane & 7);
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
      LoadMatrices(SmemAddress(q_s + r * S::kLd + s * 16 + (m >> 1) * 8), qf[s]);
  }

  const int g = lane >> 2, c2 = (lane & 3) * 2;
  // This thread's two rows (g and g + 8 of the warp's) see positions [0, limit).
  int64_t limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) limit[h] = pos0 + t0 + (warp * 16 + g + 8 * h) / group + 1;
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  for (int tile = split, it = 0; tile < n_tiles; tile += splits, ++it) {
    if (tile + splits < n_tiles) {
      load_tile(tile + splits, (it + 1) & 1);  // into the stage the tile before this one used
    } else {
      CopyAsyncCommit();  // an empty group, so the wait below still means "this tile is in"
    }
    CopyAsyncWaitAllButOne();
    __syncthreads();
    const __half* ks = tiles + (it & 1) * 2 * S::kTile;
    const __half* vs = ks + S::kTile;

    // S = Q K^T, 16 rows by 64 positions a warp: K rows (positions) are the B operand's
    // columns, read as stored.
    float sc[kPos / 8][4];
#pragma unroll
    for (int j = 0; j < kPos / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
    {
      const int m = lane >> 3;
#pragma unroll
      for (int j = 0; j < kPos / 8; j += 2) {
        const int pos = (j + (m >> 1)) * 8 + (lane & 7);
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          uint32_t b[4];
          LoadMatrices(SmemAddress(ks + pos * S::kLd + s * 16 + (m & 1) * 8), b);
          MmaF16(sc[j], qf[s], b[0], b[1]);
          MmaF16(sc[j + 1], qf[s], b[2], b[3]);
        }
      }
    }

    // Online softmax over the tile. A NaN score is not the max, so exp2(NaN - m) carries it
    // into the sum and the output.
    const int64_t p0 = static_cast<int64_t>(tile) * kPos;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kPos / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        if (p0 + j * 8 + c2 + (e & 1) >= limit[h]) sc[j][e] = -INFINITY;
        tile_max[h] = fmaxf(tile_max[h], sc[j][e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float m_new = fmaxf(row_max[h], tile_max[h]);
      // A row's first tile with a position it sees makes m_new finite (with splits, a row may
      // see none of a split's tiles: its m stays -inf, its sums zero).
      alpha[h] = row_max[h] == -INFINITY ? 0.0f : exp2f(row_max[h] - m_new);
      row_max[h] = m_new;
      row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int j = 0; j < kPos / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        sc[j][e] = sc[j][e] == -INFINITY ? 0.0f : exp2f(sc[j][e] - row_max[h]);
        row_sum[h] += sc[j][e];
      }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }

    // O += P V: the probabilities' C fragments are the A operand as they lie; V rows
    // (positions) are the B operand's k, read transposed.
    {
      const int m = lane >> 3;
#pragma unroll
      for (int s = 0; s < kPos / 16; ++s) {
        const uint32_t a[4] = {PackHalves(sc[2 * s][0], sc[2 * s][1]),
                               PackHalves(sc[2 * s][2], sc[2 * s][3]),
                               PackHalves(sc[2 * s + 1][0], sc[2 * s + 1][1]),
                               PackHalves(sc[2 * s + 1][2], sc[2 * s + 1][3])};
        const int pos = s * 16 + (m & 1) * 8 + (lane & 7);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t b[4];
          LoadMatricesTransposed(SmemAddress(vs + pos * S::kLd + (n + (m >> 1)) * 8), b);
          MmaF16(o[n], a, b[0], b[1]);
          MmaF16(o[n + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the stage is loaded again two tiles on
  }

  // The rows' sums are spread over the four lanes of each row.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
  // Staged through shared memory (the tiles are free now), so a warp writes 32 consecutive
  // elements of one row at a time: coalesced, and one quantization block when xq is set.
  float* out_s = reinterpret_cast<float*>(tiles);
  if (splits == 1) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv = 1.0f / row_sum[h];
        *reinterpret_cast<float2*>(out_s + (warp * 16 + g + 8 * h) * S::kOutLd + n * 8 + c2) =
            make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      }
    }
    __syncwarp();
  } else {
    // This split's partial result: per row its unnormalized sums, m and l ([D + 2] floats);
    // the cell's last split to finish merges them all into out_s.
    const int64_t cell = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
    constexpr int kRowFloats = D + 2;
    float* part = p.partial + (cell * p.splits + split) * (kRows * kRowFloats);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = part + (warp * 16 + g + 8 * h) * kRowFloats;
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2*>(row + n * 8 + c2) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
      if (c2 == 0) {
        row[D] = row_max[h];
        row[D + 1] = row_sum[h];
      }
    }
    if (!ArrivesLast(p.counters + cell, splits)) return;
    const float* parts = p.partial + cell * p.splits * (kRows * kRowFloats);
    // Each row's weight per split, exp2(m_s - m) / l, after the staging rows.
    float* w_s = out_s + kRows * S::kOutLd;  // [kRows][kAttentionMaxSplits]
    if (tid < kRows) {
      float m = -INFINITY;
      for (int sp = 0; sp < splits; ++sp)
        m = fmaxf(m, __ldcg(parts + (sp * kRows + tid) * kRowFloats + D));
      float l = 0.0f;
      for (int sp = 0; sp < splits; ++sp) {
        const float ms = __ldcg(parts + (sp * kRows + tid) * kRowFloats + D);
        const float w = ms == -INFINITY ? 0.0f : exp2f(ms - m);
        w_s[tid * kAttentionMaxSplits + sp] = w;
        l += w * __ldcg(parts + (sp * kRows + tid) * kRowFloats + D + 1);
      }
      for (int sp = 0; sp < splits; ++sp) w_s[tid * kAttentionMaxSplits + sp] /= l;
    }
    __syncthreads();
    for (int i = tid; i < kRows * D; i += kThreads) {
      const int r = i / D, d = i % D;
      float v = 0.0f;
      for (int sp = 0; sp < splits; ++sp)
        v = fmaf(__ldcg(parts + (sp * kRows + r) * kRowFloats + d),
                 w_s[r * kAttentionMaxSplits + sp], v);
      out_s[r * S::kOutLd + d] = v;
    }
    __syncthreads();
    if (tid == 0) p.counters[cell] = 0;
  }
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = warp * 16 + i / D, d = i % D;
    if (r >= nr) break;  // the warp's later rows are past the block's too
    const float v = out_s[(warp * 16 + i / D) * S::kOutLd + d];
    const int64_t at = (static_cast<int64_t>(t0 + r / group) * p.n_head + h0 + r % group) * D + d;
    p.out[at] = v;
    if (p.xq) QuantizeWarpStore(v, at, p.xq, p.xs);
  }
}

template <int D>
void Launch(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.n_tok + p.q_per_block - 1) / p.q_per_block),
                  static_cast<unsigned>(p.n_head_kv), static_cast<unsigned>(p.splits));
  if (p.f16) {
    LaunchKernel(AttentionMmaKernel<D, false>, grid, dim3(kThreads), MmaSmem<D>::kBytes, stream, p);
  } else {
    LaunchKernel(AttentionMmaKernel<D, true>, grid, dim3(kThreads), MmaSmem<D>::kBytes, stream, p);
  }
}

}  // namespace

bool AttentionMmaFits(int dk, int dv, int group) {
  return dk == dv && (dk == 64 || dk == 128) && group <= kRows;
}

void AllowAttentionMmaSmem() {
  auto allow = [](auto kernel, int bytes) {
    SUBSTRATE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  };
  allow(AttentionMmaKernel<64, false>, MmaSmem<64>::kBytes);
  allow(AttentionMmaKernel<64, true>, MmaSmem<64>::kBytes);
  allow(AttentionMmaKernel<128, false>, MmaSmem<128>::kBytes);
  allow(AttentionMmaKernel<128, true>, MmaSmem<128>::kBytes);
}

void LaunchAttentionMma(const AttentionParams& p, cudaStream_t stream) {
  if (p.dk == 64) {
    Launch<64>(p, stream);
  } else {
    Launch<128>(p, stream);
  }
}

}  // namespace substrate::cuda
