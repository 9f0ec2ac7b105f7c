// A vocabulary as a byte trie stored in preorder (flat arrays, no pointers), so that a token
// mask is one forward scan: each node's state comes from its parent's by one automaton step,
// and a dead node skips its whole subtree. Built once per model; immutable and shared.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace substrate::serve {

class TokenTrie {
 public:
  // Pieces longer than this are left out (no real vocabulary has them).
  static constexpr size_t kMaxPiece = 255;

  // pieces[i]: token i's bytes. Tokens with include[i] == 0 or empty pieces are left out.
  TokenTrie(const std::vector<std::string>& pieces, const std::vector<char>& include);

  // Node i (preorder): its byte, its depth (1 for a token's first byte), the first node after
  // its subtree, and the token ending there (-1: none). Separate arrays: a walk reads the first
  // two and the token of every node, `next` only where it skips.
  size_t size() const { return byte_.size(); }
  const uint8_t* bytes() const { return byte_.data(); }
  const uint8_t* depths() const { return depth_.data(); }
  const int32_t* next() const { return next_.data(); }
  const int32_t* token() const { return token_.data(); }
  // Tokens whose bytes equal another's (node, token): allowed exactly when that node's token is.
  const std::vector<std::pair<int32_t, int32_t>>& duplicates() const { return dups_; }

  // Text: characters a JSON string takes as they are — printable ASCII except '"' and '\\',
  // and every well-formed UTF-8 character from U+0080 up. The length in bytes of the text
  // character at s[0..n), or 0 when none starts there (a partial or ill-formed sequence too).
  static int TextChar(const unsigned char* s, size_t n);
  // text_height()[i] > 0: every token below node i (i included) continues from i with whole text
  // characters only (i starts a character), the longest of them by that many bytes; 0
  // otherwise. With subtree_tokens(), a state that survives any text that long allows the
  // whole subtree at once (TokenConstraint).
  const uint8_t* text_height() const { return text_height_.data(); }
  // The tokens of each subtree, contiguous: subtree i holds
  // subtree_tokens()[token_begin()[i] .. token_begin()[next()[i]]) (token_begin has size()+1).
  const int32_t* subtree_tokens() const { return preorder_tokens_.data(); }
  size_t n_preorder_tokens() const { return preorder_tokens_.size(); }
  const int32_t* token_begin() const { return token_begin_.data(); }
  int max_depth() const { return max_depth_; }

 private:
  std::vector<uint8_t> byte_, depth_;
  std::vector<int32_t> next_, token_;
  std::vector<std::pair<int32_t, int32_t>> dups_;
  std::vector<uint8_t> text_height_;
  std::vector<int32_t> preorder_tokens_, token_begin_;
  int max_depth_ = 0;
};

}  // namespace substrate::serve
