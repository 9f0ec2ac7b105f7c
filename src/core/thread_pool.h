// ThreadPool: a fixed set of workers created once; ParallelFor splits an index range among them
// and the calling thread, without creating threads per op (the token loop calls this hundreds of
// times per token, so dispatch must cost microseconds, not a thread start).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "core/function_ref.h"

namespace substrate {

class ThreadPool {
 public:
  // n_threads counts the caller: ThreadPool(1) runs everything on the calling thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) over [0, n) in chunks of at least `grain` items.
  // Returns when all chunks are done. Not reentrant: fn must not call ParallelFor. Allocates
  // nothing (fn is referenced, not copied).
  void ParallelFor(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t, int)> fn);

  // Every pool's idle workers stop polling for their next job and sleep until it comes: for a
  // thread about to block (on a read, say), whose pool's workers would otherwise poll on cores
  // that the threads it waits for need. Their next job then costs a wake-up.
  static void RestSpinners();

  // A process-wide pool, sized on first use (SUBSTRATE_THREADS or hardware concurrency).
  static ThreadPool& Default();
  static void SetDefaultThreads(int n_threads);

 private:
  void WorkerLoop(int index);
  void RunChunks(int thread_index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_cv_;
  // Workers and the caller spin briefly on these before sleeping on the condition variables:
  // a decode step issues hundreds of short ParallelFors, and a futex wake per op costs more
  // than the op. Written under mu_, read without it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  // Workers inside the current job's chunks. The caller waits only for these: a worker that
  // has not woken by the time every chunk is taken (on a loaded machine it may not run for
  // milliseconds) is not waited for, and finds the job closed when it does wake.
  std::atomic<int> active_{0};
  std::atomic<uint64_t> closed_{0};  // the last generation whose chunks were all taken

  // The job of the current generation.
  const FunctionRef<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace substrate
