#include "runtime/prefetch_scheduler.h"

#include <fcntl.h>

#include <algorithm>

#include "core/thread_pool.h"

namespace substrate {

PrefetchScheduler::PrefetchScheduler(const StoreIndex& index, IoMode mode, int n_workers,
                                     TraceWriter* trace, RuntimeClock::time_point origin, Env* env)
    : index_(index), trace_(trace), origin_(origin) {
  n_workers = std::max(1, n_workers);
  for (int i = 0; i < n_workers; ++i) readers_.push_back(IoReader::Create(mode, env));
  uring_ = readers_[0]->uring();
  for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

PrefetchScheduler::~PrefetchScheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (Item& it : queue_) {
      it.req.ticket->state = ReadTicket::kFailed;
      it.req.ticket->error = Cancelled("read cancelled: the runtime is shutting down");
    }
    queue_.clear();
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

int64_t PrefetchScheduler::NowUs() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(RuntimeClock::now() - origin_)
      .count();
}

void PrefetchScheduler::Reserve(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.reserve(n);
}

void PrefetchScheduler::Submit(const ReadRequest& r) {
  const StoreOp& op = index_.ops()[r.op];
  const uint64_t bytes = op.SlabBytes(r.tier) - op.SlabOffset(r.first_tier);
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.ticket->state = ReadTicket::kQueued;
    r.ticket->abandoned = false;
    r.ticket->error = Status::Ok();
    queue_.push_back({r, bytes});
    queue_.back().req.issue_us = NowUs();
    queued_bytes_ += bytes;
  }
  work_cv_.notify_one();
}

void PrefetchScheduler::Expedite(ReadTicket* t, int64_t deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Item& it : queue_)
    if (it.req.ticket == t) it.req.deadline = std::min(it.req.deadline, deadline);
}

bool PrefetchScheduler::Ready(const ReadTicket* t) {
  std::lock_guard<std::mutex> lock(mu_);
  return t->state == ReadTicket::kDone;
}

Status PrefetchScheduler::Wait(ReadTicket* t, int64_t* waited_us) {
  const auto t0 = RuntimeClock::now();
  std::unique_lock<std::mutex> lock(mu_);
  auto over = [&] {
    return t->state == ReadTicket::kDone || t->state == ReadTicket::kFailed ||
           t->state == ReadTicket::kIdle;
  };
  if (!over()) {
    // The compute threads have nothing to do until this read lands, and the threads landing it
    // (the readers' checks, the experts' rearrangement) need the cores they would poll on.
    ThreadPool::RestSpinners();
    done_cv_.wait(lock, over);
  }
  if (waited_us)
    *waited_us = std::chrono::duration_cast<std::chrono::microseconds>(RuntimeClock::now() - t0)
                     .count();
  if (t->state == ReadTicket::kIdle) return Internal("runtime: waited on a read never submitted");
  return t->state == ReadTicket::kDone ? Status::Ok() : t->error;
}

bool PrefetchScheduler::DropQueuedLocked(ReadTicket* t) {
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (queue_[i].req.ticket != t) continue;
    queued_bytes_ -= queue_[i].bytes;
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
    t->state = ReadTicket::kIdle;
    return true;
  }
  return false;
}

void PrefetchScheduler::Cancel(ReadTicket* t) {
  std::unique_lock<std::mutex> lock(mu_);
  if (DropQueuedLocked(t)) return;
  done_cv_.wait(lock, [&] { return t->state != ReadTicket::kRunning; });
  t->state = ReadTicket::kIdle;
}

ReadTicket::State PrefetchScheduler::Abandon(ReadTicket* t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (t->state == ReadTicket::kQueued && DropQueuedLocked(t)) return ReadTicket::kQueued;
  if (t->state != ReadTicket::kRunning) return ReadTicket::kIdle;
  t->abandoned = true;
  return ReadTicket::kRunning;
}

double PrefetchScheduler::bandwidth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read_seconds_ > 0 ? static_cast<double>(bytes_read_) / read_seconds_ : 0;
}
uint64_t PrefetchScheduler::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_;
}
uint64_t PrefetchScheduler::bytes_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_read_;
}
double PrefetchScheduler::read_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read_seconds_;
}
double PrefetchScheduler::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_seconds_;
}

void PrefetchScheduler::WorkerLoop(int index) {
  IoReader& io = *readers_[index];
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    size_t best = 0;
    for (size_t i = 1; i < queue_.size(); ++i)
      if (queue_[i].req.deadline < queue_[best].req.deadline) best = i;
    Item item = queue_[best];
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(best));
    queued_bytes_ -= item.bytes;
    item.req.ticket->state = ReadTicket::kRunning;
    const auto t0 = RuntimeClock::now();
    if (running_++ == 0) busy_since_ = t0;
    lock.unlock();
    Status st = Execute(io, item.req);
    const auto t1 = RuntimeClock::now();
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    lock.lock();
    if (--running_ == 0) busy_seconds_ += std::chrono::duration<double>(t1 - busy_since_).count();
    if (st.ok()) {
      bytes_read_ += item.bytes;
      read_seconds_ += secs;
    }
    item.req.ticket->state = st.ok() ? ReadTicket::kDone : ReadTicket::kFailed;
    item.req.ticket->error = st;
    done_cv_.notify_all();
  }
}

Status PrefetchScheduler::Execute(IoReader& io, const ReadRequest& r) {
  const StoreOp& op = index_.ops()[r.op];
  const int top = std::min(r.tier, op.n_tiers - 1);
  // Tier k lands at its slab offset, less the offset of the first tier read.
  uint8_t* const base = r.dst - op.SlabOffset(r.first_tier);
  const auto abandoned = [&] {
    return r.ticket->abandoned ? Cancelled("read abandoned: its bytes are no longer wanted")
                               : Status::Ok();
  };
  for (int k = r.first_tier; k <= top; ++k) {
    for (const StoreOp::Span& s : op.spans[k]) {
      RETURN_IF_ERROR(abandoned());
      const RandomAccessFile& f = index_.file(s.file);
      const int64_t start = NowUs();
      RETURN_IF_ERROR(io.Read(f, s.offset, s.bytes, base + op.SlabOffset(k) + s.slab_pos));
      // A file system that refused O_DIRECT: drop what the read cached, or the page cache grows
      // past the budget (the slab holds the bytes now).
      if (!f.direct() && f.fd() >= 0)
        ::posix_fadvise(f.fd(), static_cast<off_t>(s.offset), static_cast<off_t>(s.bytes),
                        POSIX_FADV_DONTNEED);
      if (trace_) {
        const std::string name = f.path().substr(f.path().rfind('/') + 1);
        ReadEvent e{&op.id, &name, s.offset, s.bytes, start, NowUs(), f.direct(), io.uring(),
                    r.issue_us, r.during >= 0 ? &index_.ops()[r.during].id : nullptr};
        trace_->Read(e);
      }
    }
  }
  // Checksums after the reads, so the disk stays busy while the CPU verifies the next op's data.
  RETURN_IF_ERROR(abandoned());
  for (const auto& [id, slice] : op.units) {
    const StoreUnit& u = index_.tensors()[id].units[slice >= 0 ? slice : 0];
    for (int k = r.first_tier; k <= top && k < u.n_tiers; ++k) {
      const StoreRange& rg = u.tier[k];
      RETURN_IF_ERROR(index_.Verify(rg, base + op.SlabOffset(k) + rg.slab_pos));
    }
  }
  if (r.finisher) r.finisher->Finish(r);
  return Status::Ok();
}

}  // namespace substrate
