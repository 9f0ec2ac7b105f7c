// The cheap half of calibration: for one weight tensor and each candidate type, the
// activation-weighted quantization error
//     E(type) = sum_ij E[x_j^2] (w_ij - q_ij)^2,
// the expected squared error that storing the tensor at that type adds to its product's output
// per token (x: the product's input; q: the tensor quantized, with importance, by the quantizer
// that will write the file; diagonal approximation: errors of different columns uncorrelated).
// A forward pass per tensor and type is what made calibration cost O(tensors x types x passes);
// this costs one quantization of (a sample of) each tensor per type. The final-logit KL of a
// type is then estimated as alpha * E(type), alpha measured for groups of tensors (size_calibrate.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/activation_stats.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "format/dtype.h"

namespace substrate::compiler {

struct TensorErrorRequest {
  std::string name;          // GGUF name (for the statistics)
  DType type = DType::kF32;  // stored type of `data`
  std::vector<uint64_t> ne;  // ggml order; a 3-D tensor is slices of ne[0] x ne[1]
  const void* data = nullptr;
  std::vector<DType> types;  // candidates
  const ActivationStats* stats = nullptr;  // null or unseen tensor: unit column weights
  bool importance = true;    // quantize with the statistics' importance (as the file will be)
  int64_t max_rows = 0;      // > 0: at most this many rows per slice, evenly spaced (scaled up)
};

struct TensorErrors {
  std::vector<double> error;  // per candidate type; +inf when the type cannot store the rows
  // Per slice (experts) and type, for ops that own one slice: [slice][type].
  std::vector<std::vector<double>> slice_error;
};

Expected<TensorErrors> ActivationWeightedErrors(const TensorErrorRequest& request, ThreadPool& pool);

}  // namespace substrate::compiler
