#include "serve/grammar_automaton.h"

#include <algorithm>
#include <cstring>

namespace substrate::serve {

namespace {
constexpr size_t kMaxNodes = 1u << 22;
uint64_t Key(uint32_t pos, int32_t parent) {
  return (uint64_t{pos} << 32) | static_cast<uint32_t>(parent + 1);
}
}  // namespace

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  leaves_.clear();
  accept_ = false;
  seen_.clear();
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
    if (!seen_.insert(Key(p, par)).second) continue;
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
        const int32_t ret =
            g_->elements[p + 1].kind == Grammar::kEnd ? par : NodeId(p + 1, par);
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
  std::string key(leaves_.size() * sizeof(int32_t) + 1, '\0');
  std::memcpy(key.data(), leaves_.data(), leaves_.size() * sizeof(int32_t));
  key.back() = accept_ ? 1 : 0;
  auto it = state_ids_.find(key);
  if (it != state_ids_.end()) return it->second;
  if (states_.size() >= static_cast<size_t>(kMaxStates) || nodes_.size() >= kMaxNodes) {
    if (status_.ok())
      status_ = Infeasible("grammar: more than " + std::to_string(kMaxStates) +
                           " matcher states (the grammar is too large or too deeply nested)");
    return kDead;
  }
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back({leaves_, accept_});
  state_ids_.emplace(std::move(key), id);
  trans_.resize(states_.size() * 256, kUnknown);
  return id;
}

int32_t GrammarAutomaton::Compute(int32_t state, uint8_t byte) {
  leaves_.clear();
  accept_ = false;
  seen_.clear();
  // Copy: Expand may add nodes, and Intern states, while we read this one.
  const std::vector<int32_t> from = states_[static_cast<size_t>(state)].leaves;
  for (int32_t leaf : from) {
    const Node n = nodes_[static_cast<size_t>(leaf)];
    if (g_->byte_sets[g_->elements[n.pos].arg][byte]) Expand(n.pos + 1, n.parent);
  }
  return Intern();
}

int32_t GrammarAutomaton::Walk(int32_t state, std::string_view bytes) {
  for (unsigned char b : bytes) {
    if (state < 0) return kDead;
    state = Step(state, b);
  }
  return state;
}

}  // namespace substrate::serve
