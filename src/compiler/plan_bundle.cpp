// PlanBundle invariants. The loader trusts nothing a file says about sizes it can recompute:
// the default path's peak comes from the catalog and the prefetch windows, not from `predicted`.
#include "compiler/plan_bundle.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "core/memory_ledger.h"

namespace substrate::compiler {
namespace {

uint64_t SatAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

Status Broken(const char* invariant, const std::string& op, const std::string& what) {
  return InvalidArgument(std::string("plan: invariant ") + invariant + " broken at op '" + op +
                         "': " + what);
}

struct Index {
  std::unordered_map<std::string, size_t> tensor;  // catalog id -> index
  std::unordered_map<std::string, int> op;         // op id -> topological position
  std::vector<std::vector<size_t>> by_op;          // op position -> its catalog tensors
};

Expected<Index> BuildIndex(const PlanBundle& plan) {
  Index ix;
  ix.by_op.resize(plan.op_bundles.size());
  for (size_t i = 0; i < plan.op_bundles.size(); ++i) {
    const std::string& id = plan.op_bundles[i].op_id;
    if (id.empty())
      return Broken("references-resolve", "(unnamed)", "op_bundles[" + std::to_string(i) + "] has an empty op id");
    if (!ix.op.emplace(id, static_cast<int>(i)).second)
      return Broken("references-resolve", id, "op id appears twice in op_bundles");
  }
  for (size_t i = 0; i < plan.tensor_catalog.size(); ++i) {
    const CatalogTensor& t = plan.tensor_catalog[i];
    if (!ix.tensor.emplace(t.id, i).second)
      return Broken("references-resolve", t.op_id, "catalog tensor '" + t.id + "' appears twice");
    auto op = ix.op.find(t.op_id);
    if (op == ix.op.end())
      return Broken("references-resolve", t.op_id,
                    "catalog tensor '" + t.id + "' belongs to an op with no bundle");
    ix.by_op[op->second].push_back(i);
    if (t.tier < 0 || t.tier > 2)
      return Broken("references-resolve", t.op_id,
                    "catalog tensor '" + t.id + "' has tier " + std::to_string(t.tier));
  }
  return ix;
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

Status CheckTier(const PlanBundle& plan, const Index& ix, const OpBundle& ob, const Tier& tier,
                 int op_pos) {
  const std::string& op = ob.op_id;
  const std::string tname = "tier " + std::to_string(tier.tier_index);
  for (const std::string& r : tier.requires_) {
    auto it = ix.tensor.find(r);
    if (it == ix.tensor.end())
      return Broken("references-resolve", op, tname + " requires '" + r + "', not in the catalog");
    const CatalogTensor& t = plan.tensor_catalog[it->second];
    if (t.op_id != op || t.tier > tier.tier_index)
      return Broken("references-resolve", op,
                    tname + " requires '" + r + "' of op '" + t.op_id + "' tier " +
                        std::to_string(t.tier));
  }
  // Every tensor of this op at tier <= k must be required: otherwise the runtime would run the
  // op without bytes the plan charged for.
  for (size_t ci : ix.by_op[op_pos]) {
    const CatalogTensor& t = plan.tensor_catalog[ci];
    if (t.tier <= tier.tier_index && !Contains(tier.requires_, t.id))
      return Broken("references-resolve", op, tname + " does not require its tensor '" + t.id + "'");
  }
  uint64_t streamed_residual = 0;
  for (const std::string& r : tier.requires_) {
    const CatalogTensor& t = plan.tensor_catalog[ix.tensor.at(r)];
    bool evicted = Contains(tier.evict_after, r);
    if (t.residency == Residency::kStreamed) {
      if (!evicted)
        return Broken("references-resolve", op,
                      tname + ": streamed tensor '" + r + "' is never evicted (evict_after)");
      if (t.tier > 0) streamed_residual = SatAdd(streamed_residual, t.ram_bytes);
    } else if (evicted) {
      return Broken("references-resolve", op,
                    tname + ": resident tensor '" + r + "' listed in evict_after");
    }
  }
  for (const std::string& e : tier.evict_after)
    if (!Contains(tier.requires_, e))
      return Broken("references-resolve", op, tname + " evicts '" + e + "', which it does not require");
  for (const Prefetch& p : tier.prefetch) {
    if (!Contains(tier.requires_, p.tensor))
      return Broken("references-resolve", op,
                    tname + " prefetches '" + p.tensor + "', which it does not require");
    if (plan.tensor_catalog[ix.tensor.at(p.tensor)].residency != Residency::kStreamed)
      return Broken("references-resolve", op, tname + " prefetches resident tensor '" + p.tensor + "'");
    if (p.deadline_before != op)
      return Broken("prefetch-order", op,
                    tname + " prefetch of '" + p.tensor + "' has deadline_before '" +
                        p.deadline_before + "', not the op that needs it");
    if (!p.start_during.empty()) {
      auto it = ix.op.find(p.start_during);
      if (it == ix.op.end())
        return Broken("references-resolve", op,
                      tname + " prefetch starts during unknown op '" + p.start_during + "'");
      if (it->second >= op_pos)
        return Broken("prefetch-order", op,
                      tname + " prefetch of '" + p.tensor + "' starts during '" + p.start_during +
                          "', which does not come before its deadline");
    }
  }
  if (!std::isfinite(tier.estimated_quality_risk) || tier.estimated_quality_risk < 0)
    return Broken("risk-monotone", op, tname + " has a quality risk that is not a finite number >= 0");
  if (tier.peak_ram_delta_bytes < streamed_residual)
    return Broken("delta-monotone", op,
                  tname + " peak_ram_delta_bytes " + std::to_string(tier.peak_ram_delta_bytes) +
                      " is below the streamed residual bytes it loads (" +
                      std::to_string(streamed_residual) + ")");
  return Status::Ok();
}

// Names the ops holding the k largest deltas, for the pool messages.
std::string LargestOps(const std::vector<std::pair<uint64_t, std::string>>& deltas, int k) {
  auto sorted = deltas;
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::string out;
  for (int i = 0; i < k && i < static_cast<int>(sorted.size()) && i < 3; ++i) {
    if (i) out.append(", ");
    out.append(sorted[i].second).append(" (").append(FormatBytes(sorted[i].first)).append(")");
  }
  return out;
}

std::string LargestOpId(const std::vector<std::pair<uint64_t, std::string>>& deltas) {
  auto it = std::max_element(deltas.begin(), deltas.end(),
                             [](auto& a, auto& b) { return a.first < b.first; });
  return it->second;
}

}  // namespace

uint64_t SumOfKLargest(std::vector<uint64_t> values, int k) {
  if (k <= 0) return 0;
  if (static_cast<size_t>(k) < values.size()) {
    std::nth_element(values.begin(), values.begin() + k, values.end(), std::greater<>());
    values.resize(k);
  }
  uint64_t sum = 0;
  for (uint64_t v : values) sum = SatAdd(sum, v);
  return sum;
}

const char* ResidencyName(Residency r) { return r == Residency::kResident ? "resident" : "streamed"; }

const char* FallbackName(FallbackStrategy f) {
  switch (f) {
    case FallbackStrategy::kNone: return "none";
    case FallbackStrategy::kStall: return "stall";
    case FallbackStrategy::kUseLowerTier: return "use_lower_tier";
  }
  return "?";
}

Expected<PlanFootprint> ComputeFootprint(const PlanBundle& plan) {
  ASSIGN_OR_RETURN(Index ix, BuildIndex(plan));
  PlanFootprint fp;
  fp.resident_bytes = plan.overhead_bytes;
  for (const CatalogTensor& t : plan.tensor_catalog)
    if (t.residency == Residency::kResident) fp.resident_bytes = SatAdd(fp.resident_bytes, t.ram_bytes);
  // A streamed tier-0 tensor is alive from the op whose window issues its read to the op that
  // evicts it; sweep those intervals for the most bytes alive at once.
  const size_t n = plan.op_bundles.size();
  std::vector<uint64_t> add(n + 1, 0), sub(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const OpBundle& ob = plan.op_bundles[i];
    if (ob.tiers.empty()) continue;
    const Tier& t0 = ob.tiers[0];
    for (const std::string& r : t0.requires_) {
      auto it = ix.tensor.find(r);
      if (it == ix.tensor.end()) continue;  // Validate reports it
      const CatalogTensor& t = plan.tensor_catalog[it->second];
      if (t.residency != Residency::kStreamed) continue;
      size_t start = i;
      for (const Prefetch& p : t0.prefetch) {
        if (p.tensor != r) continue;
        auto o = ix.op.find(p.start_during);
        start = (p.start_during.empty() || o == ix.op.end()) ? 0 : std::min<size_t>(o->second, i);
      }
      add[start] = SatAdd(add[start], t.ram_bytes);
      sub[i + 1] = SatAdd(sub[i + 1], t.ram_bytes);
    }
  }
  uint64_t alive = 0;
  for (size_t i = 0; i < n; ++i) {
    alive = SatAdd(alive, add[i]) - std::min(alive, sub[i]);
    if (alive > fp.stream_window_bytes) {
      fp.stream_window_bytes = alive;
      fp.window_peak_op = plan.op_bundles[i].op_id;
    }
  }
  fp.default_peak_bytes = SatAdd(fp.resident_bytes, fp.stream_window_bytes);
  return fp;
}

Status Validate(const PlanBundle& plan) {
  const Budget& b = plan.budget;
  for (double v : {b.ssd_read_bw, b.memory_read_bw, b.quality_loss_cap, b.target_tokens_per_second})
    if (!std::isfinite(v) || v < 0)
      return InvalidArgument("plan: budget holds a value that is not a finite number >= 0");
  if (plan.escalation_policy.max_concurrent_escalations < 0)
    return InvalidArgument("plan: escalation_policy.max_concurrent_escalations is negative");
  if (plan.op_bundles.empty()) return InvalidArgument("plan: no op bundles");
  ASSIGN_OR_RETURN(Index ix, BuildIndex(plan));

  std::vector<std::pair<uint64_t, std::string>> tier1, ceiling;
  for (size_t i = 0; i < plan.op_bundles.size(); ++i) {
    const OpBundle& ob = plan.op_bundles[i];
    if (ob.tiers.empty() || ob.tiers.size() > 3)
      return Broken("references-resolve", ob.op_id,
                    "has " + std::to_string(ob.tiers.size()) + " tiers (1 to 3 allowed)");
    if (!std::isfinite(ob.activation_prob) || ob.activation_prob < 0 || ob.activation_prob > 1)
      return Broken("references-resolve", ob.op_id, "activation_prob is not in [0, 1]");
    for (size_t k = 0; k < ob.tiers.size(); ++k) {
      const Tier& t = ob.tiers[k];
      if (t.tier_index != static_cast<int>(k))
        return Broken("references-resolve", ob.op_id,
                      "tier at position " + std::to_string(k) + " has tier_index " +
                          std::to_string(t.tier_index));
      RETURN_IF_ERROR(CheckTier(plan, ix, ob, t, static_cast<int>(i)));
      if (k == 0 && t.peak_ram_delta_bytes != 0)
        return Broken("delta-monotone", ob.op_id, "tier 0 has a non-zero peak_ram_delta_bytes");
      if (k > 0) {
        const Tier& prev = ob.tiers[k - 1];
        if (t.estimated_quality_risk > prev.estimated_quality_risk)
          return Broken("risk-monotone", ob.op_id,
                        "tier " + std::to_string(k) + " risk " +
                            std::to_string(t.estimated_quality_risk) + " > tier " +
                            std::to_string(k - 1) + " risk " +
                            std::to_string(prev.estimated_quality_risk));
        if (t.peak_ram_delta_bytes < prev.peak_ram_delta_bytes)
          return Broken("delta-monotone", ob.op_id,
                        "tier " + std::to_string(k) + " delta " +
                            std::to_string(t.peak_ram_delta_bytes) + " < tier " +
                            std::to_string(k - 1) + " delta " +
                            std::to_string(prev.peak_ram_delta_bytes));
      }
    }
    if (ob.tiers.size() > 1) {
      tier1.emplace_back(ob.tiers[1].peak_ram_delta_bytes, ob.op_id);
      ceiling.emplace_back(ob.tiers.back().peak_ram_delta_bytes, ob.op_id);
    }
  }

  ASSIGN_OR_RETURN(PlanFootprint fp, ComputeFootprint(plan));
  if (fp.default_peak_bytes > b.max_ram_bytes)
    return Broken("default-path-fits", fp.window_peak_op.empty() ? plan.op_bundles[0].op_id
                                                                 : fp.window_peak_op,
                  "all-tier-0 peak " + FormatBytes(fp.default_peak_bytes) + " (resident " +
                      FormatBytes(fp.resident_bytes) + " + stream window " +
                      FormatBytes(fp.stream_window_bytes) + ") exceeds max_ram_bytes " +
                      FormatBytes(b.max_ram_bytes));
  if (SatAdd(fp.default_peak_bytes, plan.escalation_ram_pool_bytes) > b.max_ram_bytes)
    return Broken("pool-fits-budget", plan.op_bundles[0].op_id,
                  "default peak " + FormatBytes(fp.default_peak_bytes) + " + escalation pool " +
                      FormatBytes(plan.escalation_ram_pool_bytes) + " exceeds max_ram_bytes " +
                      FormatBytes(b.max_ram_bytes));
  const int k = plan.escalation_policy.max_concurrent_escalations;
  auto check_pool = [&](const char* name, const std::vector<std::pair<uint64_t, std::string>>& d,
                        const char* what) -> Status {
    std::vector<uint64_t> v;
    for (auto& [bytes, op] : d) v.push_back(bytes);
    uint64_t need = SumOfKLargest(v, k);
    if (need > plan.escalation_ram_pool_bytes)
      return Broken(name, d.empty() ? plan.op_bundles[0].op_id : LargestOpId(d),
                    std::string("the ") + std::to_string(k) + " largest " + what + " deltas sum to " +
                        FormatBytes(need) + " > escalation_ram_pool_bytes " +
                        FormatBytes(plan.escalation_ram_pool_bytes) + " (largest: " +
                        LargestOps(d, k) + ")");
    return Status::Ok();
  };
  RETURN_IF_ERROR(check_pool("pool-k-tier1", tier1, "tier-1"));
  RETURN_IF_ERROR(check_pool("pool-k-ceiling", ceiling, "top-tier"));
  return Status::Ok();
}

Expected<PlanBundle> PlanBundle::Create(PlanBundle plan) {
  RETURN_IF_ERROR(Validate(plan));
  return plan;
}

const OpBundle* PlanBundle::Bundle(const std::string& op_id) const {
  for (const OpBundle& ob : op_bundles)
    if (ob.op_id == op_id) return &ob;
  return nullptr;
}

}  // namespace substrate::compiler
