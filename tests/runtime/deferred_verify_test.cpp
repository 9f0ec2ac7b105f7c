// Deferred verification: tiny-coder packed as a Q4_K skeleton with Q8_0 + F16 residuals. With
// --verify all the tokens are exactly the top tier's greedy tokens, resident and with the
// skeletons resident and the residuals streamed under a cap below the top tier's size; a
// scripted disagreement rolls back and recovers; after it, both tiers' caches hold what a fresh
// prefill of the same tokens computes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "runtime/engine.h"
#include "runtime/plan_fixture.h"
#include "store/store_fixture.h"

namespace substrate {
namespace {

using namespace substrate::testing;

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> p = {"def fibonacci(n):", "import os\nimport sys\n\n",
                                             "class Stack:\n    def __init__(self):"};
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  GenerateStats stats;
};

// An engine over the packed store: every tier resident (keep = -1) or skeletons resident and
// residuals streamed (keep = 0) under `max_ram`, but for those kept where the budget holds them
// (keep_residuals, as `run --verify` opens it).
std::unique_ptr<Engine> Open(int keep, uint64_t max_ram, MemoryLedger* ledger,
                             bool keep_residuals = false) {
  EngineOptions eo;
  eo.store = PackedTinyCoderStore();
  eo.max_ram = max_ram;
  eo.ledger = ledger;
  eo.n_ctx = 256;
  eo.residency.resident_max_tier = keep;
  eo.residency.keep_residuals = keep_residuals;
  auto e = Engine::Load("", eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

Outcome Generate(Engine& e, const std::string& text, const GenerateOptions& opt) {
  Outcome r;
  auto s = e.NewSession(256);
  EXPECT_TRUE(s.ok());
  auto ids = e.tokenizer()->Encode(text, {.add_special = true, .parse_special = false});
  EXPECT_TRUE(ids.ok());
  std::vector<int32_t> prompt(ids->begin(), ids->end());
  auto st = e.Generate(**s, prompt, opt, [&](int32_t tok, const std::string&) {
    if (tok >= 0) r.tokens.push_back(tok);
    return true;
  });
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (st.ok()) r.stats = *st;
  return r;
}

GenerateOptions Greedy(int n) {
  GenerateOptions o;
  o.max_tokens = n;
  o.stop_at_eog = false;
  return o;
}

GenerateOptions VerifyAll(int n, int window) {
  GenerateOptions o = Greedy(n);
  o.verify.mode = VerifyOptions::Mode::kAll;
  o.verify.window = window;
  return o;
}

TEST(DeferredVerify, AllModeGivesTheTopTiersGreedyTokensResidentAndStreamed) {
  if (PackedTinyCoderStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-bf16.gguf";
  const uint64_t data = StoreDataBytes(PackedTinyCoderStore());
  MemoryLedger roomy;
  auto resident = Open(-1, 4 * data + (64ull << 20), &roomy);
  ASSERT_TRUE(resident);
  // Below the top tier's bytes plus what the engine reserves beside them (KV cache, scratch):
  // the skeletons and a few slabs fit, not every tier.
  const uint64_t reserve = EstimateRunReserve(resident->model().hparams(), 256, 256);
  MemoryLedger capped;
  const uint64_t cap = data * 3 / 4 + reserve;
  auto streamed = Open(0, cap, &capped);
  ASSERT_TRUE(streamed);
  int64_t rollbacks = 0;
  for (const std::string& p : Prompts()) {
    const Outcome want = Generate(*resident, p, Greedy(32));
    ASSERT_EQ(want.tokens.size(), 32u);
    for (int window : {1, 5}) {
      const Outcome got = Generate(*resident, p, VerifyAll(32, window));
      EXPECT_EQ(got.tokens, want.tokens) << p << " window " << window;
      EXPECT_GE(got.stats.n_verified, 32);
      rollbacks += got.stats.n_rollbacks;
    }
    const Outcome got = Generate(*streamed, p, VerifyAll(32, 8));
    EXPECT_EQ(got.tokens, want.tokens) << p << " streamed";
    EXPECT_GT(got.stats.verify_bytes, 0u);
    EXPECT_LE(got.stats.n_verify_passes, 32 / 8 + got.stats.n_rollbacks + 1);
  }
  EXPECT_GT(rollbacks, 0) << "the skeleton never disagreed: the test shows no rollback";
  EXPECT_LE(capped.peak(), cap);
  EXPECT_EQ(streamed->runtime()->stats().n_ops_streamed, 0);  // skeletons resident
}

// Residuals the budget holds are kept beside the skeletons: a verify pass reads only the rest,
// with the same tokens. With room for all, the top tier decodes without reading anything after
// open (also the token embedding, packed without residuals: it is whole at tier 0).
TEST(DeferredVerify, ResidualsTheBudgetHoldsAreKeptAndNotReadAgain) {
  if (PackedTinyCoderStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-bf16.gguf";
  const uint64_t data = StoreDataBytes(PackedTinyCoderStore());
  const uint64_t roomy_cap = 4 * data + (64ull << 20);
  MemoryLedger roomy, l_streamed, l_kept, l_all;
  auto resident = Open(-1, roomy_cap, &roomy);
  ASSERT_TRUE(resident);
  const uint64_t cap = data * 3 / 4 + EstimateRunReserve(resident->model().hparams(), 256, 256);
  auto streamed = Open(0, cap, &l_streamed);
  auto kept = Open(0, cap, &l_kept, true);
  auto all = Open(0, roomy_cap, &l_all, true);
  ASSERT_TRUE(streamed && kept && all);
  EXPECT_GT(kept->runtime()->stats().resident_bytes, streamed->runtime()->stats().resident_bytes);
  EXPECT_GT(kept->runtime()->stats().n_slabs, 0) << "the cap should hold some residuals, not all";
  EXPECT_EQ(all->runtime()->stats().n_slabs, 0);
  for (const std::string& p : Prompts()) {
    const Outcome want = Generate(*resident, p, Greedy(24));
    const Outcome a = Generate(*streamed, p, VerifyAll(24, 8));
    const Outcome b = Generate(*kept, p, VerifyAll(24, 8));
    EXPECT_EQ(a.tokens, want.tokens) << p;
    EXPECT_EQ(b.tokens, want.tokens) << p;
    EXPECT_LT(b.stats.verify_bytes, a.stats.verify_bytes) << p;
    const uint64_t read0 = all->runtime()->stats().stream_bytes_read;
    EXPECT_EQ(Generate(*all, p, Greedy(24)).tokens, want.tokens) << p;
    EXPECT_EQ(all->runtime()->stats().stream_bytes_read, read0) << p;
  }
  EXPECT_EQ(all->runtime()->stats().demand_loads, 0u);
  EXPECT_LE(l_kept.peak(), cap);
}

// Rows [0, n) of one layer's keys, as floats, for a comparison across caches.
std::vector<float> KeyRows(KvCache& c, int layer, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * c.k_stride()));
  std::memcpy(out.data(), c.KeyBytes(layer), out.size() * sizeof(float));
  return out;
}

TEST(DeferredVerify, ScriptedDisagreementRollsBackAndBothCachesMatchAFreshPrefill) {
  if (PackedTinyCoderStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-bf16.gguf";
  MemoryLedger ledger;
  auto e = Open(0, 8 * StoreDataBytes(PackedTinyCoderStore()) + (64ull << 20), &ledger);
  ASSERT_TRUE(e);
  const std::string p = Prompts()[0];
  const Outcome want = Generate(*e, p, Greedy(24));
  // Drafts 5 and 13 are replaced by a token the verify tier will not pick.
  GenerateOptions opt = VerifyAll(24, 4);
  opt.verify.edit_draft = [](int64_t i, int32_t tok) { return i == 5 || i == 13 ? 17 : tok; };
  auto s = e->NewSession(256);
  ASSERT_TRUE(s.ok());
  auto ids = e->tokenizer()->Encode(p, {.add_special = true, .parse_special = false});
  std::vector<int32_t> prompt(ids->begin(), ids->end()), got;
  auto st = e->Generate(**s, prompt, opt, [&](int32_t tok, const std::string&) {
    if (tok >= 0) got.push_back(tok);
    return true;
  });
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(got, want.tokens);
  EXPECT_GE(st->n_rollbacks, 2);
  EXPECT_GT(st->n_rollback_lost, 0);

  // Both caches against a fresh prefill of the tokens they claim to hold, at their tiers.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), got.begin(), got.end());
  Session& sess = **s;
  const auto& draft_tokens = sess.cache.tokens();
  const auto& verify_tokens = sess.verify_cache->tokens();
  ASSERT_GT(verify_tokens.size(), prompt.size());
  EXPECT_TRUE(std::equal(draft_tokens.begin(), draft_tokens.end(), all.begin()));
  EXPECT_TRUE(std::equal(verify_tokens.begin(), verify_tokens.end(), all.begin()));
  Model& m = e->model();
  for (int tier : {0, 2}) {
    KvCache& have = tier == 0 ? sess.cache : *sess.verify_cache;
    const int64_t n = have.n_past();
    auto fresh = KvCache::Create(m.hparams(), 256, m.backend());
    ASSERT_TRUE(fresh.ok());
    std::fill(m.op_tiers().begin(), m.op_tiers().end(), static_cast<uint8_t>(tier));
    std::vector<float> logits;
    // Rows as one-token passes compute them, as the caches' passes did (the verify pass runs
    // exact rows): an AMX prefill's tile sums round differently, and over the layers that
    // grows past what this check allows.
    ExactTokenRows exact;
    ASSERT_TRUE(m.Forward(all.data(), n, *fresh, false, &logits).ok());
    for (int layer = 0; layer < fresh->n_layer(); ++layer) {
      const std::vector<float> a = KeyRows(have, layer, n), b = KeyRows(*fresh, layer, n);
      double err = 0, norm = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        err += double(a[i] - b[i]) * (a[i] - b[i]);
        norm += double(b[i]) * b[i];
      }
      // Incremental passes and one prefill differ only by float rounding.
      EXPECT_LT(err / norm, 1e-8) << "tier " << tier << " layer " << layer;
    }
  }
}

TEST(DeferredVerify, MarginModeChecksOnlyLowMarginTokens) {
  if (PackedTinyCoderStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-bf16.gguf";
  MemoryLedger ledger;
  auto e = Open(0, 8 * StoreDataBytes(PackedTinyCoderStore()) + (64ull << 20), &ledger);
  ASSERT_TRUE(e);
  for (const std::string& p : {Prompts()[0], Prompts()[2]}) {
    GenerateOptions all = VerifyAll(32, 8), margin = all;
    margin.verify.mode = VerifyOptions::Mode::kMargin;
    margin.verify.tau = 1.0f;
    const Outcome a = Generate(*e, p, all), m = Generate(*e, p, margin);
    EXPECT_EQ(m.tokens.size(), 32u);
    EXPECT_LT(m.stats.n_verified, a.stats.n_verified) << p;
    EXPECT_LE(m.stats.n_verify_passes, a.stats.n_verify_passes) << p;
    // tau = 0: nothing is checked, the draft tier's own greedy output.
    GenerateOptions none = margin;
    none.verify.tau = 0.0f;
    const Outcome z = Generate(*e, p, none);
    EXPECT_EQ(z.stats.n_verify_passes, 0);
  }
}

}  // namespace
}  // namespace substrate
