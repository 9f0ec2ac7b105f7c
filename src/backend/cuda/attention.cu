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

constexpr int kTile = 32;
constexpr int kThreads = 128;

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

// A tile of kTile cache rows (columns [col, col + width) of each) into shared memory rows of
// `ld` floats, zeros past n_kv: 16-byte loads (4 floats or 8 halves), all of a thread's issued
// before the first is stored. Needs width, stride and col multiples of 8 (checked by the host).
__device__ __forceinline__ void LoadTile(const void* base, int f16, int64_t stride, int64_t col,
                                         int width, int64_t p0, int64_t n_kv, float* dst, int ld) {
  const int per = f16 ? 8 : 4;  // elements per 16 bytes
  const int vecs_per_row = width / per;
  const int total = kTile * vecs_per_row;
  constexpr int kMax = 8;  // loads in flight per thread and round
  for (int i0 = threadIdx.x; i0 < total; i0 += kMax * kThreads) {
    uint4 v[kMax];
#pragma unroll
    for (int u = 0; u < kMax; ++u) {
      const int i = i0 + u * kThreads;
      const int r = i / vecs_per_row, c = i % vecs_per_row;
      v[u] = make_uint4(0, 0, 0, 0);
      if (i < total && p0 + r < n_kv) {
        const int64_t e = (p0 + r) * stride + col + static_cast<int64_t>(c) * per;
        v[u] = f16 ? *reinterpret_cast<const uint4*>(static_cast<const __half*>(base) + e)
                   : *reinterpret_cast<const uint4*>(static_cast<const float*>(base) + e);
      }
    }
#pragma unroll
    for (int u = 0; u < kMax; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= total) break;
      const int r = i / vecs_per_row, c = i % vecs_per_row;
      float* o = dst + r * ld + c * per;
      if (f16) {
        const __half2* h = reinterpret_cast<const __half2*>(&v[u]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __half22float2(h[k]);
          o[2 * k] = f.x;
          o[2 * k + 1] = f.y;
        }
      } else {
        o[0] = __uint_as_float(v[u].x);
        o[1] = __uint_as_float(v[u].y);
        o[2] = __uint_as_float(v[u].z);
        o[3] = __uint_as_float(v[u].w);
      }
    }
  }
}

// A block takes tokens [t0, t0 + q_per_block) and query heads [h0, h0 + heads_per_block) of one
// KV head: its "rows" are (token, head) pairs, all scored against each K/V tile it loads.
__global__ void __launch_bounds__(kThreads)
    AttentionKernel(const __grid_constant__ AttentionParams p) {
  PdlStart();
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
  const int kld = KRow(dk, p.vec);

  float* q_s = smem;                // [rmax][dk]
  float* k_s = q_s + rmax * dk;     // [kTile][kld]
  float* v_s = k_s + KSize(dk);     // [kTile][dv]
  float* p_s = v_s + kTile * dv;    // [rmax][kTile]
  float* m_s = p_s + rmax * kTile;  // [rmax]
  float* l_s = m_s + rmax;          // [rmax]
  float* a_s = l_s + rmax;          // [rmax] rescale of the accumulators

  const int64_t pos0 = *p.pos0;
  const int64_t n_kv_max = pos0 + t0 + nt;  // the last token's history
  const int64_t n_tiles = (n_kv_max + kTile - 1) / kTile;
  // Decode over a short history: only as many splits as there are tiles take part (the rest
  // leave now); with one, its block writes the output without the partials' round trip.
  const int splits = static_cast<int>(min(static_cast<int64_t>(p.splits), n_tiles));
  if (split >= splits) return;
  // The block's query rows (row r: token r / nh, head r % nh; each row's dk floats contiguous).
  auto q_at = [&](int i) {
    const int r = i / dk, d = i % dk;
    return (static_cast<int64_t>(t0 + r / nh) * p.n_head + h0 + r % nh) * dk + d;
  };
  if (p.vec) {
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
  for (int r = tid; r < rmax; r += kThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }
  float acc[kAttentionMaxAcc];
#pragma unroll
  for (int i = 0; i < kAttentionMaxAcc; ++i) acc[i] = 0.0f;
  __syncthreads();

  for (int64_t tile = split; tile < n_tiles; tile += splits) {
    const int64_t p0 = tile * kTile;
    if (p.vec) {
      LoadTile(p.k, p.f16, p.k_stride, static_cast<int64_t>(hk) * dk, dk, p0, n_kv_max, k_s, kld);
      LoadTile(p.v, p.f16, p.v_stride, static_cast<int64_t>(hk) * dv, dv, p0, n_kv_max, v_s, dv);
    } else {
      for (int i = tid; i < kTile * dk; i += kThreads) {
        const int r = i / dk, d = i % dk;
        const int64_t pos = p0 + r;
        k_s[r * kld + d] =
            pos < n_kv_max
                ? LoadKv(p.k, p.f16, pos * p.k_stride + static_cast<int64_t>(hk) * dk + d)
                : 0.0f;
      }
      for (int i = tid; i < kTile * dv; i += kThreads) {
        const int r = i / dv, d = i % dv;
        const int64_t pos = p0 + r;
        v_s[i] = pos < n_kv_max
                     ? LoadKv(p.v, p.f16, pos * p.v_stride + static_cast<int64_t>(hk) * dv + d)
                     : 0.0f;
      }
    }
    __syncthreads();
    for (int i = tid; i < nr * kTile; i += kThreads) {
      const int r = i / kTile, pp = i % kTile;
      const int64_t n_kv = pos0 + t0 + r / nh + 1;  // this row's token sees [0, n_kv)
      const float* qh = q_s + r * dk;
      const float* kr = k_s + pp * kld;
      float dot = 0.0f;
      if (p.vec) {
        // 16-byte reads and two chains: the query row is a broadcast, the K rows conflict-free.
        const float4* q4 = reinterpret_cast<const float4*>(qh);
        const float4* k4 = reinterpret_cast<const float4*>(kr);
        float dot2 = 0.0f;
        for (int d = 0; d < dk / 4; d += 2) {
          const float4 a = q4[d], b = k4[d], c = q4[d + 1], e = k4[d + 1];
          dot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot))));
          dot2 = fmaf(c.x, e.x, fmaf(c.y, e.y, fmaf(c.z, e.z, fmaf(c.w, e.w, dot2))));
        }
        dot += dot2;
      } else {
        for (int d = 0; d < dk; ++d) dot = fmaf(qh[d], kr[d], dot);
      }
      p_s[r * kTile + pp] = p0 + pp < n_kv ? dot * p.scale : -INFINITY;
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
#pragma unroll
    for (int i = 0; i < kAttentionMaxAcc; ++i) {
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
    __syncthreads();
  }

  // Row r's output: token t0 + r / nh, head h0 + r % nh.
  auto out_index = [&](int idx) {
    const int r = idx / dv, d = idx % dv;
    return (static_cast<int64_t>(t0 + r / nh) * p.n_head + h0 + r % nh) * dv + d;
  };
  // With xq (dv % 32 == 0, so a warp's 32 elements are one quantization block of one head, all
  // stored or none): the output quantized for the product that reads it, as it is written.
  auto store = [&](int idx, float v) {
    const int64_t o = out_index(idx);
    p.out[o] = v;
    if (p.xq) QuantizeWarpStore(v, o, p.xq, p.xs);
  };
  if (splits == 1) {
#pragma unroll
    for (int i = 0; i < kAttentionMaxAcc; ++i) {
      const int idx = tid + i * kThreads;
      if (idx < nr * dv) store(idx, acc[i] / l_s[idx / dv]);
    }
    return;
  }

  // Splits (decode: one token per block, q_per_block == 1): partial results of this split,
  // m[hb], l[hb], acc[hb * dv]; the last split of the cell to finish merges them.
  const int64_t cell = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
  const int64_t stride = static_cast<int64_t>(hb) * (dv + 2);
  float* part = p.partial + (cell * p.splits + split) * stride;
  if (tid < nr) {
    part[tid] = m_s[tid];
    part[hb + tid] = l_s[tid];
  }
#pragma unroll
  for (int i = 0; i < kAttentionMaxAcc; ++i) {
    const int idx = tid + i * kThreads;
    if (idx < nr * dv) part[2 * hb + idx] = acc[i];
  }
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (tid == 0) last = atomicAdd(p.counters + cell, 1u) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Each head's weight per split, exp(m_s - m) / l, into shared memory (p_s is free), then every
  // output element sums its splits' partial accumulators with all their reads in flight at once
  // (not one L2 round trip after another).
  const float* parts = p.partial + cell * p.splits * stride;
  float* w_s = p_s;  // [nr][kAttentionMaxSplits]
  if (tid < nr) {
    float ms[kAttentionMaxSplits], ls[kAttentionMaxSplits];
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kAttentionMaxSplits; ++s) {
      ms[s] = s < splits ? __ldcg(parts + s * stride + tid) : -INFINITY;
      ls[s] = s < splits ? __ldcg(parts + s * stride + hb + tid) : 0.0f;
    }
#pragma unroll
    for (int s = 0; s < kAttentionMaxSplits; ++s) m = fmaxf(m, ms[s]);
    // A split with no positions (m = -inf, l = 0) weighs nothing; a NaN l (a NaN score) is kept,
    // and so reaches the output.
    float l = 0.0f;
#pragma unroll
    for (int s = 0; s < kAttentionMaxSplits; ++s) {
      ms[s] = ms[s] == -INFINITY && !(ls[s] != ls[s]) ? 0.0f : expf(ms[s] - m);
      l += ls[s] * ms[s];
    }
#pragma unroll
    for (int s = 0; s < kAttentionMaxSplits; ++s) w_s[tid * kAttentionMaxSplits + s] = ms[s] / l;
  }
  __syncthreads();
  for (int idx = tid; idx < nr * dv; idx += kThreads) {
    const float* w = w_s + (idx / dv) * kAttentionMaxSplits;
    float a[kAttentionMaxSplits];
#pragma unroll
    for (int s = 0; s < kAttentionMaxSplits; ++s)
      a[s] = s < splits ? __ldcg(parts + s * stride + 2 * hb + idx) : 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int s = 0; s < kAttentionMaxSplits; ++s) o = fmaf(a[s], w[s], o);
    store(idx, o);
  }
  if (tid == 0) p.counters[cell] = 0;
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
  const int floats = rows * dk + KSize(dk) + kTile * dv + rows * kTile + 3 * rows;
  return floats * 4;
}

void LaunchAttention(const void* params, cudaStream_t stream) {
  const AttentionParams& p = *static_cast<const AttentionParams*>(params);
  const int group = p.n_head / p.n_head_kv;
  const int chunks = (group + p.heads_per_block - 1) / p.heads_per_block;
  const dim3 grid(static_cast<unsigned>((p.n_tok + p.q_per_block - 1) / p.q_per_block),
                  static_cast<unsigned>(p.n_head_kv * chunks), static_cast<unsigned>(p.splits));
  LaunchKernel(AttentionKernel, grid, dim3(kThreads), static_cast<size_t>(p.smem_bytes), stream, p);
}

// Raises the kernel's dynamic shared memory limit (once per process and device).
void AllowAttentionSmem(int bytes) {
  SUBSTRATE_CUDA_CHECK(
      cudaFuncSetAttribute(AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace substrate::cuda
