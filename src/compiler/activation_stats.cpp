#include "compiler/activation_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/gguf_reader.h"
#include "format/gguf_writer.h"

namespace substrate::compiler {
namespace {

constexpr const char* kKind = "substrate.activation_stats";
constexpr float kImportanceFloor = 1e-3f;

}  // namespace

void ActivationStats::Add(const std::string& name, int64_t slices, int slice, const float* x,
                          int64_t n, int64_t cols) {
  ColumnStats& s = tensors[name];
  if (s.cols == 0) {
    s.cols = cols;
    s.slices = std::max<int64_t>(1, slices);
    s.sum_sq.assign(static_cast<size_t>(s.slices * cols), 0.0);
    s.rows.assign(static_cast<size_t>(s.slices), 0);
  }
  if (cols != s.cols || slice >= s.slices) return;  // a shape the first call did not announce
  const int64_t k = std::max(slice, 0);
  double* acc = s.sum_sq.data() + k * cols;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * cols;
    for (int64_t j = 0; j < cols; ++j) acc[j] += static_cast<double>(row[j]) * row[j];
  }
  s.rows[static_cast<size_t>(k)] += n;
}

void ActivationStats::RoundToStored() {
  for (auto& [name, s] : tensors)
    for (double& v : s.sum_sq) v = static_cast<double>(static_cast<float>(v));
}

std::vector<float> ActivationStats::ColumnImportance(const std::string& tensor, int slice,
                                                     int64_t cols) const {
  auto it = tensors.find(tensor);
  if (it == tensors.end() || it->second.cols != cols) return {};
  const ColumnStats& s = it->second;
  const int64_t k = std::max(slice, 0);
  if (k >= s.slices || s.rows[static_cast<size_t>(k)] == 0) return {};
  const double* v = s.sum_sq.data() + k * cols;
  // Equal sums mean uniform activations: exactly ones, so they quantize as without importance.
  if (std::all_of(v, v + cols, [&](double a) { return a == v[0]; }))
    return v[0] > 0 ? std::vector<float>(static_cast<size_t>(cols), 1.f) : std::vector<float>{};
  double mean = 0;
  for (int64_t j = 0; j < cols; ++j) mean += v[j];
  mean /= static_cast<double>(cols);
  if (!(mean > 0) || !std::isfinite(mean)) return {};
  std::vector<float> out(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    const float r = static_cast<float>(v[j] / mean);
    out[static_cast<size_t>(j)] = std::isfinite(r) ? std::max(r, kImportanceFloor) : 1.f;
  }
  return out;
}

std::vector<double> ActivationStats::MeanSquarePerToken(const std::string& tensor, int slice) const {
  auto it = tensors.find(tensor);
  if (it == tensors.end() || tokens <= 0) return {};
  const ColumnStats& s = it->second;
  const int64_t k = std::max(slice, 0);
  if (k >= s.slices) return {};
  std::vector<double> out(s.sum_sq.begin() + k * s.cols, s.sum_sq.begin() + (k + 1) * s.cols);
  for (double& v : out) v /= static_cast<double>(tokens);
  return out;
}

// Layout: metadata substrate.kind, .tokens, .text; per tensor "<name>.sum_sq" (F32 [cols,
// slices], sums of squares) and "<name>.rows" (F32 [slices], rows seen; exact below 2^24 per
// slice, and only used as "seen or not" and for ratios).
Status SaveActivationStats(const ActivationStats& stats, const std::string& path) {
  Metadata md;
  md.Set("substrate.kind", MetaValue::Str(kKind));
  md.Set("substrate.tokens", MetaValue::U64(static_cast<uint64_t>(stats.tokens)));
  md.Set("substrate.text", MetaValue::Str(stats.text));
  GgufWriter w(path);
  w.SetMetadata(md);
  for (const auto& [name, s] : stats.tensors) {
    RETURN_IF_ERROR(w.AddTensor(name + ".sum_sq",
                                {static_cast<uint64_t>(s.cols), static_cast<uint64_t>(s.slices)},
                                DType::kF32));
    RETURN_IF_ERROR(w.AddTensor(name + ".rows", {static_cast<uint64_t>(s.slices)}, DType::kF32));
  }
  for (const auto& [name, s] : stats.tensors) {
    std::vector<float> v(s.sum_sq.begin(), s.sum_sq.end());
    RETURN_IF_ERROR(w.WriteTensorData(v.data(), v.size() * 4));
    std::vector<float> r(s.rows.begin(), s.rows.end());
    RETURN_IF_ERROR(w.WriteTensorData(r.data(), r.size() * 4));
  }
  return w.Finish();
}

Expected<ActivationStats> LoadActivationStats(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, GgufFile::Open(path));
  const Metadata& md = file->metadata();
  if (md.GetString("substrate.kind", "") != kKind)
    return InvalidArgument("'" + path + "' is not an activation statistics file");
  ActivationStats out;
  out.tokens = md.GetInt("substrate.tokens", 0);
  out.text = md.GetString("substrate.text", "");
  const std::string suffix = ".sum_sq";
  for (const TensorInfo& t : file->tensors()) {
    if (t.name.size() <= suffix.size() ||
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string name = t.name.substr(0, t.name.size() - suffix.size());
    const TensorInfo* rows = file->Find(name + ".rows");
    if (t.type != DType::kF32 || t.ne.size() != 2 || !rows || rows->type != DType::kF32 ||
        rows->ne.size() != 1 || rows->ne[0] != t.ne[1] || t.ne[0] == 0 || t.ne[0] > (1u << 24) ||
        t.ne[1] > (1u << 20))
      return Corruption("activation statistics '" + path + "': tensor '" + name + "' is malformed");
    ColumnStats s;
    s.cols = static_cast<int64_t>(t.ne[0]);
    s.slices = static_cast<int64_t>(t.ne[1]);
    std::vector<float> v(t.ne[0] * t.ne[1]), r(rows->ne[0]);
    RETURN_IF_ERROR(file->ReadTensor(t, v.data()));
    RETURN_IF_ERROR(file->ReadTensor(*rows, r.data()));
    s.sum_sq.assign(v.begin(), v.end());
    for (float x : r) s.rows.push_back(static_cast<int64_t>(std::max(0.f, x)));
    out.tensors[name] = std::move(s);
  }
  return out;
}

}  // namespace substrate::compiler
