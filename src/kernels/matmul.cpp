#include "kernels/matmul.h"

#include <vector>

#include "quant/quant.h"

namespace substrate {
namespace {

// Dequantizes row r of the view (skeleton plus residuals) into out[0..cols).
void DequantizeViewRow(const WeightView& w, int64_t r, float* out, std::vector<float>& tmp) {
  uint64_t row_bytes = *RowBytes(w.type, static_cast<uint64_t>(w.cols));
  DequantizeRow(w.type, w.data + r * row_bytes, out, w.cols);
  for (int k = 0; k < w.n_residuals; ++k) {
    uint64_t rb = *RowBytes(w.residual_type[k], static_cast<uint64_t>(w.cols));
    tmp.resize(static_cast<size_t>(w.cols));
    DequantizeRow(w.residual_type[k], w.residual[k] + r * rb, tmp.data(), w.cols);
    for (int64_t c = 0; c < w.cols; ++c) out[c] += tmp[c];
  }
}

void MatMulRows(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0,
                int64_t r1) {
  std::vector<float> row(static_cast<size_t>(w.cols)), tmp;
  for (int64_t r = r0; r < r1; ++r) {
    DequantizeViewRow(w, r, row.data(), tmp);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.cols;
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[c]) * xt[c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

}  // namespace

void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  MatMulRows(w, x, n_tokens, y, 0, w.rows);
}

void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  // Placeholder dispatch until the SIMD kernels land: the reference, split over rows.
  pool.ParallelFor(w.rows, 16, [&](int64_t r0, int64_t r1, int) {
    MatMulRows(w, x, n_tokens, y, r0, r1);
  });
}

}  // namespace substrate
