// A Grammar run one byte at a time, determinized lazily: a state is the set of the pushdown
// matcher's stacks (hash-consed, so equal sets are one state id) and each (state, byte)
// transition is computed once and then read from a table. Token masks walk the vocabulary trie
// through Step, so after warm-up a step is one table read.
//
// Not thread-safe: one automaton per request. Memory is bounded by kMaxStates (a grammar that
// needs more fails closed: Step returns kDead and status() says why).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "serve/grammar.h"

namespace substrate::serve {

class GrammarAutomaton {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kMaxStates = 1 << 15;  // 1 KiB of transitions each: <= 32 MiB

  explicit GrammarAutomaton(std::shared_ptr<const Grammar> grammar);

  int32_t start() const { return start_; }
  // The state after `byte` (kDead: the byte cannot continue the text).
  int32_t Step(int32_t state, uint8_t byte) {
    const size_t i = static_cast<size_t>(state) * 256 + byte;
    int32_t t = trans_[i];
    if (t == kUnknown) trans_[i] = t = Compute(state, byte);  // Compute may grow trans_
    return t;
  }
  // Runs `bytes` from `state`; kDead when they leave the grammar.
  int32_t Walk(int32_t state, std::string_view bytes);
  // The text so far is a complete sentence of the grammar.
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].accepting; }
  // More bytes may follow.
  bool can_continue(int32_t state) const { return !states_[static_cast<size_t>(state)].leaves.empty(); }
  size_t n_states() const { return states_.size(); }
  const Status& status() const { return status_; }
  const Grammar& grammar() const { return *g_; }

 private:
  static constexpr int32_t kUnknown = -2;
  struct Node {
    uint32_t pos;    // kBytes element (a leaf) or the element to continue at (a frame)
    int32_t parent;  // the frame to return to; -1: the root
  };
  struct State {
    std::vector<int32_t> leaves;  // sorted node ids whose element is kBytes
    bool accepting = false;
  };
  int32_t NodeId(uint32_t pos, int32_t parent);
  void Expand(uint32_t pos, int32_t parent);
  int32_t Intern();  // the state of leaves_/accept_ (new or existing)
  int32_t Compute(int32_t state, uint8_t byte);

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<int32_t> trans_;
  int32_t start_ = kDead;
  Status status_;
  // Scratch of Compute.
  std::vector<int32_t> leaves_;
  bool accept_ = false;
  std::unordered_set<uint64_t> seen_;
  std::vector<std::pair<uint32_t, int32_t>> work_;
};

}  // namespace substrate::serve
