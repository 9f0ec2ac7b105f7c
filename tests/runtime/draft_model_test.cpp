// Speculative decoding with a draft model (runtime/draft_model.h): tiny-coder drafts for
// tiny-coder-moe (same tokenizer). Greedy output equals the target's own greedy output token for
// token, resident and with the target read in place out of core under a ledger cap that also
// holds the drafter; after rejections the drafter's cache holds what a fresh prefill of the same
// tokens computes; a drafter of another vocabulary is refused naming both files; a drafter that
// cannot fit the budget is an OutOfMemory naming it.
#include "runtime/draft_model.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "format/model_file.h"
#include "runtime/engine.h"
#include "store/store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;

std::string Gguf(const std::string& name) {
  return std::string(SUBSTRATE_SHARED_DIR) + "/gguf/" + name + ".gguf";
}
const std::string& Target() {
  static const std::string p = Gguf("tiny-coder-moe-Q8_0");
  return p;
}
const std::string& Drafter() {
  static const std::string p = Gguf("tiny-coder-Q8_0");
  return p;
}

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> p = {
      "def fibonacci(n):", "import os\nimport sys\n\ndef main():",
      "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):"};
  return p;
}

constexpr int64_t kCtx = 256;

// Checksum records of the read-only fixtures (a GGUF read in place) go to a temp folder.
class DraftModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static const std::string dir = testing::StoreTestPath("draft_gguf_cache");
    setenv("SUBSTRATE_CACHE_DIR", dir.c_str(), 1);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(testing::StoreTestPath("draft_gguf_cache"), ec);
  }
  void SetUp() override {
    if (!fs::exists(Target()) || !fs::exists(Drafter()))
      GTEST_SKIP() << "no fixtures " << Target() << " / " << Drafter();
  }
};

struct Outcome {
  std::vector<int32_t> tokens;
  GenerateStats stats;
  std::vector<int32_t> prompt;
};

std::unique_ptr<Engine> Open(MemoryLedger* ledger, const std::string& draft, uint64_t max_ram = 0) {
  EngineOptions o;
  o.ledger = ledger;
  o.n_ctx = kCtx;
  o.max_ram = max_ram;
  o.draft_model = draft;
  auto e = Engine::Load(Target(), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

Outcome Generate(Engine& e, Session& s, const std::string& prompt, const GenerateOptions& opt) {
  Outcome r;
  auto ids = e.tokenizer()->Encode(prompt, {.add_special = true, .parse_special = false});
  EXPECT_TRUE(ids.ok());
  r.prompt.assign(ids->begin(), ids->end());
  auto st = e.Generate(s, r.prompt, opt, [&](int32_t tok, const std::string&) {
    if (tok >= 0) r.tokens.push_back(tok);
    return true;
  });
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (st.ok()) r.stats = *st;
  return r;
}

Outcome Generate(Engine& e, const std::string& prompt, const GenerateOptions& opt) {
  auto s = e.NewSession(kCtx);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return Generate(e, **s, prompt, opt);
}

GenerateOptions Greedy(int n, int draft_max) {
  GenerateOptions g;
  g.max_tokens = n;
  g.stop_at_eog = false;
  g.draft_max = draft_max;
  return g;
}

// For every prompt and K: the drafted run's tokens are the plain run's, in fewer target passes
// (every accepted draft saves one), and some drafts were rejected (the rollback path ran).
void ExpectGreedyEqual(Engine& e) {
  int64_t accepted = 0, drafted = 0;
  for (const std::string& p : Prompts()) {
    const Outcome want = Generate(e, p, Greedy(40, 0));
    ASSERT_EQ(want.tokens.size(), 40u);
    for (int k : {1, 3, 8}) {
      SCOPED_TRACE(p.substr(0, 12) + " k=" + std::to_string(k));
      const Outcome got = Generate(e, p, Greedy(40, k));
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.stats.n_forwards + got.stats.n_accepted, want.stats.n_forwards);
      EXPECT_GT(got.stats.n_draft_passes, 0);
      accepted += got.stats.n_accepted;
      drafted += got.stats.n_drafted;
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

TEST_F(DraftModelTest, GreedyEqualsTheTargetsOwnResident) {
  MemoryLedger ledger;
  auto e = Open(&ledger, Drafter());
  ASSERT_TRUE(e);
  ASSERT_TRUE(e->draft_model());
  EXPECT_EQ(e->runtime(), nullptr);
  // The drafter's weights are in the target's ledger.
  EXPECT_EQ(&e->draft_model()->engine().ledger(), &ledger);
  MemoryLedger alone;
  auto target_alone = Open(&alone, "");
  ASSERT_TRUE(target_alone);
  EXPECT_GE(ledger.current(), alone.current() + fs::file_size(Drafter()) * 9 / 10);
  ExpectGreedyEqual(*e);
}

TEST_F(DraftModelTest, GreedyEqualsTheTargetsOwnOutOfCoreUnderACap) {
  // Half the target's weights beside its reserve and the drafter's: experts stream.
  uint64_t weights = 0;
  auto file = ModelFile::Open(Target());
  ASSERT_TRUE(file.ok());
  for (const TensorInfo& t : (*file)->tensors()) weights += t.bytes;
  auto hp = ModelHParams::FromMetadata((*file)->metadata());
  ASSERT_TRUE(hp.ok());
  EngineOptions est;
  est.n_ctx = kCtx;
  auto draft_reserve = DraftModel::EstimateReserve(Drafter(), est);
  ASSERT_TRUE(draft_reserve.ok()) << draft_reserve.status().ToString();
  const uint64_t cap = weights / 2 + EstimateRunReserve(*hp, kCtx, kCtx) + *draft_reserve;

  MemoryLedger ledger;
  auto e = Open(&ledger, Drafter(), cap);
  ASSERT_TRUE(e);
  ASSERT_NE(e->runtime(), nullptr) << "the target should run out of core under " << cap;
  const ResidencyStats rs = e->runtime()->stats();
  EXPECT_GT(rs.n_ops_expert, 0);
  EXPECT_LT(rs.expert_slots, hp->n_layer * hp->n_expert);
  ExpectGreedyEqual(*e);
  // The same tokens as the target resident, without a drafter.
  MemoryLedger resident_ledger;
  auto r = Open(&resident_ledger, "");
  ASSERT_TRUE(r);
  const Outcome want = Generate(*r, Prompts()[0], Greedy(40, 0));
  EXPECT_EQ(Generate(*e, Prompts()[0], Greedy(40, 4)).tokens, want.tokens);
  EXPECT_GT(e->runtime()->stats().expert_misses, rs.expert_misses);
  EXPECT_LE(ledger.peak(), cap);
}

std::vector<float> KeyRows(KvCache& c, int layer, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * c.k_stride()));
  std::memcpy(out.data(), c.KeyBytes(layer), out.size() * sizeof(float));
  return out;
}

TEST_F(DraftModelTest, DraftCacheMatchesAFreshPrefillAfterRejections) {
  MemoryLedger ledger;
  auto e = Open(&ledger, Drafter());
  ASSERT_TRUE(e);
  auto s = e->NewSession(kCtx);
  ASSERT_TRUE(s.ok());
  Session& sess = **s;
  // Two generations in one session: the second reuses the first's prefix in both caches.
  Outcome first = Generate(*e, sess, Prompts()[2], Greedy(24, 6));
  ASSERT_LT(first.stats.n_accepted, first.stats.n_drafted) << "no draft was rejected";
  std::vector<int32_t> all = first.prompt;
  all.insert(all.end(), first.tokens.begin(), first.tokens.end());
  auto text =
      e->tokenizer()->Decode(std::vector<TokenId>(all.begin(), all.end()), {.special = false});
  ASSERT_TRUE(text.ok());
  Outcome second = Generate(*e, sess, *text + "\n", Greedy(24, 6));
  all = second.prompt;
  all.insert(all.end(), second.tokens.begin(), second.tokens.end());

  // The drafter's cache holds a prefix of the conversation (never a rejected token)...
  const KvCache& have = *sess.draft_cache;
  const int64_t n = have.n_past();
  ASSERT_GT(n, static_cast<int64_t>(second.prompt.size()));
  ASSERT_LE(n, static_cast<int64_t>(all.size()));
  EXPECT_TRUE(std::equal(have.tokens().begin(), have.tokens().end(), all.begin()));
  // ...and the rows a fresh prefill of those tokens computes.
  Model& m = e->draft_model()->engine().model();
  auto fresh = KvCache::Create(m.hparams(), kCtx, m.backend());
  ASSERT_TRUE(fresh.ok());
  std::vector<float> logits;
  ASSERT_TRUE(m.Forward(all.data(), n, *fresh, false, &logits).ok());
  for (int layer = 0; layer < fresh->n_layer(); ++layer) {
    const std::vector<float> a = KeyRows(*sess.draft_cache, layer, n),
                             b = KeyRows(*fresh, layer, n);
    double err = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      err += double(a[i] - b[i]) * (a[i] - b[i]);
      norm += double(b[i]) * b[i];
    }
    // Incremental passes and one prefill differ only by float rounding.
    EXPECT_LT(err / norm, 1e-8) << "layer " << layer;
  }
}

TEST_F(DraftModelTest, SampledRunsAreReproducible) {
  MemoryLedger ledger;
  auto e = Open(&ledger, Drafter());
  ASSERT_TRUE(e);
  GenerateOptions g = Greedy(32, 4);
  g.sampling.temperature = 0.8f;
  g.sampling.seed = 5;
  const Outcome a = Generate(*e, Prompts()[1], g);
  const Outcome b = Generate(*e, Prompts()[1], g);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 32u);
  EXPECT_GT(a.stats.n_drafted, 0);
}

TEST_F(DraftModelTest, AnotherVocabularyIsRefusedNamingBothFiles) {
  // A drafter with another tokenizer (vocabulary of 512).
  const std::string other = std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-random-qwen2";
  if (!fs::exists(other)) GTEST_SKIP() << "no fixture " << other;
  MemoryLedger ledger;
  EngineOptions o;
  o.ledger = &ledger;
  o.n_ctx = kCtx;
  o.draft_model = other;
  auto e = Engine::Load(Target(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
  const std::string msg = e.status().ToString();
  EXPECT_NE(msg.find("different vocabularies"), std::string::npos) << msg;
  EXPECT_NE(msg.find(Target()), std::string::npos) << msg;
  EXPECT_NE(msg.find(other), std::string::npos) << msg;
  // Nothing of either model stays charged.
  EXPECT_EQ(ledger.current(), 0u);
}

TEST_F(DraftModelTest, ATokenOfAnotherTextIsRefused) {
  auto file = ModelFile::Open(Drafter());
  ASSERT_TRUE(file.ok());
  const Metadata& same = (*file)->metadata();
  EXPECT_TRUE(CheckSameVocabulary("target.gguf", same, "draft.gguf", same).ok());
  auto tokens = same.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  (*tokens)[300] += "x";
  Metadata edited = same;
  edited.Set("tokenizer.ggml.tokens", MetaValue::StrArray(*tokens));
  const Status st = CheckSameVocabulary("target.gguf", same, "draft.gguf", edited);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token 300"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("target.gguf"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("draft.gguf"), std::string::npos) << st.ToString();
}

// The command line: a clear message naming both files and a non-zero exit.
TEST_F(DraftModelTest, CliRefusesAnotherVocabulary) {
  const std::string other = std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-random-qwen2";
  if (!fs::exists(other)) GTEST_SKIP() << "no fixture " << other;
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " run -m " + Target() +
                          " --draft-model " + other + " -p 'def f():' -n 4 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_NE(out.find("different vocabularies"), std::string::npos) << out;
  EXPECT_NE(out.find(Target()), std::string::npos) << out;
  EXPECT_NE(out.find(other), std::string::npos) << out;
}

TEST_F(DraftModelTest, ADrafterBeyondTheBudgetIsOutOfMemoryNamingIt) {
  MemoryLedger ledger;
  EngineOptions o;
  o.ledger = &ledger;
  o.n_ctx = kCtx;
  o.max_ram = 2ull << 20;  // below the drafter's weights
  o.draft_model = Drafter();
  auto e = Engine::Load(Target(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfMemory) << e.status().ToString();
  EXPECT_NE(e.status().ToString().find(Drafter()), std::string::npos) << e.status().ToString();
}

}  // namespace
}  // namespace substrate
