// Continuous batching (runtime/pass_batcher.h): sessions generating at the same time on their
// own threads, their passes batched, give exactly the tokens each gives alone (greedy and
// seeded sampling, with and without prompt-lookup drafts), in fewer model passes than they take
// one after the other; a long prompt joins the running decodes in chunks; an exclusive pass
// (what deferred verification and the server's statistics use) never shares a step.
// Batch-invariant batchers throughout, so that the comparison holds on CPUs with AMX too (whose
// prompt GEMM rows differ from exact ones); elsewhere the option changes nothing.
#include "runtime/pass_batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <latch>
#include <thread>

#include "model/model_test_util.h"
#include "runtime/engine.h"

namespace substrate::testing {
namespace {

struct Job {
  std::string prompt;
  GenerateOptions opt;
};

struct Outcome {
  std::vector<int32_t> tokens;
  GenerateStats stats;
};

class PassBatcherTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string path =
        GetParam() == "dense" ? std::string(SUBSTRATE_SOURCE_DIR) + "/models/tiny-coder-Q8_0.gguf"
                              : SharedDir() + "/gguf/tiny-coder-moe-Q8_0.gguf";
    if (!Exists(path)) GTEST_SKIP() << "no model " << path;
    EngineOptions eo;
    eo.ledger = &ledger_;
    auto e = Engine::Load(path, eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
  }

  // One generation in a fresh session; `on_token` (optional) hears each token's index.
  Outcome Run(const Job& job, PassRunner* passes,
              const std::function<void(int64_t)>& on_token = nullptr) {
    Outcome r;
    auto s = engine_->NewSession(512);
    EXPECT_TRUE(s.ok());
    auto ids = engine_->tokenizer()->Encode(job.prompt);
    EXPECT_TRUE(ids.ok());
    GenerateOptions opt = job.opt;
    opt.passes = passes;
    auto st = engine_->Generate(**s, {ids->begin(), ids->end()}, opt,
                                [&](int32_t tok, const std::string&) {
                                  if (tok >= 0) r.tokens.push_back(tok);
                                  if (on_token) on_token(static_cast<int64_t>(r.tokens.size()));
                                  return true;
                                });
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (st.ok()) r.stats = *st;
    return r;
  }

  // Every job on its own thread through one batcher.
  std::vector<Outcome> RunTogether(const std::vector<Job>& jobs, PassRunner& batcher) {
    std::vector<Outcome> out(jobs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < jobs.size(); ++i)
      threads.emplace_back([&, i] { out[i] = Run(jobs[i], &batcher); });
    for (auto& t : threads) t.join();
    return out;
  }

  MemoryLedger ledger_;
  std::unique_ptr<Engine> engine_;
};

std::vector<Job> Jobs() {
  const char* prompts[] = {"def fibonacci(n):",
                           "import os\nimport sys\n\n",
                           "class Stack:\n    def __init__(self):",
                           "# sort a list\ndef sort(xs):",
                           "for i in range(10):",
                           "def add(a, b):\n    return a + b\n\ndef sub(a, b):"};
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) {
    Job j{prompts[i], {}};
    j.opt.max_tokens = 24 + 7 * i;  // generations end at different steps
    j.opt.stop_at_eog = false;
    if (i % 2 == 1) {  // seeded sampling
      j.opt.sampling.temperature = 0.8f;
      j.opt.sampling.seed = 1000 + i;
    } else {
      j.opt.sampling.temperature = 0.0f;
    }
    if (i == 4) j.opt.draft_max = 3;  // speculative rows in the batch
    jobs.push_back(j);
  }
  return jobs;
}

PassBatcherOptions Invariant() {
  PassBatcherOptions o;
  o.batch_invariant = true;
  return o;
}

// Forwards to a runner; a generation begins only once `n` have begun, so every session is
// counted by the batcher before any of them runs a pass, however late the threads start.
class StartTogetherRunner : public PassRunner {
 public:
  StartTogetherRunner(PassRunner* inner, std::ptrdiff_t n) : inner_(inner), begun_(n) {}
  Status Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                 std::vector<float>* logits, bool token_step) override {
    return inner_->Forward(tokens, n, cache, all_logits, logits, token_step);
  }
  Status Exclusive(const std::function<Status()>& fn) override { return inner_->Exclusive(fn); }
  void BeginGeneration() override {
    inner_->BeginGeneration();
    begun_.arrive_and_wait();
  }
  void EndGeneration() override { inner_->EndGeneration(); }

 private:
  PassRunner* inner_;
  std::latch begun_;
};

TEST_P(PassBatcherTest, ConcurrentSessionsGetTheirAloneTokensInFewerPasses) {
  const std::vector<Job> jobs = Jobs();
  std::vector<Outcome> alone;
  int64_t alone_passes = 0;
  PassBatcher solo(engine_.get(), Invariant());
  for (const Job& j : jobs) {
    alone.push_back(Run(j, &solo));
    alone_passes += alone.back().stats.n_forwards + 1;  // + the prompt's
  }
  // Every step waits for all live sessions' passes (the wait is only a bound, far above a
  // session's sampling time), so the steps are the same on a loaded machine.
  PassBatcherOptions o = Invariant();
  o.gather_wait = std::chrono::seconds(10);
  PassBatcher batcher(engine_.get(), o);
  StartTogetherRunner start(&batcher, static_cast<std::ptrdiff_t>(jobs.size()));
  const std::vector<Outcome> together = RunTogether(jobs, start);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "job " << i;
    EXPECT_EQ(together[i].tokens.size(), static_cast<size_t>(jobs[i].opt.max_tokens));
  }
  const PassBatcherStats s = batcher.stats();
  EXPECT_EQ(s.sequences, static_cast<uint64_t>(alone_passes));
  EXPECT_EQ(s.max_sequences, jobs.size());
  // Six sessions of 24..59 tokens in the longest one's steps (a draft may add some), not the sum.
  EXPECT_LT(s.steps * 2, static_cast<uint64_t>(alone_passes)) << s.steps << " steps";
}

// Forwards to a runner and notes that a first pass was submitted through it.
class NotingRunner : public PassRunner {
 public:
  explicit NotingRunner(PassRunner* inner) : inner_(inner) {}
  Status Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                 std::vector<float>* logits, bool token_step) override {
    submitted = true;
    return inner_->Forward(tokens, n, cache, all_logits, logits, token_step);
  }
  Status Exclusive(const std::function<Status()>& fn) override { return inner_->Exclusive(fn); }
  void BeginGeneration() override { inner_->BeginGeneration(); }
  void EndGeneration() override { inner_->EndGeneration(); }

  std::atomic<bool> submitted{false};

 private:
  PassRunner* inner_;
};

TEST_P(PassBatcherTest, ALongPromptJoinsRunningDecodesInChunks) {
  Job decoding{"def fibonacci(n):", {}};
  decoding.opt.max_tokens = 160;  // long enough that the joining prompt arrives mid-decode
  decoding.opt.stop_at_eog = false;
  decoding.opt.sampling.temperature = 0.0f;
  Job joining{"", {}};
  for (int i = 0; i < 12; ++i)
    joining.prompt += "def f" + std::to_string(i) + "(x):\n    return x\n";
  joining.opt.max_tokens = 8;
  joining.opt.sampling.temperature = 0.0f;
  PassBatcher solo(engine_.get(), Invariant());
  const Outcome want_decoding = Run(decoding, &solo), want_joining = Run(joining, &solo);

  PassBatcherOptions o = Invariant();
  o.ubatch_size = 16;  // the prompt (well over 100 tokens) joins 16 tokens a step
  PassBatcher batcher(engine_.get(), o);
  NotingRunner joining_passes(&batcher);
  std::atomic<bool> started{false};
  Outcome got_decoding, got_joining;
  std::thread first([&] {
    got_decoding = Run(decoding, &batcher, [&](int64_t n) {
      if (n == 4) started = true;
      // The decode waits (at most 10 s) for the prompt's first pass, so however fast this
      // machine decodes, the prompt's later chunks meet decode rows.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (n == 5 && !joining_passes.submitted && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread second([&] { got_joining = Run(joining, &joining_passes); });
  first.join();
  second.join();
  EXPECT_EQ(got_decoding.tokens, want_decoding.tokens);
  EXPECT_EQ(got_joining.tokens, want_joining.tokens);
  const PassBatcherStats s = batcher.stats();
  // The prompt went in several chunks, at least some of them beside the other's decode rows.
  EXPECT_GE(s.prompt_chunks, 3u) << s.steps << " steps";
  EXPECT_GE(s.max_sequences, 2u);
}

TEST_P(PassBatcherTest, ExclusivePassesNeverOverlapAStep) {
  // The model's observer sees every block of every step as it computes.
  struct Watch : PassObserver {
    std::atomic<bool> exclusive{false};
    std::atomic<int> blocks_during_exclusive{0}, blocks{0};
    void BeforeBlock(int, const Tensor&) override {
      ++blocks;
      blocks_during_exclusive += exclusive.load();
    }
  } watch;
  engine_->model().set_observer(&watch);
  PassBatcher batcher(engine_.get(), {});
  std::atomic<bool> done{false};
  std::atomic<int> exclusive_runs{0};
  std::thread poller([&] {
    while (!done) {
      const Status st = batcher.Exclusive([&] {
        watch.exclusive = true;
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        watch.exclusive = false;
        ++exclusive_runs;
        return Status::Ok();
      });
      EXPECT_TRUE(st.ok());
    }
  });
  std::vector<Job> jobs = Jobs();
  jobs.resize(3);
  const std::vector<Outcome> out = RunTogether(jobs, batcher);
  done = true;
  poller.join();
  engine_->model().set_observer(nullptr);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(out[i].tokens.size(), static_cast<size_t>(jobs[i].opt.max_tokens));
  EXPECT_GT(exclusive_runs.load(), 0);
  EXPECT_GT(watch.blocks.load(), 0);
  EXPECT_EQ(watch.blocks_during_exclusive.load(), 0);
  EXPECT_EQ(batcher.stats().exclusive, static_cast<uint64_t>(exclusive_runs.load()));
}

INSTANTIATE_TEST_SUITE_P(Models, PassBatcherTest, ::testing::Values("dense", "moe"));

}  // namespace
}  // namespace substrate::testing
