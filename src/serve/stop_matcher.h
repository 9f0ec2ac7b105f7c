// Stop strings over streamed text: the text that may be the start of a stop string is held
// back until it is known not to be one, so a client never sees a stop string (or a piece of
// one) that the non-streaming answer would not contain.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace substrate::serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds generated text; returns the text that is now safe to emit. After a stop string is
  // found, stopped() is true, matched() names it, and later calls return nothing.
  std::string Push(std::string_view text);
  // The text still held back (at the end of generation it is emitted).
  std::string Flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

// Emits only complete UTF-8 sequences: a byte-level tokenizer's token may end inside a
// multi-byte character, and JSON strings must be valid UTF-8.
class Utf8Assembler {
 public:
  std::string Push(std::string_view bytes);
  // What is left at the end (an incomplete sequence becomes U+FFFD).
  std::string Flush();

 private:
  std::string pending_;
};

// Replaces invalid UTF-8 with U+FFFD, so that nlohmann::json::dump never throws on model text.
std::string SanitizeUtf8(std::string_view s);

}  // namespace substrate::serve
