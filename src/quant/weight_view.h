// WeightView: the bytes of a weight matrix (or one expert slice of it) at a tier, as kernels see
// it. Kernels know nothing of models or files; they get a view and compute.
#pragma once

#include <cstdint>

#include "format/dtype.h"

namespace substrate {

// Bytes of one tensor (or one slice of its outermost dimension) at a tier.
struct WeightView {
  DType type = DType::kF32;
  const uint8_t* data = nullptr;  // tier-0 bytes (the skeleton)
  uint64_t bytes = 0;
  int64_t rows = 0;               // product of ne[1..] of the viewed part
  int64_t cols = 0;               // ne[0], the contiguous dimension
  // Residual tiers: tier k adds residual[0..k-1] (same shape, their own types) to the skeleton.
  int n_residuals = 0;
  DType residual_type[2] = {DType::kF32, DType::kF32};
  const uint8_t* residual[2] = {nullptr, nullptr};
};

}  // namespace substrate
