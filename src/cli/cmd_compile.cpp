// substrate compile PROFILE --max-ram 36G --quality 0.05 --tps 4 --max-concurrent 6 -o plan.json
#include <cstdio>

#include "cli/command.h"
#include "compiler/planner.h"
#include "core/memory_ledger.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate compile PROFILE --max-ram BYTES --quality LOSS|min [--tps T]\n"
    "         [--max-concurrent K] [--mem-bw B/S] [--ssd-bw B/S] [--threshold 0.15]\n"
    "         [--persistence 32] -o plan.json\n";

int RunCompile(const std::vector<std::string>& args) {
  Flags f(args, {{"--max-ram", "--quality", "--tps", "--max-concurrent", "--mem-bw", "--ssd-bw",
                  "--threshold", "--persistence", "--out", "-o"},
                 {},
                 1});
  if (!f.status().ok()) return UsageError("compile", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  if (f.positional().size() != 1)
    return UsageError("compile", InvalidArgument("one PROFILE expected"), kUsage);
  std::string out = f.Get({"--out", "-o"});
  if (out.empty()) return PrintError("compile", InvalidArgument("-o plan.json is required"));
  if (f.Get({"--max-ram"}).empty()) return PrintError("compile", InvalidArgument("--max-ram is required"));
  if (f.Get({"--quality"}).empty()) return PrintError("compile", InvalidArgument("--quality is required"));
  auto profile = compiler::LoadProfile(f.positional()[0]);
  if (!profile.ok()) return PrintError("compile", profile.status());
  auto ram = ParseBytes(f.Get({"--max-ram"}));
  // "--quality min": the least loss the RAM and speed budget allow (fill to the budget).
  const bool fill_to_budget = f.Get({"--quality"}) == "min";
  auto q = fill_to_budget ? Expected<double>(0.0) : f.GetDouble({"--quality"}, 0);
  auto tps = f.GetDouble({"--tps"}, 0);
  auto mem = f.GetDouble({"--mem-bw"}, 0), ssd = f.GetDouble({"--ssd-bw"}, 0);
  auto thr = f.GetDouble({"--threshold"}, 0.15);
  auto k = f.GetInt({"--max-concurrent"}, 4), persist = f.GetInt({"--persistence"}, 32);
  if (!ram.ok()) return PrintError("compile", ram.status());
  for (auto* e : {&q, &tps, &mem, &ssd, &thr})
    if (!e->ok()) return PrintError("compile", e->status());
  for (auto* e : {&k, &persist})
    if (!e->ok()) return PrintError("compile", e->status());
  if (*k < 0 || *k > (1 << 20) || *persist < 0 || *persist > (1 << 30))
    return PrintError("compile", InvalidArgument("--max-concurrent and --persistence must be >= 0"));
  compiler::CompileRequest req;
  req.budget.max_ram_bytes = *ram;
  req.budget.quality_loss_cap = *q;
  req.budget.target_tokens_per_second = *tps;
  req.budget.memory_read_bw = *mem;
  req.budget.ssd_read_bw = *ssd;
  req.escalation.max_concurrent_escalations = static_cast<int>(*k);
  req.escalation.persistence_tokens = static_cast<int>(*persist);
  req.escalation.disagreement_threshold = *thr;
  if (fill_to_budget) {
    auto axes = compiler::EvaluateAxes(*profile, req);
    if (!axes.ok()) return PrintError("compile", axes.status());
    req.budget.quality_loss_cap = axes->quality_loss;  // exactly what the full fill reaches
  }
  auto plan = compiler::CompilePlan(*profile, req);
  if (!plan.ok()) return PrintError("compile", plan.status());
  Status st = compiler::SavePlan(*plan, out);
  if (!st.ok()) return PrintError("compile", st);
  int streamed = 0;
  for (const auto& t : plan->tensor_catalog) streamed += t.tier == 0 && t.residency == compiler::Residency::kStreamed;
  std::printf("wrote %s: %zu ops, default path peak %s of %s, escalation pool %s (K=%d)\n"
              "predicted: quality loss %.6g (cap %.6g), %.3f tokens/s, %d skeletons streamed "
              "(%s/token from SSD)\n",
              out.c_str(), plan->op_bundles.size(),
              FormatBytes(plan->predicted.default_peak_ram_bytes).c_str(),
              FormatBytes(plan->budget.max_ram_bytes).c_str(),
              FormatBytes(plan->escalation_ram_pool_bytes).c_str(),
              plan->escalation_policy.max_concurrent_escalations, plan->predicted.quality_loss,
              plan->budget.quality_loss_cap, plan->predicted.tokens_per_second, streamed,
              FormatBytes(static_cast<uint64_t>(plan->predicted.ssd_bytes_per_token)).c_str());
  return 0;
}

CommandRegistrar reg("compile", "compile a model profile and budget into a validated plan", &RunCompile);

}  // namespace
}  // namespace substrate::cli
