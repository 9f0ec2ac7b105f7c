#include "compiler/tensor_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>

#include "quant/quant.h"

namespace substrate::compiler {

Expected<TensorErrors> ActivationWeightedErrors(const TensorErrorRequest& r, ThreadPool& pool) {
  if (r.ne.size() < 2 || r.ne.size() > 3 || !r.data)
    return InvalidArgument("calibrate: tensor '" + r.name + "' is not a matrix");
  if (!CanDequantize(r.type))
    return Unimplemented(std::string("calibrate: cannot read '") + r.name + "' (" + DTypeName(r.type) + ")");
  const int64_t cols = static_cast<int64_t>(r.ne[0]), rows = static_cast<int64_t>(r.ne[1]);
  const int64_t slices = r.ne.size() == 3 ? static_cast<int64_t>(r.ne[2]) : 1;
  auto in_row = RowBytes(r.type, r.ne[0]);
  if (!in_row) return Corruption("calibrate: rows of '" + r.name + "' do not fit their type");
  const size_t nt = r.types.size();
  std::vector<std::optional<uint64_t>> out_row(nt);
  for (size_t k = 0; k < nt; ++k)
    if (CanQuantize(r.types[k])) out_row[k] = RowBytes(r.types[k], r.ne[0]);

  TensorErrors out;
  out.error.assign(nt, 0.0);
  out.slice_error.assign(static_cast<size_t>(slices), std::vector<double>(nt, 0.0));
  const int64_t sampled = r.max_rows > 0 ? std::min(rows, r.max_rows) : rows;
  const double scale = static_cast<double>(rows) / static_cast<double>(sampled);
  std::mutex mu;
  for (int64_t s = 0; s < slices; ++s) {
    std::vector<double> weight;
    std::vector<float> importance;
    if (r.stats) {
      weight = r.stats->MeanSquarePerToken(r.name, slices > 1 ? static_cast<int>(s) : -1);
      if (r.importance)
        importance = r.stats->ColumnImportance(r.name, slices > 1 ? static_cast<int>(s) : -1, cols);
    }
    const bool seen = r.stats && r.stats->tensors.count(r.name);
    // A slice no calibration token reached costs nothing; a tensor never multiplied (a lookup
    // table) counts each row's plain squared error, averaged over rows (one row per token).
    if (seen && weight.empty()) continue;
    const double row_scale = seen ? scale : scale / static_cast<double>(rows);
    if (weight.empty()) weight.assign(static_cast<size_t>(cols), 1.0);
    const uint8_t* base = static_cast<const uint8_t*>(r.data) + static_cast<uint64_t>(s * rows) * *in_row;
    std::vector<double>& acc = out.slice_error[static_cast<size_t>(s)];
    pool.ParallelFor(sampled, 1, [&](int64_t begin, int64_t end, int) {
      std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(cols));
      std::vector<uint8_t> q;
      std::vector<double> local(nt, 0.0);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t row = sampled == rows ? i : i * rows / sampled;
        DequantizeRow(r.type, base + static_cast<uint64_t>(row) * *in_row, x.data(), cols);
        for (size_t k = 0; k < nt; ++k) {
          if (!out_row[k]) continue;
          q.resize(*out_row[k]);
          QuantizeRow(r.types[k], x.data(), q.data(), cols, importance.empty() ? nullptr : importance.data());
          DequantizeRow(r.types[k], q.data(), y.data(), cols);
          double e = 0;
          for (int64_t j = 0; j < cols; ++j) {
            const double d = static_cast<double>(x[j]) - y[j];
            e += weight[static_cast<size_t>(j)] * d * d;
          }
          local[k] += e;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      for (size_t k = 0; k < nt; ++k) acc[k] += local[k];
    });
    for (size_t k = 0; k < nt; ++k) {
      acc[k] *= row_scale;
      out.error[k] += acc[k];
    }
  }
  for (size_t k = 0; k < nt; ++k)
    if (!out_row[k]) out.error[k] = std::numeric_limits<double>::infinity();
  return out;
}

}  // namespace substrate::compiler
