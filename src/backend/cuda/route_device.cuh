// The top-k routing of one token's router logits by one warp: the routing kernel's (moe.cu) and
// the router product's epilogue (gemv.cu), so both choose alike.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "backend/cuda/cuda_ops.h"

namespace substrate::cuda {

// One warp a token: routers have at most a few hundred experts, so a lane takes a few and the
// reductions and the k rounds of the top-k are shuffles with no barrier but the warp's (on the
// H200 no slower than a block of 256 threads, decode or prefill).
constexpr int kRouteThreads = 32;

// The better of two candidates: the larger score, the lower index among equals.
__device__ __forceinline__ bool RouteBetter(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// Token t's choice and weights into p.sel / p.weight, by the calling warp (prob and choice:
// shared arrays of p.n_expert floats). A NaN selection score ranks lowest (the NaN weights still
// carry it to the output, where the finiteness check sees it); every chosen index is a valid
// expert. The logits are read through L2: the epilogue reads rows other blocks just wrote.
__device__ __forceinline__ void RouteToken(const RouteTopKParams& p, int t, float* prob,
                                           float* choice) {
  const int E = p.n_expert, lane = threadIdx.x & 31;
  const float* logits = p.logits + static_cast<int64_t>(t) * E;

  float mx = -INFINITY;
  for (int e = lane; e < E; e += kRouteThreads) {
    prob[e] = __ldcg(logits + e);
    mx = fmaxf(mx, prob[e]);
  }
  if (!p.sigmoid) {  // softmax: exp(x - max) / sum, the sum in double as the CPU's
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
    for (int e = lane; e < E; e += kRouteThreads) {
      prob[e] = mx == -INFINITY ? 0.0f : expf(prob[e] - mx);
      sum += prob[e];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = sum == 0 ? 0.0f : static_cast<float>(1.0 / sum);  // NaN stays NaN
    for (int e = lane; e < E; e += kRouteThreads) prob[e] *= inv;
  } else {
    for (int e = lane; e < E; e += kRouteThreads) prob[e] = 1.0f / (1.0f + expf(-prob[e]));
  }
  for (int e = lane; e < E; e += kRouteThreads) {
    const float c = prob[e] + (p.bias ? p.bias[e] : 0.0f);
    choice[e] = isnan(c) ? -INFINITY : c;
  }
  __syncwarp();

  int32_t* sel = p.sel + static_cast<int64_t>(t) * p.k;
  float* weight = p.weight + static_cast<int64_t>(t) * p.k;
  for (int j = 0; j < p.k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = lane; e < E; e += kRouteThreads)
      if (!isnan(choice[e]) && RouteBetter(choice[e], e, bv, bi)) {  // NaN: taken
        bv = choice[e];
        bi = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // xor: every lane ends with the winner
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (RouteBetter(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      sel[j] = bi;
      weight[j] = prob[bi];
      choice[bi] = NAN;  // taken: never chosen again
      // Bytes the chosen expert's products will read over the host link (zero-copy weights).
      if (p.link_bytes) atomicAdd(p.link_counter, p.link_bytes[bi]);
    }
    __syncwarp();
  }
  if (lane == 0) {
    double sum = 0;
    for (int j = 0; j < p.k; ++j) sum += weight[j];
    const float inv = p.normalize ? static_cast<float>(1.0 / (sum + 1e-20)) : 1.0f;
    for (int j = 0; j < p.k; ++j) weight[j] = weight[j] * inv * p.scale;
  }
}

}  // namespace substrate::cuda
