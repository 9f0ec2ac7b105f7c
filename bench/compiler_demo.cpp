// Benchmark: compile the seed's demo (27 layers, 64 experts, top-8, 36 GB budget, quality 0.05,
// 4 tokens/s, K=6) and print JSON with the time against the one-second goal.
#include <chrono>
#include <cstdio>

#include "compiler/planner.h"

using namespace substrate;
using namespace substrate::compiler;

int main() {
  SynthMoeOptions o;
  auto profile = SynthesizeMoeProfile(o);
  if (!profile.ok()) return std::fprintf(stderr, "%s\n", profile.status().ToString().c_str()), 1;
  // Fixed bandwidths so runs compare; `substrate synth-moe` measures the machine's own.
  profile->hardware = {2e10, 3e9, "bench constants"};
  CompileRequest req;
  req.budget.max_ram_bytes = 36ull * 1000 * 1000 * 1000;
  req.budget.quality_loss_cap = 0.05;
  req.budget.target_tokens_per_second = 4;
  req.escalation.max_concurrent_escalations = 6;
  double best = 1e30;
  Expected<PlanBundle> plan = Internal("not run");
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    plan = CompilePlan(*profile, req);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = s < best ? s : best;
    if (!plan.ok()) return std::fprintf(stderr, "%s\n", plan.status().ToString().c_str()), 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto report = CheckFeasibility(*profile, [&] { auto r = req; r.budget.max_ram_bytes = 2ull << 30; return r; }());
  double feas = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"benchmark\": \"compiler_demo\", \"ops\": %zu, \"compile_seconds\": %.4f, "
              "\"limit_seconds\": 1.0, \"ratio\": %.4f, \"infeasible_report_seconds\": %.4f, "
              "\"default_peak_bytes\": %llu, \"pool_bytes\": %llu, \"quality_loss\": %.5f, "
              "\"tokens_per_second\": %.3f, \"relax_options\": %zu}\n",
              plan->op_bundles.size(), best, best / 1.0, feas,
              static_cast<unsigned long long>(plan->predicted.default_peak_ram_bytes),
              static_cast<unsigned long long>(plan->escalation_ram_pool_bytes),
              plan->predicted.quality_loss, plan->predicted.tokens_per_second,
              report.ok() ? report->relax_options.size() : 0);
  return 0;
}
