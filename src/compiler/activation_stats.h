// Activation statistics: for every weight matrix a forward pass multiplies, the sum of squares
// of each input column over calibration text (per expert slice for 3-D expert tensors, over the
// tokens routed to that expert). Two uses:
//   - importance for the quantizer (quant.h): a weight meeting a large activation matters more,
//     so its column's mean square weights that weight's quantization error;
//   - the cheap loss estimate (tensor_loss.h): sum_ij (w_ij - q_ij)^2 E[x_j^2] is the expected
//     squared error of the product's output per token.
// Stored as a GGUF file of F32 tensors (our own layout, read back by LoadActivationStats).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "quant/quantize_model.h"

namespace substrate::compiler {

struct ColumnStats {
  int64_t cols = 0;
  int64_t slices = 1;            // experts of a 3-D tensor, else 1
  std::vector<double> sum_sq;    // [slices][cols]
  std::vector<int64_t> rows;     // per slice: input rows seen
};

class ActivationStats : public ImportanceSource {
 public:
  int64_t tokens = 0;                        // tokens the forward passes evaluated
  std::map<std::string, ColumnStats> tensors;  // GGUF tensor name -> statistics
  std::string text;                          // what they were gathered on (for the record)

  // Adds n input rows of one product (slice -1: a 2-D tensor; `slices`: the outermost dimension
  // of a 3-D one).
  void Add(const std::string& name, int64_t slices, int slice, const float* x, int64_t n,
           int64_t cols);

  // Rounds the sums to what the file stores (F32), so statistics used in memory and the same
  // statistics read back give the same importance (and the same quantized bytes).
  void RoundToStored();

  // The quantizer's importance: the slice's mean square per column divided by its mean over the
  // columns (all ones when the activations are uniform), floored at 1e-3 so no column is free.
  // Empty when the tensor was never multiplied (a token embedding used only for lookups) or the
  // slice saw no token.
  std::vector<float> ColumnImportance(const std::string& tensor, int slice,
                                      int64_t cols) const override;

  // E[x_j^2] per column over all evaluated tokens (a slice's sum divided by every token, so an
  // expert's errors count as often as it runs); empty when unseen.
  std::vector<double> MeanSquarePerToken(const std::string& tensor, int slice) const;
};

Status SaveActivationStats(const ActivationStats& stats, const std::string& path);
Expected<ActivationStats> LoadActivationStats(const std::string& path);

}  // namespace substrate::compiler
