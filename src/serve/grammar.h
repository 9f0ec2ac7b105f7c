// Grammars for constrained decoding: a GBNF-like notation (docs/serve-agents.md) parsed
// into a context-free grammar over bytes. Characters are Unicode code points, matched as their
// UTF-8 bytes, so a grammar can be checked one byte at a time against token pieces.
//
//   root   ::= "{" ws pair ("," ws pair)* ws "}"     # rules: name ::= alternatives
//   pair   ::= str ws ":" ws [0-9]+                  # "literal", [class], [^negated], .
//   str    ::= "\"" [^"\\]{1,20} "\""                # * + ? {m} {m,} {m,n}, ( groups ), |
//   ws     ::= [ \t\n]?
//
// A parsed Grammar is immutable and shared by the requests that use it.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace substrate::serve {

struct Grammar {
  enum Kind : uint8_t {
    kBytes,  // one byte from byte_sets[arg]
    kRef,    // the rule `arg`
    kEnd,    // the end of an alternative
  };
  struct Element {
    Kind kind;
    uint32_t arg;
  };
  // Every alternative of every rule, each a run of elements closed by kEnd.
  std::vector<Element> elements;
  std::vector<std::bitset<256>> byte_sets;
  // Per rule: the element index where each of its alternatives starts.
  std::vector<std::vector<uint32_t>> rule_alts;
  std::vector<std::string> rule_names;
  uint32_t root = 0;
  // Every quoted literal of the source, as bytes (control tokens whose text appears in one may
  // be generated; see TokenConstraint).
  std::vector<std::string> literals;
  // Bounded repetitions x{m,n}: the rules opt_1..opt_(n-m) (opt_k ::= x opt_(k-1) | ()), by k.
  // Text of at most L bytes cannot tell opt_k from opt_L when k >= L, which lets token masks
  // be shared between such states (TokenConstraint).
  std::vector<std::vector<uint32_t>> chains;
};

// Parses `text`; errors name the line and what is wrong (an undefined rule, left recursion, a
// malformed class). `root` names the start rule.
Expected<Grammar> ParseGrammar(std::string_view text, std::string_view root = "root");

// Appends the UTF-8 encoding of code point `cp` to *out.
void AppendUtf8(uint32_t cp, std::string* out);

// A string as a grammar literal ("..." with escapes), e.g. for grammars built in code.
std::string GrammarLiteral(std::string_view bytes);

// A grammar expression matching any text that does not contain `tag` (for reasoning before a
// closing tag). `tag`'s first character must not occur again in it ("</think>" qualifies);
// otherwise the expression excludes that first character altogether.
std::string GrammarTextWithout(std::string_view tag);

}  // namespace substrate::serve
