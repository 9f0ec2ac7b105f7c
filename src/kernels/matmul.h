// Matrix products of a weight (any stored type) with float activations: the hot path of every
// forward pass. MatMul picks the fastest kernel the CPU has (AVX-512/AVX2/scalar) at run time.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "quant/weight_view.h"

namespace substrate {

// y[t * w.rows + r] = sum_c W[r, c] * x[t * w.cols + c], for t < n_tokens and r < w.rows.
// W is w's skeleton plus its residuals (when w.n_residuals > 0). x and y must not overlap.
void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// One product of a batch: y = W x, as MatMul(*w, x, n_tokens, y, pool) computes it.
struct MatMulJob {
  const WeightView* w = nullptr;
  const float* x = nullptr;
  int64_t n_tokens = 0;
  float* y = nullptr;
};

// Runs every job; each job's y gets exactly the bits MatMul writes for it (same kernels,
// activation formats, token blocking and float order). Made for decode, where one product is
// too small to pay for a pool dispatch: activations are quantized once per distinct
// (x, n_tokens, cols, format), then ONE ParallelFor runs the row chunks of every job, in job
// order (a thread's contiguous chunks read contiguous weight rows). Jobs with enough tokens for
// the prefill GEMM, or without a dot kernel, run one after the other as MatMul runs them.
// No job's x may overlap any job's y. MatMul is the one-job case.
void MatMulBatch(const MatMulJob* jobs, int n_jobs, ThreadPool& pool);

// Per token, every dot kernel's float operations are the same whether it runs alone (decode)
// or with other tokens in one weight pass (prefill), so a row of a multi-token MatMul has the
// bits the one-token MatMul gives it. The AMX GEMM does not: its tile sums are scaled and
// summed in another order. While an ExactTokenRows lives on a thread, MatMul and MatMulBatch
// called from that thread do not use the GEMM, so passes whose rows must equal plain decoding
// (deferred verification, speculative batches) keep that promise on AMX machines too.
class ExactTokenRows {
 public:
  ExactTokenRows();
  ~ExactTokenRows();
  ExactTokenRows(const ExactTokenRows&) = delete;
  ExactTokenRows& operator=(const ExactTokenRows&) = delete;
  // Whether one lives on the calling thread.
  static bool Active();

 private:
  bool previous_;
};

// Row r of w (skeleton plus residuals, any layout) as floats, out[0..w.cols): for lookups such as
// token embeddings.
void DequantizeWeightRow(const WeightView& w, int64_t r, float* out);

// The scalar reference: dequantize each row, float dot products. Tests compare MatMul with it.
void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace substrate
