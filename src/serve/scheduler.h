// The request queue and its parallel slots. Each slot is a worker thread that owns one backend
// Session (and so one KV cache); a request waits in a FIFO queue until a slot is free, and goes
// to the free slot whose cached tokens share the longest prefix with its prompt (prompt cache).
//
// A Job is shared between the HTTP thread that made it and the slot that runs it: the slot
// appends text as it is generated, the HTTP thread takes it (Job::Take) and writes it out.
// Cancel() (a client gone) stops the generation at the next token, or drops a queued job, so
// its slot is free at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/backend.h"
#include "serve/stop_matcher.h"

namespace substrate::serve {

enum class JobEnd { kRunning, kEndOfText, kStopSequence, kLength, kCancelled, kFailed };

class Job {
 public:
  using Clock = std::chrono::steady_clock;
  Job(std::vector<int32_t> prompt, SamplingParams params, std::vector<std::string> stops);

  const std::vector<int32_t>& prompt() const { return prompt_; }
  const SamplingParams& params() const { return params_; }

  // Waits up to `timeout` for new text or the end; moves the new text into *text, and the new
  // tokens' log-probabilities (when the request asked for them) into *logprobs.
  // Returns true once the job has ended and all its text was taken.
  bool Take(std::chrono::milliseconds timeout, std::string* text,
            std::vector<StepLogprobs>* logprobs = nullptr);
  // Blocks until the job ends; returns all text not yet taken (and log-probabilities).
  std::string WaitAll(std::vector<StepLogprobs>* logprobs = nullptr);

  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Valid once ended:
  JobEnd end() const;
  const Status& status() const { return status_; }
  const GenerateResult& result() const { return result_; }
  const std::string& stop_sequence() const { return matcher_.matched(); }
  // Seconds from submission to the first text (or to the end when there was none).
  double time_to_first_token() const;

 private:
  friend class Scheduler;
  // Slot side.
  bool OnToken(std::string_view text, const StepLogprobs* logprobs);
  void Finish(Expected<GenerateResult> r);

  std::vector<int32_t> prompt_;
  SamplingParams params_;
  StopMatcher matcher_;
  std::atomic<bool> cancelled_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  // Log-probabilities of the tokens generated so far and not yet taken; a token that completes
  // a stop sequence is left out, like its text.
  std::vector<StepLogprobs> pending_logprobs_;
  JobEnd end_ = JobEnd::kRunning;
  Status status_;
  GenerateResult result_;
  Clock::time_point submitted_ = Clock::now();
  Clock::time_point first_text_{};
};

struct SchedulerStats {
  int slots = 0;
  int busy = 0;
  int queued = 0;
  uint64_t completed = 0;
  uint64_t cancelled = 0;
  uint64_t failed = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;
  uint64_t generated_tokens = 0;
  double decode_seconds = 0;   // summed over finished jobs
  double prefill_seconds = 0;
  double ttft_seconds_sum = 0; // over jobs that produced text
  uint64_t ttft_count = 0;
};

class Scheduler {
 public:
  // Creates n_slots sessions and their workers. max_queue bounds waiting jobs.
  static Expected<std::unique_ptr<Scheduler>> Create(InferenceBackend* backend, int n_slots,
                                                     int max_queue);
  ~Scheduler();  // cancels everything and joins the workers
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job; fails (Infeasible) when the queue is full.
  Status Submit(std::shared_ptr<Job> job);
  // Cancels a job wherever it is: dropped from the queue, or stopped at its next token.
  void Cancel(const std::shared_ptr<Job>& job);

  // Refuses new jobs and cancels every queued and running one (their HTTP handlers then end
  // promptly); the workers exit. Idempotent; the destructor calls it and joins.
  void Shutdown();

  // Runs `fn` on slot `index`'s session once the slot is idle, keeping jobs off it meanwhile
  // (slot save/restore). Fails when the index is out of range or the server is stopping.
  Status WithSlot(int index, const std::function<Status(Session&)>& fn);
  int n_slots() const { return static_cast<int>(slots_.size()); }

  SchedulerStats Stats() const;
  // Generated tokens per second over the last few seconds (all slots together).
  double RecentTokensPerSecond() const;

 private:
  struct Slot {
    std::unique_ptr<Session> session;
    std::vector<int32_t> cached;   // mirror of session->CachedTokens(), read under mu_
    std::shared_ptr<Job> job;
    bool reserved = false;         // WithSlot holds it
    bool answered = false;         // its job has its answer; the slot is freed in a moment
    uint64_t last_used = 0;
    std::thread thread;
  };
  Scheduler() = default;
  void WorkerLoop(int index);
  void DispatchLocked();  // hands queued jobs to free slots; call with mu_ held
  void CountToken();

  InferenceBackend* backend_ = nullptr;
  int max_queue_ = 0;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;  // a slot finished its job
  std::vector<std::unique_ptr<Slot>> slots_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  uint64_t tick_ = 0;
  SchedulerStats stats_;
  // Tokens generated per 100 ms bucket over the last 5 s, for the recent rate.
  mutable std::mutex rate_mu_;
  mutable std::deque<std::pair<int64_t, uint64_t>> rate_buckets_;
};

}  // namespace substrate::serve
