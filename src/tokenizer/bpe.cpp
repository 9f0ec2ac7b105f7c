// Byte-level BPE: a word's bytes start as one symbol each (the token of the byte's printable
// character); the adjacent pair with the lowest merge rank merges first, leftmost on ties, until no
// pair has a merge. Symbols carry token ids, so a merge is one hash lookup of two ints.
#include <algorithm>

#include "tokenizer/tokenizer_impl.h"

namespace substrate {

namespace {
bool IsPrintableByte(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}
}  // namespace

uint32_t ByteToCodepoint(uint8_t b) {
  if (IsPrintableByte(b)) return b;
  // Non-printable bytes take U+0100 + their index among the non-printable bytes.
  uint32_t n = 0;
  for (uint32_t x = 0; x < b; ++x)
    if (!IsPrintableByte(x)) ++n;
  return 256 + n;
}

int CodepointToByte(uint32_t cp) {
  if (cp < 256) return IsPrintableByte(cp) ? static_cast<int>(cp) : -1;
  uint32_t n = 0;
  for (uint32_t x = 0; x < 256; ++x) {
    if (IsPrintableByte(x)) continue;
    if (256 + n == cp) return static_cast<int>(x);
    ++n;
  }
  return -1;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void MergeTable::Reserve(size_t n) {
  size_t cap = 16;
  shift_ = 60;
  while (cap < 2 * n + 1) {
    cap <<= 1;
    --shift_;
  }
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
}

void MergeTable::Insert(TokenId l, TokenId r, BpeMerge m) {
  if (2 * (size_ + 1) > slots_.size()) {
    // Grow (Reserve normally prevents this): rehash everything into a table twice as large.
    std::vector<Slot> old = std::move(slots_);
    Reserve(old.size());
    for (const Slot& s : old) {
      if (s.key != kEmpty) Insert(static_cast<TokenId>(s.key >> 32), static_cast<TokenId>(s.key & 0xFFFFFFFFu), s.merge);
    }
  }
  const uint64_t key = Key(l, r);
  for (size_t i = Hash(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) return;
    if (s.key == kEmpty) {
      s.key = key;
      s.merge = m;
      ++size_;
      return;
    }
  }
}

namespace {

using Pair = EncodeScratch::Pair;
using Sym = EncodeScratch::Sym;

// Heap order: lowest rank (highest score) on top, then leftmost.
struct PairAfter {
  bool operator()(const Pair& a, const Pair& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

void PushPair(const Tokenizer::Impl& im, EncodeScratch& s, int32_t l, int32_t r) {
  if (l < 0 || r < 0) return;
  const Sym& a = s.syms[l];
  const Sym& b = s.syms[r];
  if (a.id < 0 || b.id < 0) return;
  const BpeMerge* m = im.FindMerge(a.id, b.id);
  if (!m) return;
  s.heap.push_back({-static_cast<float>(m->rank), l, r, a.id, b.id, m->result, 0});
  std::push_heap(s.heap.begin(), s.heap.end(), PairAfter());
}

// Most words are a few bytes: for them a flat scan for the best pair, with each adjacent pair's
// merge looked up once and kept, beats a heap (same result: lowest rank, leftmost on ties).
constexpr int kShortWord = 24;

void EncodeShortWord(const Tokenizer::Impl& im, std::string_view word, std::vector<TokenId>* out) {
  TokenId ids[kShortWord];
  const BpeMerge* pair[kShortWord] = {};  // pair[i]: merge of ids[i], ids[i + 1]
  int n = static_cast<int>(word.size());
  for (int i = 0; i < n; ++i) ids[i] = im.byte_token[static_cast<unsigned char>(word[i])];
  auto lookup = [&](int i) -> const BpeMerge* {
    return ids[i] < 0 || ids[i + 1] < 0 ? nullptr : im.FindMerge(ids[i], ids[i + 1]);
  };
  for (int i = 0; i + 1 < n; ++i) pair[i] = lookup(i);
  while (n > 1) {
    int best = -1;
    for (int i = 0; i + 1 < n; ++i) {
      if (pair[i] && (best < 0 || pair[i]->rank < pair[best]->rank)) best = i;
    }
    if (best < 0) break;
    ids[best] = pair[best]->result;
    for (int i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      pair[i] = pair[i + 1];
    }
    --n;
    if (best > 0) pair[best - 1] = lookup(best - 1);
    if (best + 1 < n) pair[best] = lookup(best);
  }
  for (int i = 0; i < n; ++i) {
    if (ids[i] >= 0) out->push_back(ids[i]);
  }
}

}  // namespace

void EncodeBpeWord(const Vocab& v, const Tokenizer::Impl& im, std::string_view word,
                   EncodeScratch& s, std::vector<TokenId>* out) {
  if (word.empty()) return;
  if (v.ignore_merges) {
    // llama3-style vocabularies take a word that is itself a token as is.
    s.text.clear();
    for (unsigned char c : word) s.text += im.byte_char[c];
    if (TokenId id = im.FindText(s.text); id != kNoToken) {
      out->push_back(id);
      return;
    }
  }
  if (word.size() == 1) {
    if (TokenId id = im.byte_token[static_cast<unsigned char>(word[0])]; id != kNoToken) out->push_back(id);
    return;
  }
  const int n = static_cast<int>(word.size());
  if (n <= kShortWord) {
    EncodeShortWord(im, word, out);
    return;
  }
  s.syms.resize(n);
  for (int i = 0; i < n; ++i) {
    s.syms[i] = {im.byte_token[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1,
                 static_cast<uint32_t>(i), 1};
  }
  s.heap.clear();
  for (int i = 0; i + 1 < n; ++i) PushPair(im, s, i, i + 1);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), PairAfter());
    const Pair p = s.heap.back();
    s.heap.pop_back();
    Sym& a = s.syms[p.left];
    Sym& b = s.syms[p.right];
    // Stale entries: either side merged away or grew since the pair was queued.
    if (a.len == 0 || b.len == 0 || a.next != p.right || a.id != p.lid || b.id != p.rid) continue;
    a.id = p.result;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) s.syms[b.next].prev = p.left;
    PushPair(im, s, a.prev, p.left);
    PushPair(im, s, p.left, a.next);
  }
  for (int i = 0; i >= 0; i = s.syms[i].next) {
    const Sym& sym = s.syms[i];
    if (sym.id >= 0) {
      out->push_back(sym.id);
      continue;
    }
    // A byte whose printable character is not in the vocabulary: nothing to emit (as llama.cpp).
  }
}

}  // namespace substrate
