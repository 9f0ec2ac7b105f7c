#include "backend/expert_routing.h"

#include <algorithm>

namespace substrate {

int UnionExperts(const int32_t* sel, int64_t count, int E, int32_t* mark, int32_t* list) {
  std::fill(mark, mark + E, 0);
  for (int64_t i = 0; i < count; ++i) mark[sel[i]] = 1;
  int n = 0;
  for (int e = 0; e < E; ++e)
    if (mark[e]) list[n++] = e;
  return n;
}

ExpertRouting GroupByExpert(const int32_t* sel, const float* weight, int64_t n, int k, int E,
                            const ExpertRoutingSpace& s) {
  ExpertRouting r;
  r.n_experts = UnionExperts(sel, n * k, E, s.list + E, s.list);
  int32_t* offset = s.offset;
  std::fill(offset, offset + E + 1, 0);
  for (int64_t i = 0; i < n * k; ++i) ++offset[sel[i] + 1];
  for (int e = 0; e < E; ++e) offset[e + 1] += offset[e];
  int32_t* fill = s.list + E;  // the work half of list: next free position per expert
  std::copy(offset, offset + E, fill);
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t pos = fill[sel[t * k + j]]++;
      s.tokens[pos] = static_cast<int32_t>(t);
      s.weights[pos] = weight[t * k + j];
    }
  }
  r.experts = s.list;
  r.offset = offset;
  r.tokens = s.tokens;
  r.weights = s.weights;
  return r;
}

}  // namespace substrate
