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

// Row r of w (skeleton plus residuals, any layout) as floats, out[0..w.cols): for lookups such as
// token embeddings.
void DequantizeWeightRow(const WeightView& w, int64_t r, float* out);

// The scalar reference: dequantize each row, float dot products. Tests compare MatMul with it.
void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace substrate
