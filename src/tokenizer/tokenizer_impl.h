// Private to src/tokenizer: the tables a Tokenizer builds from its Vocab, and the per-algorithm
// word encoders (bpe.cpp, spm.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace substrate {

// GPT-2's byte <-> printable character mapping: bytes that are printable Latin-1 map to themselves,
// the rest to U+0100.. in byte order, so every byte string is a printable string.
uint32_t ByteToCodepoint(uint8_t b);
// The byte a codepoint stands for, or -1 when it is not in the mapping.
int CodepointToByte(uint32_t cp);
void AppendUtf8(uint32_t cp, std::string* out);

struct BpeMerge {
  int32_t rank;
  TokenId result;  // id of left+right (always a token: merges whose result is not are dropped)
};

// (left id, right id) -> merge, open addressing with linear probing: the merge lookup is the
// inner loop of BPE, and this is ~3x faster than std::unordered_map for it.
class MergeTable {
 public:
  void Reserve(size_t n);
  // Keeps the first (lowest-rank) merge of a pair.
  void Insert(TokenId l, TokenId r, BpeMerge m);
  const BpeMerge* Find(TokenId l, TokenId r) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = Key(l, r);
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    BpeMerge merge{};
  };
  static uint64_t Key(TokenId l, TokenId r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  size_t Hash(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

// Reusable buffers for one Encode call (one thread).
struct EncodeScratch {
  struct Sym {
    TokenId id;
    int32_t prev, next;
    uint32_t start, len;  // bytes of the word (BPE) or of the escaped text (SPM)
  };
  struct Pair {
    float score;  // SPM: piece score (higher first); BPE: -rank
    int32_t left, right;
    TokenId lid, rid, result;
    uint32_t size;
  };
  std::vector<Sym> syms;
  std::vector<Pair> heap;
  std::vector<std::string_view> words;
  std::string text;
  // Word -> [begin, end) in `cache_ids`: code repeats its words, so most are merged only once.
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
  std::vector<TokenId> cache_ids;
};

struct Tokenizer::Impl {
  std::unordered_map<std::string_view, TokenId> by_text;  // views into vocab_.tokens
  std::array<TokenId, 256> byte_token{};  // token of one byte (byte-level char, or <0xXX>)
  std::array<std::string, 256> byte_char;  // BPE: UTF-8 of the printable char of each byte
  MergeTable merges;
  std::unique_ptr<PreTokenizer> pre;
  std::vector<std::string> pieces;  // bytes each token decodes to
  // Tokens matched in raw text before pre-tokenization, by first byte, longest first.
  std::array<std::vector<TokenId>, 256> special_by_byte;

  const BpeMerge* FindMerge(TokenId l, TokenId r) const { return merges.Find(l, r); }
  TokenId FindText(std::string_view s) const {
    auto it = by_text.find(s);
    return it == by_text.end() ? kNoToken : it->second;
  }
};

// Byte-level BPE of one pre-tokenized word (raw bytes), appended to `out`.
void EncodeBpeWord(const Vocab& v, const Tokenizer::Impl& im, std::string_view word,
                   EncodeScratch& s, std::vector<TokenId>* out);
// SentencePiece BPE of one text fragment (already ' '-escaped to U+2581), appended to `out`.
void EncodeSpmText(const Vocab& v, const Tokenizer::Impl& im, std::string_view text,
                   EncodeScratch& s, std::vector<TokenId>* out);

}  // namespace substrate
