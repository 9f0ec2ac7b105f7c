// TierController: the adaptive runtime's state machine (the Substrate seed's "Runtime"). It is
// not a planner: it only switches ops among the tiers the plan compiled, by writing the model's
// flat per-op tier table, which the forward pass and the residency layer read.
//
// Per token, a verifier reports each watched op's disagreement (Observe). An op whose
// disagreement stays above the threshold for `persistence` consecutive tokens is escalated one
// tier (to at most its ceiling), if the escalation pool has room for its residual bytes and
// fewer than K ops are escalated; when it has not, the laziest escalated op (lowest recent
// disagreement, then the most calm tokens) is demoted to make room, if it is lazier than the
// candidate. An escalated op whose disagreement stays below the threshold for `persistence`
// tokens decays back to its base tier at EndToken. ForceDemoteAll returns every op to its base
// (the runtime monitor's answer to latency or bandwidth going critical).
//
// Tier changes made during a token take effect from the next token. Every call is O(1) (EndToken
// is O(escalated ops)), allocates nothing and takes no lock: one thread drives the token loop.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory_ledger.h"
#include "core/status.h"

namespace substrate {

struct TierControllerOptions {
  float threshold = 0.15f;  // disagreement above which a token counts towards escalation
  int persistence = 4;      // consecutive tokens above (escalate) or below (decay)
  int max_concurrent = 4;   // K: ops escalated at once
  uint64_t pool_bytes = 0;  // residual bytes the escalated ops may hold together (0: no limit)
};

enum class TierSwitch { kEscalate, kDecay, kEvict, kForce };
const char* TierSwitchName(TierSwitch w);
// Told of every tier change (the engine writes them to the trace). A plain function and a
// context: no allocation.
using TierSwitchListener = void (*)(void* ctx, int op, int from, int to, TierSwitch why);

struct TierControllerStats {
  uint64_t escalations = 0, decays = 0, evictions = 0, refused = 0, force_demotes = 0;
  uint64_t pool_used = 0, pool_peak = 0;
  int escalated = 0, escalated_peak = 0;
};

class TierController {
 public:
  // tiers: the model's per-op table (indexed like `cost`); its current values are the base
  // tiers. ceiling[op]: the highest tier op may reach (its base: not escalatable).
  // cost[op][k]: bytes op holds at tier k above its base (cost[op][base] = 0). The pool is
  // charged to `ledger` (account "escalation_pool") for the controller's lifetime.
  static Expected<TierController> Create(std::vector<uint8_t>* tiers, std::vector<uint8_t> ceiling,
                                         std::vector<std::vector<uint64_t>> cost,
                                         const TierControllerOptions& options,
                                         MemoryLedger* ledger);

  void Observe(int op, float disagreement);
  void EndToken();
  void ForceDemoteAll();
  // Held: no escalation (the runtime monitor's critical states); decay and demotion go on.
  void set_hold(bool hold) { hold_ = hold; }
  bool held() const { return hold_; }
  void set_listener(TierSwitchListener fn, void* ctx) {
    listener_ = fn;
    listener_ctx_ = ctx;
  }

  int n_ops() const { return static_cast<int>(base_.size()); }
  int tier(int op) const { return (*tiers_)[op]; }
  int base(int op) const { return base_[op]; }
  const TierControllerStats& stats() const { return stats_; }
  const TierControllerOptions& options() const { return options_; }
  // Ops escalated now, in escalation order (valid until the next call).
  const std::vector<int>& escalated() const { return active_; }

 private:
  TierController() = default;
  uint64_t Cost(int op, int tier) const { return cost_[op][tier]; }
  bool TryEscalate(int op);
  void Demote(int op, TierSwitch why);
  void Track();
  void Tell(int op, int from, int to, TierSwitch why) {
    if (listener_) listener_(listener_ctx_, op, from, to, why);
  }

  TierControllerOptions options_;
  std::vector<uint8_t>* tiers_ = nullptr;
  std::vector<uint8_t> base_, ceiling_;
  std::vector<std::vector<uint64_t>> cost_;
  std::vector<int> above_, calm_;  // consecutive tokens above / below the threshold
  std::vector<float> recent_;      // moving average of the disagreement
  std::vector<int> active_;        // escalated ops (capacity reserved: no allocation)
  LedgerCharge charge_;
  TierControllerStats stats_;
  bool hold_ = false;
  TierSwitchListener listener_ = nullptr;
  void* listener_ctx_ = nullptr;
};

}  // namespace substrate
