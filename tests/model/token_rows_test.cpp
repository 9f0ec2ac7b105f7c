// The logits of a T-token pass equal, row for row and bit for bit, those of T one-token passes
// over the same cache: what deferred verification (`--verify all`) and prompt-lookup
// speculation promise (the tokens shown are those plain decoding shows). Every tiny-coder GGUF
// of ../shared (each weight format, dense and MoE), at every ISA tier the CPU has, F32 and F16
// KV caches, under ExactTokenRows as the verify and speculative passes run.
#include <cstdio>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "model/kv_cache.h"
#include "model_test_util.h"

namespace substrate::testing {
namespace {

// Returns the number of logit rows compared.
int CheckFile(const std::string& path, DType kv_type) {
  MemoryLedger ledger;
  auto m = LoadModel(path, &ledger);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return 0;
  Model& model = *m->model;
  const int64_t V = model.hparams().n_vocab;
  auto a = KvCache::Create(model.hparams(), 64, model.backend(), kv_type);
  auto b = KvCache::Create(model.hparams(), 64, model.backend(), kv_type);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return 0;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 5 + 12; ++i) tokens.push_back(static_cast<int32_t>((i * 7919 + 13) % V));
  std::vector<float> prompt_a, prompt_b, many, one;
  // The same 5-token prompt pass in both caches, then 12 tokens as one pass in `a` and as 12
  // one-token passes in `b`.
  EXPECT_TRUE(model.Forward(tokens.data(), 5, *a, false, &prompt_a).ok());
  EXPECT_TRUE(model.Forward(tokens.data(), 5, *b, false, &prompt_b).ok());
  ExactTokenRows exact;
  EXPECT_TRUE(model.Forward(tokens.data() + 5, 12, *a, true, &many).ok());
  for (int t = 0; t < 12; ++t) {
    EXPECT_TRUE(model.Forward(tokens.data() + 5 + t, 1, *b, false, &one).ok());
    const float* row = many.data() + t * V;
    if (std::memcmp(row, one.data(), static_cast<size_t>(V) * sizeof(float)) != 0) {
      float worst = 0;
      for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(row[v] - one[v]));
      ADD_FAILURE() << path << " at " << IsaName(ActiveIsa()) << " kv " << DTypeName(kv_type)
                    << ": token " << t
                    << " of the 12-token pass differs from its one-token pass by up to " << worst
                    << " in the logits";
      return t;
    }
  }
  return 12;
}

TEST(TokenRows, MultiTokenPassEqualsOneTokenPassesForEveryFormat) {
  const char* kFiles[] = {"tiny-coder-Q2_K",    "tiny-coder-Q3_K_M",     "tiny-coder-Q4_0",
                          "tiny-coder-Q4_K_M",  "tiny-coder-Q6_K",       "tiny-coder-Q8_0",
                          "tiny-coder-bf16",    "tiny-coder-moe-Q4_K_M", "tiny-coder-moe-Q8_0",
                          "tiny-coder-moe-bf16"};
  const std::string first = SharedDir() + "/gguf/" + kFiles[0] + ".gguf";
  if (!Exists(first)) GTEST_SKIP() << "no fixture " << first;
  const Isa saved = ActiveIsa();
  for (int tier = 0; tier <= static_cast<int>(DetectedIsa()); ++tier) {
    SetIsaForTesting(static_cast<Isa>(tier));
    int rows = 0;
    for (const char* f : kFiles) {
      rows += CheckFile(SharedDir() + "/gguf/" + f + ".gguf", DType::kF32);
      if (std::strstr(f, "Q4_K_M"))
        rows += CheckFile(SharedDir() + "/gguf/" + f + ".gguf", DType::kF16);
    }
    std::printf("  %-7s %d logit rows of 12-token passes equal their one-token passes\n",
                IsaName(static_cast<Isa>(tier)), rows);
  }
  SetIsaForTesting(saved);
}

}  // namespace
}  // namespace substrate::testing
