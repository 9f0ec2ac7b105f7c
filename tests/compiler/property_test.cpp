// Property test: over many random profiles and budgets, every plan that constructs keeps every
// invariant and its budget under any K escalations (checked here by code independent of the
// validator), and every infeasible request names a binding axis and relax options that work.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "compiler/planner.h"
#include "test_util.h"

namespace substrate::compiler {
namespace {

// Worst-case RAM of a plan computed from first principles: resident tensors, the streamed
// skeletons alive at each op (prefetched during the previous op, evicted after their own), and
// the K ops whose top tiers load the most streamed residual bytes. For small plans the K-subset
// is found by enumeration rather than by sorting.
uint64_t WorstCaseRam(const PlanBundle& plan) {
  std::map<std::string, const CatalogTensor*> cat;
  for (const auto& t : plan.tensor_catalog) cat[t.id] = &t;
  uint64_t resident = plan.overhead_bytes;
  for (const auto& t : plan.tensor_catalog)
    if (t.residency == Residency::kResident) resident += t.ram_bytes;
  const size_t n = plan.op_bundles.size();
  std::vector<uint64_t> own(n, 0);
  std::vector<uint64_t> escal;
  for (size_t i = 0; i < n; ++i) {
    const OpBundle& ob = plan.op_bundles[i];
    for (const auto& r : ob.tiers[0].requires_)
      if (cat[r]->residency == Residency::kStreamed) own[i] += cat[r]->ram_bytes;
    uint64_t e = 0;
    for (const auto& r : ob.tiers.back().requires_)
      if (cat[r]->tier > 0 && cat[r]->residency == Residency::kStreamed) e += cat[r]->ram_bytes;
    escal.push_back(e);
  }
  uint64_t window = 0;
  for (size_t i = 0; i < n; ++i) window = std::max(window, own[i] + (i + 1 < n ? own[i + 1] : 0));
  const int k = plan.escalation_policy.max_concurrent_escalations;
  uint64_t worst = 0;
  if (escal.size() <= 12) {
    for (uint32_t mask = 0; mask < (1u << escal.size()); ++mask) {
      if (__builtin_popcount(mask) > k) continue;
      uint64_t s = 0;
      for (size_t i = 0; i < escal.size(); ++i)
        if (mask & (1u << i)) s += escal[i];
      worst = std::max(worst, s);
    }
  } else {
    std::sort(escal.rbegin(), escal.rend());
    for (int i = 0; i < k && i < static_cast<int>(escal.size()); ++i) worst += escal[i];
  }
  return resident + window + worst;
}

CompileRequest RandomRequest(const ModelProfile& p, std::mt19937_64& rng) {
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  uint64_t lo = p.overhead_bytes, hi = p.overhead_bytes;
  double qlo = 0, qhi = 0;
  for (const auto& op : p.ops) {
    lo += op.options.front().bytes, hi += op.options.back().bytes;
    qlo += op.options.back().quality_loss, qhi += op.options.front().quality_loss;
  }
  CompileRequest r;
  r.budget.max_ram_bytes = static_cast<uint64_t>(uni(0.3, 1.6) * static_cast<double>(rng() % 2 ? lo : hi));
  r.budget.quality_loss_cap = uni(qlo * 0.8, qhi * 1.1);
  double full_t = 0;
  for (const auto& op : p.ops) full_t += op.activation_prob * op.options.front().bytes / p.hardware.memory_read_bw;
  r.budget.target_tokens_per_second = rng() % 3 == 0 ? 0.0 : uni(0.2, 1.5) / full_t;
  r.escalation.max_concurrent_escalations = static_cast<int>(rng() % 9);
  return r;
}

TEST(CompilerProperty, RandomProfilesKeepBudgetsOrNameAWayOut) {
  std::mt19937_64 rng(20261129);
  int feasible = 0, infeasible = 0, streamed_plans = 0, laddered = 0;
  std::map<std::string, int> binding;
  for (int iter = 0; iter < 1200; ++iter) {
    ModelProfile p = testing::RandomProfile(rng);
    CompileRequest req = RandomRequest(p, rng);
    SCOPED_TRACE("iteration " + std::to_string(iter));
    auto report = CheckFeasibility(p, req);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    if (report->feasible) {
      ++feasible;
      auto plan = CompilePlan(p, req);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      ASSERT_TRUE(Validate(*plan).ok());
      EXPECT_LE(WorstCaseRam(*plan), req.budget.max_ram_bytes);
      EXPECT_LE(plan->predicted.quality_loss, req.budget.quality_loss_cap);
      if (req.budget.target_tokens_per_second > 0) {
        EXPECT_GE(plan->predicted.tokens_per_second, req.budget.target_tokens_per_second);
      }
      for (const auto& ob : plan->op_bundles) {
        laddered += ob.tiers.size() > 1;
        for (size_t t = 1; t < ob.tiers.size(); ++t) {
          EXPECT_LE(ob.tiers[t].estimated_quality_risk, ob.tiers[t - 1].estimated_quality_risk);
          EXPECT_GE(ob.tiers[t].peak_ram_delta_bytes, ob.tiers[t - 1].peak_ram_delta_bytes);
        }
      }
      for (const auto& t : plan->tensor_catalog)
        if (t.tier == 0 && t.residency == Residency::kStreamed) { ++streamed_plans; break; }
      // The JSON form loads back to the same plan.
      std::string json = PlanToJson(*plan);
      auto back = PlanFromJson(json);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(PlanToJson(*back), json);
    } else {
      ++infeasible;
      ASSERT_FALSE(report->binding_axis.empty());
      binding[report->binding_axis]++;
      ASSERT_FALSE(report->relax_options.empty()) << "no relax option for binding axis " << report->binding_axis;
      for (const RelaxOption& o : report->relax_options) {
        CompileRequest relaxed = ApplyRelax(req, o);
        auto again = EvaluateAxes(p, relaxed);
        ASSERT_TRUE(again.ok());
        EXPECT_TRUE(again->feasible) << "relax option '" << o.description << "' does not make it feasible";
        auto plan = CompilePlan(p, relaxed);
        ASSERT_TRUE(plan.ok()) << o.description << ": " << plan.status().ToString();
        EXPECT_LE(WorstCaseRam(*plan), relaxed.budget.max_ram_bytes);
      }
    }
  }
  // The generator must exercise both outcomes, streaming, ladders and every kind of failure.
  EXPECT_GT(feasible, 100);
  EXPECT_GT(infeasible, 100);
  EXPECT_GT(streamed_plans, 20);
  EXPECT_GT(laddered, 100);
  EXPECT_GT(binding["memory"], 10);
  EXPECT_GT(binding["quality"], 10);
  EXPECT_GT(binding["latency"] + binding["bandwidth"], 10);
  std::printf("feasible %d, infeasible %d (memory %d, bandwidth %d, latency %d, quality %d), "
              "plans streaming skeletons %d\n", feasible, infeasible, binding["memory"],
              binding["bandwidth"], binding["latency"], binding["quality"], streamed_plans);
}

}  // namespace
}  // namespace substrate::compiler
