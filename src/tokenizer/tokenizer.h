// Tokenizer: text <-> token ids, the way the model's own tokenizer does it.
//
// Two algorithms, chosen by `tokenizer.ggml.model`:
//   "gpt2"  byte-level BPE: special tokens are cut out first, the rest is split into words by the
//           pre-tokenizer regexes (`tokenizer.ggml.pre`), each word's bytes are mapped to GPT-2's
//           printable characters and merged by rank.
//   "llama" SentencePiece BPE: ' ' becomes U+2581, a space is prefixed to each text fragment,
//           pieces merge by score, characters without a piece fall back to <0xXX> byte tokens.
//
// Load with FromMetadata (GGUF keys; a HF folder's tokenizer.json arrives as the same keys).
// Thread-safety: a Tokenizer is immutable after creation; all methods are const and thread-safe.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/vocab.h"

namespace substrate {

class Metadata;
class PreTokenizer;

struct EncodeOptions {
  // Add BOS/EOS where the model asks for them (tokenizer.ggml.add_bos_token / add_eos_token).
  bool add_special = true;
  // Recognise control tokens written in the text ("<|im_start|>"). User-defined added tokens are
  // always recognised, as in HF tokenizers. Off for untrusted text (a user typing "<|im_end|>").
  bool parse_special = false;
};

struct DecodeOptions {
  // Render control tokens (<|im_end|>, <s>) as their text; when false they decode to nothing.
  bool special = true;
  // SPM: drop the space the encoder put before the first word (when the first token carries it).
  bool strip_leading_space = true;
  // Apply the model's clean_up_tokenization_spaces rule (" ," -> ",") where its vocab asks for it.
  bool clean_spaces = false;
};

class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  static Expected<std::unique_ptr<Tokenizer>> FromMetadata(const Metadata& md);
  static Expected<std::unique_ptr<Tokenizer>> FromVocab(Vocab vocab);

  // Fails only on an internal regex failure (a PCRE2 resource limit); any bytes are accepted,
  // invalid UTF-8 included (it encodes to byte tokens).
  Expected<std::vector<TokenId>> Encode(std::string_view text, const EncodeOptions& opt = {}) const;

  // Fails on an id outside the vocabulary, naming it.
  Expected<std::string> Decode(std::span<const TokenId> ids, const DecodeOptions& opt = {}) const;

  // The raw bytes one token stands for (control tokens: their text). Empty for invalid ids.
  const std::string& Piece(TokenId id) const;
  bool IsValid(TokenId id) const { return id >= 0 && id < vocab_.n_tokens(); }
  bool IsControl(TokenId id) const;
  bool IsEog(TokenId id) const;

  const Vocab& vocab() const { return vocab_; }
  int n_vocab() const { return vocab_.n_tokens(); }
  TokenId bos() const { return vocab_.bos; }
  TokenId eos() const { return vocab_.eos; }
  // Id of a token by its exact vocabulary text (e.g. "<|im_end|>"), or kNoToken.
  TokenId Find(std::string_view token_text) const;

  struct Impl;  // opaque: tables private to src/tokenizer

 private:
  explicit Tokenizer(Vocab vocab);
  Status Init();

  Vocab vocab_;
  std::unique_ptr<Impl> impl_;
};

// Streams token ids to text for generation: Push returns only complete UTF-8, holding back a
// character whose bytes are split across tokens (byte-level BPE and <0xXX> tokens do this).
// Bytes that can never form a character come out as U+FFFD.
class TokenDecoder {
 public:
  explicit TokenDecoder(const Tokenizer& tok, DecodeOptions opt = {.strip_leading_space = false});
  // Appends the text that became complete with `id`; fails on an invalid id (nothing changes).
  Expected<std::string> Push(TokenId id);
  // Ends the stream: an incomplete trailing character comes out as U+FFFD.
  std::string Flush();
  // Bytes held back now (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  std::string TakeComplete(bool final);
  const Tokenizer& tok_;
  DecodeOptions opt_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace substrate
