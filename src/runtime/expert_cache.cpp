#include "runtime/expert_cache.h"

#include <cmath>

namespace substrate {

double DecayedUseKey(double key, uint64_t t, double half_life) {
  const double now = static_cast<double>(t) / half_life;
  return now + std::log2(1.0 + std::exp2(key - now));
}

Expected<std::unique_ptr<ExpertCache>> ExpertCache::Create(int n_slots, uint64_t slot_bytes,
                                                           int n_ops, MemoryLedger* ledger,
                                                           Policy policy, double half_life) {
  auto c = std::make_unique<ExpertCache>();
  c->policy_ = policy;
  c->half_life_ = half_life > 0 ? half_life : 1;
  c->heat_.assign(static_cast<size_t>(n_ops), kNeverUsed);
  c->slot_bytes_ = (slot_bytes + 4095) / 4096 * 4096;
  if (n_slots > 0) {
    auto arena = AlignedBuffer::Allocate(c->slot_bytes_ * static_cast<uint64_t>(n_slots), ledger,
                                         "expert_cache");
    if (!arena.ok())
      return arena.status().WithContext("expert cache of " + std::to_string(n_slots) + " slots of " +
                                        FormatBytes(c->slot_bytes_));
    c->arena_ = std::move(arena).value();
  }
  c->slots_ = std::vector<Slot>(static_cast<size_t>(n_slots));
  for (int i = 0; i < n_slots; ++i)
    c->slots_[i].data = c->arena_.data() + c->slot_bytes_ * static_cast<uint64_t>(i);
  c->op_slot_.assign(static_cast<size_t>(n_ops), -1);
  return c;
}

int ExpertCache::TakeVictim(int64_t protect_before, int64_t used_before) {
  int best = -1;
  for (int pass = 0; pass < 2 && best < 0; ++pass) {
    for (int i = 0; i < n_slots(); ++i) {
      const Slot& s = slots_[i];
      auto in_flight = [](const ReadTicket& t) {
        return t.state == ReadTicket::kQueued || t.state == ReadTicket::kRunning;
      };
      if (s.pins > 0 || in_flight(s.ticket) || in_flight(s.upgrade)) continue;
      // First pass: not a hinted read its layer has yet to use (a guess whose layer has not
      // routed, or an expert routed to and not yet begun): under kDecayed an expert never used
      // before is the coldest of all.
      if (pass == 0 && s.op >= 0 && (s.hint_pos > protect_before || s.hint_unused)) continue;
      if (s.op >= 0 && s.use_pos >= used_before) continue;
      if (s.op < 0) return i;  // an empty slot beats any victim
      if (best < 0) {
        best = i;
        continue;
      }
      const Slot& b = slots_[best];
      const double hs = heat_[s.op], hb = heat_[b.op];
      const bool better = policy_ == Policy::kLru
                              ? s.last_use < b.last_use
                              : (hs < hb || (hs == hb && s.last_use < b.last_use));
      if (better) best = i;
    }
  }
  if (best >= 0) {
    op_slot_[slots_[best].op] = -1;
    slots_[best].op = -1;
    ++evictions;
  }
  return best;
}

void ExpertCache::Assign(int s, int op, int tier, int64_t pos) {
  Slot& sl = slots_[s];
  if (sl.op >= 0) op_slot_[sl.op] = -1;
  sl.op = op;
  sl.tier = tier;
  sl.layout.clear();  // until its read is done
  sl.upgrade_tier = 0;
  sl.last_use = ++clock_;
  sl.use_pos = pos;
  sl.hint_pos = -1;
  sl.hint_unused = false;
  op_slot_[op] = s;
}

void ExpertCache::Clear(int s) {
  if (slots_[s].op >= 0) op_slot_[slots_[s].op] = -1;
  slots_[s].op = -1;
  slots_[s].upgrade_tier = 0;
}

void ExpertCache::Touch(int s, int64_t pos) {
  if (policy_ == Policy::kDecayed && slots_[s].op >= 0) {
    double& heat = heat_[slots_[s].op];
    heat = DecayedUseKey(heat, ++use_clock_, half_life_);
  }
  slots_[s].last_use = ++clock_;
  slots_[s].use_pos = pos;
}

}  // namespace substrate
