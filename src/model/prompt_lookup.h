// Prompt-lookup drafting for speculative decoding: the tokens that followed the most recent
// earlier occurrence of the sequence's last n-gram (n = kMaxNgram down to kMinNgram) are
// proposed as the next tokens. It needs no draft model, costs a scan of the history, and pays
// off where text repeats its context: code, edits, quotes, structured output. The target model
// verifies the draft in one forward pass (Engine::Generate), so the output is unchanged.
#pragma once

#include <cstdint>
#include <vector>

namespace substrate {

constexpr int kLookupMaxNgram = 3;
constexpr int kLookupMinNgram = 2;

// Up to `max_tokens` drafted continuations of `history` (empty when no n-gram recurs).
std::vector<int32_t> PromptLookupDraft(const std::vector<int32_t>& history, int max_tokens);

}  // namespace substrate
