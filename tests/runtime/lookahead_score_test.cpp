// The runtime's own score of the look-ahead (ResidencyStats::lookahead): tiny-coder-moe read in
// place with its experts streamed, guessing two layers ahead, decodes held-out text one token
// at a time. A source between the model and the runtime logs every hint and scores the guesses
// by the hint protocol alone (WeightSource::HintExperts: per pass and layer, the hints before the
// last are guesses, farthest first); the runtime's per-depth counts must equal that score. Also
// the reads' busy time (wall time with a read running) is at most their summed time. And the
// expert cache's policy and look-ahead depth as chosen from how many tokens' experts it holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "core/file_io.h"
#include "format/model_file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/op_id.h"
#include "runtime/residency_manager.h"
#include "store/store_fixture.h"
#include "tokenizer/tokenizer.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using testing::StoreTestPath;
using testing::StoreTestPool;

// Forwards to the runtime; scores the guesses of one-token passes from the order of the hints.
class HintLog : public WeightSource {
 public:
  HintLog(WeightSource* inner, int k) : inner_(inner), k_(k) {}

  TensorId Resolve(const std::string& name) const override { return inner_->Resolve(name); }
  const TensorInfo& Info(TensorId id) const override { return inner_->Info(id); }
  Expected<WeightHandle> Acquire(TensorId id, int slice, int tier) override {
    return inner_->Acquire(id, slice, tier);
  }
  bool ReadsRows(TensorId id) const override { return inner_->ReadsRows(id); }
  Status ReadRows(TensorId id, const int32_t* rows, int64_t n, uint8_t* dst) override {
    return inner_->ReadRows(id, rows, n, dst);
  }
  int DefaultTier() const override { return inner_->DefaultTier(); }
  void BindOpTiers(const std::vector<OpSpec>& ops, const uint8_t* tiers) override {
    inner_->BindOpTiers(ops, tiers);
  }
  uint64_t OpBytes(const std::string& op, int tier) const override {
    return inner_->OpBytes(op, tier);
  }
  void BeginOp(const std::string& op) override {
    if (op == OpIdTokenEmbd()) hints_.clear();  // a new pass
    inner_->BeginOp(op);
  }
  void EndOp(const std::string& op) override { inner_->EndOp(op); }
  int LookaheadLayers() const override { return inner_->LookaheadLayers(); }
  bool CachedExperts(int layer, uint8_t* cached) override {
    return inner_->CachedExperts(layer, cached);
  }
  bool ExpertsReady(int layer, const int32_t* experts, int n, uint8_t* ready) override {
    return inner_->ExpertsReady(layer, experts, n, ready);
  }

  void HintExperts(int layer, const int32_t* experts, int n) override {
    inner_->HintExperts(layer, experts, n);
    std::vector<std::vector<int32_t>>& h = hints_[layer];
    h.emplace_back(experts, experts + n);
    // Every layer of the fixture routes, so a layer's real hint comes after min(depth, layer)
    // guesses; the last of them (one layer ahead) is depth 1.
    const int n_guesses = std::min(inner_->LookaheadLayers(), layer);
    if (static_cast<int>(h.size()) != n_guesses + 1) return;
    const std::vector<int32_t>& real = h.back();
    if (static_cast<int>(real.size()) > k_) return;  // a prompt's pass: unions, not scored
    for (int i = 0; i < n_guesses; ++i) {
      const int d = n_guesses - i;
      guessed[d] += h[i].size();
      routed[d] += real.size();
      for (int32_t e : h[i]) right[d] += std::count(real.begin(), real.end(), e);
    }
  }

  uint64_t guessed[ResidencyStats::kScoredDepths + 1] = {};
  uint64_t routed[ResidencyStats::kScoredDepths + 1] = {};
  uint64_t right[ResidencyStats::kScoredDepths + 1] = {};

 private:
  WeightSource* inner_;
  int k_;
  std::map<int, std::vector<std::vector<int32_t>>> hints_;  // this pass's, by layer
};

// tiny-coder-moe Q8_0 read in place; its checksum record goes to a temp folder, not beside the
// read-only fixture.
class LookaheadScore : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(path_)) GTEST_SKIP() << "no fixture " << path_;
    setenv("SUBSTRATE_CACHE_DIR", cache_dir_.c_str(), 1);
    auto file = ModelFile::Open(path_);
    ASSERT_TRUE(file.ok());
    file_ = std::move(*file);
    auto hp = ModelHParams::FromMetadata(file_->metadata());
    ASSERT_TRUE(hp.ok());
    hp_ = *hp;
    for (const TensorInfo& t : file_->tensors()) weights_ += t.bytes;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(cache_dir_, ec);
  }

  const std::string path_ = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-Q8_0.gguf";
  const std::string cache_dir_ = StoreTestPath("lookahead_cache");
  std::unique_ptr<ModelFile> file_;
  ModelHParams hp_;
  uint64_t weights_ = 0;
};

TEST_F(LookaheadScore, RuntimeScoresItsGuessesAsTheHintsSay) {
  const std::string text_path = std::string(SUBSTRATE_SHARED_DIR) + "/text/heldout.txt";
  if (!fs::exists(text_path)) GTEST_SKIP() << "no fixture " << text_path;
  MemoryLedger ledger;
  ResidencyOptions ro;
  ro.reserve_bytes = EstimateRunReserve(hp_, 256, 256);
  ro.budget_bytes = weights_ / 2 + ro.reserve_bytes;  // about half the experts cached
  ro.lookahead_layers = 2;
  auto rm = ResidencyManager::OpenGguf(path_, &ledger, ro);
  ASSERT_TRUE(rm.ok()) << rm.status().ToString();
  ASSERT_GT((*rm)->stats().n_ops_expert, (*rm)->stats().expert_slots) << "experts must stream";
  ASSERT_EQ((*rm)->LookaheadLayers(), 2);

  HintLog log(rm->get(), hp_.n_expert_used);
  auto model = Model::Create((*rm)->metadata(), &log, &StoreTestPool(), &ledger);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto tok = Tokenizer::FromMetadata(file_->metadata());
  ASSERT_TRUE(tok.ok());
  auto text = ReadFileToString(text_path);
  ASSERT_TRUE(text.ok());
  auto ids = (*tok)->Encode(text->substr(120008, 3000));
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 72u);
  auto cache = KvCache::Create((*model)->hparams(), 128, (*model)->backend());
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  const int64_t prompt = 16;
  ASSERT_TRUE((*model)->Forward(ids->data(), prompt, *cache, false, &logits).ok());
  for (int64_t i = prompt; i < 72; ++i)
    ASSERT_TRUE((*model)->Forward(&(*ids)[static_cast<size_t>(i)], 1, *cache, false, &logits).ok());

  const ResidencyStats st = (*rm)->stats();
  const int K = hp_.n_expert_used, E = hp_.n_expert;
  for (int d = 1; d <= ResidencyStats::kScoredDepths; ++d) {
    SCOPED_TRACE("depth " + std::to_string(d));
    EXPECT_EQ(st.lookahead[d].guessed, log.guessed[d]);
    EXPECT_EQ(st.lookahead[d].routed, log.routed[d]);
    EXPECT_EQ(st.lookahead[d].right, log.right[d]);
  }
  for (int d = 1; d <= 2; ++d) {
    // Every decode step guesses each layer it can reach: K experts a guess.
    EXPECT_GT(st.lookahead[d].guessed, static_cast<uint64_t>(K) * 40);
    // Better than chance (K of E), or these are not the later layers' routers.
    EXPECT_GT(static_cast<double>(st.lookahead[d].right) / st.lookahead[d].routed, 2.0 * K / E);
  }
  EXPECT_EQ(st.lookahead[3].guessed, 0u);
  ASSERT_GT(st.stream_bytes_read, 0u);
  EXPECT_GT(st.read_busy_seconds, 0.0);
  EXPECT_LE(st.read_busy_seconds, st.read_seconds * 1.0001 + 1e-6);
}

// The expert cache's policy and look-ahead follow how many tokens' experts it holds: below two
// (ResidencyOptions::kTightTokens), decayed use counts and no guesses; from two on, least
// recently used and one layer of guesses; explicit options win. Dry-run plans over a range of
// budgets, which must give both kinds of cache.
TEST_F(LookaheadScore, TightCachesCountUsesAndGuessNothing) {
  const int per_token = hp_.n_layer * hp_.n_expert_used;  // every layer routes
  bool tight_seen = false, roomy_seen = false;
  for (double frac = 0.1; frac < 1.0; frac += 0.1) {
    ResidencyOptions ro;
    ro.reserve_bytes = EstimateRunReserve(hp_, 256, 256);
    ro.budget_bytes = static_cast<uint64_t>(weights_ * frac) + ro.reserve_bytes;
    ro.dry_run = true;
    MemoryLedger ledger;
    auto rm = ResidencyManager::OpenGguf(path_, &ledger, ro);
    if (!rm.ok()) continue;  // below the minimum
    const ResidencyStats st = (*rm)->stats();
    if (st.expert_slots >= st.n_ops_expert) continue;  // every expert fits
    SCOPED_TRACE(std::to_string(st.expert_slots) + " slots");
    const bool tight = st.expert_slots < ResidencyOptions::kTightTokens * per_token;
    (tight ? tight_seen : roomy_seen) = true;
    EXPECT_EQ(st.expert_policy,
              tight ? ExpertCache::Policy::kDecayed : ExpertCache::Policy::kLru);
    EXPECT_EQ(st.lookahead_layers, tight ? 0 : 1);
    ro.expert_policy = ExpertCache::Policy::kLru;
    ro.lookahead_layers = 2;
    auto set = ResidencyManager::OpenGguf(path_, &ledger, ro);
    ASSERT_TRUE(set.ok());
    EXPECT_EQ((*set)->stats().expert_policy, ExpertCache::Policy::kLru);
    EXPECT_EQ((*set)->stats().lookahead_layers, 2);
  }
  EXPECT_TRUE(tight_seen && roomy_seen);
}

}  // namespace
}  // namespace substrate
