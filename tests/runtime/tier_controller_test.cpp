// TierController's mechanics with scripted disagreements: escalation after the persistence,
// decay, the pool and K as hard limits, eviction of the laziest op, force-demote, the ledger.
#include "runtime/tier_controller.h"

#include <gtest/gtest.h>

#include "alloc_counter.h"

namespace substrate {
namespace {

// Four ops with tiers 0..2; op 3 is pinned at its base (ceiling 0). Escalating an op one tier
// costs 100 bytes, two tiers 250.
struct Fixture {
  explicit Fixture(TierControllerOptions o, MemoryLedger* ledger = nullptr) {
    std::vector<std::vector<uint64_t>> cost(4, {0, 100, 250});
    auto c = TierController::Create(&tiers, {2, 2, 2, 0}, cost, o, ledger);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    ctl = std::make_unique<TierController>(std::move(c).value());
  }
  // One token: each op's disagreement, then EndToken.
  void Token(std::initializer_list<float> d) {
    int op = 0;
    for (float v : d) ctl->Observe(op++, v);
    ctl->EndToken();
  }
  std::vector<uint8_t> tiers = std::vector<uint8_t>(4, 0);
  std::unique_ptr<TierController> ctl;
};

TierControllerOptions Options(int persistence, int k, uint64_t pool) {
  TierControllerOptions o;
  o.threshold = 0.5f;
  o.persistence = persistence;
  o.max_concurrent = k;
  o.pool_bytes = pool;
  return o;
}

TEST(TierController, EscalatesAfterThePersistenceAndDecaysAfterItsCalm) {
  Fixture f(Options(3, 4, 0));
  f.Token({0.9f, 0, 0, 0});
  f.Token({0.9f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 0) << "two tokens above the threshold are not yet three";
  f.Token({0.9f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 1);
  f.Token({0.9f, 0, 0, 0});
  f.Token({0.9f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 1);
  f.Token({0.9f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 2) << "three more tokens climb one more tier";
  f.Token({0.9f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 2) << "at its ceiling";
  // A token below the threshold breaks the run; calm for the persistence decays to the base.
  f.Token({0.1f, 0, 0, 0});
  f.Token({0.1f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 2);
  f.Token({0.1f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 0);
  EXPECT_EQ(f.ctl->stats().escalations, 2u);
  EXPECT_EQ(f.ctl->stats().decays, 1u);
  EXPECT_EQ(f.ctl->stats().pool_used, 0u);
  EXPECT_EQ(f.ctl->stats().pool_peak, 250u);
}

TEST(TierController, AnInterruptedRunDoesNotEscalate) {
  Fixture f(Options(2, 4, 0));
  for (int i = 0; i < 10; ++i) f.Token({i % 2 ? 0.9f : 0.1f, 0, 0, 0});
  EXPECT_EQ(f.tiers[0], 0);
  EXPECT_EQ(f.ctl->stats().escalations, 0u);
}

TEST(TierController, APinnedOpNeverMoves) {
  Fixture f(Options(1, 4, 0));
  for (int i = 0; i < 5; ++i) f.Token({0, 0, 0, 5.0f});
  EXPECT_EQ(f.tiers[3], 0);
  EXPECT_EQ(f.ctl->stats().escalations, 0u);
}

TEST(TierController, ThePoolIsNeverExceededAndTheLaziestOpMakesRoom) {
  // Room for two one-tier escalations (200 of 250 bytes).
  Fixture f(Options(1, 4, 250));
  f.Token({0.9f, 0.6f, 0, 0});
  EXPECT_EQ(f.tiers[0], 1);
  EXPECT_EQ(f.tiers[1], 1);
  EXPECT_EQ(f.ctl->stats().pool_used, 200u);
  // Op 0 climbs to tier 2 (+150 bytes): op 1, the laziest (lower recent disagreement), is
  // demoted to make room.
  f.Token({0.9f, 0.1f, 0, 0});
  EXPECT_EQ(f.tiers[0], 2);
  EXPECT_EQ(f.tiers[1], 0) << "the laziest escalated op is demoted for the new escalation";
  EXPECT_EQ(f.ctl->stats().evictions, 1u);
  EXPECT_EQ(f.ctl->stats().pool_used, 250u);
  // Op 2 starts drifting, but op 0 has drifted longer: op 2 is refused, op 0 keeps its tier.
  f.Token({0.9f, 0, 0.95f, 0});
  EXPECT_EQ(f.tiers[0], 2);
  EXPECT_EQ(f.tiers[2], 0);
  EXPECT_EQ(f.ctl->stats().refused, 1u);
  for (int i = 0; i < 20; ++i) {
    f.Token({0.9f, 0.9f, 0.9f, 0});
    EXPECT_LE(f.ctl->stats().pool_used, 250u) << "token " << i;
  }
  EXPECT_EQ(f.ctl->stats().pool_peak, 250u);
}

TEST(TierController, AtMostKOpsAreEscalated) {
  Fixture f(Options(1, 2, 0));
  for (int i = 0; i < 10; ++i) {
    f.Token({0.9f, 0.8f, 0.7f, 0});
    EXPECT_LE(f.ctl->escalated().size(), 2u);
  }
  EXPECT_EQ(f.ctl->stats().escalated_peak, 2);
  EXPECT_EQ(f.tiers[2], 0) << "the calmest candidate stays at its base";
}

TEST(TierController, ForceDemoteAllReturnsEveryOpToItsBase) {
  Fixture f(Options(1, 4, 0));
  f.Token({0.9f, 0.9f, 0.9f, 0});
  f.Token({0.9f, 0.9f, 0.9f, 0});
  EXPECT_EQ(f.ctl->escalated().size(), 3u);
  EXPECT_EQ(f.tiers[0], 2);
  f.ctl->ForceDemoteAll();
  EXPECT_EQ(f.tiers, std::vector<uint8_t>(4, 0));
  EXPECT_TRUE(f.ctl->escalated().empty());
  EXPECT_EQ(f.ctl->stats().pool_used, 0u);
  EXPECT_EQ(f.ctl->stats().force_demotes, 1u);
  // Held (the runtime monitor's critical states): no escalation until released.
  f.ctl->set_hold(true);
  f.Token({0.9f, 0.9f, 0.9f, 0});
  EXPECT_TRUE(f.ctl->escalated().empty());
  f.ctl->set_hold(false);
  f.Token({0.9f, 0.9f, 0.9f, 0});
  EXPECT_EQ(f.ctl->escalated().size(), 3u);
}

TEST(TierController, ThePoolIsChargedToTheLedgerAndRefusedBeyondItsCap) {
  MemoryLedger ledger(1000);
  {
    Fixture f(Options(1, 4, 600), &ledger);
    EXPECT_EQ(ledger.current(), 600u);
  }
  EXPECT_EQ(ledger.current(), 0u) << "released with the controller";
  std::vector<uint8_t> tiers(1, 0);
  auto c = TierController::Create(&tiers, {1}, {{0, 10}}, Options(1, 1, 2000), &ledger);
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfMemory);
}

TEST(TierController, BadShapesAreRefused) {
  std::vector<uint8_t> tiers(2, 0);
  EXPECT_FALSE(
      TierController::Create(&tiers, {1}, {{0, 1}, {0, 1}}, Options(1, 1, 0), nullptr).ok());
  EXPECT_FALSE(
      TierController::Create(&tiers, {2, 2}, {{0, 1}, {0, 1}}, Options(1, 1, 0), nullptr).ok())
      << "a ceiling without a cost";
  EXPECT_FALSE(
      TierController::Create(&tiers, {1, 1}, {{0, 1}, {0, 1}}, Options(0, 1, 0), nullptr).ok());
}

TEST(TierController, TheTokenLoopAllocatesNothing) {
  Fixture f(Options(2, 3, 400));
  f.Token({0.9f, 0.9f, 0.9f, 0});
  const uint64_t before = testing::AllocationCount();
  for (int i = 0; i < 1000; ++i) {
    const float w = static_cast<float>((i * 37) % 100) / 100.0f;
    f.Token({w, 1.0f - w, (i % 7) ? 0.9f : 0.1f, w});
    if (i % 250 == 249) f.ctl->ForceDemoteAll();
  }
  EXPECT_EQ(testing::AllocationCount(), before);
  EXPECT_GT(f.ctl->stats().escalations, 100u) << "the schedule must actually switch tiers";
}

}  // namespace
}  // namespace substrate
