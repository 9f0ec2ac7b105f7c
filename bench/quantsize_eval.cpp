// Quantize-to-a-size, measured: a per-tensor profile estimated on a calibration text, then on
// held-out text (final-logit KLD against the unquantized model, the same code as `substrate
// perplexity --kl-divergence`):
//   - llama.cpp's fixed mixes, plain (as its files are) and with importance;
//   - file-size plans at each mix's exact file size, with and without importance;
//   - plans at 10 sizes between the smallest and the Q6_K mix, for predicted vs measured.
// Prints JSON (and the estimate's timings); usage:
//   bench_quantsize_eval MODEL CALIB_TEXT EVAL_TEXT [EVAL_CHUNKS=40] [MIXES=Q2_K,Q3_K_M,Q4_K_M,Q6_K]
//       [PROFILE_CACHE_PREFIX]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compiler/calibrate.h"
#include "compiler/size_calibrate.h"
#include "compiler/size_plan.h"
#include "quant/mix.h"
#include "quant/quantize_model.h"

using namespace substrate;
using namespace substrate::compiler;

namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

double Pearson(const std::vector<double>& x, const std::vector<double>& y) {
  double mx = 0, my = 0, sxy = 0, sx = 0, sy = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / x.size(), my += y[i] / y.size();
  for (size_t i = 0; i < x.size(); ++i)
    sxy += (x[i] - mx) * (y[i] - my), sx += (x[i] - mx) * (x[i] - mx), sy += (y[i] - my) * (y[i] - my);
  return sxy / std::sqrt(sx * sy);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= s.size();) {
    size_t c = s.find(',', p);
    out.push_back(s.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4)
    return std::fprintf(stderr, "usage: %s MODEL CALIB_TEXT EVAL_TEXT [EVAL_CHUNKS] [MIXES] [CACHE_PREFIX]\n", argv[0]), 2;
  const std::string model = argv[1], calib = argv[2], eval = argv[3];
  const int64_t eval_chunks = argc > 4 ? std::atoll(argv[4]) : 40;
  const std::vector<std::string> mixes = Split(argc > 5 ? argv[5] : "Q2_K,Q3_K_M,Q4_K_M,Q6_K");
  EstimateOptions eo;
  eo.model_path = model;
  eo.text_path = calib;
  eo.cache_prefix = argc > 6 ? argv[6] : "";
  auto est = EstimateProfile(eo);
  if (!est.ok()) return Fail(est.status());
  const ModelProfile& profile = est->profile;
  auto file = ModelFile::Open(model);
  if (!file.ok()) return Fail(file.status());
  auto runner = CalibrationRunner::Open(model, eval, 512, 0);
  if (!runner.ok()) return Fail(runner.status());
  const int64_t chunks = std::min(eval_chunks, (*runner)->n_chunks_available());

  struct Row {
    std::string name;
    uint64_t bytes;
    double predicted, plain, importance;
  };
  std::vector<Row> rows;
  auto measure = [&](const std::map<std::string, DType>& types, const ImportanceSource* imp) -> Expected<double> {
    ASSIGN_OR_RETURN(KlMeasurement m, (*runner)->Measure(types, 0, chunks, imp));
    return m.mean_kld;
  };
  std::vector<uint64_t> mix_bytes;
  for (const std::string& name : mixes) {
    QuantizeOptions q;
    q.ftype = *FileTypeFromName(name);
    auto layout = LayoutQuantizedFile(**file, q);
    if (!layout.ok()) return Fail(layout.status());
    std::map<std::string, DType> types;
    for (const TensorInfo& t : layout->tensors)
      if (t.ne.size() >= 2) types[t.name] = t.type;
    auto plain = measure(types, nullptr), imp = measure(types, &est->stats);
    if (!plain.ok()) return Fail(plain.status());
    if (!imp.ok()) return Fail(imp.status());
    rows.push_back({"mix " + name, layout->file_bytes, PredictFile(profile, types).kld, *plain, *imp});
    mix_bytes.push_back(layout->file_bytes);
    auto plan = PlanFileSize(profile, layout->file_bytes);
    if (!plan.ok()) return Fail(plan.status());
    auto pplain = measure(plan->tensor_types, nullptr), pimp = measure(plan->tensor_types, &est->stats);
    if (!pplain.ok()) return Fail(pplain.status());
    if (!pimp.ok()) return Fail(pimp.status());
    rows.push_back({"plan @" + name, plan->predicted_file_bytes, plan->predicted_kld, *pplain, *pimp});
    std::fprintf(stderr, "%s: mix %.6f / %.6f, plan %.6f / %.6f\n", name.c_str(), *plain, *imp, *pplain, *pimp);
  }
  auto lo = PlanFileSize(profile, UINT64_MAX);
  if (!lo.ok()) return Fail(lo.status());
  const uint64_t hi = mix_bytes.empty() ? lo->max_file_bytes : *std::max_element(mix_bytes.begin(), mix_bytes.end());
  std::vector<double> px, py;
  for (int i = 0; i < 10; ++i) {
    const uint64_t target = lo->min_file_bytes + (hi - lo->min_file_bytes) * static_cast<uint64_t>(i) / 9;
    auto plan = PlanFileSize(profile, target);
    if (!plan.ok()) return Fail(plan.status());
    auto m = measure(plan->tensor_types, &est->stats);
    if (!m.ok()) return Fail(m.status());
    rows.push_back({"plan " + std::to_string(i), plan->predicted_file_bytes, plan->predicted_kld, -1, *m});
    px.push_back(plan->predicted_kld);
    py.push_back(*m);
  }
  std::printf("{\"benchmark\": \"quantsize_eval\", \"model\": \"%s\", \"calibration\": \"%s\", \"eval\": \"%s\", "
              "\"eval_chunks\": %lld,\n \"estimate_seconds\": {\"stats\": %.1f, \"errors\": %.1f, \"measure\": %.1f}, "
              "\"groups\": %zu, \"stats_tokens\": %lld,\n \"rows\": [\n",
              model.c_str(), calib.c_str(), eval.c_str(), static_cast<long long>(chunks), est->seconds_stats,
              est->seconds_errors, est->seconds_measure, est->groups.size(), static_cast<long long>(est->stats.tokens));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("  {\"name\": \"%s\", \"bytes\": %llu, \"predicted_kld\": %.6f, \"kld_plain\": %.6f, "
                "\"kld_importance\": %.6f}%s\n",
                r.name.c_str(), static_cast<unsigned long long>(r.bytes), r.predicted, r.plain, r.importance,
                i + 1 < rows.size() ? "," : "");
  }
  // Predicted vs measured over every plan and mix measured with importance.
  std::vector<double> ax, ay;
  for (const Row& r : rows) ax.push_back(r.predicted), ay.push_back(r.importance);
  std::printf(" ],\n \"pearson_plans\": %.4f, \"pearson_all\": %.4f,\n \"plan_vs_mix\": {", Pearson(px, py), Pearson(ax, ay));
  for (size_t i = 0; i + 1 < rows.size() && rows[i].name.rfind("mix ", 0) == 0; i += 2)
    std::printf("%s\"%s\": %.3f", i ? ", " : "", rows[i].name.substr(4).c_str(), rows[i + 1].importance / rows[i].plain);
  std::printf("}}\n");
  return 0;
}
