#include "model/prompt_lookup.h"

#include <algorithm>

namespace substrate {

std::vector<int32_t> PromptLookupDraft(const std::vector<int32_t>& history, int max_tokens) {
  const int64_t len = static_cast<int64_t>(history.size());
  if (max_tokens <= 0) return {};
  for (int n = kLookupMaxNgram; n >= kLookupMinNgram; --n) {
    if (len <= n) continue;
    const int32_t* tail = history.data() + len - n;
    // Latest match first: recent context predicts best. A match must leave a token after it.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(tail, tail + n, history.data() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_tokens, len - from);
      return std::vector<int32_t>(history.begin() + from, history.begin() + from + count);
    }
  }
  return {};
}

}  // namespace substrate
