#include "runtime/expert_cache.h"

namespace substrate {

Expected<std::unique_ptr<ExpertCache>> ExpertCache::Create(int n_slots, uint64_t slot_bytes,
                                                           int n_ops, MemoryLedger* ledger,
                                                           Policy policy) {
  auto c = std::make_unique<ExpertCache>();
  c->policy_ = policy;
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
      if (pass == 0 && s.op >= 0 && s.hint_pos > protect_before) continue;
      if (s.op >= 0 && s.use_pos >= used_before) continue;
      if (s.op < 0) return i;  // an empty slot beats any victim
      if (best < 0) {
        best = i;
        continue;
      }
      const Slot& b = slots_[best];
      const bool better = policy_ == Policy::kLru
                              ? s.last_use < b.last_use
                              : (s.uses < b.uses || (s.uses == b.uses && s.last_use < b.last_use));
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
  sl.uses = 0;
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
  slots_[s].last_use = ++clock_;
  slots_[s].use_pos = pos;
  ++slots_[s].uses;
}

}  // namespace substrate
