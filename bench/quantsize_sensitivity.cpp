// How well the activation-weighted quantization error predicts a tensor's final-logit KL: for
// every quantizable tensor of a model and each type, E (tensor_loss.h) and the KL measured with
// only that tensor quantized (importance-weighted, as the file would be). Prints JSON rows.
// usage: bench_quantsize_sensitivity MODEL TEXT [STATS_CHUNKS=8] [KL_CHUNKS=4] [TYPES=Q2_K,Q3_K,Q4_K,Q6_K]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compiler/calibrate.h"
#include "compiler/tensor_loss.h"

using namespace substrate;
using namespace substrate::compiler;

static int Fail(const Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 3) return std::fprintf(stderr, "usage: %s MODEL TEXT [STATS_CHUNKS] [KL_CHUNKS] [TYPES]\n", argv[0]), 2;
  const int64_t stats_chunks = argc > 3 ? std::atoll(argv[3]) : 8, kl_chunks = argc > 4 ? std::atoll(argv[4]) : 4;
  std::vector<DType> types;
  std::string list = argc > 5 ? argv[5] : "Q2_K,Q3_K,Q4_K,Q6_K";
  for (size_t p = 0; p <= list.size();) {
    size_t c = list.find(',', p);
    auto t = DTypeFromName(list.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (!t) return std::fprintf(stderr, "bad type list\n"), 2;
    types.push_back(*t);
    if (c == std::string::npos) break;
    p = c + 1;
  }
  auto runner = CalibrationRunner::Open(argv[1], argv[2], 512, 0);
  if (!runner.ok()) return Fail(runner.status());
  auto t0 = std::chrono::steady_clock::now();
  auto stats = (*runner)->CollectActivationStats(0, stats_chunks);
  if (!stats.ok()) return Fail(stats.status());
  auto t1 = std::chrono::steady_clock::now();
  std::printf("{\"stats_seconds\": %.2f, \"rows\": [\n", std::chrono::duration<double>(t1 - t0).count());
  bool first = true;
  for (const auto& [op, names] : (*runner)->OpTensors()) {
    for (const std::string& name : names) {
      auto base = (*runner)->Base(name);
      if (!base.ok()) return Fail(base.status());
      TensorErrorRequest req;
      req.name = name;
      req.type = base->info->type;
      req.ne = base->info->ne;
      req.data = base->handle->data;
      req.types = types;
      req.stats = &*stats;
      auto with = ActivationWeightedErrors(req, (*runner)->pool());
      req.importance = false;
      auto without = ActivationWeightedErrors(req, (*runner)->pool());
      if (!with.ok()) return Fail(with.status());
      if (!without.ok()) return Fail(without.status());
      for (size_t k = 0; k < types.size(); ++k) {
        auto kl = (*runner)->Measure({{name, types[k]}}, 0, kl_chunks, &*stats);
        if (!kl.ok()) return Fail(kl.status());
        std::printf("%s  {\"op\": \"%s\", \"tensor\": \"%s\", \"type\": \"%s\", \"error\": %.6g, "
                    "\"error_plain\": %.6g, \"kld\": %.6g, \"kld_err\": %.3g}",
                    first ? "" : ",\n", op.c_str(), name.c_str(), DTypeName(types[k]), with->error[k],
                    without->error[k], kl->mean_kld, kl->kld_err);
        first = false;
        std::fflush(stdout);
      }
    }
  }
  std::printf("\n]}\n");
  return 0;
}
