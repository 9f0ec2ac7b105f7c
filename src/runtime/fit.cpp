#include "runtime/fit.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "compiler/hardware.h"
#include "core/aligned_buffer.h"
#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "kernels/matmul.h"
#include "model/hparams.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "runtime/residency_manager.h"

namespace substrate {
namespace {

using nlohmann::json;

uint64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// Decode's GEMV over `type` rows of n_embd columns, ~64 MiB of weights, on the default pool:
// the weight bytes per second the CPU turns into outputs (decode's compute bound).
Expected<double> MeasureGemv(DType type, int64_t cols) {
  auto row = RowBytes(type, static_cast<uint64_t>(cols));
  if (!row || *row == 0) return InvalidArgument("no GEMV probe for this type");
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>((64ull << 20) / *row));
  ASSIGN_OR_RETURN(AlignedBuffer w, AlignedBuffer::Allocate(*row * rows));
  // Not zeros: a block whose scale is 0 could take a shorter path than real weights do.
  std::memset(w.data(), 0x11, *row * rows);
  WeightView v;
  v.type = type;
  v.data = w.data();
  v.bytes = *row * rows;
  v.rows = rows;
  v.cols = cols;
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  ThreadPool& pool = ThreadPool::Default();
  MatMul(v, x.data(), 1, y.data(), pool);  // warm
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    MatMul(v, x.data(), 1, y.data(), pool);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(v.bytes) / best;
}

// The out-of-core plan for `budget` (a dry run of the runtime), or its error.
struct OutOfCorePlan {
  ResidencyStats stats;
  ResidencyManager::ReadPrediction reads;
};
Expected<OutOfCorePlan> PlanOutOfCore(const std::string& path, uint64_t budget, uint64_t reserve,
                                      int depth) {
  MemoryLedger ledger;
  ResidencyOptions ro;
  ro.budget_bytes = budget;
  ro.reserve_bytes = reserve;
  ro.prefetch_depth = depth;
  ro.dry_run = true;
  ASSIGN_OR_RETURN(auto m, ResidencyManager::OpenGguf(path, &ledger, ro));
  return OutOfCorePlan{m->stats(), m->PredictReads()};
}

// The smallest budget in [lo, hi] whose plan succeeds (hi must succeed), to 256 KiB.
uint64_t SmallestBudget(const std::string& path, uint64_t lo, uint64_t hi, uint64_t reserve,
                        int depth) {
  while (hi - lo > (256ull << 10)) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (PlanOutOfCore(path, mid, reserve, depth).ok()) hi = mid; else lo = mid;
  }
  return hi;
}

std::string Gb(uint64_t b) { return FormatBytes(b); }

// A budget as --max-ram takes it: whole MiB where it is one, else bytes.
std::string Flag(uint64_t b) {
  return b % (1ull << 20) == 0 ? std::to_string(b >> 20) + "M" : std::to_string(b);
}

}  // namespace

std::string FitVerdictName(FitReport::Verdict v) {
  switch (v) {
    case FitReport::Verdict::kResident: return "resident";
    case FitReport::Verdict::kOutOfCore: return "out_of_core";
    default: return "impossible";
  }
}

Expected<FitReport> PredictFit(const std::string& path, const FitOptions& o) {
  FitReport r;
  r.path = path;
  ASSIGN_OR_RETURN(auto file, ModelFile::Open(path));
  ASSIGN_OR_RETURN(ModelHParams hp, ModelHParams::FromMetadata(file->metadata()));
  r.budget = o.max_ram;
  if (r.budget == 0) {
    r.budget = MemAvailable();
    r.budget_from_machine = true;
    if (r.budget == 0) return InvalidArgument("cannot read the available memory: give --max-ram");
  }
  r.n_ctx = o.n_ctx > 0 ? o.n_ctx : std::min<int64_t>(hp.n_ctx_train, 4096);
  r.kv_type = o.kv_type;
  r.kv_cache = KvCache::Bytes(hp, r.n_ctx, o.kv_type);
  const uint64_t reserve =
      EstimateRunReserve(hp, r.n_ctx, std::min<int64_t>(r.n_ctx, Model::kMaxBatch), o.kv_type);
  r.scratch = reserve - r.kv_cache;

  // The op table (no weight read, no checksum): bytes per op, which ones are experts.
  StoreIndexOptions io;
  io.max_tier = 0;
  io.checksums = false;
  ASSIGN_OR_RETURN(auto index, StoreIndex::OpenGguf(path, io));
  uint64_t dense = 0, expert_total = 0;
  int n_expert_ops = 0;
  std::map<DType, uint64_t> by_type;
  for (const StoreTensor& t : index->tensors()) {
    r.weights += t.info.bytes;
    if (t.info.ne.size() >= 2) by_type[t.info.type] += t.info.bytes;
  }
  for (const StoreOp& op : index->ops()) {
    const uint64_t b = op.SlabBytes(0);
    if (op.id.find(".moe.expert_") != std::string::npos) {
      expert_total += b;
      ++n_expert_ops;
    } else if (op.id != "token_embd") {  // a decoded token reads one row of the embedding
      dense += b;
    }
  }
  const double expert_avg = n_expert_ops ? static_cast<double>(expert_total) / n_expert_ops : 0;
  const double experts_per_token =
      n_expert_ops ? static_cast<double>(hp.n_layer) * std::max(hp.n_expert_used, 1) : 0;
  // A decoded token reads the dense ops and the used experts (the embedding: one row, unless the
  // output head reads the table too, in which case its op holds it: counted in `dense` then).
  r.touched_bytes = dense + static_cast<uint64_t>(experts_per_token * expert_avg);
  r.resident_budget = r.weights + reserve;
  const std::string base = "substrate run -m " + path + " -c " + std::to_string(r.n_ctx);

  if (r.weights + reserve <= r.budget) {
    r.verdict = FitReport::Verdict::kResident;
    r.resident_weights = r.weights;
    r.total = r.weights + reserve;
    r.command = base + (o.max_ram ? " --max-ram " + Flag(o.max_ram) : "");
  } else {
    auto plan = PlanOutOfCore(path, r.budget, reserve, o.prefetch_depth);
    if (plan.ok()) {
      r.verdict = FitReport::Verdict::kOutOfCore;
      const ResidencyStats& st = plan->stats;
      r.resident_weights = st.resident_bytes;
      r.n_slabs = st.n_slabs;
      r.slab_bytes = st.slab_bytes;
      r.expert_slots = st.expert_slots;
      r.expert_slot_bytes = st.expert_slot_bytes;
      r.n_ops_streamed = st.n_ops_streamed;
      r.total = r.resident_weights + r.slab_bytes * r.n_slabs +
                r.expert_slot_bytes * r.expert_slots + reserve;
      // The runtime's own prediction for the plan (what --print-plan shows).
      r.expert_hit_rate = plan->reads.expert_hit_rate;
      r.disk_bytes = plan->reads.bytes_per_token;
      r.command = base + " --max-ram " + Flag(r.budget);
    } else {
      r.verdict = FitReport::Verdict::kImpossible;
      r.message = plan.status().message();
    }
    // The smallest budget that runs out of core (a search over dry runs of the plan).
    const uint64_t hi = r.weights + reserve;
    if (PlanOutOfCore(path, hi, reserve, o.prefetch_depth).ok())
      r.minimum_budget = SmallestBudget(path, reserve, hi, reserve, o.prefetch_depth);
    if (r.verdict == FitReport::Verdict::kImpossible) {
      if (r.minimum_budget) r.relax.push_back({"a budget of at least " + Gb(r.minimum_budget) + " (out of core)", r.minimum_budget});
      r.relax.push_back({"a budget of " + Gb(r.resident_budget) + " (resident)", r.resident_budget});
      for (int64_t c : {r.n_ctx / 4, int64_t{512}}) {
        if (c >= r.n_ctx || c < 64) continue;
        const uint64_t res_c =
            EstimateRunReserve(hp, c, std::min<int64_t>(c, Model::kMaxBatch), o.kv_type);
        if (PlanOutOfCore(path, r.budget, res_c, o.prefetch_depth).ok()) {
          r.relax.push_back({"a context of " + std::to_string(c) + " tokens (-c " + std::to_string(c) + ") runs under this budget", r.budget});
          break;
        }
      }
      if (o.kv_type == DType::kF32)
        r.relax.push_back({"--kv-type f16 halves the KV cache (" + Gb(r.kv_cache) + " now)", 0});
      r.relax.push_back({"a lower-bit copy (substrate quantize --type Q4_K_M, or substrate pack "
                         "--skeleton Q4_K) shrinks every op and the minimum with it", 0});
    }
  }

  if (o.measure) {
    // The largest file: a split GGUF's first part may hold little beside the metadata.
    int largest = 0;
    for (int i = 1; i < file->n_files(); ++i)
      if (file->file(i).size() > file->file(largest).size()) largest = i;
    auto disk = compiler::MeasureFileReadBandwidth(file->file(largest).path(), 256ull << 20);
    if (disk.ok()) {
      r.disk_bytes_per_s = disk->bytes_per_second;
      r.disk_direct = disk->direct_io;
    }
    DType main = DType::kF32;
    uint64_t most = 0;
    for (const auto& [t, b] : by_type)
      if (b > most) most = b, main = t;
    auto gemv = MeasureGemv(main, hp.n_embd);
    if (gemv.ok()) r.compute_bytes_per_s = *gemv;
    if (r.verdict != FitReport::Verdict::kImpossible && r.compute_bytes_per_s > 0 && r.touched_bytes > 0) {
      const double compute_s = r.touched_bytes / r.compute_bytes_per_s;
      const double disk_s = r.disk_bytes > 0 && r.disk_bytes_per_s > 0 ? r.disk_bytes / r.disk_bytes_per_s : 0;
      r.bound = disk_s > compute_s ? "disk" : "compute";
      r.predicted_tokens_per_s = 1.0 / std::max(compute_s, disk_s);
    }
  }
  return r;
}

std::string FitToJson(const FitReport& r) {
  json j;
  j["model"] = r.path;
  j["verdict"] = FitVerdictName(r.verdict);
  j["budget"] = r.budget;
  j["budget_source"] = r.budget_from_machine ? "MemAvailable" : "--max-ram";
  j["n_ctx"] = r.n_ctx;
  j["kv_type"] = DTypeName(r.kv_type);
  j["memory"] = {{"weights", r.weights},
                 {"resident_weights", r.resident_weights},
                 {"slabs", {{"count", r.n_slabs}, {"bytes", r.slab_bytes}}},
                 {"expert_cache", {{"slots", r.expert_slots}, {"slot_bytes", r.expert_slot_bytes}}},
                 {"kv_cache", r.kv_cache},
                 {"scratch", r.scratch},
                 {"total", r.total}};
  j["per_token"] = {{"weight_bytes", r.touched_bytes}, {"disk_bytes", r.disk_bytes},
                    {"expert_hit_rate", r.expert_hit_rate}};
  j["measured"] = {{"disk_bytes_per_s", r.disk_bytes_per_s}, {"disk_direct", r.disk_direct},
                   {"compute_bytes_per_s", r.compute_bytes_per_s}};
  j["predicted"] = {{"tokens_per_s", r.predicted_tokens_per_s}, {"bound", r.bound}};
  j["minimum_budget"] = r.minimum_budget;
  j["resident_budget"] = r.resident_budget;
  json relax = json::array();
  for (const auto& x : r.relax) relax.push_back({{"what", x.what}, {"budget", x.budget}});
  j["relax"] = relax;
  if (!r.command.empty()) j["command"] = r.command;
  if (!r.message.empty()) j["message"] = r.message;
  return j.dump(2) + "\n";
}

std::string FitToText(const FitReport& r) {
  std::string s;
  char b[512];
  std::snprintf(b, sizeof b, "%s under %s%s, context %lld (%s KV):\n", r.path.c_str(),
                Gb(r.budget).c_str(), r.budget_from_machine ? " (available memory)" : "",
                static_cast<long long>(r.n_ctx), DTypeName(r.kv_type));
  s += b;
  if (r.verdict == FitReport::Verdict::kResident) {
    s += "  fits resident: weights " + Gb(r.weights) + " + KV cache " + Gb(r.kv_cache) +
         " + scratch " + Gb(r.scratch) + " = " + Gb(r.total) + "\n";
  } else if (r.verdict == FitReport::Verdict::kOutOfCore) {
    std::snprintf(b, sizeof b,
                  "  runs out of core, read in place: %s of %s weights resident, %d slabs of %s, "
                  "%d expert slots of %s, KV cache %s, scratch %s (total %s)\n"
                  "  per token: %s of weights, %s from disk (expert cache hit rate %.0f%%)\n",
                  Gb(r.resident_weights).c_str(), Gb(r.weights).c_str(), r.n_slabs,
                  Gb(r.slab_bytes).c_str(), r.expert_slots, Gb(r.expert_slot_bytes).c_str(),
                  Gb(r.kv_cache).c_str(), Gb(r.scratch).c_str(), Gb(r.total).c_str(),
                  Gb(r.touched_bytes).c_str(), Gb(r.disk_bytes).c_str(), 100 * r.expert_hit_rate);
    s += b;
  } else {
    s += "  does not run: " + r.message + "\n";
    for (const auto& x : r.relax) s += "  - " + x.what + "\n";
  }
  if (r.predicted_tokens_per_s > 0) {
    std::snprintf(b, sizeof b,
                  "  predicted decode: %.2f tokens/s, bound by %s (disk %.2f GB/s%s, compute %.2f GB/s of weights)\n",
                  r.predicted_tokens_per_s, r.bound.c_str(), r.disk_bytes_per_s / 1e9,
                  r.disk_direct ? " O_DIRECT" : " buffered", r.compute_bytes_per_s / 1e9);
    s += b;
  }
  if (!r.command.empty()) s += "  run it: " + r.command + "\n";
  return s;
}

}  // namespace substrate
