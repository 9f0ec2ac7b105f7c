// "Will it fit?" before loading: from a GGUF's tensor table alone (no weight is read), whether
// the model runs resident, out of core (read in place: the plan the ResidencyManager would make
// under the budget, computed by a dry run of it) or not at all, with the memory breakdown, the
// bytes each decoded token reads from disk and the predicted decode tokens/s from measured disk
// and compute bandwidths (which one binds). When nothing fits: the smallest budget that does,
// and what a shorter context gives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

struct FitOptions {
  uint64_t max_ram = 0;  // 0: the machine's available memory (/proc/meminfo MemAvailable)
  int64_t n_ctx = 0;     // 0: min(training context, 4096), as a run
  DType kv_type = DType::kF32;
  int prefetch_depth = 2;
  bool measure = true;   // false: no bandwidth probes (no prediction of tokens/s)
  int threads = 0;       // compute threads the run will use (0: the default pool's)
  // The expert cache's hit rate, when known (a run's stats): replaces uniform routing's
  // slots / experts. < 0: a previous run's routing record for the same slot count if there is
  // one, else uniform routing.
  double expert_hit_rate = -1;
};

struct FitReport {
  enum class Verdict { kResident, kOutOfCore, kImpossible };
  Verdict verdict = Verdict::kImpossible;
  std::string path;
  uint64_t budget = 0;
  bool budget_from_machine = false;
  int64_t n_ctx = 0;
  DType kv_type = DType::kF32;
  // Memory (bytes).
  uint64_t weights = 0;           // every tensor of the file
  uint64_t resident_weights = 0;  // kept in memory (all of them when resident)
  int n_slabs = 0;
  uint64_t slab_bytes = 0;
  int expert_slots = 0;
  uint64_t expert_slot_bytes = 0;
  uint64_t kv_cache = 0;
  uint64_t scratch = 0;           // the run's reserve less the KV cache
  uint64_t total = 0;
  int n_ops_streamed = 0;
  // Per decoded token.
  uint64_t touched_bytes = 0;     // weight bytes the forward pass reads (routed experts: the used ones)
  uint64_t disk_bytes = 0;        // of which read from disk (expected, experts at the cache's hit rate)
  uint64_t dense_disk_bytes = 0;  // of which streamed dense ops (read ahead of need)
  uint64_t expert_disk_bytes = 0; // of which routed experts the cache misses (read once routed)
  double expert_hit_rate = 0;     // expected (uniform routing: slots / routed experts, or known)
  // Where a known hit rate came from ("" = uniform routing): FitOptions::expert_hit_rate, or
  // the routing record a previous run of the file left (runtime/routing_record.h).
  std::string hit_rate_source;
  // Measured and predicted (measure).
  int threads = 0;
  double compute_seconds = 0;          // per token: the products at the model's shapes
  double compute_bytes_per_s = 0;      // the weight bytes those read over that time
  double dense_read_bytes_per_s = 0;   // the read worker's rate on the streamed ops (checks included)
  double expert_read_bytes_per_s = 0;  // ... on routed experts, one at a time, in no order
  uint64_t disk_probe_bytes = 0;       // read by those two probes
  bool disk_direct = false;
  double disk_seconds = 0;             // per token: dense and expert bytes at those rates
  double disk_bytes_per_s = 0;         // disk_bytes / disk_seconds
  double predicted_tokens_per_s = 0;   // 1 / (max(compute, dense reads) + expert reads)
  std::string bound;                   // "compute" or "disk"
  // Relaxing.
  uint64_t minimum_budget = 0;     // the smallest budget that runs out of core (0: none found)
  uint64_t resident_budget = 0;    // weights + reserve
  struct Relax {
    std::string what;
    uint64_t budget = 0;  // the smallest budget that runs with it
  };
  std::vector<Relax> relax;
  std::string command;   // how to run it
  std::string message;   // why not (impossible)
};

Expected<FitReport> PredictFit(const std::string& path, const FitOptions& options);
std::string FitVerdictName(FitReport::Verdict v);
std::string FitToJson(const FitReport& r);
std::string FitToText(const FitReport& r);

}  // namespace substrate
