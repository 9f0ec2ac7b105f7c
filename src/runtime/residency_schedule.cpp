// ResidencyManager's read scheduling (kept apart from residency and the op windows): which
// streamed ops' reads are due — a plan's start_during, else the depth rule — how many slabs a
// plan's windows want, and the bandwidth admission that predicts late reads.
#include <algorithm>

#include "runtime/residency_manager.h"

namespace substrate {

// The bandwidth admission: a read that cannot finish before its op is predicted to start (the
// queued bytes ahead of it at the measured rate, against the compute time of the ops before it)
// takes the op's fallback (FallbackPlanner): served at a lower tier when the plan allows, else
// waited for. An escalation (a resident op raised above its skeleton) is always read: its
// residual is kept for the op's next tokens, so a read too late for this one still serves them,
// and BeginOp runs the op on its skeleton while it is in flight. Leaving it unread would leave
// it unread for good on a machine whose compute outruns its disk: the admission would predict
// every later read late too.
int ResidencyManager::Admit(int op, int64_t abs) {
  const int want = Want(op);
  const double bw = sched_->bandwidth();
  if (bw <= 0 || st_[op].where == Where::kResident) return want;
  const int64_t n = static_cast<int64_t>(seq_.size());
  double deadline_us = 0;
  for (int64_t q = pos_ + 1; q < abs; ++q) {
    const OpState& s = st_[seq_[q % n]];
    // An op not yet timed (the first pass) gives no deadline to hold the read against:
    // predicting it late would serve the whole first pass below the plan on any disk.
    if (!s.timed) return want;
    deadline_us += s.compute_us;
  }
  const double queued = static_cast<double>(sched_->queued_bytes());
  const StoreOp& o = index_->ops()[op];
  const uint64_t first = o.SlabOffset(st_[op].resident_top + 1);
  auto on_time = [&](int t) {
    return (queued + static_cast<double>(o.SlabBytes(t) - first)) / bw * 1e6 <= deadline_us;
  };
  if (on_time(want)) return want;
  return fallback_.OnPredictedLate(op, want, std::max(0, st_[op].resident_top + 1),
                                   st_[op].resident_top, on_time);
}

int ResidencyManager::KeptSlabs() const {
  int n = 0;
  for (const auto& sl : slabs_) n += sl->op >= 0 && st_[sl->op].kept;
  return n;
}

int ResidencyManager::FreeSlab() const {
  for (size_t i = 0; i < slabs_.size(); ++i)
    if (slabs_[i]->op < 0) return static_cast<int>(i);
  return -1;
}

uint64_t ResidencyManager::StreamedBytes(int op) const {
  const StoreOp& o = index_->ops()[op];
  return o.SlabBytes(serve_) - o.SlabOffset(st_[op].resident_top + 1);
}

void ResidencyManager::Submit(int64_t deadline, int op, int tier, uint8_t* dst, ReadTicket* t,
                              int first_tier, int slot) {
  ReadRequest r;
  r.deadline = deadline;
  r.op = op;
  r.tier = tier;
  r.first_tier = first_tier;
  r.dst = dst;
  r.ticket = t;
  r.during = cur_op_;
  if (slot >= 0 && first_tier == 0 && options_.backend && options_.adopt_expert_reads) {
    r.finisher = this;
    r.finish_arg = slot;
  }
  sched_->Submit(r);
}

// Issues the reads of the positions ahead (one token's worth) that are due: by the plan's
// start_during, or by the depth rule. Positions go in sequence order, so the earliest deadline
// takes a free slab first; a read without a slab waits for the next EndOp that frees one.
void ResidencyManager::ScheduleAhead() {
  const int64_t n = static_cast<int64_t>(seq_.size());
  if (slabs_.empty() || pos_ < 0) return;
  int streamed = 0;  // streamed ops in (pos_, q]: the depth rule's distance
  for (int64_t q = pos_ + 1; q < pos_ + n; ++q) {
    const int o = seq_[q % n];
    OpState& s = st_[o];
    if (!Streams(o)) continue;
    ++streamed;
    if (s.issue_seq < 0 && streamed > options_.prefetch_depth) {
      if (!plan_schedules_) break;  // every later op follows the depth rule too
      continue;
    }
    if (s.slab >= 0 || fallback_.skips(o, q)) continue;  // issued for q already, or still held
    if (s.issue_seq >= 0 && pos_ < q - q % n + s.issue_seq) continue;  // start_during not begun
    const int free_slab = FreeSlab();
    if (free_slab < 0) break;
    s.asked = Want(o);
    s.tier = Admit(o, q);
    if (s.tier <= s.resident_top) {  // the residual skipped: nothing to read
      fallback_.SkipAt(o, q);
      continue;
    }
    s.slab = free_slab;
    s.abs = q;
    slabs_[free_slab]->op = o;
    Submit(q, o, s.tier, slabs_[free_slab]->buf.data(), &slabs_[free_slab]->ticket,
           s.resident_top + 1);
  }
}

// Most streamed ops alive at once over one token: each from the position that issues its read
// (the plan's, or the depth rule's: its prefetch_depth-th streamed predecessor, perhaps in the
// previous token) to the position whose EndOp evicts it.
int ResidencyManager::SlabsWanted() const {
  const int n = static_cast<int>(seq_.size());
  std::vector<int> streamed;
  for (int q = 0; q < n; ++q)
    if (st_[seq_[q]].where == Where::kStreamed) streamed.push_back(q);
  const int m = static_cast<int>(streamed.size()), depth = options_.prefetch_depth;
  std::vector<int> cover(static_cast<size_t>(n), 0);
  for (int j = 0; j < m; ++j) {
    const OpState& s = st_[seq_[streamed[j]]];
    const int x = streamed[j];
    const int end = std::max(x, st_[s.evict_at].seq);
    if (s.issue_seq < 0 && depth >= m) {
      for (int& c : cover) ++c;
      continue;
    }
    const int issue = s.issue_seq >= 0 ? s.issue_seq : streamed[((j - depth) % m + m) % m];
    if (issue <= x) {
      for (int q = issue; q <= end; ++q) ++cover[q];
    } else {  // from the previous token
      for (int q = issue; q < n; ++q) ++cover[q];
      for (int q = 0; q <= end; ++q) ++cover[q];
    }
  }
  return cover.empty() ? 0 : *std::max_element(cover.begin(), cover.end());
}

}  // namespace substrate
