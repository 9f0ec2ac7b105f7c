// ExpertCache: fixed slots for routed experts' weights (op `block_L.moe.expert_E`), allocated once
// (ledger account "expert_cache") and recycled: an expert the router picks is served from a
// slot if present (hit), else read into a victim slot (miss). Victims are unpinned slots with no
// read in flight and no recent hint: least recently used (kLru), or the expert with the fewest
// uses when each use counts less the longer ago it was (kDecayed: its weight halves every
// half-life of uses of the cache; remembered across evictions, so an expert read again keeps
// its history). Where a token's experts do not fit, LRU evicts what the next token uses again;
// decayed counts keep the experts used often (bench/RESULTS.md, "Expert-cache policies against
// Belady's optimum" and "... the expert cache's policy where a token's experts crowd it").
// A slot has room for its expert's whole ladder: an escalated expert's residual tiers are read
// into the room above the tiers it holds (an upgrade) and stay there while the expert does.
//
// Not thread-safe: the ResidencyManager calls it under its own lock.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/aligned_buffer.h"
#include "quant/weight_view.h"
#include "runtime/prefetch_scheduler.h"

namespace substrate {

// An expert's decayed use count as an ordering key: log2(count at time t) + t / half_life, so
// keys of experts last used at different times compare as their counts would at any one time,
// and a key changes only when its expert is used. The key after a use at time t (counted in
// uses); kNeverUsed before the first.
constexpr double kNeverUsed = -std::numeric_limits<double>::infinity();
double DecayedUseKey(double key, uint64_t t, double half_life);

class ExpertCache {
 public:
  enum class Policy { kLru, kDecayed };
  struct Slot {
    uint8_t* data = nullptr;
    int op = -1;  // StoreIndex op held (or being read), -1 when empty
    int tier = 0;  // tiers 0..tier, read by `ticket`
    ReadTicket ticket;
    // An upgrade: tiers tier+1..upgrade_tier being read by `upgrade` (0: none), while tiers
    // 0..tier serve; the runtime folds it into `tier` once read.
    int upgrade_tier = 0;
    ReadTicket upgrade;
    int pins = 0;
    uint64_t last_use = 0;
    int64_t hint_pos = -1;  // sequence position of the hint that filled it
    int64_t use_pos = -1;   // sequence position of its last use (or of its filling)
    bool hint_unused = false;  // filled by a hint and not acquired since
    // Per unit of its op, the layout tier 0 has once read (the backend's; empty: plain rows).
    std::vector<WeightLayout> layout;
  };

  // n_slots slots of slot_bytes (4096-aligned), charged to "expert_cache". n_ops: ops in the store.
  // half_life: kDecayed's, in uses of the cache.
  static Expected<std::unique_ptr<ExpertCache>> Create(int n_slots, uint64_t slot_bytes, int n_ops,
                                                       MemoryLedger* ledger, Policy policy,
                                                       double half_life = 1);

  int Find(int op) const { return op_slot_[op]; }
  // A victim slot (emptied of its op), or -1 when every slot is pinned, in flight or protected
  // (hinted at a position > protect_before). Slots used or filled at a position >= used_before
  // are never taken (a guess must not evict what the tokens now running use).
  int TakeVictim(int64_t protect_before, int64_t used_before = INT64_MAX);
  // Slot s now holds op (its read is the caller's to submit), filled at sequence position pos.
  void Assign(int s, int op, int tier, int64_t pos = -1);
  void Touch(int s, int64_t pos = -1);  // a use at position pos: recency and frequency
  void Clear(int s);  // empties slot s (its read failed)
  Slot& slot(int s) { return slots_[s]; }
  int n_slots() const { return static_cast<int>(slots_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }

  // hint_used: hinted reads whose expert was then acquired, before its layer routed elsewhere
  // (the guesses' precision is ResidencyStats::lookahead); hint_dropped: hinted reads dropped before they started; hint_abandoned:
  // those stopped while running.
  uint64_t hits = 0, misses = 0, late = 0, hinted = 0, hint_used = 0, hint_dropped = 0,
           hint_abandoned = 0, evictions = 0;

 private:
  Policy policy_ = Policy::kLru;
  double half_life_ = 1;
  uint64_t slot_bytes_ = 0;
  uint64_t clock_ = 0;      // fills and uses: recency
  uint64_t use_clock_ = 0;  // uses: kDecayed's time
  std::vector<double> heat_;  // per op: DecayedUseKey (kDecayed only)
  AlignedBuffer arena_;
  std::vector<Slot> slots_;
  std::vector<int> op_slot_;
};

}  // namespace substrate
