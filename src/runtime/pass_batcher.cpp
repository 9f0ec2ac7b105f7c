#include "runtime/pass_batcher.h"

#include <algorithm>
#include <optional>

#include "kernels/matmul.h"

namespace substrate {

PassBatcher::PassBatcher(Engine* engine, PassBatcherOptions options)
    : engine_(engine), options_(options) {
  options_.batch_size = std::clamp<int64_t>(options_.batch_size, 1, Model::kMaxBatch);
  options_.ubatch_size = std::clamp<int64_t>(options_.ubatch_size, 1, options_.batch_size);
}

Status PassBatcher::Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                            std::vector<float>* logits, bool token_step) {
  // A bad request fails alone, before it can fail a step it shares with others.
  RETURN_IF_ERROR(engine_->model().CheckTokens(tokens, n, cache));
  logits->resize(static_cast<size_t>((all_logits ? n : 1) * engine_->model().hparams().n_vocab));
  Request r{tokens, n, &cache, all_logits, logits, token_step, 0, false, Status::Ok()};
  std::unique_lock<std::mutex> lock(mu_);
  queue_.push_back(&r);
  cv_.notify_all();
  while (!r.finished) {
    // Exclusive passes go first, but not twice in a row while steps wait.
    if (!leading_ && (exclusive_waiting_ == 0 || exclusive_ran_last_)) {
      LeadStep(lock);
    } else {
      cv_.wait(lock);
    }
  }
  return r.status;
}

void PassBatcher::LeadStep(std::unique_lock<std::mutex>& lock) {
  leading_ = true;
  // Let the other generations under way queue their next pass (they are sampling), so the step
  // carries them all; an exclusive pass waiting cuts the wait short.
  const auto gather_start = std::chrono::steady_clock::now();
  const auto deadline = gather_start + options_.gather_wait;
  while (static_cast<int>(queue_.size()) < generations_ && exclusive_waiting_ == 0) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
  }

  // Decode passes first (a row, or a few drafted rows, each), then prompt chunks, oldest first.
  pieces_.clear();
  int64_t room = options_.batch_size;
  bool token_step = false;
  for (int pass = 0; pass < 2; ++pass) {
    for (Request* r : queue_) {
      if (room == 0) break;
      if (r->token_step != (pass == 0)) continue;
      int64_t m = std::min(r->n - r->done, room);
      if (!r->token_step) m = std::min(m, options_.ubatch_size);
      pieces_.emplace_back(r, m);
      room -= m;
      token_step |= r->token_step;
    }
  }
  const int64_t V = engine_->model().hparams().n_vocab;
  passes_.clear();
  for (const auto& [r, m] : pieces_) {
    const bool last = r->done + m == r->n;
    float* out =
        r->all_logits ? r->logits->data() + r->done * V : (last ? r->logits->data() : nullptr);
    passes_.push_back({r->tokens + r->done, m, r->cache, r->all_logits, out});
  }
  ++stats_.steps;
  stats_.rows += static_cast<uint64_t>(options_.batch_size - room);
  stats_.sequences += pieces_.size();
  stats_.max_sequences = std::max<uint64_t>(stats_.max_sequences, pieces_.size());
  stats_.token_steps += token_step;
  if (token_step)
    for (const auto& [r, m] : pieces_) stats_.prompt_chunks += !r->token_step;

  const auto compute_start = std::chrono::steady_clock::now();
  stats_.gather_seconds += std::chrono::duration<double>(compute_start - gather_start).count();
  lock.unlock();
  Status st;
  {
    std::optional<ExactTokenRows> exact;
    if (token_step || options_.batch_invariant) exact.emplace();
    st = engine_->model().ForwardSequences(passes_.data(), static_cast<int>(passes_.size()));
    if (st.ok()) engine_->AfterToken(token_step);
  }
  lock.lock();
  stats_.compute_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - compute_start).count();

  for (const auto& [r, m] : pieces_) {
    r->done += m;
    r->finished = !st.ok() || r->done == r->n;
    if (!st.ok()) r->status = st;
  }
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [](Request* r) { return r->finished; }),
               queue_.end());
  leading_ = false;
  exclusive_ran_last_ = false;
  cv_.notify_all();
}

Status PassBatcher::Exclusive(const std::function<Status()>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  ++exclusive_waiting_;
  cv_.notify_all();  // a leader gathering a step stops waiting
  cv_.wait(lock, [&] { return !leading_ && !(exclusive_ran_last_ && !queue_.empty()); });
  --exclusive_waiting_;
  leading_ = true;
  ++stats_.exclusive;
  lock.unlock();
  const Status st = fn();
  lock.lock();
  leading_ = false;
  exclusive_ran_last_ = true;
  cv_.notify_all();
  return st;
}

void PassBatcher::BeginGeneration() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generations_;
}

void PassBatcher::EndGeneration() {
  std::lock_guard<std::mutex> lock(mu_);
  --generations_;
  cv_.notify_all();  // a leader waiting for this generation's pass need not
}

PassBatcherStats PassBatcher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace substrate
