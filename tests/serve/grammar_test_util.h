// Test helpers for grammars: whether a text is a sentence of a grammar, and random sentences
// drawn token by token through a TokenConstraint over a small vocabulary (the way a model
// decodes under the mask).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "serve/grammar.h"
#include "serve/grammar_automaton.h"
#include "serve/token_constraint.h"

namespace substrate::serve::testing {

inline std::shared_ptr<const Grammar> MustParse(const std::string& text) {
  auto g = ParseGrammar(text);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << text;
  if (!g.ok()) return nullptr;
  return std::make_shared<const Grammar>(std::move(*g));
}

// True when `text` is a complete sentence of `g`.
inline bool Accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarAutomaton a(g);
  const int32_t s = a.Walk(a.start(), text);
  return s >= 0 && a.accepting(s);
}

// True when `text` can be continued into a sentence (a prefix of one).
inline bool Continues(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarAutomaton a(g);
  return a.Walk(a.start(), text) >= 0;
}

// Every byte as a token, a few multi-byte tokens (so masks cut across token boundaries), and
// an end-of-generation token (the last id).
inline std::vector<std::string> TestVocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t :
       {"\"",   "\": ",     "{\"",     "\"}",       "true",        "false",       "null",
        "  ",   "\n  ",     "\", \"",  "name",      "arguments",   "<tool_call>", "</tool_call>",
        "12",   "-0.5",     "e+3",     "Paris",     "caf\xC3\xA9", "\xC3",        "\xA9",
        "\\n",  "\\u00e9",  "]",       "[",         ", ",          "2024-05-0",   "T12:00",
        ":00Z", "</think>", "<think>", "functools["})
    v.push_back(t);
  v.push_back("");  // the end-of-generation token
  return v;
}

// A random sentence of `g`: tokens drawn uniformly among those the mask allows, except that
// closing characters are favoured so that generation ends. Empty on failure (reported).
inline std::string RandomSentence(const std::shared_ptr<const Grammar>& g, uint64_t seed,
                                  int max_tokens = 4000) {
  static const auto vocab_pieces = TestVocab();
  const int32_t eog = static_cast<int32_t>(vocab_pieces.size() - 1);
  static const auto vocab = ConstraintVocab::FromPieces(vocab_pieces, {eog});
  TokenConstraint c(vocab, g);
  std::mt19937_64 rng(seed);
  std::vector<float> logits(vocab_pieces.size());
  std::string out;
  for (int step = 0; step < max_tokens; ++step) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    c.Apply(logits.data(), static_cast<int64_t>(logits.size()), {});
    std::vector<int32_t> allowed;
    std::vector<double> weight;
    for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
      if (std::isinf(logits[i])) continue;
      allowed.push_back(i);
      const std::string& p = vocab_pieces[i];
      double w = 1;
      if (i == eog)
        w = 1e6;  // end as soon as the sentence may end
      else if (p.find_first_of("\"]}") != std::string::npos || p == "</think>")
        w = 40;
      weight.push_back(w);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "no token allowed after: " << out;
      return "";
    }
    std::discrete_distribution<size_t> pick(weight.begin(), weight.end());
    const int32_t t = allowed[pick(rng)];
    if (t == eog) return out;
    c.Accept(t);
    if (!c.status().ok()) {
      ADD_FAILURE() << c.status().ToString() << " after: " << out;
      return "";
    }
    out += vocab_pieces[t];
  }
  ADD_FAILURE() << "no end after " << max_tokens << " tokens: " << out.substr(0, 400);
  return "";
}

}  // namespace substrate::serve::testing
