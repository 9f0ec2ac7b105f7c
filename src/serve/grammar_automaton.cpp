#include "serve/grammar_automaton.h"

#include <algorithm>
#include <map>

namespace substrate::serve {

namespace {
constexpr size_t kMaxNodes = 1u << 22;
uint64_t Key(uint32_t pos, int32_t parent) {
  return (uint64_t{pos} << 32) | static_cast<uint32_t>(parent + 1);
}
}  // namespace

bool GrammarAutomaton::SeenSet::Insert(uint64_t key) {
  if ((count + 1) * 2 > keys.size()) {
    // Grow and keep this stamp's keys.
    std::vector<uint64_t> old_keys;
    for (size_t i = 0; i < keys.size(); ++i)
      if (stamps[i] == stamp) old_keys.push_back(keys[i]);
    const size_t cap = std::max<size_t>(64, keys.size() * 2);
    keys.assign(cap, 0);
    stamps.assign(cap, 0);
    count = 0;
    for (uint64_t k : old_keys) Insert(k);
  }
  const size_t mask = keys.size() - 1;
  for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> 40 & mask;; i = (i + 1) & mask) {
    if (stamps[i] != stamp) {
      stamps[i] = stamp;
      keys[i] = key;
      ++count;
      return true;
    }
    if (keys[i] == key) return false;
  }
}

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar)
    : g_(std::move(grammar)) {
  // Byte classes: bytes with the same membership in every byte set.
  std::map<std::vector<bool>, uint8_t> classes;
  for (int b = 0; b < 256; ++b) {
    std::vector<bool> sig(g_->byte_sets.size());
    for (size_t s = 0; s < sig.size(); ++s) sig[s] = g_->byte_sets[s][static_cast<size_t>(b)];
    auto [it, fresh] =
        classes.try_emplace(std::move(sig), static_cast<uint8_t>(class_bytes_.size()));
    if (fresh) class_bytes_.emplace_back();
    byte_class_[b] = it->second;
    class_bytes_[it->second].push_back(static_cast<uint8_t>(b));
  }
  leaves_.clear();
  accept_ = false;
  seen_.Clear();
  for (uint32_t alt : g_->rule_alts[g_->root]) Expand(alt, -1);
  start_ = Intern();
}

int32_t GrammarAutomaton::NodeId(uint32_t pos, int32_t parent) {
  auto [it, fresh] = node_ids_.try_emplace(Key(pos, parent), static_cast<int32_t>(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return it->second;
}

// Adds to leaves_ every stack reachable from (pos, parent) without consuming a byte.
void GrammarAutomaton::Expand(uint32_t pos, int32_t parent) {
  work_.clear();
  work_.push_back({pos, parent});
  while (!work_.empty()) {
    auto [p, par] = work_.back();
    work_.pop_back();
    if (!seen_.Insert(Key(p, par))) continue;
    const Grammar::Element e = g_->elements[p];
    switch (e.kind) {
      case Grammar::kBytes:
        leaves_.push_back(NodeId(p, par));
        break;
      case Grammar::kEnd:
        if (par < 0) {
          accept_ = true;
        } else {
          const Node n = nodes_[static_cast<size_t>(par)];
          work_.push_back({n.pos, n.parent});
        }
        break;
      case Grammar::kRef: {
        // A reference at the end of an alternative returns where this one would (a tail call),
        // so repetition does not grow the stack.
        const int32_t ret = g_->elements[p + 1].kind == Grammar::kEnd ? par : NodeId(p + 1, par);
        for (uint32_t alt : g_->rule_alts[e.arg]) work_.push_back({alt, ret});
        break;
      }
    }
  }
}

int32_t GrammarAutomaton::Intern() {
  std::sort(leaves_.begin(), leaves_.end());
  leaves_.erase(std::unique(leaves_.begin(), leaves_.end()), leaves_.end());
  if (leaves_.empty() && !accept_) return kDead;
  uint64_t h = accept_ ? 0x9E3779B97F4A7C15ull : 0x2545F4914F6CDD1Dull;
  for (int32_t l : leaves_) h = (h ^ static_cast<uint32_t>(l)) * 0x100000001b3ull;
  std::vector<int32_t>& same_hash = state_ids_[h];
  for (int32_t id : same_hash) {
    const State& s = states_[static_cast<size_t>(id)];
    if (s.accepting == accept_ && s.leaves == leaves_) return id;
  }
  if (states_.size() >= static_cast<size_t>(kMaxStates) || nodes_.size() >= kMaxNodes) {
    if (status_.ok())
      status_ = Infeasible("grammar: more than " + std::to_string(kMaxStates) +
                           " matcher states (the grammar is too large or too deeply nested)");
    return kDead;
  }
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back({leaves_, accept_});
  leaf_bytes_ += leaves_.size() * sizeof(int32_t);
  same_hash.push_back(id);
  trans_.resize(states_.size() * 256, kUnknown);
  return id;
}

int32_t GrammarAutomaton::Compute(int32_t state, uint8_t byte) {
  leaves_.clear();
  accept_ = false;
  seen_.Clear();
  // Expand adds nodes but no states (Intern comes after), so the leaves stay in place.
  const std::vector<int32_t>& from = states_[static_cast<size_t>(state)].leaves;
  for (size_t i = 0; i < from.size(); ++i) {
    const Node n = nodes_[static_cast<size_t>(from[i])];
    if (g_->byte_sets[g_->elements[n.pos].arg][byte]) Expand(n.pos + 1, n.parent);
  }
  const int32_t t = Intern();  // may grow trans_
  for (uint8_t b : class_bytes_[byte_class_[byte]])
    trans_[static_cast<size_t>(state) * 256 + b] = t;
  return t;
}

int32_t GrammarAutomaton::Walk(int32_t state, std::string_view bytes) {
  for (unsigned char b : bytes) {
    if (state < 0) return kDead;
    state = Step(state, b);
  }
  return state;
}

uint64_t GrammarAutomaton::bytes() const {
  uint64_t b = trans_.capacity() * sizeof(int32_t) + nodes_.capacity() * sizeof(Node) +
               node_ids_.size() * 32 + states_.capacity() * sizeof(State) + state_ids_.size() * 48;
  return b + leaf_bytes_;
}

}  // namespace substrate::serve
