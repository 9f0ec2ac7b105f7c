#include "runtime/tier_controller.h"

#include <algorithm>

namespace substrate {

const char* TierSwitchName(TierSwitch w) {
  switch (w) {
    case TierSwitch::kEscalate:
      return "escalate";
    case TierSwitch::kDecay:
      return "decay";
    case TierSwitch::kEvict:
      return "evict";
    case TierSwitch::kForce:
      return "force";
  }
  return "?";
}

Expected<TierController> TierController::Create(std::vector<uint8_t>* tiers,
                                                std::vector<uint8_t> ceiling,
                                                std::vector<std::vector<uint64_t>> cost,
                                                const TierControllerOptions& options,
                                                MemoryLedger* ledger) {
  const size_t n = tiers->size();
  if (ceiling.size() != n || cost.size() != n)
    return InvalidArgument("tier controller: tiers, ceilings and costs of different op counts");
  if (options.persistence < 1 || options.max_concurrent < 1)
    return InvalidArgument("tier controller: persistence and max_concurrent must be >= 1");
  TierController c;
  c.options_ = options;
  c.tiers_ = tiers;
  c.base_ = *tiers;
  c.ceiling_ = std::move(ceiling);
  c.cost_ = std::move(cost);
  for (size_t o = 0; o < n; ++o) {
    c.ceiling_[o] = std::max(c.ceiling_[o], c.base_[o]);
    if (c.cost_[o].size() <= c.ceiling_[o])
      return InvalidArgument("tier controller: op " + std::to_string(o) + " has no cost for tier " +
                             std::to_string(c.ceiling_[o]));
  }
  c.above_.assign(n, 0);
  c.calm_.assign(n, 0);
  c.recent_.assign(n, 0.0f);
  c.active_.reserve(static_cast<size_t>(options.max_concurrent) + 1);
  if (options.pool_bytes > 0 && ledger) {
    ASSIGN_OR_RETURN(c.charge_, ledger->Charge("escalation_pool", options.pool_bytes));
  }
  return c;
}

void TierController::Observe(int op, float d) {
  recent_[op] = 0.75f * recent_[op] + 0.25f * d;
  if (d > options_.threshold) {
    calm_[op] = 0;
    if (++above_[op] >= options_.persistence && (*tiers_)[op] < ceiling_[op] && !hold_) {
      if (TryEscalate(op)) above_[op] = 0;
    }
  } else {
    above_[op] = 0;
    ++calm_[op];
  }
}

bool TierController::TryEscalate(int op) {
  const int next = (*tiers_)[op] + 1;
  const uint64_t extra = Cost(op, next) - Cost(op, (*tiers_)[op]);
  const bool fresh = (*tiers_)[op] == base_[op];
  auto fits = [&] {
    return (!fresh || static_cast<int>(active_.size()) < options_.max_concurrent) &&
           (options_.pool_bytes == 0 || stats_.pool_used + extra <= options_.pool_bytes);
  };
  while (!fits()) {
    // The laziest escalated op: lowest recent disagreement, then the longest calm.
    int lazy = -1;
    for (int o : active_) {
      if (o == op) continue;
      if (lazy < 0 || recent_[o] < recent_[lazy] ||
          (recent_[o] == recent_[lazy] && calm_[o] > calm_[lazy]))
        lazy = o;
    }
    if (lazy < 0 || recent_[lazy] >= recent_[op]) {
      ++stats_.refused;
      return false;
    }
    Demote(lazy, TierSwitch::kEvict);
    ++stats_.evictions;
  }
  if (fresh) active_.push_back(op);
  stats_.pool_used += extra;
  (*tiers_)[op] = static_cast<uint8_t>(next);
  Tell(op, next - 1, next, TierSwitch::kEscalate);
  calm_[op] = 0;
  ++stats_.escalations;
  Track();
  return true;
}

void TierController::Demote(int op, TierSwitch why) {
  stats_.pool_used -= Cost(op, (*tiers_)[op]);
  Tell(op, (*tiers_)[op], base_[op], why);
  (*tiers_)[op] = base_[op];
  above_[op] = calm_[op] = 0;
  active_.erase(std::find(active_.begin(), active_.end(), op));
  Track();
}

void TierController::EndToken() {
  for (size_t i = 0; i < active_.size();) {
    const int op = active_[i];
    if (calm_[op] >= options_.persistence) {
      Demote(op, TierSwitch::kDecay);  // erases active_[i]
      ++stats_.decays;
    } else {
      ++i;
    }
  }
}

void TierController::ForceDemoteAll() {
  while (!active_.empty()) Demote(active_.back(), TierSwitch::kForce);
  ++stats_.force_demotes;
}

void TierController::Track() {
  stats_.pool_peak = std::max(stats_.pool_peak, stats_.pool_used);
  stats_.escalated = static_cast<int>(active_.size());
  stats_.escalated_peak = std::max(stats_.escalated_peak, stats_.escalated);
}

}  // namespace substrate
