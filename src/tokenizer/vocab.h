// Vocab: everything a tokenizer needs to know about a model's vocabulary, read from GGUF-style
// metadata (`tokenizer.ggml.*`). A HF folder reaches us through the same keys, synthesized by the
// format layer, so this is the only loader.
//
// The defaults (which pre-tokenizer adds a BOS, which one cleans spaces on decode, which tokens end
// generation) follow what llama.cpp does with the same metadata, so that a GGUF behaves the same
// in both engines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace substrate {

class Metadata;

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// Token attributes, a bit set. The first values mirror GGUF `tokenizer.ggml.token_type`.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,  // special: only matched in text with parse_special, hidden on decode
  kAttrUserDefined = 1u << 4,  // added token: always matched in text, shown verbatim on decode
  kAttrByte = 1u << 5,  // <0xXX> byte-fallback token
  kAttrLStrip = 1u << 7,  // matching swallows whitespace on its left
  kAttrRStrip = 1u << 8,  // ... and on its right
};

enum class VocabType { kBpe, kSpm };

struct Vocab {
  VocabType type = VocabType::kBpe;
  std::string model;  // tokenizer.ggml.model ("gpt2", "llama")
  std::string pre = "default";  // tokenizer.ggml.pre
  std::vector<std::string> tokens;
  std::vector<float> scores;  // SPM merge priority (higher merges first); may be empty for BPE
  std::vector<uint32_t> attrs;  // TokenAttr bits per token
  std::vector<std::string> merges;  // BPE merges "left right", rank = index

  TokenId bos = kNoToken, eos = kNoToken, unk = kNoToken, pad = kNoToken, eot = kNoToken;
  std::vector<TokenId> eog;  // tokens that end generation (eos, eot, <|im_end|>, ...)

  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SPM: prepend ' ' to text that starts a fragment
  bool ignore_merges = false;  // BPE: a word that is itself a token is not merged (llama3)
  bool clean_spaces = false;  // decode: " ," -> "," cleanup (HF clean_up_tokenization_spaces)

  int n_tokens() const { return static_cast<int>(tokens.size()); }
};

// Token types as stored in GGUF `tokenizer.ggml.token_type`.
uint32_t TokenAttrFromGgufType(int64_t type);

// Reads tokenizer.ggml.* keys. Fails with a message naming the key when a required key is missing
// or malformed, or when the tokenizer model is not one we implement.
Expected<Vocab> VocabFromMetadata(const Metadata& md);

// Sets the flags (add_bos, add_space_prefix, ignore_merges, clean_spaces) and default special ids
// that `type` and `pre` imply; metadata keys read afterwards override them.
void ApplyVocabDefaults(Vocab* v);

// Marks control-looking tokens (<|im_end|>, <|eot_id|>, ...) as control and fills `eog`. Call after
// tokens, attrs and special ids are final (VocabFromMetadata does; hand-built test vocabs may too).
void FinishVocab(Vocab* v);

}  // namespace substrate
