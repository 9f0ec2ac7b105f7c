// Drafting from the model's own next-n (multi-token prediction) layer (runtime/nextn_draft.h).
// No fixture carries a next-n layer, so one is made here: the random-weight tiny DeepSeek-V3
// checkpoint written as a GGUF with a fourth block marked as its next-n layer (the third block's
// attention and MoE weights again, plus random nextn.eh_proj and the nextn norms), the layout
// llama.cpp's converter gives DeepSeek-V3 and GLM-4.5. Greedy output with --draft-mtp equals
// plain decoding token for token, over several prompts and a session that goes on with a longer
// prompt; drafts are made and checked; the next-n cache after generation holds what a fresh
// prefill of the same tokens computes; the main stack ignores the next-n block, which is neither
// loaded nor planned without --draft-mtp; read in place out of core under a budget, the layer's
// experts stream through the expert cache and the output is still plain decoding's; a model
// without one is refused naming the missing key.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "format/convert.h"
#include "format/gguf_writer.h"
#include "format/model_file.h"
#include "model/model_test_util.h"
#include "runtime/engine.h"
#include "runtime/pass_batcher.h"
#include "store/store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;

const std::string& Checkpoint() {
  static const std::string p =
      std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-random-deepseek-v3";
  return p;
}

// Deterministic values in [-scale, scale).
std::vector<float> RandomValues(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f);
  }
  return v;
}

// base: the checkpoint as an F32 GGUF; with_nextn: the same plus the next-n block. A pass-through
// block (`identity`) has its attention output and experts' down projections zero, eh_proj taking
// hnorm(h) alone and no head norm of its own, so its logits are the main model's for h (RMSNorm
// does not see the scale): something to check ForwardNextn against.
Status WriteFixtures(const std::string& base, const std::string& with_nextn, bool identity) {
  ASSIGN_OR_RETURN(auto hf, ModelFile::Open(Checkpoint()));
  RETURN_IF_ERROR(ConvertToGguf(*hf, base, DType::kF32));
  ASSIGN_OR_RETURN(auto in, ModelFile::Open(base));
  Metadata md = in->metadata();
  ASSIGN_OR_RETURN(std::string arch, md.GetString("general.architecture"));
  ASSIGN_OR_RETURN(int64_t n_layer, md.GetInt(arch + ".block_count"));
  ASSIGN_OR_RETURN(int64_t d, md.GetInt(arch + ".embedding_length"));
  const std::string last = "blk." + std::to_string(n_layer - 1) + ".";
  const std::string nextn = "blk." + std::to_string(n_layer) + ".";
  md.Set(arch + ".block_count", MetaValue::U32(static_cast<uint32_t>(n_layer + 1)));
  md.Set(arch + ".nextn_predict_layers", MetaValue::U32(1));

  struct Out {
    std::string name;
    std::vector<uint64_t> ne;
    const TensorInfo* copy_of = nullptr;  // else random (scale 0: ones)
    float scale = 0;
    bool zero = false;
  };
  std::vector<Out> outs;
  for (const TensorInfo& t : in->tensors()) {
    if (t.type != DType::kF32) return Corruption("fixture tensor " + t.name + " is not F32");
    outs.push_back({t.name, t.ne, &t});
  }
  for (const TensorInfo& t : in->tensors()) {
    if (t.name.rfind(last, 0) != 0) continue;
    const std::string rest = t.name.substr(last.size());
    const bool out_proj = rest.rfind("attn_output", 0) == 0 || rest.rfind("ffn_down", 0) == 0;
    outs.push_back({nextn + rest, t.ne, &t, 0, identity && out_proj});
  }
  const uint64_t ud = static_cast<uint64_t>(d);
  outs.push_back({nextn + "nextn.enorm.weight", {ud}});
  outs.push_back({nextn + "nextn.hnorm.weight", {ud}});
  outs.push_back({nextn + "nextn.eh_proj.weight", {2 * ud, ud}, nullptr, identity ? -1.0f : 0.15f});
  if (!identity) outs.push_back({nextn + "nextn.shared_head_norm.weight", {ud}});

  GgufWriter w(with_nextn);
  w.SetMetadata(md);
  for (const Out& o : outs) RETURN_IF_ERROR(w.AddTensor(o.name, o.ne, DType::kF32));
  uint32_t seed = 7;
  for (const Out& o : outs) {
    size_t n = 1;
    for (uint64_t e : o.ne) n *= static_cast<size_t>(e);
    std::vector<float> v(n, 1.0f);
    if (o.zero) {
      std::fill(v.begin(), v.end(), 0.0f);
    } else if (o.copy_of) {
      RETURN_IF_ERROR(in->ReadTensor(*o.copy_of, v.data()));
    } else if (o.scale < 0) {  // [0 | I]: row j takes column d + j
      std::fill(v.begin(), v.end(), 0.0f);
      for (size_t j = 0; j < ud; ++j) v[j * 2 * ud + ud + j] = 1.0f;
    } else if (o.scale > 0) {
      v = RandomValues(n, ++seed, o.scale);
    }
    RETURN_IF_ERROR(w.WriteTensorData(v.data(), n * sizeof(float)));
  }
  return w.Finish();
}

class NextnDraftTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(Checkpoint())) return;
    // The checksum records of a GGUF read in place.
    static const std::string cache = testing::StoreTestPath("nextn_cache");
    setenv("SUBSTRATE_CACHE_DIR", cache.c_str(), 1);
    base_ = new std::string(testing::StoreTestPath("nextn_base.gguf"));
    mtp_ = new std::string(testing::StoreTestPath("nextn_mtp.gguf"));
    identity_ = new std::string(testing::StoreTestPath("nextn_identity.gguf"));
    Status st = WriteFixtures(*base_, *mtp_, false);
    ASSERT_TRUE(st.ok()) << st.ToString();
    st = WriteFixtures(*base_, *identity_, true);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  static void TearDownTestSuite() {
    if (!base_) return;
    std::error_code ec;
    fs::remove(*base_, ec);
    fs::remove(*mtp_, ec);
    fs::remove(*identity_, ec);
    fs::remove_all(testing::StoreTestPath("nextn_cache"), ec);
    delete base_;
    delete mtp_;
    delete identity_;
    base_ = mtp_ = identity_ = nullptr;
  }
  void SetUp() override {
    if (!base_) GTEST_SKIP() << "no fixture " << Checkpoint();
  }

  // Resident, or read in place under max_ram (with that many expert slots, 0: what the budget
  // leaves); charging `ledger` when given.
  static std::unique_ptr<Engine> Open(const std::string& path, bool mtp, uint64_t max_ram = 0,
                                      MemoryLedger* ledger = nullptr, int expert_slots = 0) {
    EngineOptions o;
    o.device = testing::TestDevice();  // SUBSTRATE_TEST_DEVICE=cuda: the GPU
    o.ledger = ledger;
    o.residency.expert_slots = expert_slots;
    o.n_ctx = 160;
    o.require_tokenizer = false;
    o.draft_mtp = mtp;
    o.max_ram = max_ram;
    if (max_ram) o.gguf_in_place = EngineOptions::InPlace::kAlways;
    auto e = Engine::Load(path, o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  struct Outcome {
    std::vector<int32_t> tokens;
    GenerateStats stats;
  };
  static Outcome Generate(Engine& e, Session& s, const std::vector<int32_t>& prompt, int n,
                          int draft_max, PassRunner* passes = nullptr) {
    GenerateOptions g;
    g.max_tokens = n;
    g.draft_max = draft_max;
    g.passes = passes;
    Outcome out;
    auto st = e.Generate(s, prompt, g, [&](int32_t tok, const std::string&) {
      if (tok >= 0) out.tokens.push_back(tok);
      return true;
    });
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (st.ok()) out.stats = *st;
    return out;
  }

  // n tokens from `prompt` in a fresh session of each engine, `drafting`'s with drafts of up to
  // k: the same tokens expected. Returns the drafting run.
  static Outcome ExpectPlainTokens(Engine& plain, Engine& drafting,
                                   const std::vector<int32_t>& prompt, int n, int k) {
    auto ps = plain.NewSession(0);
    auto ds = drafting.NewSession(0);
    EXPECT_TRUE(ps.ok() && ds.ok());
    if (!ps.ok() || !ds.ok()) return {};
    const Outcome want = Generate(plain, **ps, prompt, n, 0);
    const Outcome got = Generate(drafting, **ds, prompt, n, k);
    EXPECT_EQ(got.tokens, want.tokens);
    return got;
  }

  static std::string* base_;
  static std::string* mtp_;
  static std::string* identity_;
};

std::string* NextnDraftTest::base_ = nullptr;
std::string* NextnDraftTest::mtp_ = nullptr;
std::string* NextnDraftTest::identity_ = nullptr;

const std::vector<std::vector<int32_t>>& Prompts() {
  static const std::vector<std::vector<int32_t>> p = {
      {1, 17, 250, 3, 99},
      {1, 400, 401, 402, 403, 404, 405, 406, 407},
      {1, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12}};
  return p;
}

TEST_F(NextnDraftTest, GreedyOutputIsPlainDecodingsAndDraftsAreChecked) {
  auto plain = Open(*mtp_, false);
  auto mtp = Open(*mtp_, true);
  ASSERT_TRUE(plain && mtp);
  // The main stack does not run the next-n block: the file without it decodes the same.
  auto base = Open(*base_, false);
  ASSERT_TRUE(base);
  int64_t drafted = 0, accepted = 0, passes = 0;
  for (const auto& prompt : Prompts()) {
    for (int k : {1, 3}) {
      auto ps = plain->NewSession(0);
      auto ms = mtp->NewSession(0);
      auto bs = base->NewSession(0);
      ASSERT_TRUE(ps.ok() && ms.ok() && bs.ok());
      const Outcome want = Generate(*plain, **ps, prompt, 40, 0);
      const Outcome got = Generate(*mtp, **ms, prompt, 40, k);
      EXPECT_EQ(Generate(*base, **bs, prompt, 40, 0).tokens, want.tokens);
      ASSERT_EQ(want.tokens.size(), 40u);
      EXPECT_EQ(got.tokens, want.tokens) << "draft max " << k;
      EXPECT_LT(got.stats.n_forwards, want.stats.n_forwards + 1);
      drafted += got.stats.n_drafted;
      accepted += got.stats.n_accepted;
      passes += got.stats.n_draft_passes;

      // The conversation goes on: the history and a few more tokens, the reused prefix's
      // next-n entries kept.
      std::vector<int32_t> longer = prompt;
      longer.insert(longer.end(), want.tokens.begin(), want.tokens.end());
      longer.insert(longer.end(), {5, 6, 7});
      const Outcome want2 = Generate(*plain, **ps, longer, 24, 0);
      const Outcome got2 = Generate(*mtp, **ms, longer, 24, k);
      EXPECT_EQ(got2.tokens, want2.tokens) << "draft max " << k;
      EXPECT_GT(got2.stats.n_reused, 0);
      drafted += got2.stats.n_drafted;
    }
  }
  EXPECT_GT(drafted, 100);
  EXPECT_GT(passes, 100);
  EXPECT_LE(accepted, drafted);
}

// The pass-through block: each next-n step's logits are the main model's at that position, so the
// hidden rows kept, their order against the embeddings in eh_proj's input, the block's residual
// path and the head borrowed from the main model are all checked; and the first draft of each
// step is the token just chosen.
TEST_F(NextnDraftTest, APassThroughLayerGivesTheMainModelsLogits) {
  auto e = Open(*identity_, true);
  ASSERT_TRUE(e);
  Model& m = e->model();
  const int64_t V = m.hparams().n_vocab;
  auto s = e->NewSession(0);
  ASSERT_TRUE(s.ok());
  const std::vector<int32_t>& prompt = Prompts()[1];
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<float> main_logits;
  ASSERT_TRUE(m.Forward(prompt.data(), n, (*s)->cache, true, &main_logits).ok());
  ASSERT_EQ((*s)->cache.hidden_begin(), 0);
  ASSERT_EQ((*s)->cache.hidden_end(), n);
  std::vector<float> logits;
  for (int64_t i = 0; i + 1 < n; ++i) {
    ASSERT_TRUE(m.ForwardNextn(&prompt[i + 1], (*s)->cache.HiddenRow(i), 1, *(*s)->nextn_cache,
                               &logits, nullptr)
                    .ok());
    double worst = 0;
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, std::fabs(double{logits[v]} - main_logits[i * V + v]));
    EXPECT_LT(worst, 1e-3) << "position " << i;
  }
  // In generation, the first draft repeats the last chosen token: accepted where the model
  // repeats itself (a token after an accepted draft comes with the verify pass, undrafted).
  auto g = e->NewSession(0);
  ASSERT_TRUE(g.ok());
  const Outcome out = Generate(*e, **g, Prompts()[2], 30, 1);
  int64_t repeats = 0;
  for (size_t i = 1; i < out.tokens.size(); ++i) repeats += out.tokens[i] == out.tokens[i - 1];
  EXPECT_GT(out.stats.n_accepted, 0);
  EXPECT_LE(out.stats.n_accepted, repeats);
}

TEST_F(NextnDraftTest, CacheAfterGenerationEqualsAFreshPrefill) {
  if (testing::TestDevice() != "cpu") GTEST_SKIP() << "reads the KV cache's host bytes";
  auto mtp = Open(*mtp_, true);
  ASSERT_TRUE(mtp);
  auto s = mtp->NewSession(0);
  ASSERT_TRUE(s.ok());
  Generate(*mtp, **s, Prompts()[1], 30, 3);
  const KvCache& got = *(*s)->nextn_cache;
  const std::vector<int32_t> history = (*s)->cache.tokens();
  ASSERT_GT(got.n_past(), 30);

  // A fresh session prefilled with the same tokens (and one more to pick) computes the entries
  // from the prompt pass's hidden rows.
  auto f = mtp->NewSession(0);
  ASSERT_TRUE(f.ok());
  std::vector<int32_t> prompt = history;
  prompt.push_back(2);
  Generate(*mtp, **f, prompt, 1, 3);
  const KvCache& want = *(*f)->nextn_cache;
  ASSERT_GE(want.n_past(), got.n_past());
  for (int64_t i = 0; i < got.n_past(); ++i) ASSERT_EQ(got.tokens()[i], want.tokens()[i]);
  const size_t n = static_cast<size_t>(got.n_past()) * got.k_row_bytes() / sizeof(float);
  const float* a = reinterpret_cast<const float*>(const_cast<KvCache&>(got).KeyBytes(0));
  const float* b = reinterpret_cast<const float*>(const_cast<KvCache&>(want).KeyBytes(0));
  double worst = 0;
  for (size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(double{a[i]} - b[i]) / (1e-3 + std::fabs(double{b[i]})));
  EXPECT_LT(worst, 1e-3);
}

// The server's way: sessions on their own threads through one batcher, each drafting from its
// own next-n cache in exclusive passes while the verify passes share steps (each sequence's
// hidden rows come back from the multi-sequence pass).
TEST_F(NextnDraftTest, ConcurrentSessionsThroughABatcher) {
  auto plain = Open(*mtp_, false);
  auto mtp = Open(*mtp_, true);
  ASSERT_TRUE(plain && mtp);
  std::vector<std::vector<int32_t>> want;
  for (const auto& prompt : Prompts()) {
    auto s = plain->NewSession(0);
    ASSERT_TRUE(s.ok());
    want.push_back(Generate(*plain, **s, prompt, 36, 0).tokens);
  }
  PassBatcherOptions bo;
  bo.batch_invariant = true;
  bo.gather_wait = std::chrono::milliseconds(50);  // a loaded test machine is slow to wake threads
  PassBatcher batcher(mtp.get(), bo);
  std::vector<Outcome> got(Prompts().size());
  std::vector<std::thread> threads;
  // The sessions start together, so that a loaded machine's thread start-up does not run them
  // one after the other.
  std::atomic<int> ready{0};
  const int n = static_cast<int>(Prompts().size());
  for (size_t i = 0; i < Prompts().size(); ++i)
    threads.emplace_back([&, i] {
      auto s = mtp->NewSession(0);
      ++ready;
      while (ready.load() < n) std::this_thread::yield();
      ASSERT_TRUE(s.ok());
      got[i] = Generate(*mtp, **s, Prompts()[i], 36, 2, &batcher);
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < Prompts().size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i]) << "prompt " << i;
    EXPECT_GT(got[i].stats.n_drafted, 0);
  }
  const PassBatcherStats bs = batcher.stats();
  EXPECT_GT(bs.exclusive, 0u);
  EXPECT_GE(bs.max_sequences, 2u);
}

TEST_F(NextnDraftTest, TheLayerIsLoadedAndPlannedOnlyForDrafting) {
  MemoryLedger plain_ledger, mtp_ledger;
  auto plain = Open(*mtp_, false, 0, &plain_ledger);
  auto mtp = Open(*mtp_, true, 0, &mtp_ledger);
  ASSERT_TRUE(plain && mtp);
  EXPECT_EQ(plain->weights().Resolve("blk.3.nextn.eh_proj.weight"), kNoTensor);
  EXPECT_NE(mtp->weights().Resolve("blk.3.nextn.eh_proj.weight"), kNoTensor);
  // The next-n block is a quarter of this model's layers.
  EXPECT_LT(plain_ledger.current() * 1.1, mtp_ledger.current());
  constexpr uint64_t kBudget = 48ull << 20;
  auto in_place = Open(*mtp_, false, kBudget);
  ASSERT_TRUE(in_place && in_place->runtime());
  EXPECT_EQ(in_place->weights().OpBytes("block_3.attn", 0), 0u);
  EXPECT_EQ(in_place->weights().OpBytes("block_3.nextn", 0), 0u);
}

TEST_F(NextnDraftTest, ReadInPlaceUnderABudget) {
  constexpr uint64_t kBudget = 48ull << 20;
  MemoryLedger ledger;
  auto plain = Open(*mtp_, false);
  auto mtp = Open(*mtp_, true, kBudget, &ledger, /*expert_slots=*/4);
  ASSERT_TRUE(plain && mtp);
  ASSERT_TRUE(mtp->runtime());
  EXPECT_GT(mtp->weights().OpBytes("block_3.nextn", 0), 0u);
  EXPECT_GT(mtp->weights().OpBytes("block_3.moe.expert_0", 0), 0u);
  for (const auto& prompt : Prompts())
    EXPECT_GT(ExpectPlainTokens(*plain, *mtp, prompt, 32, 3).stats.n_draft_passes, 0);
  EXPECT_LE(ledger.peak(), kBudget);
  // Two MoE layers of 8 experts and the next-n layer's 8, through 4 slots.
  const ResidencyStats rs = mtp->runtime()->stats();
  EXPECT_EQ(rs.n_ops_expert, 24);
  EXPECT_EQ(rs.expert_slots, 4);
  EXPECT_GT(rs.expert_misses, 100u);
}

// Another architecture's layers as the next-n block (`synth --nextn 1` on a qwen2moe layout, with
// a vocabulary): text in, the same text out with drafting, from the GGUF and from a packed store
// (which holds the layer as ops of its own, loaded only for drafting).
TEST_F(NextnDraftTest, SynthFileWithANextnLayer) {
  const std::string path = testing::StoreTestPath("nextn_synth.gguf");
  const std::string cmd = std::string(SUBSTRATE_BINARY) +
                          " synth --preset test-tiny-moe --type Q8_0 --nextn 1 -t 2 -o " + path +
                          " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EngineOptions o;
  o.n_ctx = 128;
  o.device = testing::TestDevice();
  auto plain = Engine::Load(path, o);
  o.draft_mtp = true;
  auto mtp = Engine::Load(path, o);
  ASSERT_TRUE(plain.ok() && mtp.ok());
  EXPECT_EQ((*mtp)->model().hparams().n_layer, 2);
  EXPECT_EQ((*mtp)->model().hparams().n_nextn, 1);
  auto ids = (*plain)->tokenizer()->Encode("the quick brown fox");
  ASSERT_TRUE(ids.ok());
  const std::vector<int32_t> prompt(ids->begin(), ids->end());
  EXPECT_GT(ExpectPlainTokens(**plain, **mtp, prompt, 40, 3).stats.n_drafted, 0);

  const std::string store = testing::StoreTestPath("nextn_store");
  const std::string pack =
      std::string(SUBSTRATE_BINARY) + " pack -m " + path + " -o " + store + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(pack.c_str()), 0) << pack;
  EngineOptions so;
  so.n_ctx = 128;
  so.store = store;
  so.max_ram = 64ull << 20;
  MemoryLedger plain_ledger, mtp_ledger;
  so.ledger = &plain_ledger;
  auto splain = Engine::Load("", so);
  so.ledger = &mtp_ledger;
  so.draft_mtp = true;
  auto smtp = Engine::Load("", so);
  ASSERT_TRUE(splain.ok() && smtp.ok()) << splain.status().ToString() << smtp.status().ToString();
  EXPECT_GT(ExpectPlainTokens(**splain, **smtp, prompt, 40, 3).stats.n_drafted, 0);
  // Without drafting the next-n ops are never loaded: less resident weight.
  EXPECT_LT(plain_ledger.Accounts()["weights"].peak, mtp_ledger.Accounts()["weights"].peak);
  std::error_code ec;
  fs::remove_all(store, ec);
  std::remove(path.c_str());
}

// The hidden rows a cache keeps are bounded: the oldest go, a pass's own rows stay.
TEST_F(NextnDraftTest, HiddenRowsAreBounded) {
  auto e = Open(*mtp_, true);
  ASSERT_TRUE(e);
  auto s = e->NewSession(0);
  ASSERT_TRUE(s.ok());
  KvCache& c = (*s)->cache;
  c.set_keep_hidden(true, 4);
  c.HiddenRows(0, 3, 2)[5] = 1.0f;
  c.HiddenRows(3, 3, 2)[0] = 2.0f;
  EXPECT_EQ(c.hidden_begin(), 2);
  EXPECT_EQ(c.hidden_end(), 6);
  EXPECT_EQ(c.HiddenRow(2)[1], 1.0f);
  EXPECT_EQ(c.HiddenRow(3)[0], 2.0f);
  c.HiddenRows(6, 10, 2);  // longer than the bound: all its rows stay
  EXPECT_EQ(c.hidden_begin(), 6);
  EXPECT_EQ(c.hidden_end(), 16);
  c.HiddenRows(9, 1, 2);  // a verify pass after a rejection rewrites from its position
  EXPECT_EQ(c.hidden_begin(), 6);
  EXPECT_EQ(c.hidden_end(), 10);
}

TEST_F(NextnDraftTest, AModelWithoutANextnLayerIsRefused) {
  EngineOptions o;
  o.require_tokenizer = false;
  o.draft_mtp = true;
  auto e = Engine::Load(*base_, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().ToString().find("nextn_predict_layers"), std::string::npos)
      << e.status().ToString();
  o.draft_model = *base_;
  auto both = Engine::Load(*mtp_, o);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().ToString().find("one drafter"), std::string::npos);
}

}  // namespace
}  // namespace substrate
