#include "backend/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace substrate::cuda {
namespace {

template <typename F>
bool Symbol(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

const CublasApi* Load() {
  const char* off = std::getenv("SUBSTRATE_NO_CUBLAS");
  if (off && std::string(off) == "1") return nullptr;
  void* lib = nullptr;
  for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
  }
  if (!lib) return nullptr;
  static CublasApi api;
  if (!Symbol(lib, "cublasCreate_v2", &api.create) ||
      !Symbol(lib, "cublasDestroy_v2", &api.destroy) ||
      !Symbol(lib, "cublasSetStream_v2", &api.set_stream) ||
      !Symbol(lib, "cublasSetWorkspace_v2", &api.set_workspace) ||
      !Symbol(lib, "cublasGemmEx", &api.gemm_ex))
    return nullptr;
  return &api;
}

}  // namespace

const CublasApi* LoadCublas() {
  static const CublasApi* api = Load();
  return api;
}

void LaunchGemm(const void* params, cudaStream_t stream) {
  const GemmParams& p = *static_cast<const GemmParams*>(params);
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType t = p.half ? CUDA_R_16F : CUDA_R_32F;
  if (p.api->set_stream(p.handle, stream) != CUBLAS_STATUS_SUCCESS)
    FatalError("cublasSetStream failed");
  const cublasStatus_t st = p.api->gemm_ex(
      p.handle, CUBLAS_OP_T, CUBLAS_OP_N, p.m, p.n, p.k, &alpha, p.a, t, p.k, p.b, t, p.k, &beta,
      p.c, CUDA_R_32F, static_cast<int>(p.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) FatalError("cublasGemmEx failed: status " + std::to_string(st));
}

}  // namespace substrate::cuda
