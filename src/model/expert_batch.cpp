// Routed experts, expert after expert, each product split over the pool.
#include "model/expert_batch.h"

#include <cstring>

#include "model/op_id.h"

namespace substrate {
namespace {

Status RunOneByOne(ForwardContext& c, int il, const LayerWeights& w, const float* xn,
                   const ExpertRouting& r, float* acc) {
  const int64_t d = c.hp->n_embd, n = c.n;
  ASSIGN_OR_RETURN(float* xg, c.scratch->Get(Scratch::kGathered, n * d));
  ASSIGN_OR_RETURN(float* out, c.scratch->Get(Scratch::kExpertOut, n * d));
  for (int i = 0; i < r.n_experts; ++i) {
    const int e = r.experts[i];
    const int32_t* toks = r.tokens + r.offset[e];
    const float* wts = r.weights + r.offset[e];
    const int64_t m = r.offset[e + 1] - r.offset[e];
    OpScope op(c.source, OpIdMoeExpert(il, e));
    for (int64_t j = 0; j < m; ++j)
      std::memcpy(xg + j * d, xn + static_cast<int64_t>(toks[j]) * d, static_cast<size_t>(d) * 4);
    RETURN_IF_ERROR(SwiGluMlp(c, w.gate_exps, w.up_exps, w.down_exps, xg, m, out, e));
    for (int64_t j = 0; j < m; ++j) {
      float* a = acc + static_cast<int64_t>(toks[j]) * d;
      const float wt = wts[j];
      for (int64_t k = 0; k < d; ++k) a[k] += wt * out[j * d + k];
    }
  }
  return Status::Ok();
}

}  // namespace

Status RunRoutedExperts(ForwardContext& c, int il, const LayerWeights& w, const float* xn,
                        const ExpertRouting& r, float* acc) {
  return RunOneByOne(c, il, w, xn, r, acc);
}

}  // namespace substrate
