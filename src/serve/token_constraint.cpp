#include "serve/token_constraint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "tokenizer/tokenizer.h"

namespace substrate::serve {

namespace {
// Cached masks per request (a mask is n_vocab bits: 19 KB for 150k tokens).
constexpr size_t kMaxCachedMasks = 512;

std::shared_ptr<const ConstraintVocab> Build(std::vector<std::string> pieces, int32_t n_vocab,
                                             std::vector<char> include,
                                             std::vector<std::pair<std::string, int32_t>> control,
                                             std::vector<int32_t> eog) {
  auto v = std::make_shared<ConstraintVocab>();
  v->n_vocab = n_vocab;
  v->trie = std::make_unique<TokenTrie>(pieces, include);
  v->pieces = std::move(pieces);
  v->control = std::move(control);
  v->eog = std::move(eog);
  return v;
}
}  // namespace

std::shared_ptr<const ConstraintVocab> ConstraintVocab::FromTokenizer(const Tokenizer& tok,
                                                                      int32_t n_vocab) {
  std::vector<std::string> pieces(static_cast<size_t>(n_vocab));
  std::vector<char> include(static_cast<size_t>(n_vocab), 0);
  std::vector<std::pair<std::string, int32_t>> control;
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < n_vocab && id < tok.n_vocab(); ++id) {
    pieces[id] = tok.Piece(id);
    if (tok.IsEog(id)) {
      eog.push_back(id);
    } else if (tok.IsControl(id)) {
      if (!pieces[id].empty()) control.push_back({pieces[id], id});
    } else {
      include[id] = 1;
    }
  }
  return Build(std::move(pieces), n_vocab, std::move(include), std::move(control), std::move(eog));
}

std::shared_ptr<const ConstraintVocab> ConstraintVocab::FromPieces(std::vector<std::string> pieces,
                                                                   std::vector<int32_t> eog) {
  const int32_t n = static_cast<int32_t>(pieces.size());
  std::vector<char> include(pieces.size(), 1);
  for (int32_t id : eog)
    if (id >= 0 && id < n) include[id] = 0;
  return Build(std::move(pieces), n, std::move(include), {}, std::move(eog));
}

TokenConstraint::TokenConstraint(std::shared_ptr<const ConstraintVocab> vocab,
                                 std::shared_ptr<const Grammar> grammar,
                                 std::map<int32_t, float> logit_bias,
                                 std::vector<std::string> triggers)
    : vocab_(std::move(vocab)), bias_(std::move(logit_bias)), triggers_(std::move(triggers)) {
  triggers_.erase(std::remove(triggers_.begin(), triggers_.end(), std::string()), triggers_.end());
  if (!grammar) return;
  active_ = triggers_.empty();
  // Control tokens are generated only where the grammar spells their text in a literal
  // ("[TOOL_CALLS]"), never as the bytes of, say, a JSON string.
  for (const auto& [text, id] : vocab_->control)
    for (const std::string& lit : grammar->literals)
      if (lit.find(text) != std::string::npos) {
        specials_.push_back(id);
        break;
      }
  // Bounded repetitions deeper than the longest token collapse into one mask class.
  size_t longest = static_cast<size_t>(vocab_->trie->max_depth());
  for (int32_t id : specials_) longest = std::max(longest, vocab_->pieces[id].size());
  const size_t cap = std::max<size_t>(2, longest);
  canon_.resize(grammar->elements.size());
  for (size_t i = 0; i < canon_.size(); ++i) canon_[i] = static_cast<uint32_t>(i);
  for (const std::vector<uint32_t>& chain : grammar->chains) {
    if (chain.size() <= cap) continue;
    const auto& top = grammar->rule_alts[chain[cap - 1]];
    for (size_t k = cap; k < chain.size(); ++k) {
      const auto& alts = grammar->rule_alts[chain[k]];
      for (size_t a = 0; a < alts.size() && a < top.size(); ++a)
        for (uint32_t o = 0;; ++o) {
          canon_[alts[a] + o] = top[a] + o;
          if (grammar->elements[alts[a] + o].kind == Grammar::kEnd) break;
        }
    }
  }
  automaton_ = std::make_unique<GrammarAutomaton>(std::move(grammar));
  for (int b = 0; b < 256; ++b)
    if (TokenTrie::Plain(static_cast<uint8_t>(b))) plain_bytes_.push_back(static_cast<uint8_t>(b));
  state_ = automaton_->start();
  walk_states_.resize(static_cast<size_t>(vocab_->trie->max_depth()) + 1);
  if (!automaton_->status().ok()) status_ = automaton_->status();
}

bool TokenConstraint::complete() const {
  return !automaton_ || !active_ || (state_ >= 0 && automaton_->accepting(state_));
}

void TokenConstraint::Walk(int32_t state, std::vector<uint64_t>* mask) {
  mask->assign((static_cast<size_t>(vocab_->n_vocab) + 63) / 64, 0);
  uint64_t* bits = mask->data();
  const TokenTrie& trie = *vocab_->trie;
  const uint8_t* byte = trie.bytes();
  const uint8_t* depth = trie.depths();
  const int32_t* next = trie.next();
  const int32_t* token = trie.token();
  const uint8_t* plain_height = trie.plain_height();
  const int32_t* token_begin = trie.token_begin();
  const int32_t* subtree_tokens = trie.subtree_tokens();
  int32_t* st = walk_states_.data();
  GrammarAutomaton& a = *automaton_;
  const int32_t* trans = a.transitions();
  st[0] = state;
  const int32_t n = static_cast<int32_t>(trie.size());
  for (int32_t i = 0; i < n;) {
    const int32_t from = st[depth[i] - 1];
    if (plain_height[i] && PlainDepth(from) >= plain_height[i]) {
      // Every token below is plain text the state survives: all allowed.
      for (int32_t k = token_begin[i], e = token_begin[next[i]]; k < e; ++k)
        bits[subtree_tokens[k] >> 6] |= uint64_t{1} << (subtree_tokens[k] & 63);
      trans = a.transitions();  // PlainDepth may have stepped
      i = next[i];
      continue;
    }
    int32_t t = trans[static_cast<size_t>(from) * 256 + byte[i]];
    if (t == GrammarAutomaton::kUnknown) {
      t = a.Step(from, byte[i]);
      trans = a.transitions();  // the table may have grown
    }
    if (t < 0) {
      i = next[i];
      continue;
    }
    st[depth[i]] = t;
    if (const int32_t k = token[i]; k >= 0) bits[k >> 6] |= uint64_t{1} << (k & 63);
    ++i;
  }
  for (const auto& [node, id] : trie.duplicates()) {
    const int32_t k = token[node];
    if ((bits[k >> 6] >> (k & 63)) & 1) bits[id >> 6] |= uint64_t{1} << (id & 63);
  }
  for (int32_t id : specials_)
    if (a.Walk(state, vocab_->pieces[id]) >= 0) bits[id >> 6] |= uint64_t{1} << (id & 63);
  if (a.accepting(state))
    for (int32_t id : vocab_->eog) bits[id >> 6] |= uint64_t{1} << (id & 63);
  ++stats_.mask_walks;
}

int TokenConstraint::PlainDepth(int32_t state) {
  if (static_cast<size_t>(state) >= plain_depth_.size()) plain_depth_.resize(state + 1, -1);
  if (plain_depth_[state] >= 0) return plain_depth_[state];
  const int cap = vocab_->trie->max_depth();
  GrammarAutomaton& a = *automaton_;
  // Level by level, the states plain text of that length leads to; the first dead one ends it.
  level_.assign(1, state);
  int d = 0;
  while (d < cap) {
    next_level_.clear();
    for (int32_t s : level_)
      for (uint8_t b : plain_bytes_) {
        const int32_t t = a.Step(s, b);
        if (t < 0) return plain_depth_[state] = static_cast<int16_t>(d);
        next_level_.push_back(t);
      }
    std::sort(next_level_.begin(), next_level_.end());
    next_level_.erase(std::unique(next_level_.begin(), next_level_.end()), next_level_.end());
    ++d;
    if (next_level_ == level_) {
      d = cap;  // the same states again: alive at any length
      break;
    }
    if (next_level_.size() > 64) break;  // a wide grammar: keep the depth proven so far
    level_.swap(next_level_);
  }
  return plain_depth_[state] = static_cast<int16_t>(d);
}

int32_t TokenConstraint::MaskClass(int32_t state) {
  if (static_cast<size_t>(state) >= class_of_.size()) class_of_.resize(state + 1, -1);
  if (class_of_[state] >= 0) return class_of_[state];
  // The stacks with each element replaced by its class, as a sorted set.
  std::vector<std::string> stacks;
  for (int32_t leaf : automaton_->leaves(state)) {
    std::string s;
    for (int32_t n = leaf; n >= 0; n = automaton_->node(n).parent) {
      const uint32_t c = canon_[automaton_->node(n).pos];
      s.append(reinterpret_cast<const char*>(&c), sizeof c);
    }
    stacks.push_back(std::move(s));
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  std::string key(1, automaton_->accepting(state) ? 'a' : 'n');
  for (const std::string& s : stacks) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    key += s;
  }
  auto [it, fresh] = classes_.try_emplace(std::move(key), static_cast<int32_t>(classes_.size()));
  return class_of_[state] = it->second;
}

const std::vector<uint64_t>& TokenConstraint::Mask(int32_t state) {
  const int32_t cls = MaskClass(state);
  auto it = masks_.find(cls);
  if (it != masks_.end()) return it->second;
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  std::vector<uint64_t>& m = masks_[cls];
  Walk(state, &m);
  return m;
}

bool TokenConstraint::Allowed(int32_t token) {
  if (!automaton_ || !active_) return true;
  if (state_ < 0 || token < 0 || token >= vocab_->n_vocab) return false;
  return (Mask(state_)[token >> 6] >> (token & 63)) & 1;
}

void TokenConstraint::Apply(float* logits, int64_t n_vocab, const std::vector<int32_t>&) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [id, b] : bias_)
    if (id >= 0 && id < n_vocab) logits[id] += b;
  if (!automaton_ || !active_) return;
  constexpr float kNo = -std::numeric_limits<float>::infinity();
  if (state_ < 0 || !status_.ok()) {
    // Out of the grammar: only an end of generation, which the caller reports as a failure.
    for (int64_t i = 0; i < n_vocab; ++i) logits[i] = kNo;
    if (!vocab_->eog.empty()) logits[vocab_->eog[0]] = 0;
    return;
  }
  const std::vector<uint64_t>& m = Mask(state_);
  bool any = false;
  for (int64_t w = 0; w * 64 < n_vocab; ++w) {
    const uint64_t bits = w < static_cast<int64_t>(m.size()) ? m[w] : 0;
    const int64_t end = std::min<int64_t>(n_vocab, (w + 1) * 64);
    if (bits == ~uint64_t{0} && end == (w + 1) * 64) {
      any = true;
      continue;
    }
    for (int64_t i = w * 64; i < end; ++i)
      if (!((bits >> (i & 63)) & 1)) logits[i] = kNo;
      else any = true;
  }
  if (!any) {
    // A state with no token (a grammar needing bytes no token has): end, failed.
    if (status_.ok())
      status_ = InvalidArgument("grammar: no token of the vocabulary can continue the output");
    if (!vocab_->eog.empty()) logits[vocab_->eog[0]] = 0;
  }
  ++stats_.masks;
  stats_.mask_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void TokenConstraint::Accept(int32_t token) {
  if (!automaton_ || !status_.ok()) return;
  if (state_ < 0 || token < 0 || token >= vocab_->n_vocab) {
    status_ = Internal("grammar: token " + std::to_string(token) + " outside the vocabulary");
    state_ = GrammarAutomaton::kDead;
    return;
  }
  if (!active_) {
    // Free text until a trigger; then the grammar reads the output from the trigger on.
    const size_t from = before_.size();
    before_ += vocab_->pieces[token];
    size_t at = std::string::npos;
    for (const std::string& t : triggers_) {
      const size_t back = std::min(from, t.size() - 1);
      at = std::min(at, before_.find(t, from - back));
    }
    if (at == std::string::npos) return;
    active_ = true;
    state_ = automaton_->Walk(automaton_->start(), std::string_view(before_).substr(at));
    if (state_ < 0)
      status_ = automaton_->status().ok()
                    ? InvalidArgument("grammar: the text after '" + before_.substr(at) +
                                      "' does not continue the grammar")
                    : automaton_->status();
    before_.clear();
    return;
  }
  const int32_t next = automaton_->Walk(state_, vocab_->pieces[token]);
  if (next < 0) {
    status_ = automaton_->status().ok()
                  ? Internal("grammar: token " + std::to_string(token) +
                             " does not continue the grammar (a constrained-decoding bug)")
                  : automaton_->status();
  }
  state_ = next;
}

}  // namespace substrate::serve
