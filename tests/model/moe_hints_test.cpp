// The MoE routing hints (WeightSource::HintExperts): a recording source over the resident one
// checks that every acquired expert was hinted first, in its own op, and that the hint names
// exactly the experts acquired; logits do not change when the look-ahead runs or when experts
// still being read run after the others; and it measures how many of a layer's experts the
// look-ahead (layer L+d's router on layer L's hidden state, d = 1 and 2) predicted, on heldout
// text.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu_features.h"
#include "model/expert_batch.h"
#include "model/kv_cache.h"
#include "model/op_id.h"
#include "model_test_util.h"
#include "tokenizer/tokenizer.h"

namespace substrate::testing {
namespace {

class RecordingSource : public WeightSource {
 public:
  RecordingSource(WeightSource* inner, int depth) : inner_(inner), depth_(depth) {}

  TensorId Resolve(const std::string& name) const override { return inner_->Resolve(name); }
  const TensorInfo& Info(TensorId id) const override { return inner_->Info(id); }
  int LookaheadLayers() const override { return depth_; }

  void BeginOp(const std::string& op) override {
    if (op == OpIdTokenEmbd()) EndPass();
    open_.insert(op);
  }
  void EndOp(const std::string& op) override { open_.erase(op); }

  void HintExperts(int layer, const int32_t* experts, int n) override {
    std::set<int> s(experts, experts + n);
    if (static_cast<int>(s.size()) != n) ++errors;  // duplicates
    for (int i = 1; i < n; ++i)
      if (experts[i] <= experts[i - 1]) ++errors;  // not increasing
    // With the look-ahead d layers deep, the first min(d, layer) hints of a layer in a pass are
    // guesses, farthest first (every layer of the fixture is a MoE layer).
    const int k = hinted_[layer]++;
    const int n_guesses = std::min(depth_, layer);
    if (k < n_guesses) {
      guess_[n_guesses - k][layer] = s;
      ++guesses;
    } else {
      if (real_.count(layer)) ++errors;  // two real hints for one layer
      real_[layer] = s;
    }
  }

  // With `split`, every other routed expert of a decode step reads as still in flight, so the
  // step computes the others (and the shared expert) first.
  bool ExpertsReady(int layer, const int32_t* experts, int n, uint8_t* ready) override {
    if (!split) return false;
    for (int i = 0; i < n; ++i) ready[i] = i % 2 == 0;
    splits += n > 1;
    return true;
  }

  Expected<WeightHandle> Acquire(TensorId id, int slice, int tier) override {
    if (slice >= 0) {
      const std::string& name = Info(id).name;  // blk.L.ffn_*_exps.weight
      const int layer = std::stoi(name.substr(4, name.find('.', 4) - 4));
      ++expert_acquires;
      if (!real_.count(layer) || !real_[layer].count(slice)) ++unhinted;
      if (!open_.count(OpIdMoeExpert(layer, slice))) ++outside_op;
      acquired_[layer].insert(slice);
    } else if (const std::string& name = Info(id).name; name.find("_shexp") != std::string::npos) {
      const int layer = std::stoi(name.substr(4, name.find('.', 4) - 4));
      if (!open_.count(OpIdMoeShared(layer))) ++outside_op;  // shared expert in its own op
      ++shared_acquires;
    }
    return inner_->Acquire(id, slice, tier);
  }
  bool ReadsRows(TensorId id) const override { return inner_->ReadsRows(id); }
  Status ReadRows(TensorId id, const int32_t* rows, int64_t n, uint8_t* dst) override {
    return inner_->ReadRows(id, rows, n, dst);
  }

  // Closes the pass: compares hints with what was acquired, scores the guesses.
  void EndPass() {
    for (const auto& [layer, s] : real_)
      if (acquired_[layer] != s) ++errors;  // hinted experts never acquired, or the reverse
    for (int d = 1; d <= depth_; ++d)
      for (const auto& [layer, g] : guess_[d]) {
        const std::set<int>& a = real_[layer];
        if (static_cast<int>(a.size()) > decode_k) continue;  // score decode steps only
        for (int e : a) predicted[d] += g.count(e);
        actual[d] += static_cast<int64_t>(a.size());
      }
    real_.clear();
    for (auto& g : guess_) g.clear();
    acquired_.clear();
    hinted_.clear();
  }

  bool split = false;
  int splits = 0;
  int decode_k = 1 << 30;  // a real hint with more experts is a prefill pass
  int errors = 0, unhinted = 0, outside_op = 0, guesses = 0;
  int64_t expert_acquires = 0, shared_acquires = 0;
  int64_t predicted[3] = {}, actual[3] = {};  // by look-ahead depth (1, 2)

 private:
  WeightSource* inner_;
  int depth_;
  std::multiset<std::string> open_;
  std::map<int, std::set<int>> real_, guess_[3], acquired_;
  std::map<int, int> hinted_;
};

// Prefill `prefill` tokens, then teacher-forced decode of the rest one at a time.
void RunText(const LoadedModel& m, WeightSource* src, const std::vector<int32_t>& toks,
             size_t prefill, std::vector<float>* all, MemoryLedger* ledger) {
  ThreadPool& pool = TestPool();
  auto model = Model::Create(m.file->metadata(), src, &pool, ledger);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto cache = KvCache::Create((*model)->hparams(), static_cast<int64_t>(toks.size()) + 8, (*model)->backend());
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward(toks.data(), static_cast<int64_t>(prefill), *cache, false, &logits).ok());
  all->insert(all->end(), logits.begin(), logits.end());
  for (size_t i = prefill; i < toks.size(); ++i) {
    ASSERT_TRUE((*model)->Forward(&toks[i], 1, *cache, false, &logits).ok());
    all->insert(all->end(), logits.begin(), logits.end());
  }
}

TEST(MoeHints, EveryAcquiredExpertIsHintedAndLookaheadIsMeasured) {
  const std::string path = SharedDir() + "/gguf/tiny-coder-moe-bf16.gguf";
  const std::string text_path = SharedDir() + "/text/heldout.txt";
  if (!Exists(path) || !Exists(text_path)) GTEST_SKIP() << "no fixture " << path << " or " << text_path;
  MemoryLedger ledger;
  auto m = LoadModel(path, &ledger);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto tok = Tokenizer::FromMetadata(m->file->metadata());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto text = ReadFileToString(text_path);
  ASSERT_TRUE(text.ok());
  auto ids = (*tok)->Encode(text->substr(0, 4000));
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> toks(ids->begin(), ids->end());
  if (toks.size() > 160) toks.resize(160);
  ASSERT_GT(toks.size(), 64u);
  const size_t prefill = 32;

  std::vector<float> plain, hinted, ahead, ahead2, late_last;
  RunText(*m, m->source.get(), toks, prefill, &plain, &ledger);
  RecordingSource no_look(m->source.get(), 0), look(m->source.get(), 1), look2(m->source.get(), 2),
      split(m->source.get(), 1);
  look.decode_k = look2.decode_k = m->model->hparams().n_expert_used;
  split.split = true;
  RunText(*m, &no_look, toks, prefill, &hinted, &ledger);
  RunText(*m, &look, toks, prefill, &ahead, &ledger);
  RunText(*m, &look2, toks, prefill, &ahead2, &ledger);
  RunText(*m, &split, toks, prefill, &late_last, &ledger);
  for (RecordingSource* r : {&no_look, &look, &look2, &split}) r->EndPass();
  EXPECT_GT(split.splits, 0) << "no decode step ran its late experts last";

  for (RecordingSource* r : {&no_look, &look, &look2, &split}) {
    EXPECT_GT(r->expert_acquires, 0);
    EXPECT_GT(r->shared_acquires, 0);
    EXPECT_EQ(r->errors, 0);
    EXPECT_EQ(r->unhinted, 0) << "experts acquired before their layer's hint";
    EXPECT_EQ(r->outside_op, 0) << "expert tensors acquired outside their op";
  }
  EXPECT_EQ(no_look.guesses, 0);
  EXPECT_GT(look.guesses, 0);
  EXPECT_GT(look2.guesses, look.guesses);
  // The hooks change no arithmetic; nor does running a decode step's experts together.
  ASSERT_EQ(plain.size(), ahead.size());
  EXPECT_EQ(plain, hinted);
  EXPECT_EQ(plain, ahead);
  EXPECT_EQ(plain, ahead2);
  EXPECT_EQ(plain, late_last) << "running late experts in a second batch changed the logits";
  std::vector<float> one_by_one;
  const int64_t old = SetBatchedExpertMaxTokens(0);
  RunText(*m, m->source.get(), toks, prefill, &one_by_one, &ledger);
  SetBatchedExpertMaxTokens(old);
  EXPECT_EQ(plain, one_by_one);

  const int K = m->model->hparams().n_expert_used, E = m->model->hparams().n_expert;
  auto precision = [](const RecordingSource& r, int d) {
    return static_cast<double>(r.predicted[d]) / static_cast<double>(r.actual[d]);
  };
  // Depth 1 scores the same whether or not a depth-2 guess came before it.
  EXPECT_EQ(look.predicted[1], look2.predicted[1]);
  std::printf("{\"lookahead_precision\": %.4f, \"lookahead2_precision\": %.4f, \"predicted\": %lld, "
              "\"actual\": %lld, \"chance\": %.4f, \"tokens\": %zu}\n",
              precision(look, 1), precision(look2, 2), static_cast<long long>(look.predicted[1]),
              static_cast<long long>(look.actual[1]), static_cast<double>(K) / E, toks.size());
  // Far better than chance (K/E), or the look-ahead is not using the later layers' routers.
  EXPECT_GT(precision(look, 1), 2.0 * K / E);
  EXPECT_GT(precision(look2, 2), 2.0 * K / E);
}

// A Q8_0 MoE loaded as engines load it: its Q8_0 matrices (the shared expert's, and each routed
// expert's slice of the stacked tensors) take the interleaved decode layout. Its decode steps
// still run the experts together (interleaved products inside the same batches), with the same
// logits as expert by expert: on the interleaved kernel, and on AVX2, where the groups are put
// back into rows.
TEST(MoeHints, BatchedEqualsOneByOneWithInterleavedExperts) {
  const std::string path = SharedDir() + "/gguf/tiny-coder-moe-Q8_0.gguf";
  if (!Exists(path)) GTEST_SKIP() << "no fixture " << path;
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "no interleaved layout below AVX-512";
  MemoryLedger ledger;
  LoadedModel m;
  auto file = ModelFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  m.file = std::move(file).value();
  CpuBackend backend(&TestPool(), &ledger);
  ResidentWeightSource::Options ro;
  ro.backend = &backend;
  auto src = ResidentWeightSource::Load(*m.file, &ledger, ro);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  m.source = std::move(src).value();
  {
    auto h = m.source->Acquire(m.source->Resolve("blk.0.ffn_gate_shexp.weight"));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_EQ(h->view().layout, WeightLayout::kQ8_0Interleaved);
    auto e = m.source->Acquire(m.source->Resolve("blk.0.ffn_down_exps.weight"), 31);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_EQ(e->view().layout, WeightLayout::kQ8_0Interleaved);
  }
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back(static_cast<int32_t>((i * 37 + 11) % 8000));
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    const Isa prev = SetIsaForTesting(isa);
    std::vector<float> batched, one_by_one;
    RunText(m, m.source.get(), toks, 8, &batched, &ledger);
    const int64_t old = SetBatchedExpertMaxTokens(0);
    RunText(m, m.source.get(), toks, 8, &one_by_one, &ledger);
    SetBatchedExpertMaxTokens(old);
    SetIsaForTesting(prev);
    ASSERT_EQ(batched.size(), one_by_one.size());
    EXPECT_TRUE(batched == one_by_one) << IsaName(isa);
  }
}

}  // namespace
}  // namespace substrate::testing
