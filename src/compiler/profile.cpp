// ModelProfile: normalization, JSON, and the seed's synthetic MoE generator.
#include "compiler/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>
#include <unordered_set>

#include "compiler/json_read.h"
#include "core/file_io.h"

namespace substrate::compiler {
namespace {

using nlohmann::json;
using namespace jsonr;
const std::string kDoc = "profile";
constexpr const char* kSchema = "substrate.profile";

}  // namespace

std::optional<uint64_t> TensorBytesAt(const std::vector<ProfileTensor>& tensors, DType type) {
  uint64_t total = 0;
  for (const ProfileTensor& t : tensors) {
    if (t.ne.empty()) return std::nullopt;
    auto row = RowBytes(type, t.ne[0]);
    if (!row) return std::nullopt;
    uint64_t rows = 1;
    for (size_t i = 1; i < t.ne.size(); ++i) {
      if (t.ne[i] != 0 && rows > (1ull << 50) / t.ne[i]) return std::nullopt;  // absurd shape
      rows *= t.ne[i];
    }
    total += *row * rows;
  }
  return total;
}

std::pair<std::string, int> TensorKindAndLayer(const std::string& name) {
  std::string kind = name;
  int layer = -1;
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    if (dot != std::string::npos) {
      layer = std::atoi(name.substr(4, dot - 4).c_str());
      kind = name.substr(dot + 1);
    }
  }
  const std::string suffix = ".weight";
  if (kind.size() > suffix.size() && kind.compare(kind.size() - suffix.size(), suffix.size(), suffix) == 0)
    kind.resize(kind.size() - suffix.size());
  return {kind, layer};
}

namespace {

// Sizes each option from the tensors (when known), drops options no type fits and dominated
// ones (more bytes, no less loss), sorts the rest by bytes.
Status NormalizeOptions(const std::string& what, const std::vector<ProfileTensor>& tensors,
                        std::vector<PrecisionOption>* options) {
  std::vector<PrecisionOption> kept;
  for (PrecisionOption o : *options) {
    if (!std::isfinite(o.quality_loss) || o.quality_loss < 0)
      return InvalidArgument(std::string("profile: ") + what + ": quality loss of " +
                             DTypeName(o.type) + " is not a finite number >= 0");
    if (!tensors.empty()) {
      auto b = TensorBytesAt(tensors, o.type);
      if (!b) continue;  // the type cannot store these rows
      o.bytes = *b;
    }
    if (o.bytes == 0) continue;
    kept.push_back(o);
  }
  std::sort(kept.begin(), kept.end(), [](const PrecisionOption& a, const PrecisionOption& b) {
    return a.bytes != b.bytes ? a.bytes < b.bytes : a.quality_loss < b.quality_loss;
  });
  options->clear();
  for (const PrecisionOption& o : kept)
    if (options->empty() || o.quality_loss < options->back().quality_loss) options->push_back(o);
  if (options->empty()) return InvalidArgument("profile: " + what + " has no usable precision option");
  return Status::Ok();
}

}  // namespace

Status ModelProfile::Normalize() {
  if (ops.empty()) return InvalidArgument("profile '" + model_id + "': no ops");
  std::unordered_set<std::string> seen;
  for (OpProfile& op : ops) {
    if (op.id.empty()) return InvalidArgument("profile: an op has an empty id");
    if (!seen.insert(op.id).second) return InvalidArgument("profile: op '" + op.id + "' appears twice");
    if (!std::isfinite(op.activation_prob) || op.activation_prob < 0 || op.activation_prob > 1)
      return InvalidArgument("profile: op '" + op.id + "': activation_prob not in [0, 1]");
    if (!std::isfinite(op.sensitivity) || op.sensitivity < 0)
      return InvalidArgument("profile: op '" + op.id + "': sensitivity must be >= 0");
    RETURN_IF_ERROR(NormalizeOptions("op '" + op.id + "'", op.tensors, &op.options));
  }
  seen.clear();
  for (TensorProfile& t : tensors) {
    if (t.name.empty() || t.ne.empty()) return InvalidArgument("profile: a tensor has no name or shape");
    if (!seen.insert(t.name).second) return InvalidArgument("profile: tensor '" + t.name + "' appears twice");
    RETURN_IF_ERROR(NormalizeOptions("tensor '" + t.name + "'", {ProfileTensor{t.name, -1, t.ne}}, &t.options));
  }
  if (file.alignment != 0 && (file.alignment & (file.alignment - 1)) != 0)
    return InvalidArgument("profile: file alignment must be a power of two");
  return Status::Ok();
}

double ModelProfile::FittedKld(double additive) const {
  if (additive <= 0) return 0;
  return kld_fit.scale * (kld_fit.power == 1 ? additive : std::pow(additive, kld_fit.power));
}

const OpProfile* ModelProfile::Find(const std::string& id) const {
  for (const OpProfile& op : ops)
    if (op.id == id) return &op;
  return nullptr;
}

namespace {

json PrecisionsJson(const std::vector<PrecisionOption>& options) {
  json prec = json::array();
  for (const PrecisionOption& o : options) {
    json e = {{"type", DTypeName(o.type)}, {"bytes", o.bytes}, {"quality_loss", o.quality_loss}};
    if (o.act_error > 0) e["act_error"] = o.act_error;
    prec.push_back(std::move(e));
  }
  return prec;
}

}  // namespace

std::string ProfileToJson(const ModelProfile& p) {
  json j;
  j["schema"] = kSchema;
  j["version"] = kProfileSchemaVersion;
  j["model_id"] = p.model_id;
  j["quality_metric"] = p.quality_metric;
  j["overhead_bytes"] = p.overhead_bytes;
  j["hardware"] = {{"memory_read_bw_bytes_per_s", p.hardware.memory_read_bw},
                   {"ssd_read_bw_bytes_per_s", p.hardware.ssd_read_bw},
                   {"measured_by", p.hardware.measured_by}};
  json ops = json::array();
  for (const OpProfile& op : p.ops) {
    json tensors = json::array();
    for (const ProfileTensor& t : op.tensors) {
      json jt = {{"name", t.name}, {"ne", t.ne}};
      if (t.slice >= 0) jt["slice"] = t.slice;
      tensors.push_back(std::move(jt));
    }
    ops.push_back({{"id", op.id}, {"kind", op.kind}, {"layer", op.layer},
                   {"activation_prob", op.activation_prob}, {"sensitivity", op.sensitivity},
                   {"tensors", std::move(tensors)}, {"precisions", PrecisionsJson(op.options)}});
  }
  j["ops"] = std::move(ops);
  if (!p.estimate.empty()) j["estimate"] = p.estimate;
  if (p.kld_fit.scale != 1 || p.kld_fit.power != 1)
    j["kld_fit"] = {{"scale", p.kld_fit.scale}, {"power", p.kld_fit.power}};
  if (p.file.alignment != 0)
    j["file"] = {{"alignment", p.file.alignment}, {"header_bytes", p.file.header_bytes},
                 {"fixed_bytes", p.file.fixed_bytes}, {"n_parameters", p.file.n_parameters}};
  if (!p.tensors.empty()) {
    json ts = json::array();
    for (const TensorProfile& t : p.tensors)
      ts.push_back({{"name", t.name}, {"kind", t.kind}, {"layer", t.layer}, {"ne", t.ne},
                    {"precisions", PrecisionsJson(t.options)}});
    j["tensors"] = std::move(ts);
  }
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

namespace {

Expected<std::vector<uint64_t>> ReadShape(const json& j, const std::string& path) {
  ASSIGN_OR_RETURN(const json* ne, Arr(kDoc, j, path, "ne"));
  if (ne->empty() || ne->size() > 4) return Corruption("profile: " + path + ".ne must have 1 to 4 dimensions");
  std::vector<uint64_t> out;
  for (const json& d : *ne) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() == 0 || d.get<uint64_t>() > (1ull << 40))
      return Corruption("profile: " + path + ".ne: dimensions must be integers in 1..2^40");
    out.push_back(d.get<uint64_t>());
  }
  return out;
}

Expected<std::vector<PrecisionOption>> ReadPrecisions(const json& j, const std::string& path) {
  ASSIGN_OR_RETURN(const json* prec, Arr(kDoc, j, path, "precisions"));
  std::vector<PrecisionOption> out;
  for (size_t k = 0; k < prec->size(); ++k) {
    const std::string pp = path + ".precisions[" + std::to_string(k) + "]";
    PrecisionOption o;
    ASSIGN_OR_RETURN(std::string tname, Str(kDoc, (*prec)[k], pp, "type"));
    auto type = DTypeFromName(tname);
    if (!type) return Corruption("profile: " + pp + ".type: unknown type '" + tname + "'");
    o.type = *type;
    ASSIGN_OR_RETURN(o.bytes, U64(kDoc, (*prec)[k], pp, "bytes"));
    ASSIGN_OR_RETURN(o.quality_loss, F64(kDoc, (*prec)[k], pp, "quality_loss"));
    if ((*prec)[k].contains("act_error")) {
      ASSIGN_OR_RETURN(o.act_error, F64(kDoc, (*prec)[k], pp, "act_error"));
    }
    out.push_back(o);
  }
  return out;
}

Expected<ModelProfile> ReadProfile(const json& j) {
  ModelProfile p;
  ASSIGN_OR_RETURN(std::string schema, Str(kDoc, j, "$", "schema"));
  if (schema != kSchema) return Corruption("profile: schema is '" + schema + "', expected '" + kSchema + "'");
  ASSIGN_OR_RETURN(int64_t version, I64(kDoc, j, "$", "version"));
  if (version != kProfileSchemaVersion)
    return Corruption("profile: schema version " + std::to_string(version) + " is not supported");
  ASSIGN_OR_RETURN(p.model_id, Str(kDoc, j, "$", "model_id"));
  if (j.contains("quality_metric")) {
    ASSIGN_OR_RETURN(p.quality_metric, Str(kDoc, j, "$", "quality_metric"));
  }
  ASSIGN_OR_RETURN(p.overhead_bytes, U64(kDoc, j, "$", "overhead_bytes"));
  ASSIGN_OR_RETURN(const json* hw, Field(kDoc, j, "$", "hardware"));
  ASSIGN_OR_RETURN(p.hardware.memory_read_bw, F64(kDoc, *hw, "hardware", "memory_read_bw_bytes_per_s"));
  ASSIGN_OR_RETURN(p.hardware.ssd_read_bw, F64(kDoc, *hw, "hardware", "ssd_read_bw_bytes_per_s"));
  if (hw->contains("measured_by")) {
    ASSIGN_OR_RETURN(p.hardware.measured_by, Str(kDoc, *hw, "hardware", "measured_by"));
  }
  if (!std::isfinite(p.hardware.memory_read_bw) || p.hardware.memory_read_bw < 0 ||
      !std::isfinite(p.hardware.ssd_read_bw) || p.hardware.ssd_read_bw < 0)
    return Corruption("profile: hardware bandwidths must be finite numbers >= 0");
  ASSIGN_OR_RETURN(const json* ops, Arr(kDoc, j, "$", "ops"));
  for (size_t i = 0; i < ops->size(); ++i) {
    const json& jo = (*ops)[i];
    const std::string path = "ops[" + std::to_string(i) + "]";
    OpProfile op;
    ASSIGN_OR_RETURN(op.id, Str(kDoc, jo, path, "id"));
    ASSIGN_OR_RETURN(op.kind, Str(kDoc, jo, path, "kind"));
    ASSIGN_OR_RETURN(int64_t layer, I64(kDoc, jo, path, "layer"));
    op.layer = static_cast<int>(std::clamp<int64_t>(layer, -1, 1 << 20));
    ASSIGN_OR_RETURN(op.activation_prob, F64(kDoc, jo, path, "activation_prob"));
    if (jo.contains("sensitivity")) {
      ASSIGN_OR_RETURN(op.sensitivity, F64(kDoc, jo, path, "sensitivity"));
    }
    if (jo.contains("tensors")) {
      ASSIGN_OR_RETURN(const json* ts, Arr(kDoc, jo, path, "tensors"));
      for (size_t k = 0; k < ts->size(); ++k) {
        const std::string tp = path + ".tensors[" + std::to_string(k) + "]";
        ProfileTensor t;
        ASSIGN_OR_RETURN(t.name, Str(kDoc, (*ts)[k], tp, "name"));
        if ((*ts)[k].contains("slice")) {
          ASSIGN_OR_RETURN(int64_t s, I64(kDoc, (*ts)[k], tp, "slice"));
          if (s < 0 || s > (1 << 24)) return Corruption("profile: " + tp + ".slice out of range");
          t.slice = static_cast<int>(s);
        }
        ASSIGN_OR_RETURN(t.ne, ReadShape((*ts)[k], tp));
        op.tensors.push_back(std::move(t));
      }
    }
    ASSIGN_OR_RETURN(op.options, ReadPrecisions(jo, path));
    p.ops.push_back(std::move(op));
  }
  if (j.contains("estimate")) {
    ASSIGN_OR_RETURN(p.estimate, Str(kDoc, j, "$", "estimate"));
  }
  if (j.contains("kld_fit")) {
    ASSIGN_OR_RETURN(const json* f, Field(kDoc, j, "$", "kld_fit"));
    ASSIGN_OR_RETURN(p.kld_fit.scale, F64(kDoc, *f, "kld_fit", "scale"));
    ASSIGN_OR_RETURN(p.kld_fit.power, F64(kDoc, *f, "kld_fit", "power"));
    if (!(p.kld_fit.scale > 0) || !std::isfinite(p.kld_fit.scale) || !(p.kld_fit.power > 0) ||
        !std::isfinite(p.kld_fit.power))
      return Corruption("profile: kld_fit must hold finite positive numbers");
  }
  if (j.contains("file")) {
    ASSIGN_OR_RETURN(const json* f, Field(kDoc, j, "$", "file"));
    ASSIGN_OR_RETURN(p.file.alignment, U64(kDoc, *f, "file", "alignment"));
    ASSIGN_OR_RETURN(p.file.header_bytes, U64(kDoc, *f, "file", "header_bytes"));
    ASSIGN_OR_RETURN(p.file.fixed_bytes, U64(kDoc, *f, "file", "fixed_bytes"));
    ASSIGN_OR_RETURN(p.file.n_parameters, U64(kDoc, *f, "file", "n_parameters"));
  }
  if (j.contains("tensors")) {
    ASSIGN_OR_RETURN(const json* ts, Arr(kDoc, j, "$", "tensors"));
    for (size_t i = 0; i < ts->size(); ++i) {
      const json& jt = (*ts)[i];
      const std::string path = "tensors[" + std::to_string(i) + "]";
      TensorProfile t;
      ASSIGN_OR_RETURN(t.name, Str(kDoc, jt, path, "name"));
      ASSIGN_OR_RETURN(t.kind, Str(kDoc, jt, path, "kind"));
      ASSIGN_OR_RETURN(int64_t layer, I64(kDoc, jt, path, "layer"));
      t.layer = static_cast<int>(std::clamp<int64_t>(layer, -1, 1 << 20));
      ASSIGN_OR_RETURN(t.ne, ReadShape(jt, path));
      ASSIGN_OR_RETURN(t.options, ReadPrecisions(jt, path));
      p.tensors.push_back(std::move(t));
    }
  }
  RETURN_IF_ERROR(p.Normalize());
  return p;
}

}  // namespace

Expected<ModelProfile> ProfileFromJson(const std::string& text) {
  ASSIGN_OR_RETURN(json j, Parse(kDoc, text));
  try {
    return ReadProfile(j);
  } catch (const json::exception& e) {
    return Corruption(std::string("profile: malformed field: ") + e.what());
  }
}

Expected<ModelProfile> LoadProfile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1ull << 30));
  auto p = ProfileFromJson(text);
  if (!p.ok()) return p.status().WithContext(path);
  return p;
}

Status SaveProfile(const ModelProfile& profile, const std::string& path) {
  ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(writer->Append(ProfileToJson(profile)));
  return writer->Commit();
}

// --- synthetic MoE ------------------------------------------------------------------------

namespace {

// Whole-model mean KLD of tiny-coder at each type (reference table in shared/README.md; Q5_K
// between Q6_K and Q4_K). Spread over ops, they give a profile of plausible scale.
double ReferenceKld(DType t) {
  switch (t) {
    case DType::kQ2_K: return 0.283912;
    case DType::kQ3_K: return 0.065013;
    case DType::kQ4_K: return 0.022918;
    case DType::kQ5_K: return 0.0090;
    case DType::kQ6_K: return 0.003484;
    case DType::kQ8_0: return 0.000565;
    default: return 0.0;
  }
}

ProfileTensor T(std::string name, std::vector<uint64_t> ne, int slice = -1) {
  return ProfileTensor{std::move(name), slice, std::move(ne)};
}

}  // namespace

Expected<ModelProfile> SynthesizeMoeProfile(const SynthMoeOptions& o) {
  if (o.layers <= 0 || o.layers > 1000 || o.experts <= 0 || o.experts > 4096 || o.top_k <= 0 ||
      o.top_k > o.experts || o.shared_experts < 0 || o.shared_experts > 16)
    return InvalidArgument("synth-moe: need 1 <= layers <= 1000, 1 <= top_k <= experts <= 4096, "
                           "0 <= shared_experts <= 16");
  if (o.d_model == 0 || o.d_model > 65536 || o.expert_ffn == 0 || o.expert_ffn > 65536 ||
      o.vocab == 0 || o.vocab > (1u << 22))
    return InvalidArgument("synth-moe: d_model, expert_ffn up to 65536 and vocab up to 4M");
  std::vector<DType> types = o.types;
  if (types.empty())
    types = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0, DType::kBF16};
  std::set<int> sensitive(o.sensitive_layers.begin(), o.sensitive_layers.end());
  if (o.sensitive_layers.empty()) sensitive = {0, 1, o.layers - 2, o.layers - 1};

  ModelProfile p;
  p.model_id = o.model_id;
  const uint64_t d = o.d_model, f = o.expert_ffn;
  auto add = [&](std::string id, std::string kind, int layer, double prob,
                 std::vector<ProfileTensor> tensors) {
    OpProfile op;
    op.id = std::move(id);
    op.kind = std::move(kind);
    op.layer = layer;
    op.activation_prob = prob;
    op.tensors = std::move(tensors);
    p.ops.push_back(std::move(op));
  };
  for (int l = 0; l < o.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const std::string id = "block_" + std::to_string(l);
    add(id + ".attn", "attn", l, 1.0,
        {T(b + "attn_q.weight", {d, d}), T(b + "attn_k.weight", {d, d}),
         T(b + "attn_v.weight", {d, d}), T(b + "attn_output.weight", {d, d})});
    add(id + ".moe.router", "router", l, 1.0,
        {T(b + "ffn_gate_inp.weight", {d, static_cast<uint64_t>(o.experts)})});
    if (o.shared_experts > 0) {
      const uint64_t fs = f * static_cast<uint64_t>(o.shared_experts);
      add(id + ".moe.shared", "shared_expert", l, 1.0,
          {T(b + "ffn_gate_shexp.weight", {d, fs}), T(b + "ffn_up_shexp.weight", {d, fs}),
           T(b + "ffn_down_shexp.weight", {fs, d})});
    }
    for (int e = 0; e < o.experts; ++e)
      add(id + ".moe.expert_" + std::to_string(e), "expert", l,
          static_cast<double>(o.top_k) / o.experts,
          {T(b + "ffn_gate_exps.weight", {d, f}, e), T(b + "ffn_up_exps.weight", {d, f}, e),
           T(b + "ffn_down_exps.weight", {f, d}, e)});
  }
  add("output", "output", -1, 1.0, {T("output.weight", {d, o.vocab})});

  // Each op's share of the whole-model loss: its parameters times how often it runs, heavier on
  // sensitive layers, attention and the output, with jitter so experts differ.
  std::mt19937_64 rng(o.seed);
  std::lognormal_distribution<double> jitter(0.0, 0.5);
  std::vector<double> share(p.ops.size());
  double total = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    OpProfile& op = p.ops[i];
    double params = static_cast<double>(*TensorBytesAt(op.tensors, DType::kF32)) / 4.0;
    double w = params * op.activation_prob * jitter(rng);
    if (sensitive.count(op.layer)) w *= 3.0;
    if (op.kind == "attn" || op.kind == "output") w *= 1.5;
    if (op.kind == "router") w *= 4.0;
    op.sensitivity = sensitive.count(op.layer) ? 0.5 : 0.0;
    share[i] = w;
    total += w;
  }
  for (size_t i = 0; i < p.ops.size(); ++i)
    for (DType t : types)
      p.ops[i].options.push_back(PrecisionOption{t, 0, ReferenceKld(t) * share[i] / total});
  // Token embedding (a row lookup per token) and a 4k-context KV cache: resident, not planned.
  p.overhead_bytes = o.vocab * d * 2 + static_cast<uint64_t>(o.layers) * 2 * 4096 * d * 2 / 4;
  RETURN_IF_ERROR(p.Normalize());
  return p;
}

}  // namespace substrate::compiler
