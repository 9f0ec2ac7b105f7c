// FallbackPlanner: what an op does when the read of its tensors will miss, or has missed, the
// moment the op runs (the plan's fallback_policy, the Substrate seed's "FallbackPlanner"):
//   wait         the op waits for its read (a stall);
//   lower tier   the read is made at a lower tier, whose bytes arrive in time;
//   skip         an op whose lower tiers are already in memory (a resident skeleton, an expert's
//                cached skeleton) runs on them this token and leaves its residual for later.
// Lower tier and skip are one policy (the plan's kUseLowerTier): skipping is the lowest tier.
// The planner owns each op's policy, the position at which an op skips its residual, and the
// counters; the residency manager asks it at admission (a read predicted late) and when an op
// begins without its residual (not read yet, or still in flight).
//
// Not thread-safe: the ResidencyManager calls it under its own lock. No call allocates.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/plan_bundle.h"
#include "core/function_ref.h"

namespace substrate {

struct FallbackCounters {
  uint64_t predicted_late = 0;  // admission: reads predicted to miss their deadline
  uint64_t demoted = 0;         // of which served below the tier asked (lower tier or skip)
  uint64_t skipped = 0;         // op-tokens run on their lower tiers, the residual left out
};

class FallbackPlanner {
 public:
  // n_ops ops, each waiting for its reads until told otherwise.
  void Reset(int n_ops);
  // Op lowers its tier when late (use_lower_tier) or waits (stall).
  void set_lowers(int op, bool lower) { ops_[op].lower = lower; }
  // A plan's choice for op: its tier's fallback, else the plan's deadline_miss; kNone in both
  // keeps what set_lowers said.
  void SetFromPlan(int op, compiler::FallbackStrategy tier_fallback,
                   compiler::FallbackStrategy deadline_miss);
  bool lowers(int op) const { return ops_[op].lower; }
  // Whether op, holding tiers 0..held in memory (held < 0: none), may run on them when its
  // residual is late.
  bool may_skip(int op, int held) const { return ops_[op].lower && held >= 0; }

  // Admission of a read of op's tiers up to `want`, predicted late (counted): the highest tier
  // from `want` down to `lowest_read` (the first tier the read covers) that `on_time(tier)`
  // says arrives in time; when none does and the op holds tiers 0..`held` in memory (held >=
  // 0), `held` (its residual skipped); `want` unchanged when the op waits.
  int OnPredictedLate(int op, int want, int lowest_read, int held,
                      FunctionRef<bool(int tier)> on_time);
  // The admission left op's read out for position `pos`: it runs on what it holds there.
  void SkipAt(int op, int64_t pos) { ops_[op].skip_at = pos; }
  // Op begins at position `pos` and its residual is not in memory; `held` as above. True (and
  // counted) when it runs on its held tiers this token; false when it must wait.
  bool SkipMissing(int op, int held, int64_t pos);
  // Whether op runs without its residual at position `pos`.
  bool skips(int op, int64_t pos) const { return ops_[op].skip_at == pos; }

  const FallbackCounters& counters() const { return counters_; }

 private:
  struct Op {
    bool lower = false;
    int64_t skip_at = INT64_MIN;  // positions start at -1
  };
  std::vector<Op> ops_;
  FallbackCounters counters_;
};

}  // namespace substrate
