// Calibration runner: a resident model whose weight source can swap any tensor for a copy
// quantized to another type, and KL measurements through the model layer's perplexity code.
#include "compiler/calibrate.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "compiler/hardware.h"
#include "core/aligned_buffer.h"
#include "core/file_io.h"
#include "core/memory_ledger.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "model/resident_weight_source.h"
#include "quant/quant.h"
#include "quant/quantize_model.h"
#include "tokenizer/tokenizer.h"

namespace substrate::compiler {
namespace {

// Serves the base model's tensors, except those given another type: those come from a copy
// quantized (through F32) from the base bytes.
class OverrideSource : public WeightSource {
 public:
  explicit OverrideSource(WeightSource* base) : base_(base) {}
  TensorId Resolve(const std::string& name) const override { return base_->Resolve(name); }
  const TensorInfo& Info(TensorId id) const override {
    auto it = over_.find(id);
    return it != over_.end() ? it->second.info : base_->Info(id);
  }
  Expected<WeightHandle> Acquire(TensorId id, int slice, int tier) override {
    auto it = over_.find(id);
    if (it == over_.end()) return base_->Acquire(id, slice, tier);
    ASSIGN_OR_RETURN(WeightView v, MakeWeightView(it->second.info, it->second.data.data(), slice));
    return WeightHandle(this, v, 0);
  }
  bool ReadsRows(TensorId id) const override {
    return over_.find(id) == over_.end() && base_->ReadsRows(id);
  }
  Status ReadRows(TensorId id, const int32_t* rows, int64_t n, uint8_t* dst) override {
    return base_->ReadRows(id, rows, n, dst);
  }

  // Calibration passes: report every product's input to `stats` (null: off).
  void Observe(ActivationStats* stats) { stats_ = stats; }
  bool ObservesInputs() const override { return stats_ != nullptr; }
  void ObserveInput(TensorId id, int slice, const float* x, int64_t n, int64_t cols) override {
    const TensorInfo& info = base_->Info(id);
    stats_->Add(info.name, info.ne.size() == 3 ? static_cast<int64_t>(info.ne[2]) : 1, slice, x, n, cols);
  }

  Status Set(const std::string& name, DType type, ThreadPool& pool, MemoryLedger* ledger,
             const ImportanceSource* importance) {
    TensorId id = base_->Resolve(name);
    if (id == kNoTensor) return NotFound("calibrate: model has no tensor '" + name + "'");
    const TensorInfo& info = base_->Info(id);
    if (info.type == type) return Status::Ok();
    if (!CanQuantize(type) || !CanDequantize(info.type))
      return Unimplemented(std::string("calibrate: cannot convert '") + name + "' from " +
                           DTypeName(info.type) + " to " + DTypeName(type));
    const uint64_t cols = info.ne.empty() ? 0 : info.ne[0];
    auto row = RowBytes(type, cols);
    if (!row) return InvalidArgument("calibrate: rows of '" + name + "' do not fit " + DTypeName(type));
    const int64_t rows = static_cast<int64_t>(info.n_elements() / std::max<uint64_t>(cols, 1));
    Entry e;
    e.info = info;
    e.info.type = type;
    e.info.bytes = *row * static_cast<uint64_t>(rows);
    ASSIGN_OR_RETURN(e.data, AlignedBuffer::Allocate(e.info.bytes, ledger, "weights"));
    ASSIGN_OR_RETURN(WeightHandle src, base_->Acquire(id, -1, 0));
    // Slice by slice (experts), each with its own importance, as `substrate quantize` writes.
    const int64_t slices = info.ne.size() == 3 ? static_cast<int64_t>(info.ne[2]) : 1;
    const int64_t slice_rows = rows / slices;
    auto in_row = RowBytes(info.type, cols);
    if (!in_row) return Corruption("calibrate: rows of '" + name + "' do not fit their type");
    for (int64_t k = 0; k < slices; ++k) {
      std::vector<float> imp;
      if (importance)
        imp = importance->ColumnImportance(name, slices > 1 ? static_cast<int>(k) : -1,
                                           static_cast<int64_t>(cols));
      RETURN_IF_ERROR(ConvertRows(info.type, src->data + k * slice_rows * *in_row, type,
                                  e.data.data() + k * slice_rows * *row, slice_rows,
                                  static_cast<int64_t>(cols), pool, imp.empty() ? nullptr : imp.data()));
    }
    over_[id] = std::move(e);
    return Status::Ok();
  }
  void Clear() { over_.clear(); }

 private:
  struct Entry {
    TensorInfo info;
    AlignedBuffer data;
  };
  WeightSource* base_;
  std::unordered_map<TensorId, Entry> over_;
  ActivationStats* stats_ = nullptr;
};

const char* KindName(OpKind k) {
  switch (k) {
    case OpKind::kTokenEmbd: return "embed";
    case OpKind::kAttention: return "attn";
    case OpKind::kFfn: return "ffn";
    case OpKind::kMoeRouter: return "router";
    case OpKind::kMoeExpert: return "expert";
    case OpKind::kMoeShared: return "shared_expert";
    case OpKind::kOutput: return "output";
    case OpKind::kNextn: return "nextn";
  }
  return "?";
}

}  // namespace

struct CalibrationRunner::Impl {
  // First, so it is destroyed last: the weights, overrides and model scratch hold charges on it.
  MemoryLedger ledger;
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<ResidentWeightSource> base;
  std::unique_ptr<OverrideSource> over;
  std::unique_ptr<ThreadPool> own_pool;
  ThreadPool* pool = nullptr;
  std::unique_ptr<Model> model;
  std::vector<int32_t> tokens;
  int32_t bos = -1;
  int64_t n_ctx = 512;
  std::string tmpdir;
  std::map<std::pair<int64_t, int64_t>, std::string> base_files;  // (first, n) -> log-probs

  ~Impl() {
    for (auto& [k, path] : base_files) ::unlink(path.c_str());
    if (!tmpdir.empty()) ::rmdir(tmpdir.c_str());
  }
  std::vector<int32_t> Range(int64_t first, int64_t n) const {
    uint64_t a = std::min<uint64_t>(tokens.size(), static_cast<uint64_t>(first * n_ctx));
    uint64_t b = std::min<uint64_t>(tokens.size(), static_cast<uint64_t>((first + n) * n_ctx));
    return std::vector<int32_t>(tokens.begin() + a, tokens.begin() + b);
  }
};

CalibrationRunner::CalibrationRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CalibrationRunner::~CalibrationRunner() = default;

Expected<std::unique_ptr<CalibrationRunner>> CalibrationRunner::Open(const std::string& model_path,
                                                                     const std::string& text_path,
                                                                     int64_t n_ctx, int threads) {
  if (n_ctx < 16 || n_ctx > (1 << 20)) return InvalidArgument("calibrate: context length out of range");
  auto impl = std::make_unique<Impl>();
  impl->n_ctx = n_ctx;
  if (threads > 0) {
    impl->own_pool = std::make_unique<ThreadPool>(threads);
    impl->pool = impl->own_pool.get();
  } else {
    impl->pool = &ThreadPool::Default();
  }
  auto file = ModelFile::Open(model_path);
  if (!file.ok()) return file.status().WithContext("calibrate: opening '" + model_path + "'");
  impl->file = std::move(file).value();
  ASSIGN_OR_RETURN(impl->base, ResidentWeightSource::Load(*impl->file, &impl->ledger));
  impl->over = std::make_unique<OverrideSource>(impl->base.get());
  ASSIGN_OR_RETURN(impl->model, Model::Create(impl->file->metadata(), impl->over.get(), impl->pool,
                                              &impl->ledger));
  ASSIGN_OR_RETURN(auto tok, Tokenizer::FromMetadata(impl->file->metadata()));
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(text_path));
  EncodeOptions eo;
  eo.add_special = true;
  eo.parse_special = false;
  ASSIGN_OR_RETURN(auto ids, tok->Encode(text, eo));
  impl->tokens.assign(ids.begin(), ids.end());
  impl->bos = tok->vocab().add_bos ? tok->bos() : -1;
  char tmpl[] = "/tmp/substrate-calib-XXXXXX";
  if (!::mkdtemp(tmpl)) return IOError("calibrate: cannot create a temporary directory");
  impl->tmpdir = tmpl;
  return std::unique_ptr<CalibrationRunner>(new CalibrationRunner(std::move(impl)));
}

int64_t CalibrationRunner::n_chunks_available() const {
  return static_cast<int64_t>(impl_->tokens.size()) / impl_->n_ctx;
}

Status CalibrationRunner::CheckChunks(int64_t first_chunk, int64_t n_chunks) const {
  if (first_chunk < 0 || n_chunks <= 0 || first_chunk + n_chunks > n_chunks_available())
    return InvalidArgument("calibrate: chunks " + std::to_string(first_chunk) + ".." +
                           std::to_string(first_chunk + n_chunks) + " are not in the text (" +
                           std::to_string(n_chunks_available()) + " chunks of " +
                           std::to_string(impl_->n_ctx) + " tokens)");
  return Status::Ok();
}

Expected<ActivationStats> CalibrationRunner::CollectActivationStats(int64_t first_chunk,
                                                                    int64_t n_chunks) {
  Impl& m = *impl_;
  RETURN_IF_ERROR(CheckChunks(first_chunk, n_chunks));
  ActivationStats stats;
  PerplexityOptions opt;
  opt.n_ctx = m.n_ctx;
  opt.max_chunks = n_chunks;
  opt.bos = m.bos;
  m.over->Clear();
  m.over->Observe(&stats);
  auto r = ComputePerplexity(*m.model, m.Range(first_chunk, n_chunks), &m.ledger, opt);
  m.over->Observe(nullptr);
  if (!r.ok()) return r.status();
  stats.tokens = r->n_chunks * m.n_ctx;
  stats.RoundToStored();
  return stats;
}

Expected<CalibrationRunner::BaseTensor> CalibrationRunner::Base(const std::string& name) const {
  TensorId id = impl_->base->Resolve(name);
  if (id == kNoTensor) return NotFound("calibrate: model has no tensor '" + name + "'");
  BaseTensor t;
  t.info = &impl_->base->Info(id);
  ASSIGN_OR_RETURN(t.handle, impl_->base->Acquire(id, -1, 0));
  return t;
}

const ModelFile& CalibrationRunner::file() const { return *impl_->file; }
ThreadPool& CalibrationRunner::pool() const { return *impl_->pool; }

Expected<KlMeasurement> CalibrationRunner::Measure(const std::map<std::string, DType>& types,
                                                   int64_t first_chunk, int64_t n_chunks,
                                                   const ImportanceSource* importance) {
  Impl& m = *impl_;
  RETURN_IF_ERROR(CheckChunks(first_chunk, n_chunks));
  const auto key = std::make_pair(first_chunk, n_chunks);
  const std::vector<int32_t> toks = m.Range(first_chunk, n_chunks);
  PerplexityOptions opt;
  opt.n_ctx = m.n_ctx;
  opt.max_chunks = n_chunks;
  opt.bos = m.bos;
  m.over->Clear();
  if (!m.base_files.count(key)) {
    std::string path = m.tmpdir + "/base-" + std::to_string(first_chunk) + "-" + std::to_string(n_chunks);
    opt.save_base = path;
    ASSIGN_OR_RETURN(PerplexityResult r, ComputePerplexity(*m.model, toks, &m.ledger, opt));
    (void)r;
    m.base_files[key] = path;
    opt.save_base.clear();
  }
  Status st;
  for (const auto& [name, type] : types) {
    st = m.over->Set(name, type, *m.pool, &m.ledger, importance);
    if (!st.ok()) break;
  }
  Expected<PerplexityResult> r = st;
  if (st.ok()) {
    opt.kld_base = m.base_files[key];
    r = ComputePerplexity(*m.model, toks, &m.ledger, opt);
  }
  m.over->Clear();
  if (!r.ok()) return r.status();
  KlMeasurement out;
  out.mean_kld = std::max(0.0, r->mean_kld);
  out.kld_err = r->kld_err;
  out.same_top = r->same_top;
  out.ppl = r->ppl;
  out.n_scored = r->n_scored;
  return out;
}

std::vector<std::pair<std::string, std::vector<std::string>>> CalibrationRunner::OpTensors() const {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  std::set<std::string> owned;
  for (const OpSpec& op : impl_->model->ops()) {
    std::vector<std::string> names;
    for (const OpTensorRef& ref : op.tensors) {
      TensorId id = impl_->base->Resolve(ref.name);
      if (id == kNoTensor || impl_->base->Info(id).ne.size() < 2) continue;
      bool is_new = owned.insert(ref.name).second;
      // Expert slices of one 3-D tensor all belong to their experts; whole tensors to one op.
      if (!is_new && ref.slice < 0) continue;
      if (std::find(names.begin(), names.end(), ref.name) == names.end()) names.push_back(ref.name);
    }
    if (!names.empty()) out.emplace_back(op.id, std::move(names));
  }
  return out;
}

Expected<ModelProfile> CalibrationRunner::SkeletonProfile(const std::vector<DType>& types) const {
  const Impl& m = *impl_;
  const ModelHParams& hp = m.model->hparams();
  ModelProfile p;
  p.model_id = m.file->metadata().GetString("general.name", m.file->path());
  std::set<std::string> owned;
  for (const OpSpec& op : m.model->ops()) {
    OpProfile o;
    o.id = op.id;
    o.kind = KindName(op.kind);
    o.layer = op.layer;
    if (op.kind == OpKind::kMoeExpert && hp.n_expert > 0)
      o.activation_prob = static_cast<double>(hp.n_expert_used) / hp.n_expert;
    DType base_type = DType::kF32;
    for (const OpTensorRef& ref : op.tensors) {
      TensorId id = m.base->Resolve(ref.name);
      if (id == kNoTensor) continue;
      const TensorInfo& info = m.base->Info(id);
      if (info.ne.size() < 2) continue;
      bool is_new = owned.insert(ref.name).second;
      if (!is_new && ref.slice < 0) continue;
      ProfileTensor t;
      t.name = ref.name;
      t.slice = ref.slice;
      t.ne = info.ne;
      if (ref.slice >= 0) t.ne.pop_back();
      o.tensors.push_back(std::move(t));
      base_type = info.type;
    }
    if (o.tensors.empty()) continue;
    for (DType t : types) o.options.push_back({t, 0, 0.0});
    if (std::find(types.begin(), types.end(), base_type) == types.end())
      o.options.push_back({base_type, 0, 0.0});
    p.ops.push_back(std::move(o));
  }
  // Everything not planned (norms, biases) plus a float32 KV cache of one chunk stays resident.
  uint64_t planned = 0, total = 0;
  for (const TensorInfo& t : m.file->tensors()) {
    total += t.bytes;
    if (owned.count(t.name)) planned += t.bytes;
  }
  p.overhead_bytes = total - planned +
                     2ull * hp.n_layer * static_cast<uint64_t>(m.n_ctx) * hp.n_head_kv *
                         static_cast<uint64_t>(std::max(hp.head_dim_k, hp.head_dim_v)) * 4;
  return p;
}

Expected<ModelProfile> Calibrate(const CalibrationOptions& o) {
  std::vector<DType> types = o.types;
  if (types.empty())
    types = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0};
  ASSIGN_OR_RETURN(auto runner, CalibrationRunner::Open(o.model_path, o.text_path, o.n_ctx, o.threads));
  ASSIGN_OR_RETURN(ModelProfile profile, runner->SkeletonProfile(types));

  // Groups: one per op, except the experts of a layer, measured together (one 3-D tensor).
  std::vector<std::string> group_of(profile.ops.size());
  std::map<std::string, std::set<std::string>> group_tensors;
  std::map<std::string, int> group_size;
  for (size_t i = 0; i < profile.ops.size(); ++i) {
    const OpProfile& op = profile.ops[i];
    group_of[i] = op.kind == "expert" ? "block_" + std::to_string(op.layer) + ".moe.experts" : op.id;
    for (const ProfileTensor& t : op.tensors) group_tensors[group_of[i]].insert(t.name);
    group_size[group_of[i]]++;
  }
  using nlohmann::json;
  json settings = {{"model", o.model_path}, {"text", o.text_path}, {"n_ctx", o.n_ctx},
                   {"first_chunk", o.first_chunk}, {"n_chunks", o.n_chunks}};
  json results = json::object();
  if (!o.partial_path.empty() && FileExists(o.partial_path)) {
    auto text = ReadFileToString(o.partial_path);
    if (text.ok()) {
      try {
        json j = json::parse(*text);
        if (j.at("settings") == settings) results = j.at("results");
        else std::fprintf(stderr, "calibrate: %s is for other settings; starting over\n", o.partial_path.c_str());
      } catch (const json::exception&) {
        std::fprintf(stderr, "calibrate: %s is unreadable; starting over\n", o.partial_path.c_str());
      }
    }
  }
  std::vector<std::pair<std::string, DType>> work;
  for (const auto& [g, names] : group_tensors)
    for (DType t : types) work.emplace_back(g, t);
  ProgressBar bar("calibrate", work.size());
  size_t done = 0;
  for (const auto& [g, t] : work) {
    const std::string key = g + "|" + DTypeName(t);
    if (!results.contains(key)) {
      std::map<std::string, DType> assign;
      for (const std::string& name : group_tensors[g]) assign[name] = t;
      auto m = runner->Measure(assign, o.first_chunk, o.n_chunks);
      if (!m.ok()) {
        // A type that cannot store these rows is simply not a candidate for the group.
        if (m.status().code() != StatusCode::kInvalidArgument &&
            m.status().code() != StatusCode::kUnimplemented)
          return m.status();
        results[key] = {{"skipped", m.status().message()}};
      } else {
        results[key] = {{"kld", m->mean_kld}, {"kld_err", m->kld_err}, {"same_top", m->same_top}};
      }
      if (!o.partial_path.empty()) {
        json j = {{"settings", settings}, {"results", results}};
        RETURN_IF_ERROR(WriteFileAtomic(o.partial_path, j.dump(1)));
      }
    }
    bar.Update(++done, key);
  }
  bar.Finish();
  for (size_t i = 0; i < profile.ops.size(); ++i) {
    OpProfile& op = profile.ops[i];
    std::vector<PrecisionOption> kept;
    for (PrecisionOption& opt : op.options) {
      const std::string key = group_of[i] + "|" + DTypeName(opt.type);
      if (results.contains(key)) {
        const json& r = results[key];
        if (!r.contains("kld")) continue;
        opt.quality_loss = r["kld"].get<double>() / group_size[group_of[i]];
      }  // else: the file's own type, loss 0
      kept.push_back(opt);
    }
    op.options = std::move(kept);
  }
  RETURN_IF_ERROR(profile.Normalize());
  if (o.measure_hardware) {
    ASSIGN_OR_RETURN(profile.hardware.memory_read_bw, MeasureMemoryReadBandwidth());
    auto ssd = MeasureFileReadBandwidth(o.model_path);
    if (ssd.ok()) profile.hardware.ssd_read_bw = ssd->bytes_per_second;
    profile.hardware.measured_by = std::string("substrate calibrate") +
                                   (ssd.ok() && ssd->direct_io ? " (direct I/O)" : " (buffered reads)");
  }
  return profile;
}

Expected<std::map<std::string, DType>> FileTensorTypes(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, ModelFile::Open(path));
  std::map<std::string, DType> out;
  for (const TensorInfo& t : file->tensors())
    if (t.ne.size() >= 2) out[t.name] = t.type;
  return out;
}

Prediction PredictAdditive(const ModelProfile& profile, const std::map<std::string, DType>& types) {
  Prediction p;
  for (const OpProfile& op : profile.ops) {
    if (op.tensors.empty()) continue;
    auto it = types.find(op.tensors[0].name);
    if (it == types.end()) {
      ++p.unmatched_ops;
      continue;
    }
    auto bytes = TensorBytesAt(op.tensors, it->second);
    p.bytes += bytes.value_or(0);
    // The calibrated option of that type; a dominated (dropped) one takes the option of the
    // nearest size, which is at least as good.
    const PrecisionOption* best = nullptr;
    for (const PrecisionOption& o : op.options) {
      if (o.type == it->second) { best = &o; break; }
      if (bytes && (!best || (o.bytes <= *bytes && o.bytes > best->bytes))) best = &o;
    }
    if (!best || best->type != it->second) ++p.unmatched_ops;
    if (best) p.loss += best->quality_loss;
  }
  return p;
}

}  // namespace substrate::compiler
