// Shared by the runtime tests: the packed tiny-coder-moe store's data size, and compiled plans
// for it that stream some op kinds and keep the rest resident.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "compiler/plan_bundle.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "store/store_fixture.h"
#include "store/store_index.h"

namespace substrate::testing {

// Bytes of a store's data files (*.bin); 0 without the store (its fixture is missing, and the
// test using it skips).
inline uint64_t StoreDataBytes(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".bin") n += std::filesystem::file_size(e.path());
  return n;
}

struct PlanCounts {
  int streamed = 0, resident = 0;
};

// A plan for PackedTinyMoeStore(), saved as StoreTestPath(name): the ops of kinds `streamed`
// accepts are streamed (evicted after themselves, stalling when late), the others resident;
// `start_during(op)` gives a streamed op's prefetch start op, nullopt for no prefetch entry;
// `fallback` is what a streamed op does when its read is late. Routed experts are left to the
// expert cache.
inline Expected<std::string> WriteTinyMoePlan(
    const std::function<bool(OpKind)>& streamed,
    const std::function<std::optional<std::string>(const std::string&)>& start_during,
    const std::string& name, PlanCounts* counts = nullptr,
    compiler::FallbackStrategy fallback = compiler::FallbackStrategy::kStall) {
  ASSIGN_OR_RETURN(auto index, StoreIndex::Open(PackedTinyMoeStore()));
  ASSIGN_OR_RETURN(ModelHParams hp, ModelHParams::FromMetadata(index->meta().metadata()));
  compiler::PlanBundle plan;
  plan.model_id = "tiny-coder-moe";
  plan.budget.max_ram_bytes = 1ull << 40;
  plan.escalation_policy.max_concurrent_escalations = 0;
  auto has = [&](const std::string& n) { return index->Resolve(n) != kNoTensor; };
  for (const OpSpec& op : ListOps(hp, has)) {
    const int o = index->FindOp(op.id);
    if (o < 0 || op.kind == OpKind::kMoeExpert) continue;
    const bool stream = streamed(op.kind);
    if (counts) (stream ? counts->streamed : counts->resident)++;
    compiler::CatalogTensor t;
    t.id = op.id + ".skeleton";
    t.op_id = op.id;
    t.precision = "keep";
    t.ram_bytes = t.ssd_bytes = index->ops()[o].SlabBytes(2);
    t.residency = stream ? compiler::Residency::kStreamed : compiler::Residency::kResident;
    plan.tensor_catalog.push_back(t);
    compiler::OpBundle b;
    b.op_id = op.id;
    compiler::Tier tier;
    tier.precision = "keep";
    tier.requires_ = {t.id};
    if (stream) {
      tier.evict_after = {t.id};
      tier.fallback = fallback;
      if (auto start = start_during(op.id)) tier.prefetch = {{t.id, *start, op.id}};
    }
    b.tiers = {tier};
    plan.op_bundles.push_back(b);
  }
  ASSIGN_OR_RETURN(compiler::PlanBundle made, compiler::PlanBundle::Create(plan));
  const std::string path = StoreTestPath(name);
  RETURN_IF_ERROR(compiler::SavePlan(made, path));
  return path;
}

}  // namespace substrate::testing
