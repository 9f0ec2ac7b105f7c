#include "quant/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "core/memory_ledger.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "format/gguf_writer.h"
#include "quant/quant.h"

namespace substrate {
namespace {

constexpr uint32_t kQuantizationVersion = 2;  // ggml's GGML_QNT_VERSION, stored by llama.cpp

int LayerOf(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

}  // namespace

GgufFileSink::GgufFileSink(std::string path, Env* env)
    : writer_(std::make_unique<GgufWriter>(std::move(path), env)) {}
GgufFileSink::~GgufFileSink() = default;

Status GgufFileSink::Begin(const Metadata& metadata, const std::vector<TensorInfo>& tensors) {
  writer_->SetMetadata(metadata);
  for (const auto& t : tensors) RETURN_IF_ERROR(writer_->AddTensor(t.name, t.ne, t.type));
  return Status::Ok();
}

Status GgufFileSink::WriteTensorData(size_t, const void* data, uint64_t bytes) {
  return writer_->WriteTensorData(data, bytes);
}

Status GgufFileSink::Finish() { return writer_->Finish(); }

Expected<MixModelInfo> MixModelInfoFromMetadata(const Metadata& md) {
  MixModelInfo info;
  ASSIGN_OR_RETURN(info.arch, md.GetString("general.architecture"));
  const std::string a = info.arch + ".";
  ASSIGN_OR_RETURN(int64_t n_layer, md.GetInt(a + "block_count"));
  if (n_layer < 0 || n_layer > 100000)
    return Corruption("quantize: " + a + "block_count " + std::to_string(n_layer) + " is absurd");
  info.n_layer = static_cast<int>(n_layer);
  // head counts may be per-layer arrays in some models; the rules only need a typical value.
  auto first_int = [&](const std::string& key) -> int64_t {
    const MetaValue* v = md.Find(key);
    if (v && v->is_array()) {
      auto arr = md.GetIntArray(key);
      return arr.ok() && !arr->empty() ? (*arr)[0] : 0;
    }
    return md.GetInt(key, 0);
  };
  info.n_head = static_cast<int>(first_int(a + "attention.head_count"));
  info.n_head_kv = static_cast<int>(first_int(a + "attention.head_count_kv"));
  if (info.n_head_kv == 0) info.n_head_kv = info.n_head;
  info.n_expert = static_cast<int>(md.GetInt(a + "expert_count", 0));
  return info;
}

Expected<std::vector<TensorInfo>> PlanQuantizedTensors(const ModelFile& in,
                                                       const QuantizeOptions& options,
                                                       std::vector<TensorChoice>* choices,
                                                       std::vector<size_t>* source_index) {
  ASSIGN_OR_RETURN(MixModelInfo info, MixModelInfoFromMetadata(in.metadata()));
  const auto& src = in.tensors();
  std::vector<MixTensor> mix;
  mix.reserve(src.size());
  for (const auto& t : src) mix.push_back({t.name, t.ne, t.type});
  ASSIGN_OR_RETURN(std::vector<TensorChoice> chosen,
                   ChooseTensorTypes(info, mix, options.ftype, options.overrides));

  // llama-quantize writes non-block tensors first, then blocks by number, names sorted.
  std::vector<size_t> order(src.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = LayerOf(src[a].name), lb = LayerOf(src[b].name);
    return la != lb ? la < lb : src[a].name < src[b].name;
  });
  std::vector<TensorInfo> out;
  choices->clear();
  source_index->clear();
  for (size_t i : order) {
    const TensorInfo& t = src[i];
    const TensorChoice& c = chosen[i];
    if (c.quantize && !CanDequantize(t.type))
      return Unimplemented("quantize: tensor '" + t.name + "' has type " + DTypeName(t.type) +
                           ", which we cannot read");
    TensorInfo o;
    o.name = t.name;
    o.ne = t.ne;
    o.type = c.type;
    auto bytes = RowBytes(c.type, t.n_elements());
    if (!bytes)
      return InvalidArgument("quantize: tensor '" + t.name + "' cannot be stored as " +
                             DTypeName(c.type));
    o.bytes = c.quantize ? *bytes : t.bytes;
    out.push_back(std::move(o));
    choices->push_back(c);
    source_index->push_back(i);
  }
  return out;
}

Status ConvertRows(DType src_type, const void* src, DType dst_type, void* dst, int64_t rows,
                   int64_t cols, ThreadPool& pool) {
  auto in_row = RowBytes(src_type, static_cast<uint64_t>(cols));
  auto out_row = RowBytes(dst_type, static_cast<uint64_t>(cols));
  if (!in_row || !out_row)
    return InvalidArgument(std::string("quantize: a row of ") + std::to_string(cols) +
                           " elements does not fit " + DTypeName(in_row ? dst_type : src_type));
  if (!CanDequantize(src_type) || !CanQuantize(dst_type))
    return Unimplemented(std::string("quantize: cannot convert ") + DTypeName(src_type) + " to " +
                         DTypeName(dst_type));
  // About 64k elements per chunk: enough work to amortize dispatch, enough chunks to balance.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(cols, 1));
  pool.ParallelFor(rows, grain, [&](int64_t begin, int64_t end, int) {
    std::vector<float> f32(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      const auto* s = static_cast<const uint8_t*>(src) + static_cast<uint64_t>(r) * *in_row;
      auto* d = static_cast<uint8_t*>(dst) + static_cast<uint64_t>(r) * *out_row;
      DequantizeRow(src_type, s, f32.data(), cols);
      QuantizeRow(dst_type, f32.data(), d, cols);
    }
  });
  return Status::Ok();
}

Expected<QuantizeReport> QuantizeModel(const ModelFile& in, const QuantizeOptions& options,
                                       TensorSink& sink) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<TensorChoice> choices;
  std::vector<size_t> source;
  ASSIGN_OR_RETURN(std::vector<TensorInfo> out, PlanQuantizedTensors(in, options, &choices, &source));

  Metadata md = in.metadata();
  md.Set("general.quantization_version", MetaValue::U32(kQuantizationVersion));
  md.Set("general.file_type", MetaValue::U32(options.ftype.id));
  RETURN_IF_ERROR(sink.Begin(md, out));

  ThreadPool& pool = options.pool ? *options.pool : ThreadPool::Default();
  uint64_t total = 0;
  for (const auto& t : out) total += t.bytes;
  std::optional<ProgressBar> bar;
  if (options.progress) bar.emplace(std::string("quantize ") + options.ftype.name, total);
  QuantizeReport report;
  uint64_t done = 0;
  std::vector<uint8_t> src_buf, dst_buf;
  for (size_t k = 0; k < out.size(); ++k) {
    const TensorInfo& o = out[k];
    const TensorInfo& s = in.tensors()[source[k]];
    const TensorChoice& c = choices[k];
    // 3-D tensors (experts) go one outer slice at a time to bound memory.
    const bool sliced = s.ne.size() == 3 && s.outer() > 1;
    const uint64_t n_slices = sliced ? s.outer() : 1;
    const uint64_t in_bytes = sliced ? s.slice_bytes() : s.bytes;
    const uint64_t out_bytes = o.bytes / n_slices;
    if (in_bytes * n_slices != s.bytes || out_bytes * n_slices != o.bytes)
      return Corruption("quantize: tensor '" + s.name + "' size does not split into its slices");
    LedgerCharge charge;
    if (options.ledger) {
      ASSIGN_OR_RETURN(charge, options.ledger->Charge("scratch", in_bytes + (c.quantize ? out_bytes : 0)));
    }
    src_buf.resize(in_bytes);
    const int64_t cols = static_cast<int64_t>(s.ne.empty() ? 1 : s.ne[0]);
    const int64_t rows = cols ? static_cast<int64_t>(s.n_elements() / n_slices) / cols : 0;
    for (uint64_t i = 0; i < n_slices; ++i) {
      if (sliced) {
        RETURN_IF_ERROR(in.ReadSlice(s, i, src_buf.data()));
      } else {
        RETURN_IF_ERROR(in.ReadTensor(s, src_buf.data()));
      }
      if (!c.quantize) {
        RETURN_IF_ERROR(sink.WriteTensorData(k, src_buf.data(), in_bytes));
        continue;
      }
      dst_buf.resize(out_bytes);
      Status st = ConvertRows(s.type, src_buf.data(), o.type, dst_buf.data(), rows, cols, pool);
      if (!st.ok()) return st.WithContext("tensor '" + s.name + "'");
      RETURN_IF_ERROR(sink.WriteTensorData(k, dst_buf.data(), out_bytes));
    }
    done += o.bytes;
    if (bar) bar->Update(done, o.name);
    report.tensors.push_back(
        {o.name, s.type, o.type, s.bytes, o.bytes, static_cast<uint64_t>(cols), c.fallback});
    report.bytes_in += s.bytes;
    report.bytes_out += o.bytes;
    // Large buffers are not kept across tensors of very different sizes.
    if (src_buf.capacity() > 4 * in_bytes) std::vector<uint8_t>().swap(src_buf);
  }
  if (bar) bar->Finish();
  RETURN_IF_ERROR(sink.Finish());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace substrate
