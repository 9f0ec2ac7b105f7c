// Speculative decoding with prompt-lookup drafts: the drafter's choices, Sampler::Verify's
// exactness (the verified token is distributed as Sample's), and Engine::Generate giving the
// same tokens, stop reasons and cache contents with drafting as without, in fewer forward
// passes when the text repeats its context.
#include <cmath>
#include <map>

#include "runtime/engine.h"
#include "model/prompt_lookup.h"
#include "model/sampler.h"
#include "model/model_test_util.h"

namespace substrate::testing {
namespace {

TEST(StopStrings, HoldsBackPossiblePrefixes) {
  EXPECT_EQ(StopPrefixHold("hello <|im", {"<|im_end|>"}), 4u);
  EXPECT_EQ(StopPrefixHold("hello", {"<|im_end|>"}), 0u);
  EXPECT_EQ(StopPrefixHold("ab\n\n", {"\n\n\n"}), 2u);
}

TEST(PromptLookup, ProposesWhatFollowedTheLatestMatch) {
  // Last 3-gram [1 2 3] occurred at 0 (followed by 4 1 2) and at 4 (followed by 9 1 2 3).
  EXPECT_EQ(PromptLookupDraft({1, 2, 3, 4, 1, 2, 3, 9, 1, 2, 3}, 3), (std::vector<int32_t>{9, 1, 2}));
  EXPECT_EQ(PromptLookupDraft({1, 2, 3, 4, 1, 2, 3}, 8), (std::vector<int32_t>{4, 1, 2, 3}));
  // No 3-gram recurs: the 2-gram [7 8] does.
  EXPECT_EQ(PromptLookupDraft({7, 8, 5, 6, 1, 7, 8}, 2), (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(PromptLookupDraft({1, 2, 3, 4, 5}, 4).empty());
  EXPECT_TRUE(PromptLookupDraft({1, 2, 1, 2}, 0).empty());
}

// Frequencies of Verify's result against Sample's distribution, for a draft that is likely,
// one that is unlikely and one the filters remove.
TEST(SamplerVerify, DistributedExactlyAsSample) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.2f, -1.0f, 2.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 5;  // drops token 3
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 42;
  std::vector<double> want(logits.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (i != 3) z += want[i] = std::exp(logits[i] / p.temperature);
  for (double& w : want) w /= z;
  const int n = 200000;
  for (int32_t draft : {4, 2, 3}) {
    Sampler s(p);
    std::vector<int> count(logits.size(), 0);
    for (int i = 0; i < n; ++i) ++count[static_cast<size_t>(s.Verify(logits.data(), 6, {}, draft))];
    for (size_t i = 0; i < logits.size(); ++i) {
      const double sigma = std::sqrt(n * want[i] * (1 - want[i])) + 1;
      EXPECT_NEAR(count[i], n * want[i], 5 * sigma) << "draft " << draft << " token " << i;
    }
  }
  // Greedy: the argmax whatever the draft.
  SamplingParams g;
  Sampler s(g);
  EXPECT_EQ(s.Verify(logits.data(), 6, {}, 1), 4);
}

class SpeculativeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(SUBSTRATE_SOURCE_DIR) + "/models/tiny-coder-Q8_0.gguf";
    if (!Exists(path)) GTEST_SKIP() << "no bundled model " << path;
    EngineOptions eo;
    eo.ledger = &ledger_;
    auto e = Engine::Load(path, eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
  }
  struct Run {
    std::string text;
    GenerateStats stats;
    std::vector<int32_t> tokens, cached;
  };
  Run Generate(const std::string& prompt, GenerateOptions opt, int64_t n_ctx = 512) {
    Run r;
    auto s = engine_->NewSession(n_ctx);
    EXPECT_TRUE(s.ok());
    auto ids = engine_->tokenizer()->Encode(prompt);
    EXPECT_TRUE(ids.ok());
    std::vector<int32_t> prompt_ids(ids->begin(), ids->end());
    auto st = engine_->Generate(**s, prompt_ids, opt, [&](int32_t tok, const std::string& text) {
      r.text += text;
      if (tok >= 0) r.tokens.push_back(tok);
      return true;
    });
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    r.stats = *st;
    r.cached = (*s)->cache.tokens();
    // The cache holds the prompt and every shown token but the last (not yet evaluated).
    std::vector<int32_t> want = prompt_ids;
    if (!r.tokens.empty()) want.insert(want.end(), r.tokens.begin(), r.tokens.end() - 1);
    EXPECT_EQ(r.cached, want);
    return r;
  }

  MemoryLedger ledger_;
  std::unique_ptr<Engine> engine_;
};

const char* kRepetitive =
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):";

TEST_F(SpeculativeTest, GreedyOutputUnchangedInFewerPasses) {
  for (const char* prompt : {kRepetitive, "import os\n\ndef list_files(path):"}) {
    for (int max_tokens : {1, 5, 17, 64}) {
      GenerateOptions plain;
      plain.max_tokens = max_tokens;
      const Run want = Generate(prompt, plain);
      for (int k : {1, 3, 8}) {
        SCOPED_TRACE(std::string(prompt).substr(0, 12) + " n=" + std::to_string(max_tokens) +
                     " k=" + std::to_string(k));
        GenerateOptions spec = plain;
        spec.draft_max = k;
        const Run got = Generate(prompt, spec);
        EXPECT_EQ(got.tokens, want.tokens);
        EXPECT_EQ(got.text, want.text);
        EXPECT_EQ(got.stats.stop_reason, want.stats.stop_reason);
        EXPECT_EQ(got.stats.n_forwards + got.stats.n_accepted, want.stats.n_forwards);
      }
    }
  }
  // The repetitive prompt is drafted well: 64 tokens in far fewer than 63 passes.
  GenerateOptions spec;
  spec.max_tokens = 64;
  spec.draft_max = 4;
  const Run r = Generate(kRepetitive, spec);
  EXPECT_LT(r.stats.n_forwards, 32) << r.stats.n_accepted << " of " << r.stats.n_drafted;
}

TEST_F(SpeculativeTest, StopsAndContextAsWithout) {
  GenerateOptions plain;
  plain.max_tokens = 64;
  plain.stop = {"sub("};
  const Run want = Generate(kRepetitive, plain);
  ASSERT_EQ(want.stats.stop_reason, "stop");
  GenerateOptions spec = plain;
  spec.draft_max = 6;
  const Run got = Generate(kRepetitive, spec);
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.stats.stop_reason, "stop");
  // A context that ends mid-draft.
  plain.stop.clear();
  spec.stop.clear();
  const Run want_ctx = Generate(kRepetitive, plain, 60);
  const Run got_ctx = Generate(kRepetitive, spec, 60);
  EXPECT_EQ(want_ctx.stats.stop_reason, "context");
  EXPECT_EQ(got_ctx.tokens, want_ctx.tokens);
  EXPECT_EQ(got_ctx.stats.stop_reason, "context");
}

TEST_F(SpeculativeTest, SampledRunsAreReproducible) {
  GenerateOptions spec;
  spec.max_tokens = 48;
  spec.draft_max = 4;
  spec.sampling.temperature = 0.7f;
  spec.sampling.seed = 9;
  const Run a = Generate(kRepetitive, spec);
  const Run b = Generate(kRepetitive, spec);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 48u);
}

}  // namespace
}  // namespace substrate::testing
