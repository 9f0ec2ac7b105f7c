// substrate inspect plan.json [--ops N] [--svg FILE]: loads (and so re-validates) a plan and
// prints its budget, footprint and tier ladders.
#include <cstdio>
#include <map>

#include "cli/command.h"
#include "compiler/plan_bundle.h"
#include "compiler/plan_svg.h"
#include "core/file_io.h"
#include "core/memory_ledger.h"

namespace substrate::cli {
namespace {

int RunInspect(const std::vector<std::string>& args) {
  constexpr const char* kUsage =
      "usage: substrate inspect plan.json [--ops N (default 40, 0 = all)] [--svg FILE]\n";
  Flags f(args, {{"--svg", "--ops"}, {}, 1});
  if (!f.status().ok()) return UsageError("inspect", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  if (f.positional().size() != 1)
    return UsageError("inspect", InvalidArgument("one plan.json expected"), kUsage);
  auto plan = compiler::LoadPlan(f.positional()[0]);
  if (!plan.ok()) return PrintError("inspect", plan.status());
  auto max_ops = f.GetInt({"--ops"}, 40);
  if (!max_ops.ok()) return PrintError("inspect", max_ops.status());
  auto fp = compiler::ComputeFootprint(*plan);
  if (!fp.ok()) return PrintError("inspect", fp.status());
  const auto& b = plan->budget;
  std::printf("plan for %s (schema %s v%d): valid, every invariant holds\n", plan->model_id.c_str(),
              compiler::kPlanSchemaName, compiler::kPlanSchemaVersion);
  std::printf("budget: max RAM %s, quality cap %.6g, target %.3g tokens/s, memory %s/s, SSD %s/s\n",
              FormatBytes(b.max_ram_bytes).c_str(), b.quality_loss_cap, b.target_tokens_per_second,
              FormatBytes(static_cast<uint64_t>(b.memory_read_bw)).c_str(),
              FormatBytes(static_cast<uint64_t>(b.ssd_read_bw)).c_str());
  std::printf("default path: resident %s (overhead %s) + stream window %s = %s\n",
              FormatBytes(fp->resident_bytes).c_str(), FormatBytes(plan->overhead_bytes).c_str(),
              FormatBytes(fp->stream_window_bytes).c_str(), FormatBytes(fp->default_peak_bytes).c_str());
  std::printf("escalation pool %s, K=%d, threshold %.3g, persistence %d tokens\n",
              FormatBytes(plan->escalation_ram_pool_bytes).c_str(),
              plan->escalation_policy.max_concurrent_escalations,
              plan->escalation_policy.disagreement_threshold, plan->escalation_policy.persistence_tokens);
  std::printf("predicted: quality loss %.6g, %.3f tokens/s, %s/token from SSD\n",
              plan->predicted.quality_loss, plan->predicted.tokens_per_second,
              FormatBytes(static_cast<uint64_t>(plan->predicted.ssd_bytes_per_token)).c_str());
  std::map<std::string, int> by_type;
  std::map<std::string, const compiler::CatalogTensor*> skeleton;
  for (const auto& t : plan->tensor_catalog)
    if (t.tier == 0) by_type[t.precision]++, skeleton[t.op_id] = &t;
  std::printf("tier-0 precisions:");
  for (auto& [t, n] : by_type) std::printf(" %s x%d", t.c_str(), n);
  std::printf("\n\n%-32s %-9s %-9s %s\n", "op", "skeleton", "residency", "tiers (precision risk delta)");
  long long shown = 0;
  for (const auto& ob : plan->op_bundles) {
    if (*max_ops > 0 && shown++ >= *max_ops) {
      std::printf("... %zu more ops (--ops 0 shows all)\n", plan->op_bundles.size() - static_cast<size_t>(*max_ops));
      break;
    }
    const auto* sk = skeleton[ob.op_id];
    std::printf("%-32s %-9s %-9s", ob.op_id.c_str(), sk ? FormatBytes(sk->ram_bytes).c_str() : "?",
                sk ? compiler::ResidencyName(sk->residency) : "?");
    for (const auto& t : ob.tiers)
      std::printf("  [%s %.3g +%s]", t.precision.c_str(), t.estimated_quality_risk,
                  FormatBytes(t.peak_ram_delta_bytes).c_str());
    std::printf("\n");
  }
  std::string svg = f.Get({"--svg"});
  if (!svg.empty()) {
    Status st = WriteFileAtomic(svg, compiler::PlanToSvg(*plan));
    if (!st.ok()) return PrintError("inspect", st);
    std::printf("wrote %s\n", svg.c_str());
  }
  return 0;
}

CommandRegistrar reg("inspect", "print a compiled plan (and draw it with --svg)", &RunInspect);

}  // namespace
}  // namespace substrate::cli
