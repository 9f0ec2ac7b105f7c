// A vocabulary as a byte trie stored in preorder (flat arrays, no pointers), so that a token
// mask is one forward scan: each node's state comes from its parent's by one automaton step,
// and a dead node skips its whole subtree. Built once per model; immutable and shared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace substrate::serve {

class TokenTrie {
 public:
  struct Node {
    int32_t next;       // index of the first node after this node's subtree
    int32_t tok_begin;  // tokens ending here: tokens_[tok_begin, nodes_[i + 1].tok_begin)
    uint16_t depth;     // 1 for a token's first byte
    uint8_t byte;
  };

  // pieces[i]: token i's bytes. Tokens with include[i] == 0 or empty pieces are left out.
  TokenTrie(const std::vector<std::string>& pieces, const std::vector<char>& include);

  // Nodes in preorder, followed by one sentinel (tok_begin = number of tokens).
  const std::vector<Node>& nodes() const { return nodes_; }
  size_t size() const { return nodes_.size() - 1; }
  const int32_t* tokens() const { return tokens_.data(); }
  size_t n_tokens() const { return tokens_.size(); }
  int max_depth() const { return max_depth_; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  int max_depth_ = 0;
};

}  // namespace substrate::serve
