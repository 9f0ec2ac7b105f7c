#include "compiler/quantize_report.h"

#include <algorithm>
#include <memory>

#include "compiler/calibrate.h"
#include "quant/mix.h"

namespace substrate::compiler {

Expected<RdChart> BuildRdReport(const ModelFile& model, const ModelProfile& profile,
                                const FilePlan& chosen, const RdReportOptions& o) {
  RdChart chart;
  chart.title = profile.model_id + ": KL divergence against file size";
  // The whole predicted curve, from every tensor at its cheapest type to every one at its most
  // precise (the chosen plan's own path stops at its target).
  auto full = PlanFileSize(profile, std::max(chosen.max_file_bytes, chosen.target_file_bytes));
  chart.predicted_curve = full.ok() ? full->curve : chosen.curve;
  std::unique_ptr<CalibrationRunner> runner;
  if (!o.eval_text.empty()) {
    ASSIGN_OR_RETURN(runner, CalibrationRunner::Open(model.path(), o.eval_text, o.n_ctx, o.threads));
    chart.title += " (measured on " + std::to_string(o.eval_chunks) + " chunks of " + o.eval_text + ")";
  }
  auto measure = [&](const std::map<std::string, DType>& types, const ImportanceSource* imp) -> Expected<double> {
    if (!runner) return -1.0;
    ASSIGN_OR_RETURN(KlMeasurement m, runner->Measure(types, o.eval_first_chunk, o.eval_chunks, imp));
    return m.mean_kld;
  };
  RdPoint self{"this file", chosen.predicted_file_bytes, chosen.predicted_kld, -1};
  ASSIGN_OR_RETURN(self.measured, measure(chosen.tensor_types, o.importance));
  chart.plans.push_back(self);
  for (const std::string& name : o.mixes) {
    auto ft = FileTypeFromName(name);
    if (!ft) return InvalidArgument("report: unknown mix '" + name + "'");
    QuantizeOptions q;
    q.ftype = *ft;
    ASSIGN_OR_RETURN(QuantizedLayout layout, LayoutQuantizedFile(model, q));
    std::map<std::string, DType> types;
    for (const TensorInfo& t : layout.tensors)
      if (t.ne.size() >= 2) types[t.name] = t.type;
    RdPoint mix{name, layout.file_bytes, PredictFile(profile, types).kld, -1};
    ASSIGN_OR_RETURN(mix.measured, measure(types, nullptr));
    chart.mixes.push_back(mix);
    // The plan at exactly that file's size (when the candidate types can reach it).
    auto plan = PlanFileSize(profile, layout.file_bytes);
    if (!plan.ok() || plan->tensor_types == chosen.tensor_types) continue;
    RdPoint at{"plan @" + name, plan->predicted_file_bytes, plan->predicted_kld, -1};
    ASSIGN_OR_RETURN(at.measured, measure(plan->tensor_types, o.importance));
    chart.plans.push_back(at);
  }
  return chart;
}

}  // namespace substrate::compiler
