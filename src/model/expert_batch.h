// The routed experts of one MoE layer, given the router's choices (moe_block.cpp routes).
#pragma once

#include <cstdint>

#include "backend/expert_routing.h"
#include "model/blocks.h"

namespace substrate {

// acc [n, d] += sum over the selected experts of weight * expert(xn) for the tokens each serves.
// Each expert's tensors are acquired inside its op block_L.moe.expert_E. When the pass runs its
// experts together (decode) and the layer has a shared expert, the shared expert joins the
// batch (in its op block_L.moe.shared, begun after the routed ones): its output, sigmoid-gated
// where the model has that gate, goes to shared_out [n, d] and *shared_done is set; otherwise
// the caller runs it.
Status RunExperts(ForwardContext& c, int il, const LayerWeights& w, const Tensor& xn,
                  const ExpertRouting& r, const Tensor& acc, const Tensor& shared_out,
                  bool* shared_done);

// Passes of at most n tokens (default 4: decode; environment SUBSTRATE_MOE_BATCH_TOKENS) run
// all selected experts together; larger ones expert by expert. For tests and benchmarks;
// returns the previous value.
int64_t SetBatchedExpertMaxTokens(int64_t n);

}  // namespace substrate
