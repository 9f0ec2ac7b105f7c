#include "serve/token_trie.h"

#include <algorithm>
#include <numeric>

namespace substrate::serve {

namespace {
// Token bytes beyond this are not in any real vocabulary; longer pieces are left out.
constexpr size_t kMaxPiece = 1024;
}  // namespace

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
      tokens_.push_back(id);  // same bytes as the previous token: same node
      continue;
    }
    for (size_t k = common; k < s.size(); ++k) {
      Node n{};
      n.byte = static_cast<uint8_t>(s[k]);
      n.depth = static_cast<uint16_t>(k + 1);
      n.tok_begin = static_cast<int32_t>(tokens_.size());
      nodes_.push_back(n);
    }
    tokens_.push_back(id);
    max_depth_ = std::max(max_depth_, static_cast<int>(s.size()));
    prev = &s;
  }
  // next: the first later node at a depth <= this one's.
  const int32_t n = static_cast<int32_t>(nodes_.size());
  std::vector<int32_t> open;  // nodes whose subtree has not ended, by depth
  for (int32_t i = 0; i < n; ++i) {
    while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
      nodes_[open.back()].next = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  for (int32_t i : open) nodes_[i].next = n;
  nodes_.push_back({n, static_cast<int32_t>(tokens_.size()), 0, 0});
}

}  // namespace substrate::serve
