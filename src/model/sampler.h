// Sampler: picks the next token from logits. Greedy when temperature <= 0; otherwise the
// llama.cpp-style chain: repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw.
// Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace substrate {

struct SamplingParams {
  float temperature = 0.0f;   // <= 0: greedy (argmax)
  int top_k = 40;             // <= 0: off
  float top_p = 0.95f;        // >= 1: off
  float min_p = 0.05f;        // <= 0: off (relative to the most likely token)
  float repeat_penalty = 1.0f;  // 1: off; > 1 discourages tokens seen in the last repeat_last_n
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  // `history` is every token so far (prompt and generated), for the repetition penalty.
  int32_t Sample(const float* logits, int64_t n_vocab, const std::vector<int32_t>& history);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused: no allocation per token
  std::vector<float> adjusted_;
};

// Index of the largest logit (the lowest index wins a tie).
int32_t Argmax(const float* logits, int64_t n);

}  // namespace substrate
