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
  std::unordered_map<uint64_t, BpeMerge> merges;  // key: left id << 32 | right id
  std::unique_ptr<PreTokenizer> pre;
  std::vector<std::string> pieces;  // bytes each token decodes to
  // Tokens matched in raw text before pre-tokenization, by first byte, longest first.
  std::array<std::vector<TokenId>, 256> special_by_byte;

  const BpeMerge* FindMerge(TokenId l, TokenId r) const {
    auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) |
                          static_cast<uint32_t>(r));
    return it == merges.end() ? nullptr : &it->second;
  }
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
