#include "cli/store_flags.h"

#include <algorithm>

#include "model/model.h"

namespace substrate::cli {

std::vector<std::string> StoreFlagsWithValue(std::vector<std::string> extra) {
  for (const char* f : {"--store", "--max-ram", "--plan", "--trace", "--prefetch-depth", "--io",
                        "--io-threads", "--tier"})
    extra.push_back(f);
  return extra;
}

Expected<StoreRun> ApplyStoreFlags(const Flags& f, int64_t n_ctx, std::string* model_path,
                                   EngineOptions* opt, uint64_t extra_reserve) {
  StoreRun run;
  run.store = f.Get({"--store"});
  if (f.Has("--max-ram")) {
    ASSIGN_OR_RETURN(run.max_ram, ParseBytes(f.Get({"--max-ram"})));
    if (run.max_ram == 0) return InvalidArgument("--max-ram must be more than 0");
    MemoryLedger* ledger = opt->ledger ? opt->ledger : &MemoryLedger::Global();
    ledger->set_cap(run.max_ram);
  }
  if (run.store.empty()) {
    for (const char* flag : {"--plan", "--trace", "--prefetch-depth", "--io", "--io-threads", "--tier"})
      if (f.Has(flag)) return InvalidArgument(std::string(flag) + " needs --store STORE/");
    return run;
  }
  if (!f.Has("--max-ram")) return InvalidArgument("--store needs --max-ram SIZE (the RAM budget)");
  if (model_path->size() && *model_path != run.store + "/model.gguf")
    return InvalidArgument("give either -m MODEL or --store STORE/, not both");
  *model_path = run.store + "/model.gguf";
  ResidencyOptions ro;
  ro.budget_bytes = run.max_ram;
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
  const std::string dir = run.store;
  auto slot = run.manager;
  const DType kv_type = opt->kv_type;
  opt->weights = [dir, ro, n_ctx, slot, extra_reserve, kv_type](const ModelFile& file,
                                                                MemoryLedger* ledger)
      -> Expected<std::unique_ptr<WeightSource>> {
    ResidencyOptions o = ro;
    ASSIGN_OR_RETURN(ModelHParams hp, ModelHParams::FromMetadata(file.metadata()));
    const int64_t ctx = n_ctx > 0 ? n_ctx : std::min<int64_t>(hp.n_ctx_train, 4096);
    o.reserve_bytes =
        EstimateRunReserve(hp, ctx, std::min<int64_t>(ctx, Model::kMaxBatch), kv_type) +
        extra_reserve;
    ASSIGN_OR_RETURN(auto m, ResidencyManager::Open(dir, ledger, o));
    *slot = m.get();
    return std::unique_ptr<WeightSource>(std::move(m));
  };
  return run;
}

std::string StoreStatsJson(const StoreRun& run) {
  return run.get() ? run.get()->StatsJson() : "null";
}

}  // namespace substrate::cli
