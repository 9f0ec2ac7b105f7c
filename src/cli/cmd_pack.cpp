// substrate pack -m MODEL -o STORE/ [--skeleton Q4_K] [--residual Q8_0] [--residual2 F16]
//                [--tiers N]
// Writes the tiered store (store/pack.h): per op id a skeleton file and residual files, with a
// checksummed manifest. --residual none / --tiers 1 writes skeletons only.
#include <cstdio>

#include "cli/command.h"
#include "format/model_file.h"
#include "store/pack.h"

namespace substrate::cli {
namespace {

Expected<DType> TypeFlag(const std::string& name) {
  auto t = DTypeFromName(name);
  if (!t) return InvalidArgument("unknown type '" + name + "'");
  return *t;
}

int RunPack(const std::vector<std::string>& args) {
  Flags f(args, {"-m", "--model", "-o", "--out", "--skeleton", "--residual", "--residual2",
                 "--tiers", "--plan"});
  if (!f.status().ok()) return PrintError("pack", f.status());
  const std::string model = f.Get({"-m", "--model"});
  const std::string out = f.Get({"-o", "--out"});
  if (model.empty() || out.empty())
    return PrintError("pack", InvalidArgument("usage: substrate pack -m MODEL -o STORE/ "
                                              "[--skeleton Q4_K --residual Q8_0 --residual2 F16]"));
  if (f.Has("--plan"))
    return PrintError("pack", Unimplemented("--plan is not supported yet; use --skeleton/--residual"));
  PackOptions o;
  auto sk = TypeFlag(f.Get({"--skeleton"}, "Q4_K"));
  if (!sk.ok()) return PrintError("pack", sk.status());
  o.skeleton = *sk;
  o.residuals.clear();
  auto tiers = f.GetInt({"--tiers"}, 3);
  if (!tiers.ok() || *tiers < 1 || *tiers > 3)
    return PrintError("pack", InvalidArgument("--tiers must be 1, 2 or 3"));
  const std::string r1 = f.Get({"--residual"}, "Q8_0"), r2 = f.Get({"--residual2"}, "F16");
  for (const std::string& r : {r1, r2}) {
    if (r == "none" || static_cast<long long>(o.residuals.size()) + 1 >= *tiers) break;
    auto t = TypeFlag(r);
    if (!t.ok()) return PrintError("pack", t.status());
    o.residuals.push_back(*t);
  }
  auto file = ModelFile::Open(model);
  if (!file.ok()) return PrintError("pack", file.status());
  auto stats = PackStore(**file, out, o);
  if (!stats.ok()) return PrintError("pack", stats.status());
  std::printf("{\"store\":\"%s\",\"units\":%d,\"files\":%d,\"tier_bytes\":[%llu,%llu,%llu]}\n",
              out.c_str(), stats->n_units, stats->n_files,
              static_cast<unsigned long long>(stats->tier_bytes[0]),
              static_cast<unsigned long long>(stats->tier_bytes[1]),
              static_cast<unsigned long long>(stats->tier_bytes[2]));
  return 0;
}

CommandRegistrar reg("pack", "write a tiered store (skeleton + residual files per op)", &RunPack);

}  // namespace
}  // namespace substrate::cli
