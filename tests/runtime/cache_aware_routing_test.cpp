// Cache-aware routing on tiny-coder-moe packed and streamed with a small expert cache: off (the
// default) the out-of-core model computes exactly what the resident one does; on, a model with
// every expert in memory (nothing to favour) still routes exactly, and the streamed one reads
// fewer experts per token for the same text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/plan_fixture.h"
#include "store/store_fixture.h"

namespace substrate {
namespace {

using namespace substrate::testing;

struct Decoded {
  std::vector<float> logits;  // every position's, concatenated
  uint64_t expert_reads = 0;  // reads issued for experts (on a hint, or on a miss) over the decode
};

// Teacher-forced: a prompt pass, then the text's next tokens one at a time.
Decoded Decode(float bonus, bool streamed) {
  MemoryLedger ledger;
  EngineOptions eo;
  eo.store = PackedTinyMoeStore();
  eo.n_ctx = 128;
  eo.ledger = &ledger;
  eo.cache_aware_routing = bonus;
  if (streamed) {
    eo.max_ram = StoreDataBytes(PackedTinyMoeStore()) / 2 + (32ull << 20);
    eo.residency.expert_slots = 24;  // an eighth of the 192 experts
  } else {
    eo.max_ram = 8 * StoreDataBytes(PackedTinyMoeStore()) + (64ull << 20);
  }
  auto e = Engine::Load("", eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  Decoded r;
  if (!e.ok()) return r;
  auto ids = (*e)->tokenizer()->Encode(
      "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
      "fibonacci(n - 2)\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n",
      {.add_special = true, .parse_special = false});
  EXPECT_TRUE(ids.ok());
  if (!ids.ok()) return r;
  const std::vector<int32_t> toks(ids->begin(), ids->end());
  auto s = (*e)->NewSession(128);
  EXPECT_TRUE(s.ok());
  Model& m = (*e)->model();
  std::vector<float> logits;
  EXPECT_TRUE(m.Forward(toks.data(), 4, (*s)->cache, false, &logits).ok());
  r.logits = logits;
  const auto before = streamed ? (*e)->runtime()->stats() : ResidencyStats{};
  for (size_t i = 4; i < toks.size(); ++i) {
    EXPECT_TRUE(m.Forward(&toks[i], 1, (*s)->cache, false, &logits).ok());
    r.logits.insert(r.logits.end(), logits.begin(), logits.end());
  }
  if (streamed) {
    const ResidencyStats after = (*e)->runtime()->stats();
    r.expert_reads = after.expert_hinted + after.expert_misses - before.expert_hinted -
                     before.expert_misses;
  }
  return r;
}

TEST(CacheAwareRouting, OffIsExactOnOnlyMovesNearTiesToCachedExperts) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  const Decoded resident = Decode(0, false);
  const Decoded resident_on = Decode(0.1f, false);
  const Decoded streamed = Decode(0, true);
  const Decoded streamed_on = Decode(0.1f, true);
  ASSERT_FALSE(resident.logits.empty());
  EXPECT_EQ(resident_on.logits, resident.logits) << "every expert in memory: nothing to favour";
  EXPECT_EQ(streamed.logits, resident.logits) << "off, out of core routes exactly";
  EXPECT_NE(streamed_on.logits, resident.logits) << "on, some choices went to cached experts";
  EXPECT_GT(streamed.expert_reads, 0u);
  EXPECT_LT(streamed_on.expert_reads, streamed.expert_reads);
}

}  // namespace
}  // namespace substrate
