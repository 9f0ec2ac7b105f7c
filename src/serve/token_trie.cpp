#include "serve/token_trie.h"

#include <algorithm>

namespace substrate::serve {

int TokenTrie::TextChar(const unsigned char* s, size_t n) {
  if (n == 0) return 0;
  const unsigned char c = s[0];
  if (c < 0x80) return c >= 0x20 && c < 0x7F && c != '"' && c != '\\' ? 1 : 0;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (no overlongs, no surrogates)
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 0;
  if (n < static_cast<size_t>(len) || s[1] < lo || s[1] > hi) return 0;
  for (int k = 2; k < len; ++k)
    if (s[k] < 0x80 || s[k] > 0xBF) return 0;
  return len;
}

TokenTrie::TokenTrie(const std::vector<std::string>& pieces, const std::vector<char>& include) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < pieces.size(); ++i)
    if ((i >= include.size() || include[i]) && !pieces[i].empty() && pieces[i].size() <= kMaxPiece)
      order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces[a] != pieces[b] ? pieces[a] < pieces[b] : a < b;
  });
  // In sorted order, each piece adds nodes for its bytes past the common prefix with the
  // previous piece: that is the trie's preorder. `path` holds the current piece's nodes.
  std::vector<int32_t> path;
  std::vector<char> text_ok;
  std::vector<char> starts, rest_text;
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = pieces[id];
    const size_t len = s.size();
    size_t common = 0;
    if (prev) {
      const size_t n = std::min(prev->size(), len);
      while (common < n && (*prev)[common] == s[common]) ++common;
    }
    if (prev && common == len && common == prev->size()) {
      dups_.push_back({path.back(), id});  // same bytes as the previous token: same node
      continue;
    }
    path.resize(common);
    for (size_t k = common; k < len; ++k) {
      path.push_back(static_cast<int32_t>(byte_.size()));
      byte_.push_back(static_cast<uint8_t>(s[k]));
      depth_.push_back(static_cast<uint8_t>(k + 1));
      token_.push_back(-1);
      text_height_.push_back(0);
      text_ok.push_back(1);
    }
    token_.back() = id;
    max_depth_ = std::max(max_depth_, static_cast<int>(len));
    prev = &s;
    // starts[p]: the bytes before p are whole characters; rest_text[p]: from p on, whole text
    // characters only. A node is text for this piece when both hold at its byte.
    const auto* u = reinterpret_cast<const unsigned char*>(s.data());
    starts.assign(len + 1, 0);
    rest_text.assign(len + 1, 0);
    starts[0] = 1;
    for (size_t p = 0; p < len;) {
      int c = u[p] < 0x80 ? 1 : TextChar(u + p, len - p);
      if (c == 0) break;
      starts[p + c] = 1;
      p += c;
    }
    rest_text[len] = 1;
    for (size_t p = len; p-- > 0;) {
      const int c = TextChar(u + p, len - p);
      rest_text[p] = c > 0 && rest_text[p + c];
    }
    for (size_t p = 0; p < len; ++p) {
      const int32_t node = path[p];
      if (!(starts[p] && rest_text[p])) text_ok[node] = 0;
      const int h = static_cast<int>(std::min<size_t>(len - p, 255));
      if (h > text_height_[node]) text_height_[node] = static_cast<uint8_t>(h);
    }
  }
  for (size_t i = 0; i < text_ok.size(); ++i)
    if (!text_ok[i]) text_height_[i] = 0;
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
}

}  // namespace substrate::serve
