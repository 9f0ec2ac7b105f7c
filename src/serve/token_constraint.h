// Constrained decoding: the engine's LogitsProcessor that lets through only the tokens whose
// bytes continue a grammar (the end-of-generation tokens only where the grammar is complete),
// plus OpenAI's logit_bias. The mask of a grammar state is computed by walking the vocabulary
// trie once and is then cached by state, so a state seen before (the inside of a JSON string,
// say) costs a cache lookup.
//
// Fails closed: a token the grammar cannot take (which the mask rules out, so only a bug or a
// grammar over the matcher's state limit) ends generation and sets status().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/memory_ledger.h"
#include "runtime/engine.h"
#include "serve/grammar.h"
#include "serve/grammar_automaton.h"
#include "serve/token_trie.h"

namespace substrate {
class Tokenizer;
}

namespace substrate::serve {

// What a constraint needs to know about a model's vocabulary; built once per model.
struct ConstraintVocab {
  int32_t n_vocab = 0;              // the model's logits per row (may exceed the tokenizer's)
  std::vector<std::string> pieces;  // each token's bytes
  std::unique_ptr<TokenTrie> trie;  // every token but control and end-of-generation ones
  std::vector<std::pair<std::string, int32_t>> control;  // control tokens (text, id)
  std::vector<int32_t> eog;                              // end-of-generation tokens
  std::vector<int32_t> outside;  // tokens not in the trie (control, empty, padding ids)

  static std::shared_ptr<const ConstraintVocab> FromTokenizer(const Tokenizer& tok,
                                                              int32_t n_vocab);
  // For tests and benchmarks: a vocabulary of raw pieces, `eog` ids ending generation.
  static std::shared_ptr<const ConstraintVocab> FromPieces(std::vector<std::string> pieces,
                                                           std::vector<int32_t> eog);
  // Bytes it holds, roughly (its pieces and the trie).
  uint64_t bytes() const;
};

struct ConstraintStats {
  uint64_t masks = 0;           // masks applied
  uint64_t mask_walks = 0;      // of which computed by a trie walk (the rest from the cache)
  uint64_t nodes_stepped = 0;   // trie nodes the walks stepped through
  uint64_t subtrees_taken = 0;  // whole subtrees the walks allowed at once (text)
  double mask_seconds = 0;      // time spent computing and applying masks
};

class TokenConstraint : public LogitsProcessor {
 public:
  // `grammar` may be null (logit_bias only). With `triggers`, the output is free until one of
  // them appears in it; the grammar then applies from that trigger on (the grammar's sentences
  // start with a trigger).
  TokenConstraint(std::shared_ptr<const ConstraintVocab> vocab,
                  std::shared_ptr<const Grammar> grammar, std::map<int32_t, float> logit_bias = {},
                  std::vector<std::string> triggers = {});

  // Charges what the matcher and its cached masks hold to `ledger`'s "grammar" account as they
  // grow (null: not charged); growing past the ledger's cap fails the constraint (status()).
  void set_ledger(MemoryLedger* ledger) { ledger_ = ledger; }

  void Apply(float* logits, int64_t n_vocab, const std::vector<int32_t>& history) override;
  void Accept(int32_t token) override;

  // Whether `token` may come next (the mask's bit), for tests.
  bool Allowed(int32_t token);
  // The text so far is a complete sentence of the grammar (true without a grammar).
  bool complete() const;
  // The grammar applies now (false before a trigger).
  bool active() const { return automaton_ && active_; }
  // Not ok once the output left the grammar (generation must be reported as failed).
  const Status& status() const { return status_; }
  const ConstraintStats& stats() const { return stats_; }

 private:
  const std::vector<uint64_t>& Mask(int32_t state);
  void Walk(int32_t state, std::vector<uint64_t>* mask);
  // States whose stacks are equal once bounded-repetition counts are capped at the longest
  // token share one mask (a token cannot tell them apart): the id of that class.
  int32_t MaskClass(int32_t state);
  // The longest d (capped at the longest token) such that all text (TokenTrie::TextChar) of at
  // most d bytes keeps `state` alive: a trie subtree of text no deeper than that is allowed
  // whole, without stepping through it (the inside of a JSON string).
  int TextDepth(int32_t state);
  // The length of the shortest text from `state` that leaves the grammar, at most cap + 1;
  // memoized where exact (see the .cpp).
  int TextDeath(int32_t state, int* explored, bool* tainted);
  void ChargeMemory();

  std::shared_ptr<const ConstraintVocab> vocab_;
  std::unique_ptr<GrammarAutomaton> automaton_;
  std::map<int32_t, float> bias_;
  std::vector<int32_t> specials_;  // control tokens the grammar names in a literal
  int32_t state_ = 0;
  bool active_ = true;
  std::vector<std::string> triggers_;
  std::string before_;  // output so far, while waiting for a trigger
  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;  // by MaskClass
  std::vector<uint32_t> canon_;    // grammar element -> its class (bounded repetitions capped)
  std::vector<int32_t> class_of_;  // state -> MaskClass (-1: not yet)
  std::unordered_map<std::string, int32_t> classes_;
  std::vector<int16_t> text_death_;  // by state; -1: not computed
  std::vector<char> on_path_;        // TextDeath's recursion
  // One text character per combination of byte classes (all others behave as one of these).
  std::vector<std::string> text_chars_;
  std::vector<int32_t> walk_states_;
  std::vector<uint64_t> pre_;  // a walk's allowed tokens, in the trie's preorder
  Status status_;
  ConstraintStats stats_;
  MemoryLedger* ledger_ = nullptr;
  std::vector<LedgerCharge> charges_;
  uint64_t charged_ = 0;
};

}  // namespace substrate::serve
