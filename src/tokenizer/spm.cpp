// SentencePiece BPE (llama-style vocabularies): the text starts as one symbol per UTF-8 character;
// the adjacent pair whose concatenation is a piece with the highest score merges first (leftmost on
// ties). Symbols that are not pieces at the end fall back to <0xXX> byte tokens.
#include <algorithm>

#include "tokenizer/tokenizer_impl.h"

namespace substrate {
namespace {

using Pair = EncodeScratch::Pair;
using Sym = EncodeScratch::Sym;

struct PairAfter {
  bool operator()(const Pair& a, const Pair& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

void PushPair(const Vocab& v, const Tokenizer::Impl& im, std::string_view text, EncodeScratch& s,
              int32_t l, int32_t r) {
  if (l < 0 || r < 0) return;
  const Sym& a = s.syms[l];
  const Sym& b = s.syms[r];
  const uint32_t size = a.len + b.len;
  TokenId id = im.FindText(text.substr(a.start, size));
  if (id == kNoToken) return;
  s.heap.push_back({v.scores[id], l, r, kNoToken, kNoToken, id, size});
  std::push_heap(s.heap.begin(), s.heap.end(), PairAfter());
}

}  // namespace

void EncodeSpmText(const Vocab& v, const Tokenizer::Impl& im, std::string_view text,
                   EncodeScratch& s, std::vector<TokenId>* out) {
  if (text.empty()) return;
  s.syms.clear();
  for (size_t i = 0; i < text.size();) {
    int len = Utf8SequenceLength(text, i);
    if (len <= 0) len = 1;  // an invalid byte is a symbol of its own (it will become <0xXX>)
    const int32_t idx = static_cast<int32_t>(s.syms.size());
    s.syms.push_back({kNoToken, idx - 1, -1, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
    if (idx > 0) s.syms[idx - 1].next = idx;
    i += len;
  }
  s.heap.clear();
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(s.syms.size()); ++i) PushPair(v, im, text, s, i, i + 1);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), PairAfter());
    const Pair p = s.heap.back();
    s.heap.pop_back();
    Sym& a = s.syms[p.left];
    Sym& b = s.syms[p.right];
    if (a.len == 0 || b.len == 0 || a.next != p.right || a.len + b.len != p.size) continue;
    a.len += b.len;
    a.id = p.result;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) s.syms[b.next].prev = p.left;
    PushPair(v, im, text, s, a.prev, p.left);
    PushPair(v, im, text, s, p.left, a.next);
  }
  for (int32_t i = 0; i >= 0; i = s.syms[i].next) {
    const Sym& sym = s.syms[i];
    TokenId id = sym.id != kNoToken ? sym.id : im.FindText(text.substr(sym.start, sym.len));
    if (id != kNoToken) {
      out->push_back(id);
      continue;
    }
    for (uint32_t k = 0; k < sym.len; ++k) {
      TokenId b = im.byte_token[static_cast<unsigned char>(text[sym.start + k])];
      if (b == kNoToken) b = v.unk;
      if (b != kNoToken) out->push_back(b);
    }
  }
}

}  // namespace substrate
