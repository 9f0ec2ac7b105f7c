// Mixture-of-experts routing of one token: gating (softmax or sigmoid), the optional selection
// bias, group-limited selection, top-k, weight normalization and scale (RoutingParams).
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"

namespace substrate {

// idx/weight [p.k]: the chosen experts in decreasing selection score (lowest index among
// equals) and their weights, from logits [p.n_expert]. bias [p.n_expert] or nullptr: added to
// the gate probabilities for choosing only. Allocation-free after the first call on a thread.
void RouteRow(const RoutingParams& p, const float* logits, const float* bias, int32_t* idx,
              float* weight);

}  // namespace substrate
