#include "kernels/routing.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace substrate {
namespace {

// Index of the largest v[i] not yet taken, the lowest index among equals: the order a stable
// descending sort gives, without the sort's temporary buffer.
int ArgmaxFree(const float* v, const uint8_t* taken, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i)
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

// Per-thread routing work space, grown once.
struct RouteWork {
  std::vector<float> prob, choice, gscore;
  std::vector<uint8_t> taken, gtaken, keep;
  void Reserve(int E, int G) {
    if (prob.size() < static_cast<size_t>(E)) {
      prob.resize(E);
      choice.resize(E);
      taken.resize(E);
    }
    if (gscore.size() < static_cast<size_t>(G)) {
      gscore.resize(G);
      gtaken.resize(G);
      keep.resize(G);
    }
  }
};

}  // namespace

void RouteRow(const RoutingParams& p, const float* logits, const float* bias, int32_t* idx,
              float* weight) {
  const int E = p.n_expert, K = p.k;
  const bool grouped = p.n_groups > 1 && p.n_groups_used < p.n_groups;
  thread_local RouteWork work;
  work.Reserve(E, grouped ? p.n_groups : 0);
  float* prob = work.prob.data();
  std::copy(logits, logits + E, prob);
  if (p.gating == GatingFunc::kSigmoid) {
    for (int e = 0; e < E; ++e) prob[e] = Sigmoid(prob[e]);
  } else {
    Softmax(prob, E);
  }
  // Selection scores: deepseek-v3 adds its correction bias for choosing only.
  float* choice = work.choice.data();
  for (int e = 0; e < E; ++e) choice[e] = prob[e] + (bias ? bias[e] : 0.0f);
  if (p.cached)
    for (int e = 0; e < E; ++e)
      if (p.cached[e]) choice[e] += p.cached_bonus;
  if (grouped) {
    // Keep the best groups (v3: sum of each group's top two; v2: its max); others score 0,
    // as the reference implementation masks them.
    const int G = p.n_groups, per = E / G;
    for (int g = 0; g < G; ++g) {
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > m1) {
          m2 = m1;
          m1 = choice[e];
        } else if (choice[e] > m2) {
          m2 = choice[e];
        }
      }
      work.gscore[g] = p.gating == GatingFunc::kSigmoid ? m1 + (per > 1 ? m2 : 0.0f) : m1;
    }
    std::fill(work.gtaken.begin(), work.gtaken.begin() + G, 0);
    std::fill(work.keep.begin(), work.keep.begin() + G, 0);
    for (int i = 0; i < p.n_groups_used; ++i) {
      const int g = ArgmaxFree(work.gscore.data(), work.gtaken.data(), G);
      work.gtaken[g] = 1;
      work.keep[g] = 1;
    }
    for (int e = 0; e < E; ++e)
      if (!work.keep[e / per]) choice[e] = 0.0f;
  }
  uint8_t* taken = work.taken.data();
  std::fill(taken, taken + E, 0);
  double sum = 0;
  for (int k = 0; k < K; ++k) {
    const int e = ArgmaxFree(choice, taken, E);
    taken[e] = 1;
    idx[k] = e;
    weight[k] = prob[e];
    sum += weight[k];
  }
  if (p.normalize) {
    const float inv = static_cast<float>(1.0 / (sum + 1e-20));
    for (int k = 0; k < K; ++k) weight[k] *= inv;
  }
  for (int k = 0; k < K; ++k) weight[k] *= p.scale;
}

}  // namespace substrate
