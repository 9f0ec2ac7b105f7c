// PassBatcher: continuous batching. The sessions of a server (its slots) each run their own
// token loop on their own thread and hand every model pass to one PassBatcher; it evaluates the
// passes that are due at the same time as one multi-sequence pass (Model::ForwardSequences), so
// every weight is read once per step for all sessions, resident or streamed out of core (an
// out-of-core MoE reads the union of the step's experts once).
//
// A step takes every decode pass that is waiting and fills the rest of `batch_size` rows with
// chunks of prompts (at most `ubatch_size` rows of one prompt per step), oldest first, so a long
// prompt joining the batch delays the others' next token by one chunk, not by the whole prompt.
// Before a step it waits, up to `gather_wait`, until every generation under way has its next
// pass queued (a session samples between its passes; without the wait steps would fragment).
//
// No thread of its own: the first caller to find no step running leads the next one on its own
// thread (the compute runs on the engine's pool as ever) and the others wait for their results.
// With one session nothing is waited for, so a single client pays nothing for the batching.
//
// On the CPU, rows of a token step are exact (ExactTokenRows; the CUDA kernels do not honour
// it): each sequence gets the bits it would get decoding alone, so batched greedy output equals
// unbatched greedy output token for token. A
// prompt row is exact too except on CPUs with AMX, whose prefill GEMM sums in another order:
// there a prompt chunk's bits depend on whether decode rows shared its step (and a cached
// prefix's on how it was split), unless `batch_invariant` makes every step exact, at the cost
// of the AMX GEMM for prompts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "runtime/engine.h"

namespace substrate {

struct PassBatcherOptions {
  int64_t batch_size = Model::kMaxBatch;   // rows per step, all sequences (<= kMaxBatch)
  int64_t ubatch_size = Model::kMaxBatch;  // rows of one prompt per step
  std::chrono::microseconds gather_wait{2000};
  bool batch_invariant = false;  // every step's rows exact, prompts included (see above)
};

struct PassBatcherStats {
  uint64_t steps = 0;          // multi-sequence passes run
  uint64_t rows = 0;           // tokens evaluated in them
  uint64_t sequences = 0;      // sequences in them (summed over steps)
  uint64_t max_sequences = 0;  // most sequences in one step
  uint64_t token_steps = 0;    // steps that held at least one decode pass
  uint64_t prompt_chunks = 0;  // prompt pieces that shared a step with decode passes
  uint64_t exclusive = 0;      // passes run alone (Exclusive)
  double gather_seconds = 0;   // spent waiting for sessions to queue their passes
  double compute_seconds = 0;  // spent in the steps' passes
};

class PassBatcher : public PassRunner {
 public:
  // `engine` must outlive the batcher; every pass over its model must go through it.
  PassBatcher(Engine* engine, PassBatcherOptions options);

  Status Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                 std::vector<float>* logits, bool token_step) override;
  // fn must not call Forward on this batcher (it would wait for itself).
  Status Exclusive(const std::function<Status()>& fn) override;
  void BeginGeneration() override;
  void EndGeneration() override;

  PassBatcherStats stats() const;
  const PassBatcherOptions& options() const { return options_; }

 private:
  struct Request {
    const int32_t* tokens;
    int64_t n;
    KvCache* cache;
    bool all_logits;
    std::vector<float>* logits;
    bool token_step;
    int64_t done = 0;  // tokens evaluated so far
    bool finished = false;
    Status status;
  };
  // Runs one step as the leader; mu_ held on entry and exit (released while computing).
  void LeadStep(std::unique_lock<std::mutex>& lock);

  Engine* engine_;
  PassBatcherOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Request*> queue_;  // unfinished requests, oldest first
  bool leading_ = false;         // a step (or an exclusive pass) is running
  int exclusive_waiting_ = 0;        // Exclusive callers waiting: they go first, except that
  bool exclusive_ran_last_ = false;  // an exclusive pass and a waiting step take turns
  int generations_ = 0;          // generations under way
  PassBatcherStats stats_;
  // Per step, grow-only.
  std::vector<Model::SequencePass> passes_;
  std::vector<std::pair<Request*, int64_t>> pieces_;  // request, rows this step
};

}  // namespace substrate
