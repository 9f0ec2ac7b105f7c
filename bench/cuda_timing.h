// Timing of CUDA launches for the device benchmarks (bench_cuda_gemv, bench_cuda_attention):
// `launches` calls of launch(i) captured in one graph and replayed, each after the one before as
// in a decode step; microseconds a launch, the best of three replays after the first (which
// uploads the graph). Exits with the CUDA error on failure.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#define CUDA_BENCH_CHECK(x)                                                           \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

template <typename F>
double MicrosecondsPerLaunch(cudaStream_t s, int launches, F launch) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_BENCH_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) launch(i);
  CUDA_BENCH_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_BENCH_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CUDA_BENCH_CHECK(cudaEventCreate(&a));
  CUDA_BENCH_CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 4; ++rep) {
    CUDA_BENCH_CHECK(cudaEventRecord(a, s));
    CUDA_BENCH_CHECK(cudaGraphLaunch(ge, s));
    CUDA_BENCH_CHECK(cudaEventRecord(b, s));
    CUDA_BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (rep > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return best * 1e3 / launches;
}
