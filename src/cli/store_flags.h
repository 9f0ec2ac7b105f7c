// Flags that choose how a command runs its model: `--device cpu|cuda` and `--gpu N` (the compute
// backend, backend/backend_factory.h), `--max-ram SIZE` (the RAM budget: the ledger's cap), and
// out of core `--store STORE/ [--plan P] [--trace T] [--prefetch-depth N]
// [--io auto|uring|pread] [--io-threads N] [--tier N]` (--tier: serve tier N of the store's
// ladder, 0 = skeleton only; default its top tier). With --store the model is the store's
// model.gguf and its weights stream through the runtime inside the budget (Engine).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "runtime/engine.h"

namespace substrate::cli {

// `extra` plus the flags above that take a value.
std::vector<std::string> StoreFlagsWithValue(std::vector<std::string> extra);
// `extra` plus the switches of these flags (--adaptive, --print-plan).
std::vector<std::string> StoreSwitches(std::vector<std::string> extra = {});

// --print-plan: the engine's plan (Engine::PlanText) on stderr, where it does not mix with the
// command's output on stdout.
void PrintPlanIfAsked(const Flags& f, const Engine& e);
// Reads the flags into opt (device, gpu, max_ram, store, residency, adaptive).
Status ApplyStoreFlags(const Flags& f, EngineOptions* opt);
// `--adaptive [--verifier residual|linear|scripted] [--probes P] [--verifier-script F]
// [--escalation-threshold X] [--escalation-persistence N] [--escalation-max K]
// [--escalation-pool SIZE]`: the adaptive runtime (with --store).
Status ApplyAdaptiveFlags(const Flags& f, AdaptiveOptions* a);
// The tier controller's counters, or null without --adaptive.
nlohmann::json AdaptiveStatsJson(Engine& e);

// {"bytes_read":..,"read_seconds":..,...} of the engine's out-of-core runtime, or "null".
std::string StoreStatsJson(const Engine& e);

}  // namespace substrate::cli
