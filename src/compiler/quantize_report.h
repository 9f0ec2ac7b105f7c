// The rate-distortion report of `substrate quantize --size ... --report F.svg`: the predicted
// curve of the file-size planner, the file just planned, llama.cpp's fixed mixes of the same
// model (predicted from the profile), and plans at each mix's exact size; optionally all of
// them measured (final-logit KLD against the unquantized model) on held-out text, plans with
// importance as they would be written, mixes without (as llama.cpp writes them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/profile.h"
#include "compiler/rd_svg.h"
#include "compiler/size_plan.h"
#include "core/status.h"
#include "format/model_file.h"
#include "quant/quantize_model.h"

namespace substrate::compiler {

struct RdReportOptions {
  std::vector<std::string> mixes = {"Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K"};
  std::string eval_text;       // "": predictions only
  int64_t eval_first_chunk = 0;
  int64_t eval_chunks = 20;
  int64_t n_ctx = 512;
  int threads = 0;
  const ImportanceSource* importance = nullptr;  // plans' importance (null: none)
};

// `chosen`: the plan just written (drawn and measured as "this file").
Expected<RdChart> BuildRdReport(const ModelFile& model, const ModelProfile& profile,
                                const FilePlan& chosen, const RdReportOptions& options);

}  // namespace substrate::compiler
