// Routing and the weighted sum of the routed experts on the device (CudaBackend::RoutedExperts):
// with these, a MoE decode step never waits for the host between layers. The experts' products
// themselves are the GEMV kernels' (gemv.cu), over slots of expert rows.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "backend/cuda/launch.cuh"

namespace substrate::cuda {
namespace {

constexpr int kRouteThreads = 256;

// The better of two candidates: the larger score, the lower index among equals.
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// One block per token. A NaN selection score ranks lowest (the NaN weights still carry it to the
// output, where the finiteness check sees it); every chosen index is a valid expert.
__global__ void __launch_bounds__(kRouteThreads)
    RouteTopKKernel(const __grid_constant__ RouteTopKParams p) {
  PdlStart();
  __shared__ float prob[kRouteMaxExperts];
  __shared__ float choice[kRouteMaxExperts];
  __shared__ float red_v[kRouteThreads / 32];
  __shared__ int red_i[kRouteThreads / 32];
  __shared__ double red_s[kRouteThreads / 32];
  const int t = blockIdx.x, E = p.n_expert, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* logits = p.logits + static_cast<int64_t>(t) * E;

  float mx = -INFINITY;
  for (int e = tid; e < E; e += kRouteThreads) {
    prob[e] = logits[e];
    mx = fmaxf(mx, prob[e]);
  }
  if (!p.sigmoid) {  // softmax: exp(x - max) / sum, the sum in double as the CPU's
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red_v[warp] = mx;
    __syncthreads();
    mx = red_v[0];
    for (int w = 1; w < kRouteThreads / 32; ++w) mx = fmaxf(mx, red_v[w]);
    double sum = 0;
    for (int e = tid; e < E; e += kRouteThreads) {
      prob[e] = mx == -INFINITY ? 0.0f : expf(prob[e] - mx);
      sum += prob[e];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) red_s[warp] = sum;
    __syncthreads();
    sum = 0;
    for (int w = 0; w < kRouteThreads / 32; ++w) sum += red_s[w];
    const float inv = sum == 0 ? 0.0f : static_cast<float>(1.0 / sum);  // NaN stays NaN
    for (int e = tid; e < E; e += kRouteThreads) prob[e] *= inv;
  } else {
    for (int e = tid; e < E; e += kRouteThreads) prob[e] = 1.0f / (1.0f + expf(-prob[e]));
  }
  for (int e = tid; e < E; e += kRouteThreads) {
    const float c = prob[e] + (p.bias ? p.bias[e] : 0.0f);
    choice[e] = isnan(c) ? -INFINITY : c;
  }
  __syncthreads();

  int32_t* sel = p.sel + static_cast<int64_t>(t) * p.k;
  float* weight = p.weight + static_cast<int64_t>(t) * p.k;
  for (int j = 0; j < p.k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = tid; e < E; e += kRouteThreads)
      if (!isnan(choice[e]) && Better(choice[e], e, bv, bi)) {  // NaN: taken
        bv = choice[e];
        bi = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (Better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      red_v[warp] = bv;
      red_i[warp] = bi;
    }
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < kRouteThreads / 32; ++w)
        if (Better(red_v[w], red_i[w], bv, bi)) {
          bv = red_v[w];
          bi = red_i[w];
        }
      sel[j] = bi;
      weight[j] = prob[bi];
      choice[bi] = NAN;  // taken: never chosen again
    }
    __syncthreads();
  }
  if (tid == 0) {
    double sum = 0;
    for (int j = 0; j < p.k; ++j) sum += weight[j];
    const float inv = p.normalize ? static_cast<float>(1.0 / (sum + 1e-20)) : 1.0f;
    for (int j = 0; j < p.k; ++j) weight[j] = weight[j] * inv * p.scale;
  }
}

__global__ void MoeCombineKernel(const __grid_constant__ MoeCombineParams p) {
  PdlStart();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n * p.cols) return;
  const int64_t t = i / p.cols, c = i % p.cols;
  float acc = 0;
  for (int j = 0; j < p.k; ++j) {
    const int64_t s = t * p.k + j;
    acc = fmaf(p.weight[s], p.out[s * p.cols + c], acc);
  }
  p.acc[i] = acc;
}

}  // namespace

void LaunchRouteTopK(const void* params, cudaStream_t stream) {
  const RouteTopKParams& p = *static_cast<const RouteTopKParams*>(params);
  LaunchKernel(RouteTopKKernel, dim3(p.n), dim3(kRouteThreads), 0, stream, p);
}

void LaunchMoeCombine(const void* params, cudaStream_t stream) {
  const MoeCombineParams& p = *static_cast<const MoeCombineParams*>(params);
  const int64_t total = p.n * p.cols;
  LaunchKernel(MoeCombineKernel, dim3(static_cast<unsigned>((total + 255) / 256)), dim3(256), 0,
               stream, p);
}

}  // namespace substrate::cuda
