#include "runtime/fallback_planner.h"

namespace substrate {

void FallbackPlanner::Reset(int n_ops) {
  ops_.assign(static_cast<size_t>(n_ops), Op{});
  counters_ = {};
}

void FallbackPlanner::SetFromPlan(int op, compiler::FallbackStrategy tier_fallback,
                                  compiler::FallbackStrategy deadline_miss) {
  const compiler::FallbackStrategy f =
      tier_fallback == compiler::FallbackStrategy::kNone ? deadline_miss : tier_fallback;
  if (f != compiler::FallbackStrategy::kNone)
    ops_[op].lower = f == compiler::FallbackStrategy::kUseLowerTier;
}

int FallbackPlanner::OnPredictedLate(int op, int want, int lowest_read, int held,
                                     FunctionRef<bool(int)> on_time) {
  ++counters_.predicted_late;
  if (!ops_[op].lower) return want;
  int tier = want;
  while (tier > lowest_read && !on_time(tier)) --tier;
  // Even the first tier read is late: an op holding lower tiers runs on them this token.
  if (held >= 0 && tier == lowest_read && !on_time(tier)) tier = held;
  if (tier < want) ++counters_.demoted;
  return tier;
}

bool FallbackPlanner::SkipMissing(int op, int held, int64_t pos) {
  if (!may_skip(op, held)) return false;
  ops_[op].skip_at = pos;
  ++counters_.skipped;
  return true;
}

}  // namespace substrate
