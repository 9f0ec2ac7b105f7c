// substrate fit -m MODEL.gguf [--max-ram SIZE] [-c CTX] [--kv-type f32|f16] [--json]: will it
// fit? Answered from the tensor table alone (runtime/fit.h): resident, out of core read in place
// (with the plan, bytes per token and predicted tokens/s) or not at all (with what would).
// Exit 0 when it runs, 3 when it does not.
#include <cstdio>
#include <cstdlib>

#include "cli/command.h"
#include "cli/generation_flags.h"
#include "core/memory_ledger.h"
#include "runtime/fit.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate fit -m MODEL.gguf [--max-ram SIZE] [-c CTX] [--kv-type f32|f16]\n"
    "                     [--prefetch-depth N] [-t THREADS] [--expert-hit-rate H]\n"
    "                     [--no-measure] [--json]\n"
    "Says, before loading, whether MODEL runs resident, out of core (read in place) or not at\n"
    "all under SIZE (default: the available memory), the memory breakdown, the bytes each token\n"
    "reads from disk and the predicted decode tokens/s: the token's matrix products timed at\n"
    "the model's shapes on THREADS (default: every core), the disk read as the runtime reads\n"
    "it (the plan's streamed ops, then routed experts; a few seconds of O_DIRECT reads).\n"
    "Routed experts hit the cache at the rate a previous run of MODEL in place measured (kept\n"
    "in the cache folder, used for a cache within a quarter of that run's slots), else at slots /\n"
    "experts (uniform routing); H, a hit rate from 0 to 1, overrides both.\n"
    "Exit 0 when it runs, 3 when it does not.\n";

int RunFit(const std::vector<std::string>& args) {
  Flags f(args, {{"-m", "--model", "--max-ram", "-c", "--ctx-size", "--kv-type", "--prefetch-depth", "-t",
                  "--threads", "--expert-hit-rate"},
                 {"--json", "--no-measure"}, 0});
  if (!f.status().ok()) return UsageError("fit", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  const std::string model = f.Get({"-m", "--model"});
  if (model.empty()) return UsageError("fit", InvalidArgument("-m MODEL.gguf is required"), kUsage);
  FitOptions o;
  if (f.Has("--max-ram")) {
    auto b = ParseBytes(f.Get({"--max-ram"}));
    if (!b.ok()) return UsageError("fit", b.status(), kUsage);
    if (*b == 0) return UsageError("fit", InvalidArgument("--max-ram must be more than 0"), kUsage);
    o.max_ram = *b;
  }
  auto ctx = f.GetInt({"-c", "--ctx-size"}, 0);
  auto depth = f.GetInt({"--prefetch-depth"}, 2);
  auto threads = f.GetInt({"-t", "--threads"}, 0);
  if (!threads.ok()) return UsageError("fit", threads.status(), kUsage);
  if (*threads < 0 || *threads > 1024) return UsageError("fit", InvalidArgument("-t must be 0 to 1024"), kUsage);
  if (!ctx.ok()) return UsageError("fit", ctx.status(), kUsage);
  if (!depth.ok()) return UsageError("fit", depth.status(), kUsage);
  if (*ctx < 0 || *ctx > (1 << 24)) return UsageError("fit", InvalidArgument("-c must be 0 to 16777216"), kUsage);
  if (*depth < 1 || *depth > 64) return UsageError("fit", InvalidArgument("--prefetch-depth must be 1 to 64"), kUsage);
  o.n_ctx = *ctx;
  o.prefetch_depth = static_cast<int>(*depth);
  o.threads = static_cast<int>(*threads);
  if (f.Has("--expert-hit-rate")) {
    const std::string v = f.Get({"--expert-hit-rate"});
    char* end = nullptr;
    const double h = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(h >= 0 && h <= 1))
      return UsageError("fit", InvalidArgument("--expert-hit-rate must be a number from 0 to 1"), kUsage);
    o.expert_hit_rate = h;
  }
  auto kv = ParseKvType(f);
  if (!kv.ok()) return UsageError("fit", kv.status(), kUsage);
  o.kv_type = *kv;
  o.measure = !f.Has("--no-measure");
  auto r = PredictFit(model, o);
  if (!r.ok()) return PrintError("fit", r.status());
  std::fputs((f.Has("--json") ? FitToJson(*r) : FitToText(*r)).c_str(), stdout);
  return r->verdict == FitReport::Verdict::kImpossible ? 3 : 0;
}

CommandRegistrar reg("fit", "will it fit? resident, out of core or not, before loading",
                     &RunFit);

}  // namespace
}  // namespace substrate::cli
