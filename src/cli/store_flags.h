// Flags that run a command out of core: `--store STORE/ --max-ram SIZE [--plan P] [--trace T]
// [--prefetch-depth N] [--io auto|uring|pread] [--io-threads N] [--tier N]` (--tier: serve tier N
// of the store's ladder, 0 = skeleton only; default its top tier). With --store the model path
// becomes STORE/model.gguf and the engine's weights come from a runtime ResidencyManager under
// the budget; --max-ram alone caps the ledger (a resident model that does not fit then fails).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "model/engine.h"
#include "runtime/residency_manager.h"

namespace substrate::cli {

struct StoreRun {
  std::string store;     // "" without --store
  uint64_t max_ram = 0;  // 0 without --max-ram
  // The manager the factory built (owned by the engine): for stats. Null until the engine loads.
  std::shared_ptr<ResidencyManager*> manager = std::make_shared<ResidencyManager*>(nullptr);
  ResidencyManager* get() const { return *manager; }
};

// `extra` plus the flags above that take a value.
std::vector<std::string> StoreFlagsWithValue(std::vector<std::string> extra);

// Reads the flags; with --store sets *model_path and opt->weights (n_ctx: the context the command
// will open, for the KV/scratch reserve, whose KV rows are opt->kv_type: set it first;
// extra_reserve: other ledger charges the command makes, such as bench's bandwidth buffer);
// with --max-ram caps opt->ledger (or the global ledger).
Expected<StoreRun> ApplyStoreFlags(const Flags& f, int64_t n_ctx, std::string* model_path,
                                   EngineOptions* opt, uint64_t extra_reserve = 0);

// {"bytes_read":..,"read_seconds":..,...} of the manager, or null JSON text when none.
std::string StoreStatsJson(const StoreRun& run);

}  // namespace substrate::cli
