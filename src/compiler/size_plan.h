// File-size plans: the type of every planned tensor such that the quantized GGUF is as close
// below a byte target as the tensors' sizes allow, with the least predicted loss (the sum of the
// per-tensor losses of a per-tensor profile). The size counts everything the writer writes: the
// header with this plan's summary key, every tensor at its real type, each padded to the
// alignment; so the prediction equals the written file to the byte.
//
// Search: a greedy rate-distortion fill from every tensor at its cheapest type, taking the
// upgrade with the most loss removed per byte that still fits (a jump that does not fit is
// retried one type lower), the seed's fill with the exact file size as the constraint.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "compiler/profile.h"
#include "core/status.h"
#include "quant/quantize_model.h"

namespace substrate::compiler {

// The metadata key a plan-quantized file carries its plan's summary in.
inline constexpr const char* kPlanSummaryKey = kQuantizePlanKey;

struct FilePlan {
  std::string model_id;
  uint64_t target_file_bytes = 0;
  uint64_t predicted_file_bytes = 0;
  uint64_t min_file_bytes = 0;  // every tensor at its cheapest type
  uint64_t max_file_bytes = 0;  // every tensor at its most precise type
  double predicted_kld = 0;     // the sum of the tensors' losses through the profile's KLD fit
  double additive_kld = 0;      // the sum itself (what the search minimizes)
  std::map<std::string, DType> tensor_types;
  std::string summary;  // the value of kPlanSummaryKey
  // (file bytes, predicted KLD) along the greedy path, at most ~256 points: the predicted
  // rate-distortion curve (fitted KLD).
  std::vector<std::pair<uint64_t, double>> curve;
};

// Fails when the profile has no per-tensor calibration or file layout, and when the target is
// below the smallest file the candidate types allow (the error names that minimum).
Expected<FilePlan> PlanFileSize(const ModelProfile& profile, uint64_t target_file_bytes);

// The additive loss and exact file size of any assignment of the profile's tensors (a llama.cpp
// mix, say); tensors it does not name, or whose type has no calibrated option, count the nearest
// option at most that size, and `unmatched` counts them.
struct FilePrediction {
  double kld = 0;           // through the profile's KLD fit
  double additive_kld = 0;
  uint64_t file_bytes = 0;
  int unmatched = 0;
};
FilePrediction PredictFile(const ModelProfile& profile, const std::map<std::string, DType>& types,
                           const std::string& summary = "");

// The mix per tensor kind and layer range, one line per kind (kinds in the order of `ordered`,
// which is (tensor name, type) in file order):
//   "attn_q           Q4_K 0-2, Q5_K 3-5"
std::vector<std::string> MixLines(const std::vector<std::pair<std::string, DType>>& ordered);
// The plan summary a file carries under kPlanSummaryKey: "predicted_kld=0.0112; token_embd:
// Q6_K; attn_q: Q4_K 0-2, Q5_K 3-5; ..." (kld < 0: unknown).
std::string MixSummary(const std::vector<std::pair<std::string, DType>>& ordered, double kld);

// JSON of a file plan (schema "substrate.file_plan"); `substrate quantize --plan` reads its
// "tensor_types" and "summary".
std::string FilePlanToJson(const FilePlan& plan);
Expected<FilePlan> FilePlanFromJson(const std::string& text);

}  // namespace substrate::compiler
