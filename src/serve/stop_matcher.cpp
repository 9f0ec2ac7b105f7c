#include "serve/stop_matcher.h"

#include <algorithm>

namespace substrate::serve {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  // The earliest stop string wins (as if the text had been scanned once, left to right).
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t at = pending_.find(s);
    if (at != std::string::npos && (best == std::string::npos || at < best)) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

namespace {
// Length of the UTF-8 sequence a lead byte starts, or 0 for a byte that cannot start one.
size_t SequenceLength(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return c >= 0xC2 ? 2 : 0;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return c <= 0xF4 ? 4 : 0;
  return 0;
}

// Whether s[i..i+n) is a valid sequence (continuation bytes, no overlongs or surrogates).
bool ValidSequence(std::string_view s, size_t i, size_t n) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xC0) != 0x80) return false;
  if (n == 3) {
    if (b(0) == 0xE0 && b(1) < 0xA0) return false;  // overlong
    if (b(0) == 0xED && b(1) >= 0xA0) return false;  // surrogate
  }
  if (n == 4) {
    if (b(0) == 0xF0 && b(1) < 0x90) return false;
    if (b(0) == 0xF4 && b(1) >= 0x90) return false;
  }
  return true;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
}  // namespace

std::string Utf8Assembler::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    size_t n = SequenceLength(static_cast<unsigned char>(pending_[i]));
    if (n == 0) {
      out.append(kReplacement);
      ++i;
      continue;
    }
    if (i + n > pending_.size()) {
      // Incomplete: keep it if what we have so far could still become valid.
      bool could = true;
      for (size_t k = i + 1; k < pending_.size(); ++k)
        if ((static_cast<unsigned char>(pending_[k]) & 0xC0) != 0x80) could = false;
      if (could) break;
      out.append(kReplacement);
      ++i;
      continue;
    }
    if (!ValidSequence(pending_, i, n)) {
      out.append(kReplacement);
      ++i;
      continue;
    }
    out.append(pending_, i, n);
    i += n;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Assembler::Flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

std::string SanitizeUtf8(std::string_view s) {
  Utf8Assembler a;
  std::string out = a.Push(s);
  out += a.Flush();
  return out;
}

}  // namespace substrate::serve
