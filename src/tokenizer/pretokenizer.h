// PreTokenizer: splits text into the words that BPE merges within, by the regexes of a named
// pre-tokenizer (`tokenizer.ggml.pre`: "gpt-2", "llama-bpe", "qwen2", "deepseek-coder", ...).
//
// A pre-tokenizer is a list of regexes applied in turn: each one splits every current fragment
// into its matches and the gaps between them (both kept, in order), like a sequence of HF
// `Split(behavior=Isolated)` steps. A regex only sees its fragment (so lookaheads stop at its end).
// Regexes run under PCRE2 (UTF-8, Unicode properties, JIT). Bytes that are not valid UTF-8 are
// never handed to PCRE2: each becomes a word of its own.
//
// Thread-safety: Split is const and may run on many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace substrate {

class PreTokenizer {
 public:
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // The regexes of a known pre-tokenizer name; Unimplemented for names we do not know.
  static Expected<std::vector<std::string>> RegexesFor(const std::string& name);
  // Every name RegexesFor knows.
  static std::vector<std::string> KnownNames();
  static Expected<std::unique_ptr<PreTokenizer>> ForName(const std::string& name);
  // Compiles a custom list (tests, or a tokenizer.json regex). InvalidArgument names a bad regex.
  static Expected<std::unique_ptr<PreTokenizer>> FromRegexes(const std::vector<std::string>& regexes);

  // Appends the words of `text` (views into it, in order, covering it exactly) to `words`.
  Status Split(std::string_view text, std::vector<std::string_view>* words) const;

 private:
  struct Regex;
  PreTokenizer() = default;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 if the bytes there are not one.
int Utf8SequenceLength(std::string_view s, size_t i);

}  // namespace substrate
