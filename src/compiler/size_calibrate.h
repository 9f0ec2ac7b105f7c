// Calibration that scales: a per-tensor profile from activation statistics, the
// activation-weighted quantization error of every tensor at every candidate type
// (tensor_loss.h), and a few measured final-logit KLs that turn errors into losses.
//
//   1. statistics: forward passes of the unquantized model over calibration chunks, recording
//      the mean square of every product's input column (activation_stats.h);
//   2. errors E_t(type) for every planned tensor t, quantized with importance as the file will be;
//   3. sensitivity: tensors are grouped (each tensor alone for small models; by kind and layer
//      range for large ones), each group quantized to a reference type in memory and its KL
//      measured; alpha_g = KL_g / sum_{t in g} E_t(ref);
//   4. loss of t at a type = alpha_{g(t)} * E_t(type) (bent to E^beta with a second reference
//      type). Op-level options (for `compile --max-ram`) are the sums over each op's tensors
//      (expert slices by their own errors);
//   5. two whole plans measured: predicted KL = scale * (sum of losses)^power (the sum alone runs
//      ~25 % low on tiny-coder: losses compound). The search still minimizes the sum.
//
// Everything measured is cached in `<prefix>.partial.json` (resumed when the settings match) and
// the statistics in `<prefix>.imatrix.gguf`, so an interrupted run continues where it stopped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/activation_stats.h"
#include "compiler/profile.h"
#include "core/status.h"
#include "format/dtype.h"

namespace substrate::compiler {

struct EstimateOptions {
  std::string model_path;
  std::string text_path;
  int64_t n_ctx = 0;           // chunk length; 0: by model size (512, or 256 from 200M parameters)
  int64_t stats_chunks = 0;    // chunks for the statistics; 0: by model size (see .cpp)
  int64_t measure_chunks = 0;  // chunks per KL measurement; 0: by model size
  int max_groups = 0;          // sensitivity measurements; 0: by model size
  std::vector<DType> types;    // candidates; empty: Q2_K Q3_K IQ4_XS Q4_K Q5_K Q6_K Q8_0
  std::vector<DType> reference_types;  // measured per group; empty: Q3_K
  bool importance = true;      // quantize (and estimate) with importance
  // Measure two whole plans to fit KL against the sum of losses: 1 yes, 0 no, -1 by model size
  // (each quantizes the whole model in memory: minutes for 8B parameters).
  int fit_plans = -1;
  std::string cache_prefix;    // "" : nothing cached
  int threads = 0;
  bool progress = true;
};

struct EstimateResult {
  ModelProfile profile;  // ops + tensors + file layout, estimate "activation_weighted"
  ActivationStats stats;
  struct Group {
    std::string id;  // "attn_q 0-7", or a tensor name
    std::vector<std::string> tensors;
    DType type;
    double measured_kld = 0, kld_err = 0, error = 0, alpha = 0;
  };
  std::vector<Group> groups;
  double seconds_stats = 0, seconds_errors = 0, seconds_measure = 0;
};

Expected<EstimateResult> EstimateProfile(const EstimateOptions& options);

// The tensors a file-size plan chooses types for: every tensor llama.cpp would quantize
// (quant/mix.h's rule), in file order.
std::vector<std::string> PlannedTensors(const ModelFile& file);

// The file layout of `file` quantized with `planned` tensors planned and every other tensor
// copied as it is (see FileLayout).
Expected<FileLayout> FileLayoutOf(const ModelFile& file, const std::vector<std::string>& planned);

}  // namespace substrate::compiler
