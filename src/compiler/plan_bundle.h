// PlanBundle: the compiler's output and the runtime's only instructions (DESIGN.md, "The
// PlanBundle"). A plan that constructs or loads is a guarantee: under its escalation policy's
// max_concurrent escalations it cannot exceed budget.max_ram_bytes.
//
// Invariants (Validate() checks all of them; PlanBundle::Create and PlanFromJson refuse a plan
// that fails one, and the error names the invariant and the op):
//   references-resolve     every requires / prefetch / evict_after names a catalog tensor, and
//                          every tensor an op's tier needs appears in its requires
//   prefetch-order         a prefetch's start_during op comes before its deadline_before op in
//                          topological order; the deadline is the op itself
//   default-path-fits      overhead + resident tensors + the largest set of streamed tier-0
//                          tensors alive at once (prefetch window to evict) <= max_ram_bytes
//   risk-monotone          per op, estimated_quality_risk does not rise with tier index
//   delta-monotone         per op, peak_ram_delta_bytes does not fall with tier index, tier 0 is 0,
//                          and each delta covers the streamed residual bytes that tier loads
//   pool-fits-budget       default path peak + escalation_ram_pool_bytes <= max_ram_bytes
//   pool-k-tier1           the K largest tier-1 deltas fit escalation_ram_pool_bytes
//   pool-k-ceiling         the K largest top-tier deltas fit too (any K escalations, any tier)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/dtype.h"

namespace substrate::compiler {

inline constexpr int kPlanSchemaVersion = 1;
inline constexpr const char* kPlanSchemaName = "substrate.plan_bundle";

struct Budget {
  uint64_t max_ram_bytes = 0;
  uint64_t max_ssd_cache_bytes = 0;        // 0: unlimited
  double ssd_read_bw = 0;                  // sustained, bytes/s (measured)
  double memory_read_bw = 0;               // bytes/s (measured)
  double quality_loss_cap = 0;             // mean KLD, additive estimate
  double target_tokens_per_second = 0;
};

enum class Residency { kResident, kStreamed };

// One tensor at one tier: the skeleton (tier 0) or the residual that tier k adds.
struct CatalogTensor {
  std::string id;          // "block_5.attn.skeleton", "block_5.attn.residual_1"
  std::string op_id;
  int tier = 0;
  std::string precision;   // type name the tier reaches ("Q4_K")
  uint64_t ram_bytes = 0;  // bytes once in memory
  uint64_t ssd_bytes = 0;  // bytes read from the store (4 KiB aligned for direct I/O)
  Residency residency = Residency::kResident;
  std::vector<std::string> source_tensors;  // GGUF names (with "#slice" for experts)
};

struct Prefetch {
  std::string tensor;           // catalog id
  std::string start_during;     // op id whose compute window issues the read; "" = token start
  std::string deadline_before;  // op id that needs it
};

enum class FallbackStrategy { kNone, kStall, kUseLowerTier };

struct Tier {
  int tier_index = 0;
  std::string precision;
  std::vector<std::string> requires_;  // catalog ids resident at op entry (`requires` is a keyword)
  std::vector<Prefetch> prefetch;
  std::vector<std::string> evict_after;
  FallbackStrategy fallback = FallbackStrategy::kNone;
  double estimated_quality_risk = 0;
  uint64_t peak_ram_delta_bytes = 0;
};

struct OpBundle {
  std::string op_id;
  double activation_prob = 1.0;
  std::vector<Tier> tiers;  // 1 to 3: default, escalation, ceiling
};

struct EscalationPolicy {
  double disagreement_threshold = 0.15;
  int persistence_tokens = 32;
  int max_concurrent_escalations = 4;
};

struct FallbackPolicy {
  FallbackStrategy deadline_miss = FallbackStrategy::kUseLowerTier;
  double latency_critical_factor = 2.0;  // measured/predicted latency that forces demote-all
  double ssd_bw_critical_factor = 0.5;   // measured/predicted SSD bandwidth that does the same
};

// What the compiler predicted for the default path; informative (the loader recomputes what it
// relies on).
struct PlanPrediction {
  double quality_loss = 0;
  double tokens_per_second = 0;
  double ssd_bytes_per_token = 0;
  uint64_t default_peak_ram_bytes = 0;
  // The rate-distortion curve the greedy fill walked: (resident+window bytes, quality loss).
  std::vector<std::pair<uint64_t, double>> rd_curve;
};

struct PlanBundle {
  std::string model_id;
  Budget budget;
  uint64_t overhead_bytes = 0;  // KV cache, scratch, unplanned tensors: always resident
  std::vector<CatalogTensor> tensor_catalog;
  std::vector<OpBundle> op_bundles;  // topological order
  EscalationPolicy escalation_policy;
  FallbackPolicy fallback_policy;
  uint64_t escalation_ram_pool_bytes = 0;
  PlanPrediction predicted;

  // Validates and returns the plan, or the first broken invariant.
  static Expected<PlanBundle> Create(PlanBundle plan);
  const OpBundle* Bundle(const std::string& op_id) const;
};

// Every invariant; "invariant <name> broken at op '<id>': ..." on failure.
Status Validate(const PlanBundle& plan);

// Computed from the catalog and prefetch windows, never taken from the file.
struct PlanFootprint {
  uint64_t resident_bytes = 0;      // overhead + resident tensors
  uint64_t stream_window_bytes = 0; // most streamed tier-0 bytes alive at once
  uint64_t default_peak_bytes = 0;  // the two above
  std::string window_peak_op;
};
Expected<PlanFootprint> ComputeFootprint(const PlanBundle& plan);

// Sum of the k largest values (k >= size: all of them).
uint64_t SumOfKLargest(std::vector<uint64_t> values, int k);

const char* ResidencyName(Residency r);
const char* FallbackName(FallbackStrategy f);

// Tier-0 precision of every source tensor (GGUF name) of a plan: what `substrate quantize
// --plan` writes. Expert slices of one 3-D tensor that disagree take the most precise type
// (reported in `note`). PlanToJson also writes this table as "tensor_types".
Expected<std::map<std::string, DType>> PlanTensorTypes(const PlanBundle& plan, std::string* note = nullptr);

std::string PlanToJson(const PlanBundle& plan);
// Parses and validates; a malformed document or a broken invariant is an error naming it.
Expected<PlanBundle> PlanFromJson(const std::string& text);
Expected<PlanBundle> LoadPlan(const std::string& path);
Status SavePlan(const PlanBundle& plan, const std::string& path);  // AtomicFileWriter

}  // namespace substrate::compiler
