// From a feasible fill to a PlanBundle: tier ladders, pool admission, residual residency,
// catalog and op bundles. PlanBundle::Create re-checks every invariant at the end, so a bug
// here surfaces as a refused plan, never as a plan that breaks its budget.
#include <algorithm>
#include <set>

#include "compiler/fill.h"
#include "compiler/planner.h"
#include "core/memory_ledger.h"

namespace substrate::compiler {
namespace {

uint64_t AlignSsd(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

// Per-op escalation state while admitting tiers.
struct Ladder {
  int base = 0;                          // option index of tier 0
  int tiers = 1;                         // 1..3
  uint64_t residual[3] = {0, 0, 0};      // bytes tier k adds over tier k-1
  bool resident[3] = {true, false, false};
  uint64_t Delta(int k) const {          // streamed residual bytes tier k loads
    uint64_t d = 0;
    for (int j = 1; j <= k && j < tiers; ++j) d += resident[j] ? 0 : residual[j];
    return d;
  }
  uint64_t Ceiling() const { return Delta(tiers - 1); }
};

// The K largest ceiling deltas, kept sorted as ladders change.
class TopK {
 public:
  explicit TopK(int k) : k_(k) {}
  void Insert(uint64_t d, size_t op) { if (d) set_.insert({d, op}); }
  void Erase(uint64_t d, size_t op) { if (d) set_.erase({d, op}); }
  uint64_t Sum() const {
    uint64_t s = 0;
    int n = 0;
    for (auto it = set_.rbegin(); it != set_.rend() && n < k_; ++it, ++n) s += it->first;
    return s;
  }
  bool Empty() const { return set_.empty(); }
  std::pair<uint64_t, size_t> Largest() const { return *set_.rbegin(); }

 private:
  int k_;
  std::set<std::pair<uint64_t, size_t>> set_;
};

std::vector<Ladder> AdmitTiers(const ModelProfile& profile, const FillResult& fill,
                               uint64_t max_ram, int k, uint64_t* default_peak) {
  const size_t n = profile.ops.size();
  std::vector<Ladder> lad(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& opts = profile.ops[i].options;
    Ladder& l = lad[i];
    l.base = fill.choice[i];
    l.tiers = std::min<int>(3, static_cast<int>(opts.size()) - l.base);
    l.resident[0] = !fill.streamed[i];
    for (int t = 1; t < l.tiers; ++t) l.residual[t] = opts[l.base + t].bytes - opts[l.base + t - 1].bytes;
  }
  uint64_t peak = fill.peak();
  const uint64_t headroom = max_ram - peak;
  // Pool admission: while any K escalations could overflow the headroom, drop the top tier of
  // the largest.
  TopK top(k);
  for (size_t i = 0; i < n; ++i) top.Insert(lad[i].Ceiling(), i);
  while (!top.Empty() && top.Sum() > headroom) {
    auto [d, i] = top.Largest();
    top.Erase(d, i);
    lad[i].tiers -= 1;
    top.Insert(lad[i].Ceiling(), i);
  }
  // Residual residency: most sensitive first (quality gained by tier 1 per the profile), as
  // long as the default path plus any K escalations still fit.
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (lad[i].tiers > 1 && lad[i].resident[0]) order.push_back(i);
  auto gain = [&](size_t i) {
    const auto& op = profile.ops[i];
    return (op.options[lad[i].base].quality_loss - op.options[lad[i].base + 1].quality_loss) *
           (1.0 + op.sensitivity);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return gain(a) > gain(b); });
  for (size_t i : order) {
    for (int t = 1; t < lad[i].tiers; ++t) {
      uint64_t before = lad[i].Ceiling();
      top.Erase(before, i);
      lad[i].resident[t] = true;
      top.Insert(lad[i].Ceiling(), i);
      if (peak + lad[i].residual[t] + top.Sum() > max_ram) {
        top.Erase(lad[i].Ceiling(), i);
        lad[i].resident[t] = false;
        top.Insert(before, i);
        break;
      }
      peak += lad[i].residual[t];
    }
  }
  *default_peak = peak;
  return lad;
}

std::vector<std::string> SourceNames(const OpProfile& op) {
  std::vector<std::string> out;
  for (const ProfileTensor& t : op.tensors)
    out.push_back(t.slice >= 0 ? t.name + "#" + std::to_string(t.slice) : t.name);
  return out;
}

}  // namespace

Expected<PlanBundle> CompilePlan(const ModelProfile& profile, const CompileRequest& request) {
  ASSIGN_OR_RETURN(CompileRequest req, ResolveRequest(profile, request));
  FillResult fill = RunFill(profile, req.budget);
  {
    ASSIGN_OR_RETURN(FeasibilityReport axes, EvaluateAxes(profile, req));
    if (!axes.feasible) {
      ASSIGN_OR_RETURN(FeasibilityReport full, CheckFeasibility(profile, req));
      std::string msg = "compile: infeasible, binding axis " + full.binding_axis;
      for (const AxisReport& a : full.axes)
        if (a.axis == full.binding_axis) msg += " (" + a.detail + ")";
      if (!full.relax_options.empty()) {
        msg += "; relax options:";
        for (const RelaxOption& o : full.relax_options) msg += " [" + o.description + "]";
      }
      return Infeasible(msg);
    }
  }

  const int k = req.escalation.max_concurrent_escalations;
  uint64_t peak = 0;
  std::vector<Ladder> lad = AdmitTiers(profile, fill, req.budget.max_ram_bytes, k, &peak);

  PlanBundle plan;
  plan.model_id = profile.model_id;
  plan.budget = req.budget;
  plan.overhead_bytes = profile.overhead_bytes;
  plan.escalation_policy = req.escalation;
  plan.fallback_policy = req.fallback;
  for (size_t i = 0; i < profile.ops.size(); ++i) {
    const OpProfile& op = profile.ops[i];
    const Ladder& l = lad[i];
    OpBundle ob;
    ob.op_id = op.id;
    ob.activation_prob = op.activation_prob;
    std::vector<std::string> ids;
    for (int t = 0; t < l.tiers; ++t) {
      const PrecisionOption& o = op.options[l.base + t];
      CatalogTensor ct;
      ct.id = op.id + (t == 0 ? ".skeleton" : ".residual_" + std::to_string(t));
      ct.op_id = op.id;
      ct.tier = t;
      ct.precision = DTypeName(o.type);
      ct.ram_bytes = t == 0 ? o.bytes : l.residual[t];
      ct.ssd_bytes = AlignSsd(ct.ram_bytes);
      ct.residency = l.resident[t] ? Residency::kResident : Residency::kStreamed;
      ct.source_tensors = SourceNames(op);
      ids.push_back(ct.id);
      plan.tensor_catalog.push_back(std::move(ct));

      Tier tier;
      tier.tier_index = t;
      tier.precision = DTypeName(o.type);
      bool streams_residual = false;
      for (int j = 0; j <= t; ++j) {
        tier.requires_.push_back(ids[j]);
        if (l.resident[j]) continue;
        tier.prefetch.push_back({ids[j], i == 0 ? "" : profile.ops[i - 1].id, op.id});
        tier.evict_after.push_back(ids[j]);
        streams_residual = streams_residual || j > 0;
      }
      if (t == 0) tier.fallback = l.resident[0] ? FallbackStrategy::kNone : FallbackStrategy::kStall;
      else tier.fallback = streams_residual ? req.fallback.deadline_miss : FallbackStrategy::kNone;
      tier.estimated_quality_risk = o.quality_loss;
      tier.peak_ram_delta_bytes = l.Delta(t);
      ob.tiers.push_back(std::move(tier));
    }
    plan.op_bundles.push_back(std::move(ob));
  }
  plan.escalation_ram_pool_bytes = req.budget.max_ram_bytes - peak;
  plan.predicted.quality_loss = fill.quality_loss;
  plan.predicted.tokens_per_second = fill.tokens_per_second();
  plan.predicted.ssd_bytes_per_token = fill.ssd_bytes_per_token;
  plan.predicted.default_peak_ram_bytes = peak;
  const size_t step = std::max<size_t>(1, fill.curve.size() / 256);
  for (size_t i = 0; i < fill.curve.size(); i += step) plan.predicted.rd_curve.push_back(fill.curve[i]);
  if (plan.predicted.rd_curve.back() != fill.curve.back()) plan.predicted.rd_curve.push_back(fill.curve.back());
  return PlanBundle::Create(std::move(plan));
}

}  // namespace substrate::compiler
