#include "cli/store_flags.h"

namespace substrate::cli {

std::vector<std::string> StoreFlagsWithValue(std::vector<std::string> extra) {
  for (const char* f : {"--store", "--max-ram", "--plan", "--trace", "--prefetch-depth", "--io",
                        "--io-threads", "--tier"})
    extra.push_back(f);
  return extra;
}

Status ApplyStoreFlags(const Flags& f, EngineOptions* opt) {
  opt->store = f.Get({"--store"});
  if (f.Has("--max-ram")) {
    ASSIGN_OR_RETURN(opt->max_ram, ParseBytes(f.Get({"--max-ram"})));
    if (opt->max_ram == 0) return InvalidArgument("--max-ram must be more than 0");
  }
  if (opt->store.empty()) {
    for (const char* flag : {"--plan", "--trace", "--prefetch-depth", "--io", "--io-threads", "--tier"})
      if (f.Has(flag)) return InvalidArgument(std::string(flag) + " needs --store STORE/");
    return Status::Ok();
  }
  if (!f.Has("--max-ram")) return InvalidArgument("--store needs --max-ram SIZE (the RAM budget)");
  ResidencyOptions& ro = opt->residency;
  ro.plan_path = f.Get({"--plan"});
  ro.trace_path = f.Get({"--trace"});
  ASSIGN_OR_RETURN(long long depth, f.GetInt({"--prefetch-depth"}, 2));
  if (depth < 1 || depth > 64) return InvalidArgument("--prefetch-depth must be 1 to 64");
  ro.prefetch_depth = static_cast<int>(depth);
  ASSIGN_OR_RETURN(ro.io_mode, ParseIoMode(f.Get({"--io"}, "auto")));
  ASSIGN_OR_RETURN(long long io_threads, f.GetInt({"--io-threads"}, 1));
  if (io_threads < 1 || io_threads > 16) return InvalidArgument("--io-threads must be 1 to 16");
  ro.io_threads = static_cast<int>(io_threads);
  // Past the store's ladder is the manager's error at load (it names the ladder it found).
  ASSIGN_OR_RETURN(long long tier, f.GetInt({"--tier"}, -1));
  if (f.Has("--tier") && (tier < 0 || tier > 1000000))
    return InvalidArgument("--tier " + std::to_string(tier) + ": not a tier (0 = skeleton only)");
  ro.serve_tier = static_cast<int>(tier);
  return Status::Ok();
}

std::string StoreStatsJson(const Engine& e) {
  return e.runtime() ? e.runtime()->StatsJson() : "null";
}

}  // namespace substrate::cli
