// TokenEmitter: shows the tokens a generation loop has settled on, one at a time — the end-of-
// generation check, the token budget, text decoding with stop strings held back until the next
// token decides them, and the caller's callback. Every shown token joins `history` (for the
// sampler's penalties). Shared by the plain/speculative loop and deferred verification.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace substrate {

class TokenEmitter {
 public:
  // `tokenizer` may be null (no text). The references must outlive the emitter.
  TokenEmitter(const Tokenizer* tokenizer, const GenerateOptions& opt, const TokenCallback& cb,
               std::vector<int32_t>* history, GenerateStats* st);

  // Shows `tok`, chosen from `logits`; false when generation ends with it (or, at
  // end-of-generation, before it): st->stop_reason says why.
  bool Emit(int32_t tok, const float* logits);
  // Sends the text still held back (at the end of a generation that was not cut by a stop
  // string or the callback).
  void Finish();

 private:
  const Tokenizer* tokenizer_;
  const GenerateOptions& opt_;
  const TokenCallback& on_token_;
  std::vector<int32_t>* history_;
  GenerateStats* st_;
  std::unique_ptr<TokenDecoder> decoder_;
  std::string pending_;  // decoded text not yet shown (could start a stop string)
};

}  // namespace substrate
