// Flags that choose how a command runs its model: `--max-ram SIZE` (the RAM budget: the ledger's
// cap), and out of core `--store STORE/ [--plan P] [--trace T] [--prefetch-depth N]
// [--io auto|uring|pread] [--io-threads N] [--tier N]` (--tier: serve tier N of the store's
// ladder, 0 = skeleton only; default its top tier). With --store the model is the store's
// model.gguf and its weights stream through the runtime inside the budget (Engine).
#pragma once

#include <string>
#include <vector>

#include "cli/command.h"
#include "runtime/engine.h"

namespace substrate::cli {

// `extra` plus the flags above that take a value.
std::vector<std::string> StoreFlagsWithValue(std::vector<std::string> extra);

// Reads the flags into opt (max_ram, store, residency).
Status ApplyStoreFlags(const Flags& f, EngineOptions* opt);

// {"bytes_read":..,"read_seconds":..,...} of the engine's out-of-core runtime, or "null".
std::string StoreStatsJson(const Engine& e);

}  // namespace substrate::cli
