// Continuous batching's contract with the model: a multi-sequence pass (Model::ForwardSequences)
// gives every sequence, bit for bit, the logits and cache it gets evaluated alone, whatever
// else shares the pass: sequences at different positions, a prompt chunk beside one-token
// decode rows, all logits or only the last. Dense, MoE and MLA (deepseek) models, under
// ExactTokenRows as the batched token steps run.
#include <cstring>

#include "kernels/matmul.h"
#include "model/kv_cache.h"
#include "model_test_util.h"

namespace substrate::testing {
namespace {

struct Seq {
  int64_t history;  // tokens already in the cache before the pass
  int64_t n;        // tokens in the pass
  bool all_logits;
};

std::vector<int32_t> Tokens(int64_t n, int64_t V, int salt) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i)
    t.push_back(static_cast<int32_t>((i * 7919 + salt * 104729 + 13) % V));
  return t;
}

// Evaluates `seqs` alone and together; the logits of each must match bit for bit, and so must
// those of one more one-token pass in each cache afterwards (the caches hold the same rows).
void CheckBatched(const std::string& path, const std::vector<Seq>& seqs) {
  SCOPED_TRACE(path);
  MemoryLedger ledger;
  auto m = LoadModel(path, &ledger);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Model& model = *m->model;
  const int64_t V = model.hparams().n_vocab;
  const bool exact_bits = TestDevice() == "cpu";
  ExactTokenRows exact;

  std::vector<KvCache> alone, together;
  std::vector<std::vector<int32_t>> history, pass, next;
  std::vector<float> scratch;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (auto* caches : {&alone, &together}) {
      auto c = KvCache::Create(model.hparams(), 64, model.backend());
      ASSERT_TRUE(c.ok());
      caches->push_back(std::move(*c));
    }
    history.push_back(Tokens(seqs[i].history, V, static_cast<int>(i)));
    pass.push_back(Tokens(seqs[i].n, V, static_cast<int>(i) + 17));
    next.push_back(Tokens(1, V, static_cast<int>(i) + 31));
    if (seqs[i].history > 0) {
      for (auto* caches : {&alone, &together}) {
        ASSERT_TRUE(
            model.Forward(history[i].data(), seqs[i].history, (*caches)[i], false, &scratch).ok());
      }
    }
  }

  std::vector<std::vector<float>> want(seqs.size()), got(seqs.size());
  std::vector<Model::SequencePass> passes;
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_TRUE(
        model.Forward(pass[i].data(), seqs[i].n, alone[i], seqs[i].all_logits, &want[i]).ok());
    got[i].assign(want[i].size(), -1.0f);
    passes.push_back({pass[i].data(), seqs[i].n, &together[i], seqs[i].all_logits, got[i].data()});
  }
  ASSERT_TRUE(model.ForwardSequences(passes.data(), static_cast<int>(passes.size())).ok());

  auto same = [&](const std::vector<float>& a, const std::vector<float>& b) {
    if (exact_bits) return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    return RelError(a.data(), b.data(), a.size()) < 1e-5;
  };
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_TRUE(same(want[i], got[i]))
        << "sequence " << i << " (history " << seqs[i].history << ", " << seqs[i].n << " tokens)";
    EXPECT_EQ(together[i].tokens(), alone[i].tokens()) << "sequence " << i;
    std::vector<float> a, b;
    ASSERT_TRUE(model.Forward(next[i].data(), 1, alone[i], false, &a).ok());
    ASSERT_TRUE(model.Forward(next[i].data(), 1, together[i], false, &b).ok());
    EXPECT_TRUE(same(a, b)) << "the pass after it, sequence " << i;
  }
}

const std::vector<Seq>& Mix() {
  // Decode rows at different positions, a prompt chunk, a drafted batch wanting every row.
  static const std::vector<Seq> mix = {
      {5, 1, false}, {0, 9, false}, {11, 1, false}, {3, 4, true}, {1, 1, true}};
  return mix;
}

TEST(MultiSequence, EachSequenceGetsItsAloneResultDenseAndMoe) {
  for (const char* name : {"tiny-coder", "tiny-coder-moe", "tiny-random-qwen3-moe",
                           "tiny-random-deepseek-v3", "tiny-random-qwen2"}) {
    const std::string f = SharedDir() + "/models/" + name;
    if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
    CheckBatched(f, Mix());
  }
}

TEST(MultiSequence, QuantizedFilesToo) {
  for (const char* name : {"tiny-coder-Q4_K_M", "tiny-coder-moe-Q8_0"}) {
    const std::string f = SharedDir() + "/gguf/" + name + ".gguf";
    if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
    CheckBatched(f, Mix());
  }
}

TEST(MultiSequence, BadPassesAreRefusedBeforeAnyWork) {
  const std::string f = SharedDir() + "/models/tiny-coder";
  if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
  MemoryLedger ledger;
  auto m = LoadModel(f, &ledger);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Model& model = *m->model;
  auto a = KvCache::Create(model.hparams(), 8, model.backend());
  auto b = KvCache::Create(model.hparams(), 8, model.backend());
  ASSERT_TRUE(a.ok() && b.ok());
  const int32_t ok[2] = {1, 2}, bad[1] = {-3};
  std::vector<int32_t> long_prompt(9, 1);
  // One cache twice.
  Model::SequencePass twice[2] = {{ok, 1, &*a, false, nullptr}, {ok + 1, 1, &*a, false, nullptr}};
  auto st = model.ForwardSequences(twice, 2);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("twice"), std::string::npos) << st.ToString();
  // A token outside the vocabulary, and a sequence past its context.
  Model::SequencePass with_bad[2] = {{ok, 2, &*a, false, nullptr}, {bad, 1, &*b, false, nullptr}};
  st = model.ForwardSequences(with_bad, 2);
  EXPECT_NE(st.ToString().find("out of range"), std::string::npos) << st.ToString();
  Model::SequencePass too_long[1] = {{long_prompt.data(), 9, &*b, false, nullptr}};
  st = model.ForwardSequences(too_long, 1);
  EXPECT_NE(st.ToString().find("context full"), std::string::npos) << st.ToString();
  // Nothing was evaluated.
  EXPECT_EQ(a->n_past(), 0);
  EXPECT_EQ(b->n_past(), 0);
}

}  // namespace
}  // namespace substrate::testing
