#include "runtime/token_emitter.h"

#include <algorithm>

namespace substrate {

TokenEmitter::TokenEmitter(const Tokenizer* tokenizer, const GenerateOptions& opt,
                           const TokenCallback& cb, std::vector<int32_t>* history,
                           GenerateStats* st)
    : tokenizer_(tokenizer), opt_(opt), on_token_(cb), history_(history), st_(st) {
  if (tokenizer_) decoder_ = std::make_unique<TokenDecoder>(*tokenizer_);
  st_->stop_reason = "length";
}

bool TokenEmitter::Emit(int32_t tok, const float* logits) {
  if (opt_.stop_at_eog && tokenizer_ && tokenizer_->IsEog(tok)) {
    st_->stop_reason = "eog";
    return false;
  }
  if (opt_.processor) opt_.processor->Accept(tok);
  if (opt_.on_choice) opt_.on_choice(logits, tok);
  history_->push_back(tok);
  ++st_->n_generated;
  std::string text;
  if (decoder_) {
    auto piece = decoder_->Push(tok);
    if (piece.ok()) pending_ += *piece;
    size_t cut = std::string::npos;
    for (const std::string& stop : opt_.stop) {
      if (stop.empty()) continue;
      cut = std::min(cut, pending_.find(stop));
    }
    if (cut != std::string::npos) {
      on_token_(tok, pending_.substr(0, cut));
      st_->stop_reason = "stop";
      return false;
    }
    const size_t hold = StopPrefixHold(pending_, opt_.stop);
    text = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
  }
  if (!on_token_(tok, text)) {
    st_->stop_reason = "callback";
    return false;
  }
  return st_->n_generated < opt_.max_tokens;
}

void TokenEmitter::Finish() {
  if (!decoder_ || st_->stop_reason == "stop" || st_->stop_reason == "callback") return;
  pending_ += decoder_->Flush();
  if (!pending_.empty()) on_token_(-1, pending_);
}

}  // namespace substrate
