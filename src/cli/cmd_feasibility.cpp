// substrate feasibility PROFILE --max-ram 2G --quality 0.05 [--tps 4]: the four axes, the
// binding one and relax options (each re-checked), as JSON. Exit 0 feasible, 3 infeasible.
#include <cstdio>

#include "cli/command.h"
#include "compiler/planner.h"
#include "core/memory_ledger.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate feasibility PROFILE --max-ram BYTES --quality LOSS [--tps T]\n"
    "         [--max-concurrent K] [--mem-bw B/S] [--ssd-bw B/S]\n"
    "Prints the memory, bandwidth, latency and quality axes as JSON; exit 3 when infeasible.\n";

int RunFeasibility(const std::vector<std::string>& args) {
  Flags f(args,
          {{"--max-ram", "--quality", "--tps", "--max-concurrent", "--mem-bw", "--ssd-bw"}, {}, 1});
  if (!f.status().ok()) return UsageError("feasibility", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  if (f.positional().size() != 1)
    return UsageError("feasibility", InvalidArgument("one PROFILE expected"), kUsage);
  auto profile = compiler::LoadProfile(f.positional()[0]);
  if (!profile.ok()) return PrintError("feasibility", profile.status());
  compiler::CompileRequest req;
  if (f.Get({"--max-ram"}).empty()) return PrintError("feasibility", InvalidArgument("--max-ram is required"));
  if (f.Get({"--quality"}).empty()) return PrintError("feasibility", InvalidArgument("--quality is required"));
  auto ram = ParseBytes(f.Get({"--max-ram"}));
  auto q = f.GetDouble({"--quality"}, 0), tps = f.GetDouble({"--tps"}, 0);
  auto mem = f.GetDouble({"--mem-bw"}, 0), ssd = f.GetDouble({"--ssd-bw"}, 0);
  auto k = f.GetInt({"--max-concurrent"}, 4);
  if (!ram.ok()) return PrintError("feasibility", ram.status());
  for (auto* e : {&q, &tps, &mem, &ssd})
    if (!e->ok()) return PrintError("feasibility", e->status());
  if (!k.ok()) return PrintError("feasibility", k.status());
  req.budget.max_ram_bytes = *ram;
  req.budget.quality_loss_cap = *q;
  req.budget.target_tokens_per_second = *tps;
  req.budget.memory_read_bw = *mem;
  req.budget.ssd_read_bw = *ssd;
  req.escalation.max_concurrent_escalations = static_cast<int>(std::min<long long>(*k, 1 << 20));
  auto report = compiler::CheckFeasibility(*profile, req);
  if (!report.ok()) return PrintError("feasibility", report.status());
  std::fputs(compiler::FeasibilityToJson(*report).c_str(), stdout);
  return report->feasible ? 0 : 3;
}

CommandRegistrar reg("feasibility", "check a model profile against a RAM/quality/speed budget",
                     &RunFeasibility);

}  // namespace
}  // namespace substrate::cli
