// Offline training of the linear verifier probes (`substrate train-probe`). Two prefill passes
// per text chunk — every op at tier 0, then every op at the top tier — give each block's
// residual stream x at both. The target for block op o at token t is the drift the block adds:
//
//   y = (|x_top - x_0|_after - |x_top - x_0|_before) / |x_0|_after
//
// (relative L2, the block's own share of how far the top tier's hidden state is from tier 0's:
// cheap, two passes for every op, and what escalating that op would remove). The feature is the
// tier-0 hidden state after the block (what the probe sees at run time); for wide models it is
// projected on a fixed random subspace of `features` dimensions and the probe mapped back, so
// the solve stays small. Ridge regression in closed form (Cholesky), per op; the last
// `holdout` share of the chunks is kept out of training to report each probe's correlation.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine.h"
#include "runtime/verifier.h"

namespace substrate {

struct ProbeTrainingOptions {
  int64_t n_ctx = 128;       // tokens per chunk (one prefill each)
  int64_t max_chunks = 16;
  double holdout = 0.25;     // share of chunks for the held-out correlation
  int features = 256;        // projection width when the hidden size is larger
  double ridge = 1e-3;       // lambda, relative to the mean diagonal of X^T X
};

// `tokens`: the text, encoded. The engine's weights need residual tiers (a store).
Expected<LinearProbes> TrainProbes(Engine& e, const std::vector<int32_t>& tokens,
                                   const ProbeTrainingOptions& opt);

}  // namespace substrate
