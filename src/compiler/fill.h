// The greedy rate-distortion fill (internal to the compiler): tier-0 precision and skeleton
// residency per op, with the default path's RAM, SSD traffic and predicted tokens/s.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/plan_bundle.h"
#include "compiler/profile.h"

namespace substrate::compiler {

struct FillResult {
  std::vector<int> choice;     // option index per op (tier 0)
  std::vector<bool> streamed;  // skeleton streamed from SSD
  uint64_t resident_bytes = 0; // overhead + resident skeletons
  uint64_t window_bytes = 0;   // most streamed skeleton bytes alive at once
  double quality_loss = 0;     // additive estimate
  double seconds_per_token = 0;
  double ssd_bytes_per_token = 0;
  bool memory_ok = false;      // the skeleton fits
  std::vector<std::pair<uint64_t, double>> curve;  // (default peak bytes, loss) per accepted step

  uint64_t peak() const { return resident_bytes + window_bytes; }
  double tokens_per_second() const { return seconds_per_token > 0 ? 1.0 / seconds_per_token : 0; }
};

// Predicted seconds per token of a choice/residency under the budget's bandwidths.
double SecondsPerToken(const ModelProfile& profile, const Budget& budget,
                       const std::vector<int>& choice, const std::vector<bool>& streamed);

// Runs steps 1-2 of the pipeline. Stops upgrading once quality_loss <= budget.quality_loss_cap
// (a cap of 0 upgrades as far as RAM and the tokens/s target allow).
FillResult RunFill(const ModelProfile& profile, const Budget& budget);

}  // namespace substrate::compiler
