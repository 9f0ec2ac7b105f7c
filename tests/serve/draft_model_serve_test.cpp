// The server's backend with a draft model (`serve --draft-model`): tiny-coder drafts for
// tiny-coder-moe. Requests on two slots at once, each drafting from its own cache (the drafts'
// passes one at a time, the verify passes batched), get the greedy answers the target gives
// without a drafter.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "core/file_io.h"
#include "serve/model_backend.h"

namespace substrate::serve {
namespace {

std::string Gguf(const std::string& name) {
  return std::string(SUBSTRATE_SHARED_DIR) + "/gguf/" + name + ".gguf";
}

std::unique_ptr<ModelBackend> Load(const std::string& draft) {
  ModelBackendOptions mo;
  mo.path = Gguf("tiny-coder-moe-Q8_0");
  mo.context = 256;
  mo.slots = 2;
  mo.engine.draft_model = draft;
  mo.draft_max = draft.empty() ? 0 : 4;
  // A loaded test machine can be slow to wake a slot: let a step wait for both.
  mo.batching.gather_wait = std::chrono::milliseconds(50);
  auto b = ModelBackend::Load(mo);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : nullptr;
}

std::string Answer(ModelBackend& b, Session& s, const std::string& prompt, int* generated) {
  auto ids = b.EncodeText(prompt);
  EXPECT_TRUE(ids.ok());
  SamplingParams p;
  p.max_tokens = 32;
  p.temperature = 0;
  std::string text;
  auto r = s.Generate(*ids, p, [&](int32_t, std::string_view t, const StepLogprobs*) {
    text += t;
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) *generated = r->generated_tokens;
  return text;
}

TEST(DraftModelServe, ConcurrentSlotsGetTheTargetsGreedyAnswers) {
  if (!FileExists(Gguf("tiny-coder-moe-Q8_0")) || !FileExists(Gguf("tiny-coder-Q8_0")))
    GTEST_SKIP() << "no fixtures tiny-coder-moe-Q8_0.gguf / tiny-coder-Q8_0.gguf";
  const std::vector<std::string> prompts = {
      "def is_prime(n):", "import os\n\ndef walk(path):", "class Queue:", "for i in range(10):"};
  std::vector<std::string> want;
  {
    auto plain = Load("");
    ASSERT_TRUE(plain);
    auto s = plain->NewSession();
    ASSERT_TRUE(s.ok());
    for (const auto& p : prompts) {
      int n = 0;
      want.push_back(Answer(*plain, **s, p, &n));
      EXPECT_EQ(n, 32);
    }
  }
  auto spec = Load(Gguf("tiny-coder-Q8_0"));
  ASSERT_TRUE(spec);
  std::vector<std::string> got(prompts.size());
  std::vector<std::thread> threads;
  for (int slot = 0; slot < 2; ++slot) {
    threads.emplace_back([&, slot] {
      auto s = spec->NewSession();
      ASSERT_TRUE(s.ok());
      for (size_t i = static_cast<size_t>(slot); i < prompts.size(); i += 2) {
        int n = 0;
        got[i] = Answer(*spec, **s, prompts[i], &n);
        EXPECT_EQ(n, 32);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << prompts[i];
  const nlohmann::json b = spec->RuntimeStats()["batching"];
  // The drafts ran as exclusive passes; the verify passes went through the batcher's steps.
  EXPECT_GT(b["exclusive"].get<uint64_t>(), 0u) << b.dump();
  EXPECT_GT(b["token_steps"].get<uint64_t>(), 0u) << b.dump();
}

}  // namespace
}  // namespace substrate::serve
