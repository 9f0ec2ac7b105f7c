// Kernel launches with programmatic dependent launch (Hopper and later): a kernel of the
// backend's stream may be launched while the one before it still runs, and waits at its start
// (griddepcontrol.wait) until that one has finished and its writes are visible. Decode issues
// hundreds of small kernels per token, so hiding each launch's latency behind the kernel
// before it is most of what separates the stream from its bandwidth limit.
//
// Every kernel launched through LaunchKernel must begin with PdlStart() (before any early
// return): waiting is what keeps its reads after the previous kernel's writes (the wait returns
// when that kernel has completed and its writes are visible), and a kernel that completes only
// after waiting is what makes the ordering transitive.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

namespace substrate::cuda {

// PdlEnabled() (cuda_ops.h): compute capability 9.0 or later, and SUBSTRATE_CUDA_PDL is not 0;
// decided once per process.

// Waits for the kernel before, then lets the one after be launched. In that order: a kernel
// that let its successor launch before its own wait returned would let the whole chain of
// queued kernels launch at once, their waiting blocks taking the multiprocessors from the one
// kernel that can run.
__device__ __forceinline__ void PdlStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// For a kernel whose output a kernel launched by a library (cuBLAS) reads next: waits for the
// kernel before it but lets nothing launch early, since a library kernel may not wait.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Called by every thread of a block after writing its share of a result that several blocks
// split (attention's position splits): true in the one block that arrives last of `blocks` at
// `counter`, once every other block's writes are visible to it. The counter is the caller's to
// reset.
__device__ __forceinline__ bool ArrivesLast(uint32_t* counter, int blocks) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == static_cast<unsigned>(blocks - 1);
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

// The same for a warp whose lane 0 wrote its share (a GEMV epilogue's rows): lane 0 adds
// `count` to `counter`; true in every lane of the warp that brings it to `total`, once the
// other warps' writes are visible to it. The counter is the caller's to reset.
__device__ __forceinline__ bool WarpArrivesLast(uint32_t* counter, uint32_t count, uint32_t total) {
  uint32_t done = 0;
  if ((threadIdx.x & 31) == 0) {
    __threadfence();  // lane 0's writes before the count
    done = atomicAdd(counter, count) + count;
  }
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != total) return false;
  __threadfence();
  return true;
}

template <typename... KArgs, typename... Args>
inline void LaunchKernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (PdlEnabled()) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace substrate::cuda
