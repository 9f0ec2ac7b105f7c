// Greedy decoding reproduces golden.json's continuation for the trained models, from the HF
// folder and from the reference toolchain's bf16 GGUF files.
#include "model/kv_cache.h"
#include "model/sampler.h"
#include "model_test_util.h"

namespace substrate::testing {
namespace {

void CheckGreedy(const std::string& model_path, const std::string& folder) {
  auto golden = ReadJson(folder + "/golden.json");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const std::vector<int32_t> prompt = (*golden)["greedy"]["prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> want = (*golden)["greedy"]["continuation"].get<std::vector<int32_t>>();
  MemoryLedger ledger;
  auto m = LoadModel(model_path, &ledger);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const int64_t V = m->model->hparams().n_vocab;
  auto cache = KvCache::Create(m->model->hparams(), 256, &ledger);
  ASSERT_TRUE(cache.ok());
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
