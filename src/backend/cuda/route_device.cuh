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

// A float as an unsigned key of the same order (for -inf up: every key of a score is above 0).
__device__ __forceinline__ uint32_t RouteKey(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Token t's choice and weights into p.sel / p.weight, by the calling warp (prob: a shared array
// of p.n_expert + p.k floats, choice: of p.n_expert). A NaN selection score ranks lowest (the NaN
// weights still carry it to the output, where the finiteness check sees it); every chosen index
// is a valid expert. The logits are read through L2: the epilogue reads rows other blocks just
// wrote.
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
  // Each candidate's selection score as a key whose unsigned order is the float order (a NaN
  // score ranks as -inf; 0, below every key, marks a taken candidate), kept in `choice`.
  uint32_t* key = reinterpret_cast<uint32_t*>(choice);
  for (int e = lane; e < E; e += kRouteThreads) {
    const float c = prob[e] + (p.bias ? p.bias[e] : 0.0f);
    key[e] = RouteKey(isnan(c) ? -INFINITY : c);
  }
  __syncwarp();

  // The k rounds: a lane keeps its best candidate (the largest key, the lowest index among
  // equals); a round takes the warp's best by two reductions, and only the winner's lane looks
  // for its next. (Eight rounds of five shuffle pairs over every lane took 2.8 us of a
  // qwen3-30b-a3b router's 5.7 us epilogue on the H200.)
  uint32_t best = 0;
  int best_e = INT_MAX;
  auto lane_best = [&] {
    best = 0;
    best_e = INT_MAX;
    for (int e = lane; e < E; e += kRouteThreads)
      if (key[e] > best) {
        best = key[e];
        best_e = e;
      }
  };
  lane_best();
  int32_t* sel = p.sel + static_cast<int64_t>(t) * p.k;
  float* weight = p.weight + static_cast<int64_t>(t) * p.k;
  float* chosen = prob + E;  // [k] the chosen experts' probabilities, in order
  for (int j = 0; j < p.k; ++j) {
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const int w = __reduce_min_sync(0xffffffffu, best == top ? best_e : INT_MAX);
    if (lane == 0) {
      sel[j] = w;
      chosen[j] = prob[w];
      // Bytes the chosen expert's products will read over the host link (zero-copy weights).
      if (p.link_bytes) atomicAdd(p.link_counter, p.link_bytes[w]);
    }
    if (best_e == w) {  // the winner's lane: taken, and its next best
      key[w] = 0;
      lane_best();
    }
  }
  __syncwarp();
  // The weights, summed in order in double as the CPU's routing sums them.
  double sum = 0;
  for (int j = 0; j < p.k; ++j) sum += chosen[j];
  const float inv = p.normalize ? static_cast<float>(1.0 / (sum + 1e-20)) : 1.0f;
  for (int j = lane; j < p.k; j += kRouteThreads) weight[j] = chosen[j] * inv * p.scale;
}

}  // namespace substrate::cuda
