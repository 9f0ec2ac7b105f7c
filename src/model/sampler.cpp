#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>

namespace substrate {

Status ValidateSamplingParams(const SamplingParams& p) {
  auto range = [](const char* name, double v, double lo, double hi) {
    if (std::isfinite(v) && v >= lo && v <= hi) return Status::Ok();
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s %.7g: must be a number between %.10g and %.10g", name, v, lo,
                  hi);
    return InvalidArgument(buf);
  };
  RETURN_IF_ERROR(range("temperature", p.temperature, 0.0, 1e6));
  RETURN_IF_ERROR(range("top_k", p.top_k, 0, kMaxTopK));
  RETURN_IF_ERROR(range("top_p", p.top_p, 0.0, kMaxTopP));
  RETURN_IF_ERROR(range("min_p", p.min_p, 0.0, kMaxMinP));
  RETURN_IF_ERROR(range("repeat_penalty", p.repeat_penalty, 1e-6, 1e6));
  return range("repeat_last_n", p.repeat_last_n, -1, 1 << 30);
}

int32_t Argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

const float* Sampler::Penalized(const float* logits, int64_t n_vocab,
                                const std::vector<int32_t>& history) {
  if (p_.repeat_penalty == 1.0f || p_.repeat_last_n == 0 || history.empty()) return logits;
  // CTRL-style penalty: positive logits divided, negative multiplied.
  adjusted_.assign(logits, logits + n_vocab);
  const size_t n = p_.repeat_last_n < 0 ? history.size()
                                        : std::min(history.size(),
                                                   static_cast<size_t>(p_.repeat_last_n));
  std::unordered_set<int32_t> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
  for (int32_t t : seen) {
    if (t < 0 || t >= n_vocab) continue;
    float& v = adjusted_[t];
    v = v > 0 ? v / p_.repeat_penalty : v * p_.repeat_penalty;
  }
  return adjusted_.data();
}

size_t Sampler::Candidates(const float* l, int64_t n_vocab) {
  cand_.resize(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) cand_[i] = {l[i], static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
    keep = static_cast<size_t>(p_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(keep);
  // Probabilities at temperature 1 for the p filters (as llama.cpp's default chain does).
  const float mx = cand_[0].first;
  prob_.resize(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += prob_[i] = std::exp(cand_[i].first - mx);
  for (size_t i = 0; i < keep; ++i) prob_[i] /= sum;
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t k = 0;
    while (k < keep) {
      cum += prob_[k++];
      if (cum >= p_.top_p) break;
    }
    keep = std::max<size_t>(1, k);
  }
  if (p_.min_p > 0.0f) {
    const double floor = prob_[0] * p_.min_p;
    size_t k = 1;
    while (k < keep && prob_[k] >= floor) ++k;
    keep = k;
  }
  // Temperature on what is left.
  weight_.resize(keep);
  for (size_t i = 0; i < keep; ++i) weight_[i] = std::exp((cand_[i].first - mx) / p_.temperature);
  return keep;
}

int32_t Sampler::Draw(size_t n, double total, int64_t skip) {
  std::uniform_real_distribution<double> uni(0.0, total);
  double r = uni(rng_);
  int64_t last = -1;
  for (size_t i = 0; i < n; ++i) {
    // Rounding can leave r > 0 after the last weight: fall back to the last candidate with a
    // weight (a zero weight is a token a logits processor forbade).
    if (static_cast<int64_t>(i) == skip || weight_[i] <= 0) continue;
    last = static_cast<int64_t>(i);
    r -= weight_[i];
    if (r <= 0) return cand_[i].second;
  }
  if (last < 0) last = skip >= 0 ? skip : 0;  // nothing else has a weight
  return cand_[static_cast<size_t>(last)].second;
}

int32_t Sampler::Sample(const float* logits, int64_t n_vocab,
                        const std::vector<int32_t>& history) {
  const float* l = Penalized(logits, n_vocab, history);
  if (p_.temperature <= 0.0f) return Argmax(l, n_vocab);
  const size_t n = Candidates(l, n_vocab);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += weight_[i];
  return Draw(n, total, -1);
}

int32_t Sampler::Verify(const float* logits, int64_t n_vocab, const std::vector<int32_t>& history,
                        int32_t draft) {
  const float* l = Penalized(logits, n_vocab, history);
  if (p_.temperature <= 0.0f) return Argmax(l, n_vocab);
  const size_t n = Candidates(l, n_vocab);
  double total = 0;
  int64_t at = -1;
  for (size_t i = 0; i < n; ++i) {
    total += weight_[i];
    if (cand_[i].second == draft) at = static_cast<int64_t>(i);
  }
  if (at < 0) return Draw(n, total, -1);  // filtered out: probability 0
  // Accept with probability p(draft); otherwise draw from p without the draft, renormalized:
  // p(draft) * [x = draft] + (1 - p(draft)) * p(x) / (1 - p(draft)) = p(x).
  std::uniform_real_distribution<double> uni(0.0, total);
  const double w = weight_[static_cast<size_t>(at)];
  if (uni(rng_) < w || n == 1) return draft;
  return Draw(n, total - w, at);
}

}  // namespace substrate
