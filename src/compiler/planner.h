// The compiler proper: (profile, budget, K) -> feasibility report or a validated PlanBundle.
//
// Pipeline (the seed's, on measured numbers):
//   1. skeleton: every op at its cheapest precision, all resident; if that does not fit, ops
//      that run least often (experts) stream their skeleton from SSD, one op of lookahead.
//   2. greedy rate-distortion fill: repeatedly take the upgrade with the best
//      (quality gained / byte) * (1 + sensitivity) that still fits RAM and keeps the predicted
//      tokens/s at the target, until the quality cap is met.
//   3. tier ladders: tier k = k precision steps above tier 0; escalating loads only residuals.
//   4. pool admission: drop the top tier of the largest escalations until any K of them fit
//      the RAM left above the default path; then make residuals resident in sensitivity order
//      while that still holds.
//   5. op bundles with requires / prefetch / evict_after / fallback; PlanBundle::Create checks.
//
// Predicted tokens/s comes from the profile's measured memory and SSD read bandwidths: per op,
// max(time to read its resident bytes, time to read the next op's streamed bytes), weighted by
// how often each op runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compiler/plan_bundle.h"
#include "compiler/profile.h"

namespace substrate::compiler {

struct CompileRequest {
  Budget budget;  // bandwidths of 0 are taken from the profile's measurements
  EscalationPolicy escalation;
  FallbackPolicy fallback;
};

struct AxisReport {
  std::string axis;   // "memory", "bandwidth", "latency", "quality"
  bool ok = true;
  double required = 0;   // what the cheapest valid plan needs (bytes, bytes/s, tokens/s, loss)
  double available = 0;  // what the budget gives
  std::string detail;
};

// A change to the request that, applied as a whole, makes it feasible (verified).
struct RelaxOption {
  std::string description;  // "raise max-ram to 3.20 GiB"
  std::optional<uint64_t> max_ram_bytes;
  std::optional<double> quality_loss_cap;
  std::optional<double> target_tokens_per_second;
};

struct FeasibilityReport {
  bool feasible = false;
  std::vector<AxisReport> axes;  // memory, bandwidth, latency, quality
  std::string binding_axis;      // empty when feasible
  std::vector<RelaxOption> relax_options;
  // What the fill reached under the request.
  double quality_loss = 0;
  double tokens_per_second = 0;
  uint64_t default_peak_bytes = 0;
  int streamed_ops = 0;
};

// Fills bandwidths from the profile; an error when a needed bandwidth was never measured.
Expected<CompileRequest> ResolveRequest(const ModelProfile& profile, CompileRequest request);

// Axes and, when infeasible, relax options (each re-checked before it is offered).
Expected<FeasibilityReport> CheckFeasibility(const ModelProfile& profile, const CompileRequest& request);
// Only the axes (no relax search): what the property test re-checks options with.
Expected<FeasibilityReport> EvaluateAxes(const ModelProfile& profile, const CompileRequest& request);

CompileRequest ApplyRelax(CompileRequest request, const RelaxOption& option);

// A validated plan, or Infeasible naming the binding axis and the relax options.
Expected<PlanBundle> CompilePlan(const ModelProfile& profile, const CompileRequest& request);

std::string FeasibilityToJson(const FeasibilityReport& report);

}  // namespace substrate::compiler
