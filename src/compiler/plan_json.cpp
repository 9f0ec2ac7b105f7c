// PlanBundle <-> JSON. The document carries a schema name and version; the reader refuses other
// versions, names the path of any malformed field, then runs every invariant (Validate).
#include <cmath>

#include "compiler/json_read.h"
#include "compiler/plan_bundle.h"
#include "core/file_io.h"

namespace substrate::compiler {
namespace {

using nlohmann::json;
using namespace jsonr;

const std::string kDoc = "plan";

json FallbackJson(FallbackStrategy f) { return FallbackName(f); }

Expected<FallbackStrategy> ParseFallback(const std::string& path, const std::string& s) {
  if (s == "none") return FallbackStrategy::kNone;
  if (s == "stall") return FallbackStrategy::kStall;
  if (s == "use_lower_tier") return FallbackStrategy::kUseLowerTier;
  return Corruption("plan: " + path + ": unknown fallback '" + s +
                    "' (none, stall, use_lower_tier)");
}

Expected<Budget> ReadBudget(const json& j) {
  Budget b;
  const std::string p = "budget";
  ASSIGN_OR_RETURN(b.max_ram_bytes, U64(kDoc, j, p, "max_ram_bytes"));
  ASSIGN_OR_RETURN(b.max_ssd_cache_bytes, U64(kDoc, j, p, "max_ssd_cache_bytes"));
  ASSIGN_OR_RETURN(b.ssd_read_bw, F64(kDoc, j, p, "ssd_read_bw_bytes_per_s"));
  ASSIGN_OR_RETURN(b.memory_read_bw, F64(kDoc, j, p, "memory_read_bw_bytes_per_s"));
  ASSIGN_OR_RETURN(b.quality_loss_cap, F64(kDoc, j, p, "quality_loss_cap"));
  ASSIGN_OR_RETURN(b.target_tokens_per_second, F64(kDoc, j, p, "target_tokens_per_second"));
  return b;
}

Expected<CatalogTensor> ReadCatalogTensor(const json& j, const std::string& p) {
  CatalogTensor t;
  ASSIGN_OR_RETURN(t.id, Str(kDoc, j, p, "id"));
  ASSIGN_OR_RETURN(t.op_id, Str(kDoc, j, p, "op"));
  ASSIGN_OR_RETURN(int64_t tier, I64(kDoc, j, p, "tier"));
  if (tier < 0 || tier > 2) return Corruption("plan: " + p + ".tier: " + std::to_string(tier) + " not in 0..2");
  t.tier = static_cast<int>(tier);
  ASSIGN_OR_RETURN(t.precision, Str(kDoc, j, p, "precision"));
  ASSIGN_OR_RETURN(t.ram_bytes, U64(kDoc, j, p, "ram_bytes"));
  ASSIGN_OR_RETURN(t.ssd_bytes, U64(kDoc, j, p, "ssd_bytes"));
  ASSIGN_OR_RETURN(std::string res, Str(kDoc, j, p, "residency"));
  if (res == "resident") t.residency = Residency::kResident;
  else if (res == "streamed") t.residency = Residency::kStreamed;
  else return Corruption("plan: " + p + ".residency: '" + res + "' is neither resident nor streamed");
  if (j.contains("source_tensors")) {
    ASSIGN_OR_RETURN(t.source_tensors, StrArr(kDoc, j, p, "source_tensors"));
  }
  return t;
}

Expected<Tier> ReadTier(const json& j, const std::string& p) {
  Tier t;
  ASSIGN_OR_RETURN(int64_t idx, I64(kDoc, j, p, "tier_index"));
  if (idx < 0 || idx > 2) return Corruption("plan: " + p + ".tier_index: " + std::to_string(idx) + " not in 0..2");
  t.tier_index = static_cast<int>(idx);
  ASSIGN_OR_RETURN(t.precision, Str(kDoc, j, p, "precision"));
  ASSIGN_OR_RETURN(t.requires_, StrArr(kDoc, j, p, "requires"));
  ASSIGN_OR_RETURN(t.evict_after, StrArr(kDoc, j, p, "evict_after"));
  ASSIGN_OR_RETURN(const json* pf, Arr(kDoc, j, p, "prefetch"));
  for (size_t i = 0; i < pf->size(); ++i) {
    const std::string pp = p + ".prefetch[" + std::to_string(i) + "]";
    Prefetch x;
    ASSIGN_OR_RETURN(x.tensor, Str(kDoc, (*pf)[i], pp, "tensor"));
    ASSIGN_OR_RETURN(x.start_during, Str(kDoc, (*pf)[i], pp, "start_during"));
    ASSIGN_OR_RETURN(x.deadline_before, Str(kDoc, (*pf)[i], pp, "deadline_before"));
    t.prefetch.push_back(std::move(x));
  }
  ASSIGN_OR_RETURN(std::string fb, Str(kDoc, j, p, "fallback"));
  ASSIGN_OR_RETURN(t.fallback, ParseFallback(p + ".fallback", fb));
  ASSIGN_OR_RETURN(t.estimated_quality_risk, F64(kDoc, j, p, "estimated_quality_risk"));
  ASSIGN_OR_RETURN(t.peak_ram_delta_bytes, U64(kDoc, j, p, "peak_ram_delta_bytes"));
  return t;
}

Expected<PlanBundle> ReadPlan(const json& j) {
  PlanBundle plan;
  ASSIGN_OR_RETURN(std::string schema, Str(kDoc, j, "$", "schema"));
  if (schema != kPlanSchemaName)
    return Corruption("plan: schema is '" + schema + "', expected '" + kPlanSchemaName + "'");
  ASSIGN_OR_RETURN(int64_t version, I64(kDoc, j, "$", "version"));
  if (version != kPlanSchemaVersion)
    return Corruption("plan: schema version " + std::to_string(version) + " is not supported (this build reads " +
                      std::to_string(kPlanSchemaVersion) + ")");
  ASSIGN_OR_RETURN(plan.model_id, Str(kDoc, j, "$", "model_id"));
  ASSIGN_OR_RETURN(const json* budget, Field(kDoc, j, "$", "budget"));
  ASSIGN_OR_RETURN(plan.budget, ReadBudget(*budget));
  ASSIGN_OR_RETURN(plan.overhead_bytes, U64(kDoc, j, "$", "overhead_bytes"));
  ASSIGN_OR_RETURN(const json* cat, Arr(kDoc, j, "$", "tensor_catalog"));
  for (size_t i = 0; i < cat->size(); ++i) {
    ASSIGN_OR_RETURN(CatalogTensor t, ReadCatalogTensor((*cat)[i], "tensor_catalog[" + std::to_string(i) + "]"));
    plan.tensor_catalog.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(const json* obs, Arr(kDoc, j, "$", "op_bundles"));
  for (size_t i = 0; i < obs->size(); ++i) {
    const std::string p = "op_bundles[" + std::to_string(i) + "]";
    OpBundle ob;
    ASSIGN_OR_RETURN(ob.op_id, Str(kDoc, (*obs)[i], p, "op_id"));
    ASSIGN_OR_RETURN(ob.activation_prob, F64(kDoc, (*obs)[i], p, "activation_prob"));
    ASSIGN_OR_RETURN(const json* tiers, Arr(kDoc, (*obs)[i], p, "tiers"));
    for (size_t k = 0; k < tiers->size(); ++k) {
      ASSIGN_OR_RETURN(Tier t, ReadTier((*tiers)[k], p + ".tiers[" + std::to_string(k) + "]"));
      ob.tiers.push_back(std::move(t));
    }
    plan.op_bundles.push_back(std::move(ob));
  }
  ASSIGN_OR_RETURN(const json* esc, Field(kDoc, j, "$", "escalation_policy"));
  ASSIGN_OR_RETURN(plan.escalation_policy.disagreement_threshold,
                   F64(kDoc, *esc, "escalation_policy", "disagreement_threshold"));
  ASSIGN_OR_RETURN(int64_t persist, I64(kDoc, *esc, "escalation_policy", "persistence_tokens"));
  ASSIGN_OR_RETURN(int64_t maxc, I64(kDoc, *esc, "escalation_policy", "max_concurrent_escalations"));
  if (persist < 0 || persist > 1000000000 || maxc < 0 || maxc > 1000000000)
    return Corruption("plan: escalation_policy: persistence_tokens and max_concurrent_escalations must be in 0..1e9");
  plan.escalation_policy.persistence_tokens = static_cast<int>(persist);
  plan.escalation_policy.max_concurrent_escalations = static_cast<int>(maxc);
  ASSIGN_OR_RETURN(const json* fb, Field(kDoc, j, "$", "fallback_policy"));
  ASSIGN_OR_RETURN(std::string dm, Str(kDoc, *fb, "fallback_policy", "deadline_miss"));
  ASSIGN_OR_RETURN(plan.fallback_policy.deadline_miss, ParseFallback("fallback_policy.deadline_miss", dm));
  ASSIGN_OR_RETURN(plan.fallback_policy.latency_critical_factor,
                   F64(kDoc, *fb, "fallback_policy", "latency_critical_factor"));
  ASSIGN_OR_RETURN(plan.fallback_policy.ssd_bw_critical_factor,
                   F64(kDoc, *fb, "fallback_policy", "ssd_bw_critical_factor"));
  ASSIGN_OR_RETURN(plan.escalation_ram_pool_bytes, U64(kDoc, j, "$", "escalation_ram_pool_bytes"));
  if (j.contains("predicted") && j["predicted"].is_object()) {  // informative only
    const json& pr = j["predicted"];
    plan.predicted.quality_loss = pr.value("quality_loss", 0.0);
    plan.predicted.tokens_per_second = pr.value("tokens_per_second", 0.0);
    plan.predicted.ssd_bytes_per_token = pr.value("ssd_bytes_per_token", 0.0);
    plan.predicted.default_peak_ram_bytes = pr.value("default_peak_ram_bytes", uint64_t{0});
    if (pr.contains("rd_curve") && pr["rd_curve"].is_array())
      for (const json& pt : pr["rd_curve"])
        if (pt.is_array() && pt.size() == 2 && pt[0].is_number_unsigned() && pt[1].is_number())
          plan.predicted.rd_curve.emplace_back(pt[0].get<uint64_t>(), pt[1].get<double>());
  }
  return plan;
}

double BitsPerWeight(DType t) {
  const auto& tr = GetDTypeTraits(t);
  return tr.block_size ? 8.0 * tr.block_bytes / tr.block_size : 0;
}

}  // namespace

Expected<std::map<std::string, DType>> PlanTensorTypes(const PlanBundle& plan, std::string* note) {
  std::map<std::string, DType> out;
  for (const CatalogTensor& t : plan.tensor_catalog) {
    if (t.tier != 0) continue;
    auto type = DTypeFromName(t.precision);
    if (!type) return InvalidArgument("plan: tensor '" + t.id + "' has unknown precision '" + t.precision + "'");
    for (const std::string& src : t.source_tensors) {
      std::string name = src.substr(0, src.find('#'));
      auto [it, fresh] = out.emplace(name, *type);
      if (!fresh && it->second != *type) {
        if (note) *note += "tensor '" + name + "': expert slices disagree; the most precise type is used\n";
        if (BitsPerWeight(*type) > BitsPerWeight(it->second)) it->second = *type;
      }
    }
  }
  return out;
}

std::string PlanToJson(const PlanBundle& plan) {
  json j;
  j["schema"] = kPlanSchemaName;
  j["version"] = kPlanSchemaVersion;
  j["model_id"] = plan.model_id;
  const Budget& b = plan.budget;
  j["budget"] = {{"max_ram_bytes", b.max_ram_bytes},
                 {"max_ssd_cache_bytes", b.max_ssd_cache_bytes},
                 {"ssd_read_bw_bytes_per_s", b.ssd_read_bw},
                 {"memory_read_bw_bytes_per_s", b.memory_read_bw},
                 {"quality_loss_cap", b.quality_loss_cap},
                 {"target_tokens_per_second", b.target_tokens_per_second}};
  j["overhead_bytes"] = plan.overhead_bytes;
  json cat = json::array();
  for (const CatalogTensor& t : plan.tensor_catalog)
    cat.push_back({{"id", t.id}, {"op", t.op_id}, {"tier", t.tier}, {"precision", t.precision},
                   {"ram_bytes", t.ram_bytes}, {"ssd_bytes", t.ssd_bytes},
                   {"residency", ResidencyName(t.residency)}, {"source_tensors", t.source_tensors}});
  j["tensor_catalog"] = std::move(cat);
  json obs = json::array();
  for (const OpBundle& ob : plan.op_bundles) {
    json tiers = json::array();
    for (const Tier& t : ob.tiers) {
      json pf = json::array();
      for (const Prefetch& p : t.prefetch)
        pf.push_back({{"tensor", p.tensor}, {"start_during", p.start_during},
                      {"deadline_before", p.deadline_before}});
      tiers.push_back({{"tier_index", t.tier_index}, {"precision", t.precision},
                       {"requires", t.requires_}, {"prefetch", std::move(pf)},
                       {"evict_after", t.evict_after}, {"fallback", FallbackJson(t.fallback)},
                       {"estimated_quality_risk", t.estimated_quality_risk},
                       {"peak_ram_delta_bytes", t.peak_ram_delta_bytes}});
    }
    obs.push_back({{"op_id", ob.op_id}, {"activation_prob", ob.activation_prob}, {"tiers", std::move(tiers)}});
  }
  j["op_bundles"] = std::move(obs);
  j["escalation_policy"] = {
      {"disagreement_threshold", plan.escalation_policy.disagreement_threshold},
      {"persistence_tokens", plan.escalation_policy.persistence_tokens},
      {"max_concurrent_escalations", plan.escalation_policy.max_concurrent_escalations}};
  j["fallback_policy"] = {{"deadline_miss", FallbackJson(plan.fallback_policy.deadline_miss)},
                          {"latency_critical_factor", plan.fallback_policy.latency_critical_factor},
                          {"ssd_bw_critical_factor", plan.fallback_policy.ssd_bw_critical_factor}};
  j["escalation_ram_pool_bytes"] = plan.escalation_ram_pool_bytes;
  // For `substrate quantize --plan`: the tier-0 type of every GGUF tensor.
  json types = json::object();
  if (auto tt = PlanTensorTypes(plan); tt.ok())
    for (const auto& [name, type] : *tt) types[name] = DTypeName(type);
  j["tensor_types"] = std::move(types);
  json curve = json::array();
  for (auto& [bytes, q] : plan.predicted.rd_curve) curve.push_back({bytes, q});
  j["predicted"] = {{"quality_loss", plan.predicted.quality_loss},
                    {"tokens_per_second", plan.predicted.tokens_per_second},
                    {"ssd_bytes_per_token", plan.predicted.ssd_bytes_per_token},
                    {"default_peak_ram_bytes", plan.predicted.default_peak_ram_bytes},
                    {"rd_curve", std::move(curve)}};
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

Expected<PlanBundle> PlanFromJson(const std::string& text) {
  ASSIGN_OR_RETURN(json j, Parse(kDoc, text));
  if (!j.is_object()) return Corruption("plan: the document is not a JSON object");
  // The typed readers check before they convert; the catch is for anything they missed.
  Expected<PlanBundle> plan = Corruption("plan: unreadable");
  try {
    plan = ReadPlan(j);
  } catch (const json::exception& e) {
    return Corruption(std::string("plan: malformed field: ") + e.what());
  }
  if (!plan.ok()) return plan.status();
  return PlanBundle::Create(std::move(plan).value());
}

Expected<PlanBundle> LoadPlan(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1ull << 30));
  auto plan = PlanFromJson(text);
  if (!plan.ok()) return plan.status().WithContext(path);
  return plan;
}

Status SavePlan(const PlanBundle& plan, const std::string& path) {
  RETURN_IF_ERROR(Validate(plan));  // never write a plan that would not load
  ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(writer->Append(PlanToJson(plan)));
  return writer->Commit();
}

}  // namespace substrate::compiler
