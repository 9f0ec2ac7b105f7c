#include "serve/scheduler.h"

#include <algorithm>
#include <iterator>

#include "core/log.h"

namespace substrate::serve {

Job::Job(std::vector<int32_t> prompt, SamplingParams params, std::vector<std::string> stops)
    : prompt_(std::move(prompt)), params_(params), matcher_(std::move(stops)) {}

bool Job::Take(std::chrono::milliseconds timeout, std::string* text,
               std::vector<StepLogprobs>* logprobs) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] {
    return !pending_.empty() || !pending_logprobs_.empty() || end_ != JobEnd::kRunning;
  });
  text->append(pending_);
  pending_.clear();
  if (logprobs)
    logprobs->insert(logprobs->end(), std::make_move_iterator(pending_logprobs_.begin()),
                     std::make_move_iterator(pending_logprobs_.end()));
  pending_logprobs_.clear();
  return end_ != JobEnd::kRunning;
}

std::string Job::WaitAll(std::vector<StepLogprobs>* logprobs) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return end_ != JobEnd::kRunning; });
  std::string out;
  out.swap(pending_);
  if (logprobs) logprobs->swap(pending_logprobs_);
  pending_logprobs_.clear();
  return out;
}

JobEnd Job::end() const {
  std::lock_guard<std::mutex> lock(mu_);
  return end_;
}

double Job::time_to_first_token() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto t = first_text_ == Clock::time_point{} ? Clock::now() : first_text_;
  return std::chrono::duration<double>(t - submitted_).count();
}

// Runs on the slot's thread for each generated token.
bool Job::OnToken(std::string_view text, const StepLogprobs* logprobs) {
  std::string out = matcher_.Push(text);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_text_ == Clock::time_point{}) first_text_ = Clock::now();
    if (logprobs && !matcher_.stopped()) pending_logprobs_.push_back(*logprobs);
    if (!out.empty() || (logprobs && !matcher_.stopped())) {
      pending_ += out;
      cv_.notify_all();
    }
  }
  return !matcher_.stopped() && !cancelled();
}

void Job::Finish(Expected<GenerateResult> r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!r.ok()) {
    status_ = r.status();
    end_ = cancelled() ? JobEnd::kCancelled : JobEnd::kFailed;
  } else {
    result_ = *r;
    if (matcher_.stopped()) {
      end_ = JobEnd::kStopSequence;
    } else if (cancelled()) {
      end_ = JobEnd::kCancelled;
    } else {
      pending_ += matcher_.Flush();
      end_ = r->finish == BackendFinish::kEndOfText ? JobEnd::kEndOfText : JobEnd::kLength;
    }
  }
  if (first_text_ == Clock::time_point{}) first_text_ = Clock::now();
  cv_.notify_all();
}

Expected<std::unique_ptr<Scheduler>> Scheduler::Create(InferenceBackend* backend, int n_slots,
                                                       int max_queue) {
  if (n_slots < 1 || n_slots > 256)
    return InvalidArgument("serve: --parallel must be between 1 and 256, got " +
                           std::to_string(n_slots));
  std::unique_ptr<Scheduler> s(new Scheduler());
  s->backend_ = backend;
  s->max_queue_ = std::max(0, max_queue);
  for (int i = 0; i < n_slots; ++i) {
    auto slot = std::make_unique<Slot>();
    ASSIGN_OR_RETURN(slot->session, backend->NewSession());
    s->slots_.push_back(std::move(slot));
  }
  s->stats_.slots = n_slots;
  for (int i = 0; i < n_slots; ++i) {
    Scheduler* self = s.get();
    s->slots_[i]->thread = std::thread([self, i] { self->WorkerLoop(i); });
  }
  return s;
}

Scheduler::~Scheduler() {
  Shutdown();
  for (auto& slot : slots_)
    if (slot->thread.joinable()) slot->thread.join();
}

void Scheduler::Shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    dropped.swap(queue_);
    for (auto& slot : slots_)
      if (slot->job) slot->job->Cancel();
  }
  work_cv_.notify_all();
  idle_cv_.notify_all();
  for (auto& job : dropped) {
    job->Cancel();
    job->Finish(Cancelled("serve: server shutting down"));
  }
}

Status Scheduler::Submit(std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Cancelled("serve: server shutting down");
  if (static_cast<int>(queue_.size()) >= max_queue_ && stats_.busy == stats_.slots)
    return Infeasible("serve: all " + std::to_string(stats_.slots) + " slots are busy and " +
                      std::to_string(queue_.size()) + " requests are queued; try again later");
  job->submitted_ = Job::Clock::now();
  queue_.push_back(std::move(job));
  DispatchLocked();
  return Status::Ok();
}

void Scheduler::Cancel(const std::shared_ptr<Job>& job) {
  job->Cancel();
  bool was_queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      queue_.erase(it);
      was_queued = true;
      ++stats_.cancelled;
    }
  }
  if (was_queued) job->Finish(Cancelled("serve: request cancelled while queued"));
}

static size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

void Scheduler::DispatchLocked() {
  while (!queue_.empty()) {
    // Among free slots, the one sharing the longest prefix with the prompt; ties go to the
    // least recently used, so that one hot slot's cache is not overwritten needlessly.
    std::shared_ptr<Job>& job = queue_.front();
    int best = -1;
    size_t best_prefix = 0;
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      const Slot& s = *slots_[i];
      if (s.job || s.reserved) continue;
      size_t p = CommonPrefix(s.cached, job->prompt());
      if (best < 0 || p > best_prefix ||
          (p == best_prefix && s.last_used < slots_[best]->last_used)) {
        best = i;
        best_prefix = p;
      }
    }
    // A slot that has just answered and shares more of the prompt is free in a moment: it
    // dispatches again when it is.
    for (const auto& s : slots_)
      if (s->answered && CommonPrefix(s->cached, job->prompt()) > best_prefix) return;
    if (best < 0) return;
    slots_[best]->job = std::move(job);
    slots_[best]->last_used = ++tick_;
    queue_.pop_front();
    ++stats_.busy;
  }
  work_cv_.notify_all();
}

void Scheduler::CountToken() {
  int64_t bucket = std::chrono::duration_cast<std::chrono::milliseconds>(
                       Job::Clock::now().time_since_epoch())
                       .count() /
                   100;
  std::lock_guard<std::mutex> lock(rate_mu_);
  if (!rate_buckets_.empty() && rate_buckets_.back().first == bucket) {
    ++rate_buckets_.back().second;
  } else {
    rate_buckets_.emplace_back(bucket, 1);
    while (rate_buckets_.size() > 60) rate_buckets_.pop_front();
  }
}

double Scheduler::RecentTokensPerSecond() const {
  int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                    Job::Clock::now().time_since_epoch())
                    .count() /
                100;
  std::lock_guard<std::mutex> lock(rate_mu_);
  uint64_t total = 0;
  for (const auto& [bucket, n] : rate_buckets_)
    if (bucket > now - 50) total += n;  // the last 5 s
  return static_cast<double>(total) / 5.0;
}

void Scheduler::WorkerLoop(int index) {
  Slot& slot = *slots_[index];
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || slot.job; });
    if (!slot.job) return;  // stopping and idle
    std::shared_ptr<Job> job = slot.job;
    lock.unlock();

    Expected<GenerateResult> r = Cancelled("serve: request cancelled before it started");
    if (!job->cancelled()) {
      r = slot.session->Generate(job->prompt(), job->params(),
                                 [&](int32_t token, std::string_view text,
                                     const StepLogprobs* logprobs) {
                                   if (token >= 0) CountToken();
                                   return job->OnToken(text, logprobs);
                                 });
    }
    std::vector<int32_t> cached = slot.session->CachedTokens();
    if (!r.ok() && r.status().code() != StatusCode::kCancelled)
      LOG_WARN("serve: slot %d: %s", index, r.status().ToString().c_str());

    lock.lock();
    if (r.ok()) {
      stats_.prompt_tokens += r->prompt_tokens;
      stats_.cached_tokens += r->cached_tokens;
      stats_.generated_tokens += r->generated_tokens;
      stats_.decode_seconds += r->decode_seconds;
      stats_.prefill_seconds += r->prefill_seconds;
    }
    // The slot's cache is known now: a request arriving the moment the client has this answer
    // (an agent's next turn) waits for this slot rather than take a cold one.
    slot.cached = std::move(cached);
    slot.answered = true;
    job->Finish(std::move(r));
    JobEnd end = job->end();
    if (end == JobEnd::kCancelled) ++stats_.cancelled;
    else if (end == JobEnd::kFailed) ++stats_.failed;
    else ++stats_.completed;
    if (end != JobEnd::kFailed && end != JobEnd::kCancelled && job->result().generated_tokens > 0) {
      stats_.ttft_seconds_sum += job->time_to_first_token();
      ++stats_.ttft_count;
    }
    lock.unlock();
    slot.session->AfterAnswer();  // the client has its answer; the slot is still ours
    lock.lock();
    slot.answered = false;
    slot.job.reset();
    --stats_.busy;
    idle_cv_.notify_all();
    if (stopping_) return;
    DispatchLocked();
  }
}

Status Scheduler::WithSlot(int index, const std::function<Status(Session&)>& fn) {
  if (index < 0 || index >= static_cast<int>(slots_.size()))
    return InvalidArgument("no slot " + std::to_string(index) + " (slots 0.." +
                           std::to_string(slots_.size() - 1) + ")");
  Slot& slot = *slots_[index];
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return stopping_ || (!slot.job && !slot.reserved); });
    if (stopping_) return Cancelled("serve: server shutting down");
    slot.reserved = true;
  }
  Status st = fn(*slot.session);
  std::vector<int32_t> cached = slot.session->CachedTokens();
  std::lock_guard<std::mutex> lock(mu_);
  slot.cached = std::move(cached);
  slot.reserved = false;
  idle_cv_.notify_all();
  DispatchLocked();
  return st;
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.queued = static_cast<int>(queue_.size());
  return s;
}

}  // namespace substrate::serve
