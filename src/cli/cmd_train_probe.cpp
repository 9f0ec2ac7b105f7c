// substrate train-probe: fits the linear verifier probes of the adaptive runtime (--adaptive
// --verifier linear --probes P) on a text, through a store with residual tiers.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/generation_flags.h"
#include "cli/store_flags.h"
#include "core/file_io.h"
#include "runtime/probe_training.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate train-probe --store STORE/ --max-ram SIZE -f TEXT -o PROBES.json\n"
    "                             [-c 128] [--chunks 16] [--holdout 0.25] [--features 256]\n"
    "Fits one linear probe per block (attention, FFN or MoE) predicting, from the tier-0\n"
    "hidden state after the block, the drift the block adds between tier 0 and the store's top\n"
    "tier (relative L2): two prefill passes per chunk of -c tokens, ridge regression in closed\n"
    "form. The last --holdout share of the chunks is kept out to report each probe's\n"
    "correlation. Hidden sizes above --features are randomly projected for the solve.\n";

int RunTrainProbe(const std::vector<std::string>& args) {
  Flags f(args, StoreFlagsWithValue({"-f", "--file", "-o", "--output", "-c", "--ctx-size",
                                     "--chunks", "--holdout", "--features", "-t", "--threads"}));
  if (!f.status().ok()) return UsageError("train-probe", f.status(), kUsage);
  if (f.Has("-h") || f.Has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string text_path = f.Get({"-f", "--file"}), out = f.Get({"-o", "--output"});
  if (!f.Has("--store") || text_path.empty() || out.empty()) {
    return UsageError("train-probe", InvalidArgument("need --store STORE/, -f TEXT and -o FILE"),
                      kUsage);
  }
  auto ctx = f.GetInt({"-c", "--ctx-size"}, 128), chunks = f.GetInt({"--chunks"}, 16),
       features = f.GetInt({"--features"}, 256), threads = f.GetInt({"-t", "--threads"}, 0);
  auto holdout = f.GetDouble({"--holdout"}, 0.25);
  for (auto* v : {&ctx, &chunks, &features, &threads})
    if (!v->ok()) return PrintError("train-probe", v->status());
  if (!holdout.ok()) return PrintError("train-probe", holdout.status());
  if (*ctx < 2 || *ctx > 8192 || *chunks < 2 || *features < 8 || *features > 8192 ||
      !(*holdout > 0 && *holdout < 1))
    return PrintError("train-probe", InvalidArgument("-c 2..8192, --chunks >= 2, --features "
                                                     "8..8192, 0 < --holdout < 1"));
  EngineOptions eo;
  eo.n_threads = static_cast<int>(*threads);
  eo.n_ctx = *ctx;
  if (Status st = ApplyStoreFlags(f, &eo); !st.ok()) return PrintError("train-probe", st);
  auto engine = Engine::Load("", eo);
  if (!engine.ok()) return PrintError("train-probe", engine.status());
  auto text = ReadFileToString(text_path);
  if (!text.ok()) return PrintError("train-probe", text.status());
  auto ids = EncodePlain(**engine, *text);
  if (!ids.ok()) return PrintError("train-probe", ids.status());
  ProbeTrainingOptions po;
  po.n_ctx = *ctx;
  po.max_chunks = *chunks;
  po.holdout = *holdout;
  po.features = static_cast<int>(*features);
  auto probes = TrainProbes(**engine, *ids, po);
  if (!probes.ok()) return PrintError("train-probe", probes.status());
  if (Status st = probes->Save(out); !st.ok()) return PrintError("train-probe", st);
  nlohmann::json j;
  for (const auto& [id, p] : probes->ops) j["heldout_corr"][id] = p.heldout_corr;
  j["probes"] = out;
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

CommandRegistrar reg("train-probe", "fit the adaptive runtime's linear verifier probes",
                     &RunTrainProbe);

}  // namespace
}  // namespace substrate::cli
