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
#include <vector>

#include "core/status.h"
#include "serve/grammar.h"

namespace substrate::serve {

class GrammarAutomaton {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kUnknown = -2;         // a transition not computed yet
  static constexpr int32_t kMaxStates = 1 << 15;  // 1 KiB of transitions each: <= 32 MiB

  explicit GrammarAutomaton(std::shared_ptr<const Grammar> grammar);

  int32_t start() const { return start_; }
  // The state after `byte` (kDead: the byte cannot continue the text).
  int32_t Step(int32_t state, uint8_t byte) {
    int32_t t = trans_[static_cast<size_t>(state) * 256 + byte];
    return t == kUnknown ? Compute(state, byte) : t;
  }
  // Runs `bytes` from `state`; kDead when they leave the grammar.
  int32_t Walk(int32_t state, std::string_view bytes);
  // The text so far is a complete sentence of the grammar.
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].accepting; }
  // More bytes may follow.
  bool can_continue(int32_t state) const {
    return !states_[static_cast<size_t>(state)].leaves.empty();
  }
  size_t n_states() const { return states_.size(); }
  // Bytes this automaton holds (its tables, states and stacks), roughly.
  uint64_t bytes() const;
  // The transition table (state * 256 + byte -> state, kDead or kUnknown), for a caller that
  // reads it directly in a hot loop; valid until the next Step that computes a transition.
  const int32_t* transitions() const { return trans_.data(); }
  // Bytes of one class lead from every state to the same state.
  uint8_t byte_class(uint8_t b) const { return byte_class_[b]; }
  // The stacks of a state: its leaves, each a node whose parents lead to the root (-1).
  struct Node {
    uint32_t pos;    // kBytes element (a leaf) or the element to continue at (a frame)
    int32_t parent;  // the frame to return to; -1: the root
  };
  const std::vector<int32_t>& leaves(int32_t state) const {
    return states_[static_cast<size_t>(state)].leaves;
  }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  const Status& status() const { return status_; }
  const Grammar& grammar() const { return *g_; }

 private:
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
  std::unordered_map<uint64_t, std::vector<int32_t>> state_ids_;  // hash of leaves -> states
  std::vector<int32_t> trans_;
  int32_t start_ = kDead;
  uint64_t leaf_bytes_ = 0;  // the states' leaf lists, for bytes()
  // Bytes no byte set tells apart behave alike in every state: a transition is computed once
  // per class of bytes and stored for all of them.
  uint8_t byte_class_[256];
  std::vector<std::vector<uint8_t>> class_bytes_;
  Status status_;
  // Scratch of Compute.
  std::vector<int32_t> leaves_;
  bool accept_ = false;
  // (pos, parent) pairs expanded this step: an open-addressing set cleared in O(1) by a stamp.
  struct SeenSet {
    std::vector<uint64_t> keys;
    std::vector<uint32_t> stamps;
    uint32_t stamp = 1;
    size_t count = 0;
    void Clear() {
      ++stamp;
      count = 0;
    }
    bool Insert(uint64_t key);  // false when present
  };
  SeenSet seen_;
  std::vector<std::pair<uint32_t, int32_t>> work_;
};

}  // namespace substrate::serve
