// WeightView: the bytes of a weight matrix (or one expert slice of it) at a tier, as kernels see
// it. Kernels know nothing of models or files; they get a view and compute.
#pragma once

#include <cstdint>

#include "format/dtype.h"

namespace substrate {

// How a view's rows are laid out in memory.
enum class WeightLayout : uint8_t {
  kRows,             // row after row, each in its type's block format (the file's layout)
  kQ8_0Interleaved,  // Q8_0 in groups of 16 rows, blocks interleaved (kernels/interleaved_q8_0.h)
  kQ4_0Interleaved,  // Q4_0 likewise (kernels/interleaved_q4_0.h)
  kQ4_KInterleaved,  // Q4_K likewise (kernels/interleaved_q4_k.h)
  kQ5_KInterleaved,  // Q5_K likewise (kernels/interleaved_q4_k.h)
  kQ6_KInterleaved,  // Q6_K likewise (kernels/interleaved_q6_k.h)
};

// Bytes of one tensor (or one slice of its outermost dimension) at a tier.
struct WeightView {
  DType type = DType::kF32;
  WeightLayout layout = WeightLayout::kRows;  // of the skeleton; residuals are always kRows
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
