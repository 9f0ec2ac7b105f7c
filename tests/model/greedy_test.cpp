// Greedy decoding reproduces golden.json's continuation for the trained models, from the HF
// folder and from the reference toolchain's bf16 GGUF files.
#include "model/kv_cache.h"
#include "model/sampler.h"
#include "model_test_util.h"

namespace substrate::testing {
namespace {

void CheckGreedy(const std::string& model_path, const std::string& folder,
                 DType kv_type = DType::kF32) {
  auto golden = ReadJson(folder + "/golden.json");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const std::vector<int32_t> prompt = (*golden)["greedy"]["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> want = (*golden)["greedy"]["continuation"].get<std::vector<int32_t>>();
  MemoryLedger ledger;
  auto m = LoadModel(model_path, &ledger);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const int64_t V = m->model->hparams().n_vocab;
  auto cache = KvCache::Create(m->model->hparams(), 256, m->model->backend(), kv_type);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(ledger.Accounts()["kv_cache"].current, KvCache::Bytes(m->model->hparams(), 256, kv_type));
  std::vector<float> logits;
  ASSERT_TRUE(m->model->Forward(prompt.data(), static_cast<int64_t>(prompt.size()), *cache, false,
                                &logits).ok());
  std::vector<int32_t> got;
  for (size_t i = 0; i < want.size(); ++i) {
    int32_t tok = Argmax(logits.data(), V);
    got.push_back(tok);
    ASSERT_TRUE(m->model->Forward(&tok, 1, *cache, false, &logits).ok());
  }
  EXPECT_EQ(got, want) << model_path;
}

TEST(Greedy, TinyCoderFromHf) {
  const std::string f = SharedDir() + "/models/tiny-coder";
  if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
  CheckGreedy(f, f);
}

TEST(Greedy, TinyCoderMoeFromHf) {
  const std::string f = SharedDir() + "/models/tiny-coder-moe";
  if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
  CheckGreedy(f, f);
}

TEST(Greedy, TinyCoderFromBf16Gguf) {
  const std::string g = SharedDir() + "/gguf/tiny-coder-bf16.gguf";
  if (!Exists(g)) GTEST_SKIP() << "no fixture " << g;
  CheckGreedy(g, SharedDir() + "/models/tiny-coder");
}

TEST(Greedy, TinyCoderMoeFromBf16Gguf) {
  const std::string g = SharedDir() + "/gguf/tiny-coder-moe-bf16.gguf";
  if (!Exists(g)) GTEST_SKIP() << "no fixture " << g;
  CheckGreedy(g, SharedDir() + "/models/tiny-coder-moe");
}

// An F16 KV cache (half the bytes) keeps the trained models' greedy continuations.
TEST(Greedy, TrainedModelsWithF16KvCache) {
  for (const char* name : {"tiny-coder", "tiny-coder-moe"}) {
    const std::string f = SharedDir() + "/models/" + name;
    if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
    SCOPED_TRACE(name);
    CheckGreedy(f, f, DType::kF16);
  }
}

// On every architecture (the random models' flat distributions make greedy tokens fragile, so
// logits are compared): after a prompt and 8 more tokens, F16 KV rows move the logits by a
// small fraction of their spread.
TEST(Greedy, F16KvCacheStaysCloseOnEveryArchitecture) {
  for (const char* name : {"tiny-random-llama", "tiny-random-qwen3", "tiny-random-qwen2-moe",
                           "tiny-random-deepseek-v3"}) {
    const std::string f = SharedDir() + "/models/" + name;
    if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
    SCOPED_TRACE(name);
    auto golden = ReadJson(f + "/golden.json");
    ASSERT_TRUE(golden.ok());
    std::vector<int32_t> tokens = (*golden)["greedy"]["prompt"].get<std::vector<int32_t>>();
    for (int i = 0; i < 8; ++i) tokens.push_back(static_cast<int32_t>(3 + 7 * i));
    MemoryLedger ledger;
    auto m = LoadModel(f, &ledger);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    std::vector<float> logits[2];
    int k = 0;
    for (DType type : {DType::kF32, DType::kF16}) {
      auto cache = KvCache::Create(m->model->hparams(), 64, m->model->backend(), type);
      ASSERT_TRUE(cache.ok());
      // The prompt at once, then token by token: both write paths.
      const int64_t n_prompt = static_cast<int64_t>(tokens.size()) - 8;
      ASSERT_TRUE(m->model->Forward(tokens.data(), n_prompt, *cache, false, &logits[k]).ok());
      for (size_t i = static_cast<size_t>(n_prompt); i < tokens.size(); ++i)
        ASSERT_TRUE(m->model->Forward(&tokens[i], 1, *cache, false, &logits[k]).ok());
      ++k;
    }
    float lo = logits[0][0], hi = logits[0][0];
    double worst = 0;
    for (size_t i = 0; i < logits[0].size(); ++i) {
      lo = std::min(lo, logits[0][i]);
      hi = std::max(hi, logits[0][i]);
      worst = std::max(worst, std::fabs(double{logits[0][i]} - logits[1][i]));
    }
    EXPECT_LT(worst, 0.002 * (hi - lo)) << "worst " << worst << " spread " << (hi - lo);
    EXPECT_GT(worst, 0.0);  // the F16 path ran
  }
}

// The random models too (float64 references): every architecture's greedy path.
TEST(Greedy, RandomModelsFromHf) {
  for (const char* name : {"tiny-random-llama", "tiny-random-qwen2", "tiny-random-qwen3",
                           "tiny-random-mixtral", "tiny-random-qwen2-moe", "tiny-random-qwen3-moe",
                           "tiny-random-deepseek-v3"}) {
    const std::string f = SharedDir() + "/models/" + name;
    if (!Exists(f)) GTEST_SKIP() << "no fixture " << f;
    SCOPED_TRACE(name);
    CheckGreedy(f, f);
  }
}

}  // namespace
}  // namespace substrate::testing
