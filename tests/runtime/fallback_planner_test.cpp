// FallbackPlanner: the plan's policy per op (wait, or lower the tier down to skipping the
// residual), the admission's choice of tier for a read predicted late, the skip of an op whose
// residual is missing when it begins, and the counters.
#include "runtime/fallback_planner.h"

#include <gtest/gtest.h>

namespace substrate {
namespace {

using compiler::FallbackStrategy;

TEST(FallbackPlanner, EveryOpWaitsUntilTheDefaultOrAPlanSaysOtherwise) {
  FallbackPlanner f;
  f.Reset(4);
  for (int op = 0; op < 4; ++op) EXPECT_FALSE(f.lowers(op));
  f.set_lowers(0, true);  // the runtime's default (adaptive: escalations never stall)
  f.set_lowers(1, true);
  f.set_lowers(2, true);
  // The op's tier says stall: it wins over the plan's deadline_miss and the default.
  f.SetFromPlan(1, FallbackStrategy::kStall, FallbackStrategy::kUseLowerTier);
  // Neither says anything: the default stays.
  f.SetFromPlan(2, FallbackStrategy::kNone, FallbackStrategy::kNone);
  // The tier says nothing: the plan's deadline_miss.
  f.SetFromPlan(3, FallbackStrategy::kNone, FallbackStrategy::kUseLowerTier);
  EXPECT_TRUE(f.lowers(0));
  EXPECT_FALSE(f.lowers(1));
  EXPECT_TRUE(f.lowers(2));
  EXPECT_TRUE(f.lowers(3));
  // Skipping needs tiers in memory to run on.
  EXPECT_TRUE(f.may_skip(0, 0));
  EXPECT_FALSE(f.may_skip(0, -1));
  EXPECT_FALSE(f.may_skip(1, 0));
}

TEST(FallbackPlanner, ALateReadGoesToTheHighestTierOnTimeOrSkipsTheResidual) {
  FallbackPlanner f;
  f.Reset(3);
  f.set_lowers(0, true);
  f.set_lowers(1, true);
  // Op 0, streamed (holds nothing): tiers up to 1 arrive in time, 2 does not.
  auto up_to_1 = [](int t) { return t <= 1; };
  EXPECT_EQ(f.OnPredictedLate(0, 2, 0, -1, up_to_1), 1);
  // Op 0 again, nothing on time: its lowest read, tier 0 (it has nothing else to run on).
  auto never = [](int) { return false; };
  EXPECT_EQ(f.OnPredictedLate(0, 2, 0, -1, never), 0);
  // Op 1, skeleton resident (held 0, reads start at tier 1), nothing on time: the skeleton.
  EXPECT_EQ(f.OnPredictedLate(1, 2, 1, 0, never), 0);
  // Op 2 waits: the tier asked, late or not.
  EXPECT_EQ(f.OnPredictedLate(2, 2, 1, 0, never), 2);
  EXPECT_EQ(f.counters().predicted_late, 4u);
  EXPECT_EQ(f.counters().demoted, 3u);
  EXPECT_EQ(f.counters().skipped, 0u) << "the admission's skip is counted when the op runs";
}

TEST(FallbackPlanner, AMissingResidualIsSkippedForOnePositionOnlyWhereThePolicyAllows) {
  FallbackPlanner f;
  f.Reset(3);
  f.set_lowers(0, true);
  f.set_lowers(2, true);
  EXPECT_FALSE(f.skips(0, 7));
  EXPECT_TRUE(f.SkipMissing(0, 0, 7));
  EXPECT_TRUE(f.skips(0, 7));
  EXPECT_FALSE(f.skips(0, 8)) << "the next token runs at its tier again";
  EXPECT_FALSE(f.SkipMissing(1, 0, 7)) << "op 1 waits";
  EXPECT_FALSE(f.skips(1, 7));
  EXPECT_FALSE(f.SkipMissing(2, -1, 7)) << "nothing held to run on: it must wait";
  f.SkipAt(2, 9);  // the admission left its read out
  EXPECT_TRUE(f.skips(2, 9));
  EXPECT_EQ(f.counters().skipped, 1u);
  f.Reset(3);
  EXPECT_EQ(f.counters().skipped, 0u);
  EXPECT_FALSE(f.skips(0, 7));
  EXPECT_FALSE(f.lowers(0));
}

}  // namespace
}  // namespace substrate
