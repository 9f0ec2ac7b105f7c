#include "serve/token_trie.h"

#include <algorithm>

namespace substrate::serve {

TokenTrie::TokenTrie(const std::vector<std::string>& pieces, const std::vector<char>& include) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < pieces.size(); ++i)
    if ((i >= include.size() || include[i]) && !pieces[i].empty() && pieces[i].size() <= kMaxPiece)
      order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces[a] != pieces[b] ? pieces[a] < pieces[b] : a < b;
  });
  // In sorted order, each piece adds nodes for its bytes past the common prefix with the
  // previous piece: that is the trie's preorder.
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = pieces[id];
    size_t common = 0;
    if (prev) {
      const size_t n = std::min(prev->size(), s.size());
      while (common < n && (*prev)[common] == s[common]) ++common;
    }
    if (prev && common == s.size() && common == prev->size()) {
      dups_.push_back({static_cast<int32_t>(byte_.size() - 1), id});  // same bytes, same node
      continue;
    }
    for (size_t k = common; k < s.size(); ++k) {
      byte_.push_back(static_cast<uint8_t>(s[k]));
      depth_.push_back(static_cast<uint8_t>(k + 1));
      token_.push_back(-1);
    }
    token_.back() = id;
    max_depth_ = std::max(max_depth_, static_cast<int>(s.size()));
    prev = &s;
  }
  // next: the first later node at a depth <= this one's.
  const int32_t n = static_cast<int32_t>(byte_.size());
  next_.assign(byte_.size(), n);
  std::vector<int32_t> open;  // nodes whose subtree has not ended, by depth
  for (int32_t i = 0; i < n; ++i) {
    while (!open.empty() && depth_[open.back()] >= depth_[i]) {
      next_[open.back()] = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  // Tokens in preorder (duplicates beside their node), and each node's first one.
  token_begin_.assign(byte_.size() + 1, 0);
  size_t d = 0;
  for (int32_t i = 0; i < n; ++i) {
    token_begin_[i] = static_cast<int32_t>(preorder_tokens_.size());
    if (token_[i] >= 0) preorder_tokens_.push_back(token_[i]);
    while (d < dups_.size() && dups_[d].first == i) preorder_tokens_.push_back(dups_[d++].second);
  }
  token_begin_[n] = static_cast<int32_t>(preorder_tokens_.size());
  // Plain heights, children before parents (reverse preorder).
  plain_height_.assign(byte_.size(), 0);
  std::vector<int> height(byte_.size(), 1);
  std::vector<char> plain(byte_.size(), 0);
  for (int32_t i = n - 1; i >= 0; --i) {
    bool all = Plain(byte_[i]);
    int h = 1;
    for (int32_t c = i + 1; c < next_[i]; c = next_[c]) {  // the children
      all = all && plain[c];
      h = std::max(h, 1 + height[c]);
    }
    plain[i] = all;
    height[i] = h;
    if (all) plain_height_[i] = static_cast<uint8_t>(std::min(h, 255));
  }
}

}  // namespace substrate::serve
