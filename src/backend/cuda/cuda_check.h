// Error handling of the CUDA backend. Backend ops do not fail (backend.h): a failing CUDA call
// inside one is a broken device or a programmer error, reported with the call and the CUDA
// error string, then the process ends.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace substrate::cuda {

[[noreturn]] void FatalError(const std::string& what);

inline void Check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    FatalError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
               cudaGetErrorString(e));
}

}  // namespace substrate::cuda

#define SUBSTRATE_CUDA_CHECK(call) ::substrate::cuda::Check((call), #call, __FILE__, __LINE__)
