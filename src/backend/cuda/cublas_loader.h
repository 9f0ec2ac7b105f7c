// cuBLAS, loaded at run time (dlopen) when the prefill GEMM first needs it, so the binary runs
// on machines without it (the GEMV path then serves every token count) and links only the
// static CUDA runtime. Only GemmEx is used: the prefill product over dequantized weights.
#pragma once

#include <cublas_api.h>

#include "backend/cuda/cuda_ops.h"

namespace substrate::cuda {

struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
};

// The process's cuBLAS (loaded once), or nullptr when no libcublas.so.13 / .so can be opened
// (SUBSTRATE_NO_CUBLAS=1 also says none, for tests of the fallback).
const CublasApi* LoadCublas();

// C[m, n] (column-major, ldc) = A^T B with A [k, m] and B [k, n] column-major (row-major:
// y [n, m] = x [n, k] . W [m, k]^T), half or float operands, float accumulation and output.
struct GemmParams {
  const CublasApi* api = nullptr;
  cublasHandle_t handle = nullptr;
  int32_t m = 0, n = 0, k = 0;
  int32_t half = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
};
void LaunchGemm(const void* params, cudaStream_t stream);

}  // namespace substrate::cuda
