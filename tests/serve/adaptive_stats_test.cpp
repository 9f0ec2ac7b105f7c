// What /v1/runtime/events (and the web page) report of the adaptive runtime: each op's tier
// now, counted by tier, and the escalated ops by name. tiny-coder packed with a skeleton and
// higher tiers, served out of core with a scripted verifier that makes one op drift.
#include <gtest/gtest.h>

#include "runtime/plan_fixture.h"
#include "serve/model_backend.h"
#include "store/store_fixture.h"

namespace substrate::serve {
namespace {

using substrate::testing::PackedTinyCoderStore;
using substrate::testing::StoreDataBytes;

TEST(AdaptiveStats, RuntimeStatsNameTheEscalatedOpAndCountOpsByTier) {
  if (PackedTinyCoderStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-bf16.gguf";
  const uint64_t data = StoreDataBytes(PackedTinyCoderStore());
  MemoryLedger ledger;
  ModelBackendOptions mo;
  mo.context = 128;
  mo.slots = 1;
  mo.threads = 2;
  mo.ledger = &ledger;
  mo.engine.store = PackedTinyCoderStore();
  mo.engine.residency.resident_max_tier = 0;  // skeletons resident, higher tiers streamed
  mo.engine.max_ram = data * 3 / 4 + (24ull << 20) + 128 * (64 << 10);
  ledger.set_cap(mo.engine.max_ram);
  mo.engine.adaptive.on = true;
  mo.engine.adaptive.verifier = AdaptiveOptions::Verifier::kScripted;
  mo.engine.adaptive.wait_for_escalations = true;
  mo.engine.adaptive.controller.threshold = 0.5f;
  mo.engine.adaptive.controller.persistence = 1;
  mo.engine.adaptive.controller.max_concurrent = 2;
  // Token 0 is the prompt's pass; block_1.ffn drifts from token 2 on.
  mo.engine.adaptive.script["block_1.ffn"] = std::vector<float>(64, 1.0f);
  mo.engine.adaptive.script["block_1.ffn"][0] = 0;
  mo.engine.adaptive.script["block_1.ffn"][1] = 0;
  auto backend = ModelBackend::Load(mo);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();

  nlohmann::json before = (*backend)->RuntimeStats();
  ASSERT_TRUE(before.contains("op_tiers")) << before.dump();
  ASSERT_EQ(before["op_tiers"].size(), 1u) << "every op at its skeleton: " << before.dump();
  const int n_ops = before["op_tiers"].begin()->get<int>();
  ASSERT_TRUE(before.contains("adaptive")) << before.dump();
  EXPECT_EQ(before["adaptive"]["escalations"], 0);
  EXPECT_TRUE(before["adaptive"]["escalated"].empty());

  auto session = (*backend)->NewSession();
  ASSERT_TRUE(session.ok());
  auto prompt = (*backend)->EncodeText("def fibonacci(n):");
  ASSERT_TRUE(prompt.ok());
  SamplingParams p;
  p.max_tokens = 8;
  p.temperature = 0;
  auto r = (*session)->Generate(
      *prompt, p, [](int32_t, std::string_view, const StepLogprobs*) { return true; });
  ASSERT_TRUE(r.ok()) << r.status().ToString();

  nlohmann::json after = (*backend)->RuntimeStats();
  const nlohmann::json& ad = after["adaptive"];
  EXPECT_GE(ad["escalations"].get<int>(), 1) << after.dump();
  ASSERT_EQ(ad["escalated"].size(), 1u) << after.dump();
  EXPECT_EQ(ad["escalated"][0]["op"], "block_1.ffn");
  const int tier = ad["escalated"][0]["tier"];
  EXPECT_GE(tier, 1);
  // One op above the skeleton's tier, the rest where they were.
  int total = 0;
  for (const auto& [t, n] : after["op_tiers"].items()) total += n.get<int>();
  EXPECT_EQ(total, n_ops);
  EXPECT_EQ(after["op_tiers"][std::to_string(tier)], 1) << after.dump();
}

}  // namespace
}  // namespace substrate::serve
