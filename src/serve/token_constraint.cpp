#include "serve/token_constraint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>

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
  std::vector<char> in_trie(static_cast<size_t>(n_vocab), 0);
  for (size_t k = 0; k < v->trie->n_preorder_tokens(); ++k)
    in_trie[v->trie->subtree_tokens()[k]] = 1;
  for (int32_t id = 0; id < n_vocab; ++id)
    if (!in_trie[id]) v->outside.push_back(id);
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

uint64_t ConstraintVocab::bytes() const {
  uint64_t b = pieces.capacity() * sizeof(std::string) + outside.capacity() * 4;
  for (const std::string& p : pieces) b += p.capacity() > 15 ? p.capacity() : 0;
  const uint64_t n = trie->size();
  return b + n * (1 + 1 + 4 + 4 + 1 + 4) + trie->n_preorder_tokens() * 4;
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
  // Text characters by their bytes' classes: one representative per combination.
  {
    std::set<std::string> seen;  // the class of each byte, as a key
    auto add = [&](const unsigned char* s, int n) {
      std::string key;
      for (int k = 0; k < n; ++k) key.push_back(static_cast<char>(automaton_->byte_class(s[k])));
      if (seen.insert(key).second) text_chars_.emplace_back(reinterpret_cast<const char*>(s), n);
    };
    unsigned char c[4];
    for (int b = 0x20; b < 0x7F; ++b) {
      c[0] = static_cast<unsigned char>(b);
      if (TokenTrie::TextChar(c, 1)) add(c, 1);
    }
    // Multi-byte characters: every lead, every second byte, and the continuation classes after.
    std::vector<uint8_t> cont_reps;  // one continuation byte per class
    {
      std::set<uint8_t> classes;
      for (int b = 0x80; b <= 0xBF; ++b)
        if (classes.insert(automaton_->byte_class(static_cast<uint8_t>(b))).second)
          cont_reps.push_back(static_cast<uint8_t>(b));
    }
    for (int lead = 0xC2; lead <= 0xF4; ++lead)
      for (int second = 0x80; second <= 0xBF; ++second) {
        c[0] = static_cast<unsigned char>(lead);
        c[1] = static_cast<unsigned char>(second);
        c[2] = c[3] = 0x80;
        const int n = TokenTrie::TextChar(c, 4);
        if (n == 0) continue;
        if (n == 2) {
          add(c, 2);
        } else {
          for (uint8_t third : cont_reps) {
            c[2] = third;
            if (n == 3) {
              add(c, 3);
            } else {
              for (uint8_t fourth : cont_reps) {
                c[3] = fourth;
                add(c, 4);
              }
            }
          }
        }
      }
  }
  state_ = automaton_->start();
  walk_states_.resize(static_cast<size_t>(vocab_->trie->max_depth()) + 1);
  if (!automaton_->status().ok()) status_ = automaton_->status();
}

bool TokenConstraint::complete() const {
  return !automaton_ || !active_ || (state_ >= 0 && automaton_->accepting(state_));
}

namespace {

// Sets bits [lo, hi) of a bit vector.
void SetRange(uint64_t* bits, int64_t lo, int64_t hi) {
  if (lo >= hi) return;
  const int64_t wl = lo >> 6, wh = (hi - 1) >> 6;
  const uint64_t first = ~uint64_t{0} << (lo & 63);
  const uint64_t last = ~uint64_t{0} >> (63 - ((hi - 1) & 63));
  if (wl == wh) {
    bits[wl] |= first & last;
    return;
  }
  bits[wl] |= first;
  for (int64_t w = wl + 1; w < wh; ++w) bits[w] = ~uint64_t{0};
  bits[wh] |= last;
}

}  // namespace

// The walk marks allowed tokens in the trie's preorder (a subtree is a range, set word by word),
// then the mask by token id is built from whichever is fewer, the allowed or the forbidden.
void TokenConstraint::Walk(int32_t state, std::vector<uint64_t>* mask) {
  const TokenTrie& trie = *vocab_->trie;
  const int64_t n_pre = static_cast<int64_t>(trie.n_preorder_tokens());
  pre_.assign(static_cast<size_t>((n_pre + 63) / 64), 0);
  uint64_t* pre = pre_.data();
  const uint8_t* byte = trie.bytes();
  const uint8_t* depth = trie.depths();
  const int32_t* next = trie.next();
  const uint8_t* text_height = trie.text_height();
  const int32_t* token_begin = trie.token_begin();
  int32_t* st = walk_states_.data();
  GrammarAutomaton& a = *automaton_;
  const int32_t* trans = a.transitions();
  st[0] = state;
  const int32_t n = static_cast<int32_t>(trie.size());
  for (int32_t i = 0; i < n;) {
    const int32_t from = st[depth[i] - 1];
    if (text_height[i]) {
      const int depth_alive = TextDepth(from);
      trans = a.transitions();  // TextDepth may have stepped (and grown the table)
      if (depth_alive >= text_height[i]) {
        // Every token below is text the state survives: all allowed.
        SetRange(pre, token_begin[i], token_begin[next[i]]);
        ++stats_.subtrees_taken;
        i = next[i];
        continue;
      }
    }
    ++stats_.nodes_stepped;
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
    SetRange(pre, token_begin[i], token_begin[i + 1]);  // this node's token (and duplicates)
    ++i;
  }
  // By token id.
  const int32_t* ptok = trie.subtree_tokens();
  const size_t words = (static_cast<size_t>(vocab_->n_vocab) + 63) / 64;
  int64_t allowed = 0;
  for (int64_t w = 0; w < static_cast<int64_t>(pre_.size()); ++w)
    allowed += __builtin_popcountll(pre[w]);
  uint64_t* bits;
  if (allowed * 2 <= n_pre) {
    mask->assign(words, 0);
    bits = mask->data();
    for (int64_t w = 0; w < static_cast<int64_t>(pre_.size()); ++w)
      for (uint64_t b = pre[w]; b; b &= b - 1) {
        const int32_t id = ptok[w * 64 + __builtin_ctzll(b)];
        bits[id >> 6] |= uint64_t{1} << (id & 63);
      }
  } else {
    mask->assign(words, ~uint64_t{0});
    bits = mask->data();
    for (int64_t w = 0; w < static_cast<int64_t>(pre_.size()); ++w) {
      uint64_t no = ~pre[w];
      if (w == static_cast<int64_t>(pre_.size()) - 1 && (n_pre & 63))
        no &= (uint64_t{1} << (n_pre & 63)) - 1;
      for (; no; no &= no - 1) {
        const int32_t id = ptok[w * 64 + __builtin_ctzll(no)];
        bits[id >> 6] &= ~(uint64_t{1} << (id & 63));
      }
    }
    for (int32_t id : vocab_->outside) bits[id >> 6] &= ~(uint64_t{1} << (id & 63));
    if (vocab_->n_vocab & 63) bits[words - 1] &= (uint64_t{1} << (vocab_->n_vocab & 63)) - 1;
  }
  for (int32_t id : specials_)
    if (a.Walk(state, vocab_->pieces[id]) >= 0) bits[id >> 6] |= uint64_t{1} << (id & 63);
  if (a.accepting(state))
    for (int32_t id : vocab_->eog) bits[id >> 6] |= uint64_t{1} << (id & 63);
  ++stats_.mask_walks;
}

// The shortest dying text is a shortest path (edges: text characters, weighted by their bytes)
// to a dead state. Depth-first with memos: an edge back to a state still being explored is
// skipped, which is exact for the state where the search started (a path through a cycle is
// never the shortest) but may not be for those in between, so only their untainted results
// are kept.
int TokenConstraint::TextDeath(int32_t state, int* explored, bool* tainted) {
  const int cap = vocab_->trie->max_depth();
  if (static_cast<size_t>(state) >= text_death_.size()) {
    text_death_.resize(state + 1, -1);
    on_path_.resize(state + 1, 0);
  }
  if (text_death_[state] >= 0) return text_death_[state];
  if (on_path_[state]) {
    *tainted = true;
    return cap + 1;
  }
  if (++*explored > 512) {  // a wide grammar: claim the worst (no subtree will be skipped)
    *tainted = true;
    return 1;
  }
  on_path_[state] = 1;
  GrammarAutomaton& a = *automaton_;
  int best = cap + 1;
  bool taint = false;
  for (const std::string& ch : text_chars_) {
    const int n = static_cast<int>(ch.size());
    if (n >= best) continue;
    const int32_t t = a.Walk(state, ch);
    if (t < 0) {
      best = n;
    } else if (t != state) {
      best = std::min(best, n + TextDeath(t, explored, &taint));
    }
    if (best <= 1) break;
  }
  on_path_[state] = 0;
  if (!taint) text_death_[state] = static_cast<int16_t>(best);
  *tainted |= taint;
  return best;
}

int TokenConstraint::TextDepth(int32_t state) {
  int explored = 0;
  bool tainted = false;
  const int death = TextDeath(state, &explored, &tainted);
  // The starting state's answer is exact even when tainted (see TextDeath).
  if (static_cast<size_t>(state) < text_death_.size())
    text_death_[state] = static_cast<int16_t>(death);
  return std::min(vocab_->trie->max_depth(), death - 1);
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

void TokenConstraint::ChargeMemory() {
  if (!ledger_ || !automaton_ || !status_.ok()) return;
  const uint64_t mask_bytes = (static_cast<uint64_t>(vocab_->n_vocab) + 63) / 64 * 8;
  const uint64_t need = automaton_->bytes() + masks_.size() * mask_bytes +
                        pre_.capacity() * 8 + text_death_.capacity() * 3 + class_of_.capacity() * 4;
  if (need <= charged_) return;
  // In steps of 1 MiB, so that the ledger is not touched on every new state.
  const uint64_t step = std::max<uint64_t>(1 << 20, (need - charged_ + (1 << 20) - 1) & ~uint64_t{(1 << 20) - 1});
  auto c = ledger_->Charge("grammar", step);
  if (!c.ok()) {
    status_ = c.status().WithContext("constrained decoding (the grammar's matcher and masks)");
    return;
  }
  charged_ += step;
  charges_.push_back(std::move(*c));
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
  ChargeMemory();
  bool any = false;
  for (int64_t w = 0; w * 64 < n_vocab; ++w) {
    const int64_t base = w * 64, n = std::min<int64_t>(64, n_vocab - base);
    uint64_t bits = w < static_cast<int64_t>(m.size()) ? m[w] : 0;
    if (n < 64) bits &= (uint64_t{1} << n) - 1;
    any |= bits != 0;
    if (bits == 0) {
      std::fill(logits + base, logits + base + n, kNo);
      continue;
    }
    // The forbidden tokens of this word, one by one.
    for (uint64_t no = ~bits & (n < 64 ? (uint64_t{1} << n) - 1 : ~uint64_t{0}); no; no &= no - 1)
      logits[base + __builtin_ctzll(no)] = kNo;
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
  ChargeMemory();
  if (next < 0) {
    status_ = automaton_->status().ok()
                  ? Internal("grammar: token " + std::to_string(token) +
                             " does not continue the grammar (a constrained-decoding bug)")
                  : automaton_->status();
  }
  state_ = next;
}

}  // namespace substrate::serve
