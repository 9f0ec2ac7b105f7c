// substrate pack -m MODEL -o STORE/ [--skeleton Q4_K|keep] [--residual Q8_0] [--residual2 F16]
//                [--tiers N] [--plan plan.json] [--cpu-layout] [--threads N]
// Writes the tiered store (store/pack.h): per op id a skeleton file and residual files, with a
// checksummed manifest. --residual none / --tiers 1 writes skeletons only. --skeleton keep
// stores each tensor's own bytes as tier 0 (no requantization; no residual tiers unless
// --residual is given). --plan takes tier-0 types and residual ladders from a compiled plan.
// --cpu-layout stores each expert's tier 0 in the layout the CPU's AVX-512 kernels read, so
// that an expert streamed out of core needs no rearranging (the CUDA backend does not read such
// a store).
#include <cstdio>

#include "cli/command.h"
#include "core/file_io.h"
#include "format/model_file.h"
#include "store/pack.h"

namespace substrate::cli {
namespace {

Expected<DType> TypeFlag(const std::string& name) {
  auto t = DTypeFromName(name);
  if (!t) return InvalidArgument("unknown type '" + name + "'");
  return *t;
}

constexpr const char* kUsage =
    "usage: substrate pack -m MODEL -o STORE/ [--skeleton Q4_K|keep --residual Q8_0\n"
    "                      --residual2 F16 --tiers N] [--plan plan.json] [--cpu-layout]\n"
    "                      [--threads N]\n";

int RunPack(const std::vector<std::string>& args) {
  Flags f(args, {{"-m", "--model", "-o", "--out", "--skeleton", "--residual", "--residual2",
                  "--tiers", "--plan", "-t", "--threads"},
               {"--cpu-layout"}});
  if (!f.status().ok()) return UsageError("pack", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  const std::string model = f.Get({"-m", "--model"});
  const std::string out = f.Get({"-o", "--out"});
  if (model.empty() || out.empty())
    return UsageError("pack", InvalidArgument("need -m MODEL and -o STORE/"), kUsage);
  PackOptions o;
  o.progress = true;
  o.cpu_layout = f.Has("--cpu-layout");
  const std::string skeleton = f.Get({"--skeleton"}, "Q4_K");
  o.keep_skeleton = skeleton == "keep";
  if (!o.keep_skeleton) {
    auto sk = TypeFlag(skeleton);
    if (!sk.ok()) return PrintError("pack", sk.status());
    o.skeleton = *sk;
  }
  o.residuals.clear();
  // A kept skeleton is exact: residuals only when asked for.
  const int default_tiers = o.keep_skeleton && !f.Has("--residual") ? 1 : 3;
  auto tiers = f.GetInt({"--tiers"}, default_tiers);
  if (!tiers.ok() || *tiers < 1 || *tiers > 3)
    return PrintError("pack", InvalidArgument("--tiers must be 1, 2 or 3"));
  const std::string r1 = f.Get({"--residual"}, "Q8_0"), r2 = f.Get({"--residual2"}, "F16");
  for (const std::string& r : {r1, r2}) {
    if (r == "none" || static_cast<long long>(o.residuals.size()) + 1 >= *tiers) break;
    auto t = TypeFlag(r);
    if (!t.ok()) return PrintError("pack", t.status());
    o.residuals.push_back(*t);
  }
  PackPlan plan;
  if (f.Has("--plan")) {
    auto text = ReadFileToString(f.Get({"--plan"}), 1ull << 30);
    if (!text.ok()) return PrintError("pack", text.status());
    auto p = ParsePackPlan(*text);
    if (!p.ok()) return PrintError("pack", p.status().WithContext(f.Get({"--plan"})));
    plan = std::move(p).value();
    o.plan = &plan;
  }
  auto threads = ThreadsFlag(f);
  if (!threads.ok()) return PrintError("pack", threads.status());
  if (*threads > 0) ThreadPool::SetDefaultThreads(static_cast<int>(*threads));
  auto file = ModelFile::Open(model);
  if (!file.ok()) return PrintError("pack", file.status());
  auto stats = PackStore(**file, out, o);
  if (!stats.ok()) return PrintError("pack", stats.status());
  std::printf("{\"store\":\"%s\",\"units\":%d,\"copied_units\":%llu,\"files\":%d,"
              "\"tier_bytes\":[%llu,%llu,%llu]}\n",
              out.c_str(), stats->n_units, static_cast<unsigned long long>(stats->copied_units),
              stats->n_files, static_cast<unsigned long long>(stats->tier_bytes[0]),
              static_cast<unsigned long long>(stats->tier_bytes[1]),
              static_cast<unsigned long long>(stats->tier_bytes[2]));
  return 0;
}

CommandRegistrar reg("pack", "write a tiered store (skeleton + residual files per op)", &RunPack);

}  // namespace
}  // namespace substrate::cli
