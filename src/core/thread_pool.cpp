#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace substrate {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(int thread_index) {
  // Guided: each chunk is a share of what is left (never under the grain), so the chunks shrink
  // toward the end and the threads finish together instead of one waiting for the other's last
  // large chunk.
  int64_t begin = next_.load(std::memory_order_relaxed);
  for (;;) {
    if (begin >= n_) break;
    const int64_t size = std::max(chunk_, (n_ - begin) / (2 * n_threads_));
    if (!next_.compare_exchange_weak(begin, begin + size)) continue;
    (*job_)(begin, std::min(n_, begin + size), thread_index);
    begin = next_.load(std::memory_order_relaxed);
  }
}

namespace {
// About 50-100 microseconds of polling: long enough to bridge the gap between the ops of one
// forward pass, short enough not to burn a core when the pool goes idle.
constexpr int kSpinIterations = 20000;

// Bumped by RestSpinners: a worker polling for its next job stops when it changes.
std::atomic<uint64_t> g_rest_epoch{0};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const uint64_t rest = g_rest_epoch.load(std::memory_order_relaxed);
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen || stop_.load() ||
          g_rest_epoch.load(std::memory_order_relaxed) != rest)
        break;
      CpuRelax();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_.load()) return;
      seen = generation_.load();
    }
    // Join the job only while it is still open: once the caller has closed it (every chunk
    // taken) it may return and its job vanish. Announcing ourselves before looking (both
    // sequentially consistent) means the caller either sees us and waits, or we see it closed.
    active_.fetch_add(1);
    if (generation_.load() == seen && closed_.load() != seen) RunChunks(index);
    if (active_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             FunctionRef<void(int64_t, int64_t, int)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  // The smallest chunk: the grain, and no less than 1/16 of a thread's share, which keeps the
  // number of chunks (and contention on next_) small.
  int64_t chunk = std::max(grain, (n + 16 * n_threads_ - 1) / (16 * n_threads_));
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0);
    generation = generation_.fetch_add(1) + 1;
  }
  wake_.notify_all();
  RunChunks(0);
  // Every chunk is taken: close the job, then wait only for the workers running chunks.
  closed_.store(generation);
  for (int i = 0; i < kSpinIterations; ++i) {
    if (active_.load() == 0) break;
    CpuRelax();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return active_.load() == 0; });
  job_ = nullptr;
}

void ThreadPool::RestSpinners() {
  // SUBSTRATE_REST_ON_WAIT=0 keeps the workers polling, for A/B benchmarks.
  static const bool on = [] {
    const char* v = std::getenv("SUBSTRATE_REST_ON_WAIT");
    return !v || std::atoi(v) != 0;
  }();
  if (on) g_rest_epoch.fetch_add(1, std::memory_order_relaxed);
}

namespace {
std::unique_ptr<ThreadPool>& DefaultPoolStorage() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

ThreadPool& ThreadPool::Default() {
  auto& pool = DefaultPoolStorage();
  if (!pool) {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("SUBSTRATE_THREADS")) n = std::atoi(env);
    pool = std::make_unique<ThreadPool>(std::max(1, n));
  }
  return *pool;
}

void ThreadPool::SetDefaultThreads(int n_threads) {
  DefaultPoolStorage() = std::make_unique<ThreadPool>(std::max(1, n_threads));
}

}  // namespace substrate
