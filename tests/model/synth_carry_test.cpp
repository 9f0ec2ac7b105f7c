// `substrate synth --carry`: a trained small model placed inside a larger preset's shapes (more
// layers, wider hidden and FFN, more and wider heads, four query heads per kv head where the
// small model has two) computes the small model's logits, position by position; a preset the
// model does not fit in is refused with a message naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <unistd.h>
#include <vector>

#include "model/model_test_util.h"

namespace substrate {
namespace {

std::string TinyCoder() { return testing::SharedDir() + "/gguf/tiny-coder-bf16.gguf"; }

std::vector<float> AllLogits(const std::string& path, const std::vector<int32_t>& tokens) {
  MemoryLedger ledger;
  auto m = testing::LoadModel(path, &ledger);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  const auto n = static_cast<int64_t>(tokens.size());
  auto cache = KvCache::Create(m->model->hparams(), n, m->model->backend());
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits;
  EXPECT_TRUE(m->model->Forward(tokens.data(), n, *cache, true, &logits).ok());
  return logits;
}

TEST(SynthCarry, LargerShapesComputeTheCarriedModelsLogits) {
  if (!testing::Exists(TinyCoder())) GTEST_SKIP() << "no " << TinyCoder();
  const std::string out =
      ::testing::TempDir() + "synth_carry_" + std::to_string(getpid()) + ".gguf";
  const std::string cmd = std::string(SUBSTRATE_BINARY) +
                          " synth --preset test-tiny-dense --type F32 -t 2 --carry " +
                          TinyCoder() + " -o " + out + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  {
    auto f = ModelFile::Open(out);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->metadata().GetInt("qwen2.block_count", 0), 7);
    EXPECT_EQ((*f)->metadata().GetInt("qwen2.embedding_length", 0), 384);
    EXPECT_EQ((*f)->metadata().GetInt("qwen2.attention.head_count", 0), 8);
    const TensorInfo* q = (*f)->Find("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->ne, (std::vector<uint64_t>{384, 8 * 96}));
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 977 + 13) % 8192);
  const std::vector<float> small = AllLogits(TinyCoder(), tokens);
  const std::vector<float> large = AllLogits(out, tokens);
  std::remove(out.c_str());
  ASSERT_EQ(small.size(), large.size());
  ASSERT_FALSE(small.empty());
  EXPECT_LE(testing::RelError(large.data(), small.data(), small.size()), 1e-4);
  const size_t V = 8192;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto top = [&](const std::vector<float>& l) {
      return std::max_element(l.begin() + t * V, l.begin() + (t + 1) * V) - l.begin();
    };
    EXPECT_EQ(top(large), top(small)) << "position " << t;
  }
}

TEST(SynthCarry, APresetTheModelDoesNotFitIsRefused) {
  if (!testing::Exists(TinyCoder())) GTEST_SKIP() << "no " << TinyCoder();
  const std::string out =
      ::testing::TempDir() + "synth_carry_refused_" + std::to_string(getpid()) + ".gguf";
  // A MoE preset; a dense one cut to 3 layers (tiny-coder has 6).
  const std::pair<std::string, std::string> cases[] = {
      {"--preset test-tiny-moe", "dense"}, {"--preset test-tiny-dense --layers 3", "larger"}};
  for (const auto& [preset, why] : cases) {
    const std::string cmd = std::string(SUBSTRATE_BINARY) + " synth " + preset +
                            " --type F32 --carry " + TinyCoder() + " -o " + out + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string text;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) text += buf;
    const int status = pclose(p);
    EXPECT_NE(WEXITSTATUS(status), 0) << text;
    EXPECT_NE(text.find("--carry"), std::string::npos) << text;
    EXPECT_NE(text.find(why), std::string::npos) << text;
    EXPECT_FALSE(testing::Exists(out));
  }
}

}  // namespace
}  // namespace substrate
