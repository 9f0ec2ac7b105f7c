// PrefetchScheduler: an earliest-deadline-first queue of op reads served by worker threads that
// do real reads (an Env's IoReader: O_DIRECT, io_uring or pread) and verify every range's
// CRC32C before the op may use it. The ResidencyManager submits the next ops' reads while the
// current op computes, and waits on an op's ticket at its BeginOp.
//
// Deadlines are positions in the op sequence (smaller = needed sooner): a read for the op about
// to run jumps ahead of look-ahead reads. Throughput is measured (bytes per second of read time)
// for the manager's admission control.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/env.h"
#include "runtime/trace_writer.h"
#include "store/store_index.h"

namespace substrate {

using RuntimeClock = std::chrono::steady_clock;

// A read's lifecycle, owned by its destination (a slab or an expert slot). Fields are guarded by
// the scheduler's mutex; read them through the scheduler.
struct ReadTicket {
  enum State { kIdle, kQueued, kRunning, kDone, kFailed };
  std::atomic<State> state{kIdle};  // written under the scheduler's mutex
  // Its bytes are no longer wanted (PrefetchScheduler::Abandon): a running read stops before
  // its next range and its checksums, and fails. Cleared by Submit.
  std::atomic<bool> abandoned{false};
  Status error;
};

struct ReadRequest;

// Work on a request's bytes once they are read and verified, done by the reading thread before
// the ticket is done (the runtime rearranges an expert's matrices into its backend's layout
// there: off the compute threads, and once per read rather than per use). Every read gets it,
// late ones too: a layout that depended on whether someone was already waiting would make a
// product's last bits depend on timing (the interleaved kernels' float order differs from the
// row kernels'), and out of core must compute what resident computes.
class ReadFinisher {
 public:
  virtual void Finish(const ReadRequest& r) = 0;

 protected:
  ~ReadFinisher() = default;
};

struct ReadRequest {
  int64_t deadline = 0;  // EDF key
  int op = -1;           // StoreIndex op
  int tier = 0;          // reads tiers first_tier..tier, laid out as StoreOp::SlabOffset says,
  int first_tier = 0;    // shifted so that first_tier's span starts at dst (a resident skeleton's
                         // residuals are read alone)
  uint8_t* dst = nullptr;
  ReadTicket* ticket = nullptr;
  int during = -1;       // StoreIndex op begun last when it was issued (for the trace), -1: none
  ReadFinisher* finisher = nullptr;  // null: none
  int finish_arg = -1;               // the finisher's (an expert slot)
  int64_t issue_us = 0;  // set by Submit
};

class PrefetchScheduler {
 public:
  // `index`, `trace` (may be null) and `env` (nullptr: Env::Default(), whose readers read the
  // index's files) must outlive the scheduler. origin: time zero of traces.
  PrefetchScheduler(const StoreIndex& index, IoMode mode, int n_workers, TraceWriter* trace,
                    RuntimeClock::time_point origin, Env* env = nullptr);
  // Drops queued requests (their tickets fail with "cancelled"), lets running ones finish, joins.
  ~PrefetchScheduler();

  // Room for n queued reads, so Submit allocates nothing while at most n are queued (each
  // destination holds one ticket: the caller's slabs, expert slots and resident ops bound it).
  void Reserve(size_t n);
  // Queues a read. The ticket must not be queued or running.
  void Submit(const ReadRequest& r);
  // Moves a queued request's deadline earlier (the op is needed now).
  void Expedite(ReadTicket* t, int64_t deadline);
  // Blocks until the ticket is done or failed; its status. *waited_us: time blocked here.
  Status Wait(ReadTicket* t, int64_t* waited_us);
  bool Ready(const ReadTicket* t);
  // A queued request is dropped; a running one is waited for. The ticket is idle after.
  void Cancel(ReadTicket* t);
  // A queued request dropped (the ticket idle after: returns kQueued), a running read told to
  // stop at its next range (it then fails, its destination partly written: the caller must not
  // use it, nor reuse it while it runs: returns kRunning); a done, failed or idle ticket is left
  // as it is (returns kIdle). Never waits.
  ReadTicket::State Abandon(ReadTicket* t);

  double bandwidth() const;       // bytes/s of read time so far; 0 before the first read
  uint64_t queued_bytes() const;  // bytes of queued requests
  uint64_t bytes_read() const;
  double read_seconds() const;  // summed over the workers: concurrent reads count each
  double busy_seconds() const;  // wall time with at least one read running
  bool uring() const { return uring_; }

 private:
  struct Item {
    ReadRequest req;
    uint64_t bytes;
  };
  void WorkerLoop(int index);
  bool DropQueuedLocked(ReadTicket* t);  // under mu_: removes t's queued request if there is one
  Status Execute(IoReader& io, const ReadRequest& r);
  int64_t NowUs() const;

  const StoreIndex& index_;
  TraceWriter* trace_;
  RuntimeClock::time_point origin_;
  std::vector<std::unique_ptr<IoReader>> readers_;
  std::vector<std::thread> workers_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<Item> queue_;  // small (prefetch depth + expert hints): a linear scan picks the EDF
  bool stop_ = false;
  bool uring_ = false;
  uint64_t queued_bytes_ = 0;
  uint64_t bytes_read_ = 0;
  double read_seconds_ = 0;
  int running_ = 0;  // reads being executed
  RuntimeClock::time_point busy_since_;
  double busy_seconds_ = 0;
};

}  // namespace substrate
