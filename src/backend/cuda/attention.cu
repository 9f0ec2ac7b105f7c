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

namespace substrate::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kThreads = 128;

__device__ __forceinline__ float LoadKv(const void* base, int f16, int64_t i) {
  return f16 ? __half2float(static_cast<const __half*>(base)[i]) : static_cast<const float*>(base)[i];
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
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.rows * per_tok;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_tok;
    const int64_t r = i % per_tok;
    const float* kvb = p.kvb + t * p.kvb_cols;
    if (r < static_cast<int64_t>(p.n_head) * dk) {
      const int h = static_cast<int>(r / dk), e = static_cast<int>(r % dk);
      const float v = e < p.nope ? kvb[h * per_head + e]
                                 : p.latent[t * p.lat_cols + p.rope_col + (e - p.nope)];
      StoreKvValue(p.kc, p.f16, (pos0 + t) * p.k_stride + r, v);
    } else {
      const int64_t rv = r - static_cast<int64_t>(p.n_head) * dk;
      const int h = static_cast<int>(rv / p.dv), e = static_cast<int>(rv % p.dv);
      StoreKvValue(p.vc, p.f16, (pos0 + t) * p.v_stride + rv, kvb[h * per_head + p.nope + e]);
    }
  }
}

__global__ void __launch_bounds__(kThreads) AttentionKernel(const __grid_constant__ AttentionParams p) {
  PdlStart();
  extern __shared__ float smem[];
  const int hb = p.heads_per_block, dk = p.dk, dv = p.dv;
  const int group = p.n_head / p.n_head_kv;
  const int chunks = (group + hb - 1) / hb;
  const int t = blockIdx.x;
  const int hk = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  const int h0 = hk * group + chunk * hb;                 // first query head of the block
  const int nh = min(hb, group - chunk * hb);             // heads it has
  const int split = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  float* q_s = smem;                              // [hb][dk]
  float* k_s = q_s + hb * dk;                     // [kTile][dk + 1]
  float* v_s = k_s + kTile * (dk + 1);            // [kTile][dv]
  float* p_s = v_s + kTile * dv;                  // [hb][kTile]
  float* m_s = p_s + hb * kTile;                  // [hb]
  float* l_s = m_s + hb;                          // [hb]
  float* a_s = l_s + hb;                          // [hb] rescale of the accumulators

  const int64_t n_kv = *p.pos0 + t + 1;
  const float* q = p.q + (static_cast<int64_t>(t) * p.n_head + h0) * dk;
  for (int i = tid; i < nh * dk; i += kThreads) q_s[i] = q[i];
  if (tid < hb) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  float acc[kAttentionMaxAcc];
#pragma unroll
  for (int i = 0; i < kAttentionMaxAcc; ++i) acc[i] = 0.0f;
  __syncthreads();

  const int64_t n_tiles = (n_kv + kTile - 1) / kTile;
  for (int64_t tile = split; tile < n_tiles; tile += p.splits) {
    const int64_t p0 = tile * kTile;
    for (int i = tid; i < kTile * dk; i += kThreads) {
      const int r = i / dk, d = i % dk;
      const int64_t pos = p0 + r;
      k_s[r * (dk + 1) + d] =
          pos < n_kv ? LoadKv(p.k, p.f16, pos * p.k_stride + static_cast<int64_t>(hk) * dk + d) : 0.0f;
    }
    for (int i = tid; i < kTile * dv; i += kThreads) {
      const int r = i / dv, d = i % dv;
      const int64_t pos = p0 + r;
      v_s[i] = pos < n_kv ? LoadKv(p.v, p.f16, pos * p.v_stride + static_cast<int64_t>(hk) * dv + d) : 0.0f;
    }
    __syncthreads();
    for (int i = tid; i < nh * kTile; i += kThreads) {
      const int h = i / kTile, r = i % kTile;
      const float* qh = q_s + h * dk;
      const float* kr = k_s + r * (dk + 1);
      float dot = 0.0f;
      for (int d = 0; d < dk; ++d) dot = fmaf(qh[d], kr[d], dot);
      p_s[h * kTile + r] = p0 + r < n_kv ? dot * p.scale : -INFINITY;
    }
    __syncthreads();
    for (int h = warp; h < nh; h += kThreads / 32) {
      const float s = p_s[h * kTile + lane];
      float mx = s;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, mx);
      // A NaN score is not the max, so exp(NaN - m) carries it into the sum and the output.
      const float e = s == -INFINITY ? 0.0f : expf(s - m_new);
      float sum = e;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      p_s[h * kTile + lane] = e;
      __syncwarp();
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        a_s[h] = alpha;
        m_s[h] = m_new;
        l_s[h] = l_s[h] * alpha + sum;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kAttentionMaxAcc; ++i) {
      const int idx = tid + i * kThreads;
      if (idx < nh * dv) {
        const int h = idx / dv, d = idx % dv;
        float a = acc[i] * a_s[h];
        const float* ph = p_s + h * kTile;
#pragma unroll 8
        for (int r = 0; r < kTile; ++r) a = fmaf(ph[r], v_s[r * dv + d], a);
        acc[i] = a;
      }
    }
    __syncthreads();
  }

  float* out = p.out + (static_cast<int64_t>(t) * p.n_head + h0) * dv;
  if (p.splits == 1) {
#pragma unroll
    for (int i = 0; i < kAttentionMaxAcc; ++i) {
      const int idx = tid + i * kThreads;
      if (idx < nh * dv) out[idx] = acc[i] / l_s[idx / dv];
    }
    return;
  }

  // Partial results of this split: m[hb], l[hb], acc[hb * dv].
  const int64_t cell = static_cast<int64_t>(t) * gridDim.y + blockIdx.y;
  const int64_t stride = static_cast<int64_t>(hb) * (dv + 2);
  float* part = p.partial + (cell * p.splits + split) * stride;
  if (tid < nh) {
    part[tid] = m_s[tid];
    part[hb + tid] = l_s[tid];
  }
#pragma unroll
  for (int i = 0; i < kAttentionMaxAcc; ++i) {
    const int idx = tid + i * kThreads;
    if (idx < nh * dv) part[2 * hb + idx] = acc[i];
  }
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (tid == 0) last = atomicAdd(p.counters + cell, 1u) == static_cast<unsigned>(p.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* parts = p.partial + cell * p.splits * stride;
  for (int idx = tid; idx < nh * dv; idx += kThreads) {
    const int h = idx / dv;
    float m = -INFINITY;
    for (int s = 0; s < p.splits; ++s) m = fmaxf(m, __ldcg(parts + s * stride + h));
    float l = 0.0f, a = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      const float ms = __ldcg(parts + s * stride + h);
      const float ls = __ldcg(parts + s * stride + hb + h);
      if (ms == -INFINITY && !(ls != ls)) continue;  // a split with no positions
      const float w = expf(ms - m);
      l += ls * w;
      a += __ldcg(parts + s * stride + 2 * hb + idx) * w;
    }
    out[idx] = a / l;
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

int AttentionSmemBytes(int heads_per_block, int dk, int dv) {
  const int floats = heads_per_block * dk + kTile * (dk + 1) + kTile * dv +
                     heads_per_block * kTile + 3 * heads_per_block;
  return floats * 4;
}

void LaunchAttention(const void* params, cudaStream_t stream) {
  const AttentionParams& p = *static_cast<const AttentionParams*>(params);
  const int group = p.n_head / p.n_head_kv;
  const int chunks = (group + p.heads_per_block - 1) / p.heads_per_block;
  const dim3 grid(static_cast<unsigned>(p.n_tok), static_cast<unsigned>(p.n_head_kv * chunks),
                  static_cast<unsigned>(p.splits));
  LaunchKernel(AttentionKernel, grid, dim3(kThreads), static_cast<size_t>(p.smem_bytes), stream, p);
}

// Raises the kernel's dynamic shared memory limit (once per process and device).
void AllowAttentionSmem(int bytes) {
  SUBSTRATE_CUDA_CHECK(
      cudaFuncSetAttribute(AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace substrate::cuda
