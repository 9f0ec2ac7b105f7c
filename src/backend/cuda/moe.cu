// Routing and the weighted sum of the routed experts on the device (CudaBackend::RoutedExperts):
// with these, a MoE decode step never waits for the host between layers. The experts' products
// themselves are the GEMV kernels' (gemv.cu), over slots of expert rows.
#include <cuda_runtime.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/route_device.cuh"

namespace substrate::cuda {
namespace {

// One warp per token.
__global__ void __launch_bounds__(kRouteThreads)
    RouteTopKKernel(const __grid_constant__ RouteTopKParams p) {
  PdlStart();
  __shared__ float prob[2 * kRouteMaxExperts];  // and the k chosen
  __shared__ float choice[kRouteMaxExperts];
  RouteToken(p, blockIdx.x, prob, choice);
}

__global__ void MoeCombineKernel(const __grid_constant__ MoeCombineParams p) {
  PdlStart();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n * p.cols) return;
  const int64_t t = i / p.cols, c = i % p.cols;
  float acc = p.plus ? p.plus[i] : 0.0f;
  for (int j = 0; j < p.k; ++j) {
    const int64_t s = t * p.k + j, row = p.pos ? p.pos[s] : s;
    acc = fmaf(p.weight[s], p.out[row * p.cols + c], acc);
  }
  p.acc[i] = acc;
  if (p.add_to) p.add_to[i] += acc;
}

// A stable counting sort in one block of kSortWarps warps. Warp w owns a contiguous chunk of
// slots and walks it 32 at a time: lanes holding the same expert find each other
// (__match_any_sync), so each slot's rank among its chunk's slots of that expert is a popcount,
// and the warp's per-expert counts (hist[w][e]) grow by whole groups. Then thread e turns its
// column of counts into each chunk's offset and the experts' counts into first positions and
// tiles, and the warps place their slots.
constexpr int kSortWarps = 16, kSortThreads = 32 * kSortWarps;
__global__ void __launch_bounds__(kSortThreads)
    MoeSortKernel(const __grid_constant__ MoeSortParams p) {
  PdlStart();
  __shared__ int32_t hist[kSortWarps][kMoeSortMaxExperts];
  __shared__ int32_t first[kMoeSortMaxExperts + 1], first_tile[kMoeSortMaxExperts + 1];
  const int S = p.n_slots, E = p.n_expert, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kSortWarps * E; i += kSortThreads) hist[i / E][i % E] = 0;
  __syncthreads();
  const int chunk = (S + kSortWarps - 1) / kSortWarps;
  const int s0 = warp * chunk, s1 = min(S, s0 + chunk);
  const unsigned below = (1u << lane) - 1;
  // Pass 1: each slot's rank within its chunk and expert (kept in pos for now).
  for (int base = s0; base < s1; base += 32) {
    const int s = base + lane;
    const bool live = s < s1;
    const unsigned active = __ballot_sync(0xffffffffu, live);
    if (live) {
      const int e = p.sel[s];
      const unsigned group = __match_any_sync(active, e);
      p.pos[s] = hist[warp][e] + __popc(group & below);
      __syncwarp(active);
      if ((group & below) == 0) hist[warp][e] += __popc(group);  // the group's first lane
    }
    __syncwarp();
  }
  __syncthreads();
  // Each chunk's offset within each expert; the experts' counts.
  for (int e = threadIdx.x; e < E; e += kSortThreads) {
    int run = 0;
    for (int w = 0; w < kSortWarps; ++w) {
      const int c = hist[w][e];
      hist[w][e] = run;
      run += c;
    }
    first[e + 1] = run;
    first_tile[e + 1] = (run + p.tile_slots - 1) / p.tile_slots;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // counts -> first positions and first tiles
    first[0] = first_tile[0] = 0;
    for (int e = 1; e <= E; ++e) {
      first[e] += first[e - 1];
      first_tile[e] += first_tile[e - 1];
    }
    *p.n_tiles = first_tile[E];
  }
  __syncthreads();
  // Pass 2: the sorted positions.
  for (int s = s0 + lane; s < s1; s += 32) {
    const int e = p.sel[s];
    const int at = first[e] + hist[warp][e] + p.pos[s];
    p.pos[s] = at;
    p.row_src[at] = s / p.k;
  }
  for (int e = threadIdx.x; e < E; e += kSortThreads) {
    const int count = first[e + 1] - first[e];
    for (int j = 0, t = first_tile[e]; j < count; j += p.tile_slots, ++t)
      p.tiles[t] = make_int4(e, first[e] + j, min(p.tile_slots, count - j), 0);
  }
}

}  // namespace

void LaunchMoeSort(const void* params, cudaStream_t stream) {
  LaunchKernel(MoeSortKernel, dim3(1), dim3(kSortThreads), 0, stream,
               *static_cast<const MoeSortParams*>(params));
}

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
