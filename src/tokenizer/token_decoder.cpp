// TokenDecoder: incremental detokenization that never emits half a UTF-8 character.
#include "tokenizer/tokenizer.h"
#include "tokenizer/pretokenizer.h"

namespace substrate {
namespace {

const char kReplacement[] = "\xef\xbf\xbd";  // U+FFFD

// True when s (1..3 bytes) is the start of a valid UTF-8 sequence that more bytes could complete.
bool IsIncompletePrefix(std::string_view s) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(0);
  size_t need = 0;
  if (c >= 0xC2 && c <= 0xDF) need = 2;
  else if (c >= 0xE0 && c <= 0xEF) need = 3;
  else if (c >= 0xF0 && c <= 0xF4) need = 4;
  if (need == 0 || s.size() >= need) return false;
  for (size_t k = 1; k < s.size(); ++k) {
    if ((b(k) & 0xC0) != 0x80) return false;
  }
  if (s.size() >= 2) {
    const unsigned char d = b(1);
    if (c == 0xE0 && d < 0xA0) return false;
    if (c == 0xED && d >= 0xA0) return false;
    if (c == 0xF0 && d < 0x90) return false;
    if (c == 0xF4 && d >= 0x90) return false;
  }
  return true;
}

}  // namespace

TokenDecoder::TokenDecoder(const Tokenizer& tok, DecodeOptions opt) : tok_(tok), opt_(opt) {}

Expected<std::string> TokenDecoder::Push(TokenId id) {
  if (!tok_.IsValid(id)) {
    return InvalidArgument("tokenizer: token id " + std::to_string(id) +
                           " is outside the vocabulary (size " + std::to_string(tok_.n_vocab()) + ")");
  }
  const bool first = first_;
  first_ = false;
  if (!opt_.special && tok_.IsControl(id)) return TakeComplete(false);
  const std::string& p = tok_.Piece(id);
  if (first && opt_.strip_leading_space && tok_.vocab().add_space_prefix && !p.empty() && p[0] == ' ') {
    pending_.append(p, 1);
  } else {
    pending_ += p;
  }
  return TakeComplete(false);
}

std::string TokenDecoder::Flush() { return TakeComplete(true); }

std::string TokenDecoder::TakeComplete(bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int len = Utf8SequenceLength(pending_, i);
    if (len > 0) {
      out.append(pending_, i, len);
      i += len;
      continue;
    }
    if (!final && IsIncompletePrefix(std::string_view(pending_).substr(i))) break;
    out += kReplacement;
    ++i;
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace substrate
