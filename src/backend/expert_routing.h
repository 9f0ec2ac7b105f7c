// The routed tokens of one MoE layer grouped by expert: the host-side plan of which expert runs
// which tokens, built from a Backend::Route result. The same for every backend (the lists are
// bookkeeping on the host, where the residency layer needs them to fetch experts).
#pragma once

#include <cstdint>

namespace substrate {

// experts[0..n_experts) increasing; the tokens of expert e are tokens[offset[e] ..
// offset[e + 1]) (increasing) with routing weights weights[..].
struct ExpertRouting {
  const int32_t* experts = nullptr;
  int n_experts = 0;
  const int32_t* offset = nullptr;  // [n_expert + 1], indexed by expert id
  const int32_t* tokens = nullptr;
  const float* weights = nullptr;
};

// Host work space for GroupByExpert, sized by the caller: list [2 * E], offset [E + 1],
// tokens and weights [n * k].
struct ExpertRoutingSpace {
  int32_t* list = nullptr;
  int32_t* offset = nullptr;
  int32_t* tokens = nullptr;
  float* weights = nullptr;
};

// Groups sel/weight [n, k] (a token's choices) by expert: a counting sort that keeps tokens in
// increasing order per expert.
ExpertRouting GroupByExpert(const int32_t* sel, const float* weight, int64_t n, int k, int E,
                            const ExpertRoutingSpace& space);

// The distinct experts of sel [count] in increasing order into list [E]; returns how many.
// mark [E] is work space.
int UnionExperts(const int32_t* sel, int64_t count, int E, int32_t* mark, int32_t* list);

}  // namespace substrate
