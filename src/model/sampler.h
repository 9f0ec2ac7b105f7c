// Sampler: picks the next token from logits. Greedy when temperature <= 0; otherwise the
// llama.cpp-style chain: repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw.
// Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/status.h"

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

// What every front end accepts (run's and chat's flags, the server's request fields), so a value
// is refused the same way everywhere. The temperature's upper bound is each API's own.
inline constexpr double kMaxTopP = 1.0, kMaxMinP = 1.0;
inline constexpr int kMaxTopK = 1 << 20;
// InvalidArgument naming the first parameter that is not finite or out of its range
// ("top_p 2: must be between 0 and 1").
Status ValidateSamplingParams(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  // `history` is every token so far (prompt and generated), for the repetition penalty.
  int32_t Sample(const float* logits, int64_t n_vocab, const std::vector<int32_t>& history);
  // Speculative verification of a drafted token (a deterministic draft): returns `draft` with
  // the probability Sample would pick it, else a token drawn from the rest of Sample's
  // distribution, so the result is distributed exactly as Sample's. Greedy: the argmax.
  int32_t Verify(const float* logits, int64_t n_vocab, const std::vector<int32_t>& history,
                 int32_t draft);
  const SamplingParams& params() const { return p_; }

 private:
  // The repetition-penalized logits (logits itself when the penalty is off).
  const float* Penalized(const float* logits, int64_t n_vocab, const std::vector<int32_t>& history);
  // Sample's candidates after top-k/top-p/min-p, in cand_[0..n), with their weights after
  // temperature in weight_[0..n); returns n.
  size_t Candidates(const float* l, int64_t n_vocab);
  // A draw from cand_[0..n) by weight_, skipping index `skip` (-1: none).
  int32_t Draw(size_t n, double total, int64_t skip);

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused: no allocation per token
  std::vector<float> adjusted_;
  std::vector<double> prob_, weight_;
};

// Index of the largest logit (the lowest index wins a tie).
int32_t Argmax(const float* logits, int64_t n);

}  // namespace substrate
