// The tiny-coder experiment of issue 6, as one program printing JSON:
//   1. calibrate per-op KL on the first CAL chunks (512 tokens) of heldout.txt;
//   2. measure the reference Q2_K/Q3_K_M/Q4_K_M/Q6_K files' tensor types (quantized by our
//      bit-compatible quantizer) on chunks [EVAL_FROM, EVAL_FROM + EVAL_N);
//   3. compile plans filled to the byte size of Q3_K_M and Q4_K_M and to 10 budgets between the
//      Q2_K and Q6_K sizes, measure each on the same held-out chunks;
//   4. print predicted (additive) vs measured KLD and their correlation.
// usage: bench_compiler_tinycoder SHARED_DIR [CAL=4] [EVAL_FROM=8] [EVAL_N=24] [THREADS=0]
// Heavy (hundreds of 512-token forward passes): minutes on 16 cores.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compiler/calibrate.h"
#include "compiler/planner.h"

using namespace substrate;
using namespace substrate::compiler;

namespace {

double Pearson(const std::vector<double>& x, const std::vector<double>& y) {
  double mx = 0, my = 0, sxy = 0, sx = 0, sy = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / x.size(), my += y[i] / y.size();
  for (size_t i = 0; i < x.size(); ++i)
    sxy += (x[i] - mx) * (y[i] - my), sx += (x[i] - mx) * (x[i] - mx), sy += (y[i] - my) * (y[i] - my);
  return sxy / std::sqrt(sx * sy);
}

int Fail(const Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s SHARED_DIR [CAL] [EVAL_FROM] [EVAL_N] [THREADS]\n", argv[0]), 2;
  const std::string shared = argv[1];
  const int64_t cal = argc > 2 ? std::atoll(argv[2]) : 4, from = argc > 3 ? std::atoll(argv[3]) : 8,
                n = argc > 4 ? std::atoll(argv[4]) : 24;
  const int threads = argc > 5 ? std::atoi(argv[5]) : 0;
  const std::string model = shared + "/gguf/tiny-coder-bf16.gguf", text = shared + "/text/heldout.txt";
  CalibrationOptions co;
  co.model_path = model;
  co.text_path = text;
  co.n_chunks = cal;
  co.threads = threads;
  auto profile = Calibrate(co);
  if (!profile.ok()) return Fail(profile.status());
  auto runner = CalibrationRunner::Open(model, text, 512, threads);
  if (!runner.ok()) return Fail(runner.status());

  struct Row { std::string name; uint64_t bytes; double predicted, measured, same_top; };
  std::vector<Row> rows;
  auto measure = [&](const std::string& name, const std::map<std::string, DType>& types) -> Status {
    Prediction p = PredictAdditive(*profile, types);
    ASSIGN_OR_RETURN(KlMeasurement m, (*runner)->Measure(types, from, n));
    rows.push_back({name, p.bytes, p.loss, m.mean_kld, m.same_top});
    return Status::Ok();
  };
  std::map<std::string, uint64_t> file_bytes;
  for (const char* q : {"Q2_K", "Q3_K_M", "Q4_K_M", "Q6_K"}) {
    auto types = FileTensorTypes(shared + "/gguf/tiny-coder-" + std::string(q) + ".gguf");
    if (!types.ok()) return Fail(types.status());
    Status st = measure(std::string("file ") + q, *types);
    if (!st.ok()) return Fail(st);
    file_bytes[q] = rows.back().bytes;
  }
  std::vector<std::pair<std::string, uint64_t>> budgets = {{"plan at Q3_K_M size", file_bytes["Q3_K_M"]},
                                                          {"plan at Q4_K_M size", file_bytes["Q4_K_M"]}};
  const uint64_t lo = file_bytes["Q2_K"], hi = file_bytes["Q6_K"];
  for (int i = 0; i < 10; ++i) budgets.push_back({"plan " + std::to_string(i), lo + (hi - lo) * i / 9});
  for (const auto& [name, bytes] : budgets) {
    CompileRequest req;
    req.budget.max_ram_bytes = profile->overhead_bytes + bytes;
    auto axes = EvaluateAxes(*profile, req);  // cap 0: fill to the budget, then compile at what it reached
    if (!axes.ok()) return Fail(axes.status());
    req.budget.quality_loss_cap = axes->quality_loss;
    req.escalation.max_concurrent_escalations = 0;
    auto plan = CompilePlan(*profile, req);
    if (!plan.ok()) return Fail(plan.status());
    auto types = PlanTensorTypes(*plan);
    if (!types.ok()) return Fail(types.status());
    Status st = measure(name, *types);
    if (!st.ok()) return Fail(st);
  }
  std::vector<double> px, py;
  std::printf("{\"benchmark\": \"compiler_tinycoder\", \"calibration_chunks\": [0, %lld], \"eval_chunks\": [%lld, %lld],\n \"rows\": [\n",
              static_cast<long long>(cal), static_cast<long long>(from), static_cast<long long>(from + n));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("  {\"name\": \"%s\", \"bytes\": %llu, \"predicted_kld\": %.6f, \"measured_kld\": %.6f, \"same_top\": %.4f}%s\n",
                r.name.c_str(), static_cast<unsigned long long>(r.bytes), r.predicted, r.measured,
                r.same_top, i + 1 < rows.size() ? "," : "");
    if (r.name.rfind("plan", 0) == 0) px.push_back(r.predicted), py.push_back(r.measured);
  }
  std::printf(" ],\n \"plans_pearson\": %.4f, \"plan_vs_file_kld_ratio\": {\"Q3_K_M\": %.3f, \"Q4_K_M\": %.3f}}\n",
              Pearson(px, py), rows[4].measured / rows[1].measured, rows[5].measured / rows[2].measured);
  return 0;
}
