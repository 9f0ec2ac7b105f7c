#include "cli/quantize_size.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "compiler/quantize_report.h"
#include "compiler/rd_svg.h"
#include "compiler/size_calibrate.h"
#include "compiler/size_plan.h"
#include "core/file_io.h"
#include "core/memory_ledger.h"
#include "quant/quantize_model.h"

namespace substrate::cli {
namespace {

Expected<std::vector<DType>> ParseTypes(const std::string& list) {
  std::vector<DType> out;
  for (size_t pos = 0; !list.empty() && pos <= list.size();) {
    const size_t comma = list.find(',', pos);
    const std::string name = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    auto t = DTypeFromName(name);
    if (!t) return InvalidArgument("--types: unknown type '" + name + "'");
    out.push_back(*t);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// The profile must describe this file: the same planned tensors and the same layout around them.
Status CheckProfileFits(const compiler::ModelProfile& profile, const ModelFile& in) {
  std::vector<std::string> names;
  for (const auto& t : profile.tensors) names.push_back(t.name);
  if (names != compiler::PlannedTensors(in))
    return InvalidArgument("profile '" + profile.model_id + "' plans other tensors than '" + in.path() +
                           "' has; calibrate this model (-f TEXT)");
  ASSIGN_OR_RETURN(compiler::FileLayout l, compiler::FileLayoutOf(in, names));
  if (l.alignment != profile.file.alignment || l.header_bytes != profile.file.header_bytes ||
      l.fixed_bytes != profile.file.fixed_bytes)
    return InvalidArgument("profile '" + profile.model_id + "' was made for a file laid out differently from '" +
                           in.path() + "'; calibrate this model (-f TEXT)");
  return Status::Ok();
}

uint64_t FileBytesOnDisk(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

int QuantizeToSize(const Flags& flags, const ModelFile& in, const std::string& out_path,
                   ThreadPool& pool, int threads) {
  const char* cmd = "quantize";
  const bool importance = !flags.Has("--no-importance");
  // The target.
  uint64_t target = 0;
  if (flags.Has("--size") && flags.Has("--bpw"))
    return PrintError(cmd, InvalidArgument("give --size or --bpw, not both"));
  if (flags.Has("--size")) {
    auto b = ParseBytes(flags.Get({"--size"}));
    if (!b.ok()) return PrintError(cmd, b.status().WithContext("--size"));
    target = *b;
  } else {
    auto bpw = flags.GetDouble({"--bpw"}, 0);
    if (!bpw.ok()) return PrintError(cmd, bpw.status());
    if (!(*bpw > 0 && *bpw <= 64)) return PrintError(cmd, InvalidArgument("--bpw must be in (0, 64]"));
    uint64_t params = 0;
    for (const TensorInfo& t : in.tensors()) params += t.n_elements();
    target = static_cast<uint64_t>(std::floor(*bpw * static_cast<double>(params) / 8));
  }
  auto types = ParseTypes(flags.Get({"--types"}));
  if (!types.ok()) return PrintError(cmd, types.status());
  auto n_ctx = flags.GetInt({"-c", "--ctx-size"}, 0), stats_chunks = flags.GetInt({"--stats-chunks"}, 0),
       measure_chunks = flags.GetInt({"--measure-chunks"}, 0), groups = flags.GetInt({"--groups"}, 0),
       report_chunks = flags.GetInt({"--report-chunks"}, 20);
  for (auto* e : {&n_ctx, &stats_chunks, &measure_chunks, &groups, &report_chunks})
    if (!e->ok()) return PrintError(cmd, e->status());
  if (*n_ctx < 0 || *stats_chunks < 0 || *measure_chunks < 0 || *groups < 0 || *groups > 100000 || *report_chunks < 1)
    return PrintError(cmd, InvalidArgument("--stats-chunks, --measure-chunks, --groups must be >= 0, "
                                           "--report-chunks >= 1"));

  // Calibration (cached beside the profile), or an earlier profile.
  const std::string profile_path = flags.Get({"--profile"}, out_path + ".profile.json");
  std::string prefix = profile_path;
  if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".json") == 0) prefix.resize(prefix.size() - 5);
  const std::string text = flags.Get({"-f", "--file"});
  compiler::ModelProfile profile;
  compiler::ActivationStats stats;
  if (!text.empty()) {
    compiler::EstimateOptions eo;
    eo.model_path = in.path();
    eo.text_path = text;
    eo.n_ctx = *n_ctx;
    eo.stats_chunks = *stats_chunks;
    eo.measure_chunks = *measure_chunks;
    eo.max_groups = static_cast<int>(*groups);
    eo.types = *types;
    eo.importance = importance;
    eo.cache_prefix = prefix;
    eo.threads = threads;
    auto r = compiler::EstimateProfile(eo);
    if (!r.ok()) return PrintError(cmd, r.status());
    profile = std::move(r->profile);
    stats = std::move(r->stats);
    Status st = compiler::SaveProfile(profile, profile_path);
    if (!st.ok()) return PrintError(cmd, st);
    const double secs = r->seconds_stats + r->seconds_errors + r->seconds_measure;
    std::printf("calibrated %s on %s: %zu tensors, %lld tokens of statistics, %zu measured groups "
                "(%s); profile %s\n",
                in.path().c_str(), text.c_str(), profile.tensors.size(),
                static_cast<long long>(stats.tokens), r->groups.size(),
                secs < 0.5 ? "all from the cache"
                           : (std::to_string(static_cast<int>(r->seconds_stats + 0.5)) + " s statistics, " +
                              std::to_string(static_cast<int>(r->seconds_errors + 0.5)) + " s errors, " +
                              std::to_string(static_cast<int>(r->seconds_measure + 0.5)) + " s measurements")
                                 .c_str(),
                profile_path.c_str());
  } else if (FileExists(profile_path)) {
    auto p = compiler::LoadProfile(profile_path);
    if (!p.ok()) return PrintError(cmd, p.status());
    profile = std::move(*p);
    if (importance) {
      auto s = compiler::LoadActivationStats(prefix + ".imatrix.gguf");
      if (!s.ok()) return PrintError(cmd, s.status().WithContext("the profile's statistics (or --no-importance)"));
      stats = std::move(*s);
    }
    Status st = CheckProfileFits(profile, in);
    if (!st.ok()) return PrintError(cmd, st);
  } else {
    return PrintError(cmd, InvalidArgument("--size/--bpw need -f CALIBRATION_TEXT (or --profile naming "
                                           "an earlier calibration of this model)"));
  }

  // Plan to the byte.
  auto plan = compiler::PlanFileSize(profile, target);
  if (!plan.ok()) return PrintError(cmd, plan.status());
  QuantizeOptions opt;
  opt.copy_unlisted = true;
  opt.overrides = &plan->tensor_types;
  opt.importance = importance ? &stats : nullptr;
  opt.pool = &pool;
  opt.extra_metadata.emplace_back(compiler::kPlanSummaryKey, MetaValue::Str(plan->summary));
  auto nearest = NearestFileType(in, plan->predicted_file_bytes);
  if (!nearest.ok()) return PrintError(cmd, nearest.status());
  opt.ftype = *nearest;
  auto layout = LayoutQuantizedFile(in, opt);
  if (!layout.ok()) return PrintError(cmd, layout.status());
  if (layout->file_bytes != plan->predicted_file_bytes)
    return PrintError(cmd, Internal("the plan predicted " + std::to_string(plan->predicted_file_bytes) +
                                    " bytes but the file would take " + std::to_string(layout->file_bytes)));
  GgufFileSink sink(out_path);
  auto report = QuantizeModel(in, opt, sink);
  if (!report.ok()) return PrintError(cmd, report.status());
  const uint64_t written = FileBytesOnDisk(out_path);
  if (written != plan->predicted_file_bytes)
    return PrintError(cmd, Internal("wrote " + std::to_string(written) + " bytes, predicted " +
                                    std::to_string(plan->predicted_file_bytes)));

  std::printf("wrote %s: %llu bytes for a target of %llu (%.4f %% below), %.3f bits per weight, "
              "file type %s, predicted KLD %.6g, quantized in %.2f s%s\n",
              out_path.c_str(), static_cast<unsigned long long>(written),
              static_cast<unsigned long long>(target),
              100.0 * static_cast<double>(target - written) / static_cast<double>(target),
              8.0 * static_cast<double>(written) / static_cast<double>(std::max<uint64_t>(1, profile.file.n_parameters)),
              nearest->name, plan->predicted_kld, report->seconds,
              importance ? ", with importance" : "");
  std::vector<std::pair<std::string, DType>> ordered;
  for (const auto& t : profile.tensors) ordered.emplace_back(t.name, plan->tensor_types.at(t.name));
  for (const std::string& line : compiler::MixLines(ordered)) std::printf("  %s\n", line.c_str());

  const std::string svg = flags.Get({"--report"});
  if (!svg.empty()) {
    compiler::RdReportOptions ro;
    ro.eval_text = flags.Get({"--report-text"});
    ro.eval_chunks = *report_chunks;
    ro.n_ctx = *n_ctx > 0 ? *n_ctx : 512;
    ro.threads = threads;
    ro.importance = opt.importance;
    auto chart = compiler::BuildRdReport(in, profile, *plan, ro);
    if (!chart.ok()) return PrintError(cmd, chart.status());
    Status st = WriteFileAtomic(svg, compiler::RateDistortionSvg(*chart));
    if (!st.ok()) return PrintError(cmd, st);
    std::printf("report %s:\n", svg.c_str());
    for (const auto* set : {&chart->plans, &chart->mixes})
      for (const auto& p : *set)
        std::printf("  %-16s %10llu bytes  predicted KLD %-10.6g measured %s\n", p.label.c_str(),
                    static_cast<unsigned long long>(p.bytes), p.predicted,
                    p.measured >= 0 ? std::to_string(p.measured).c_str() : "-");
  }
  return 0;
}

}  // namespace substrate::cli
