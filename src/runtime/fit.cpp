#include "runtime/fit.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <nlohmann/json.hpp>

#include "core/aligned_buffer.h"
#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "kernels/matmul.h"
#include "model/hparams.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "runtime/read_probe.h"
#include "runtime/routing_record.h"
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

// Decode's matrix products per token, timed at the model's own shapes on the pool a run uses:
// every 2-D weight of every op a token runs, one GEMV each (a routed expert's op counts
// n_expert_used / experts-in-its-layer times, as the router picks that many of them). Each
// distinct (type, rows, cols) is timed, the median of 5 sweeps over all of them: a matrix above kRotate
// on a slice of its rows (time scaled by rows), a smaller one cycling through copies that together
// fill kRotate, so that, as in decode, its bytes come from memory and not from the cache.
struct ComputeProbe {
  double seconds = 0;  // per token
  uint64_t bytes = 0;  // weight bytes those products read
  int shapes = 0;      // distinct shapes timed
  double products = 0; // GEMVs per token
};
Expected<ComputeProbe> MeasureTokenCompute(const StoreIndex& index, const ModelHParams& hp,
                                           ThreadPool& pool) {
  constexpr uint64_t kRotate = 128ull << 20;  // well past a server's last-level cache
  struct Shape {
    DType type;
    int64_t rows, cols;
    auto operator<=>(const Shape&) const = default;
  };
  std::map<Shape, double> count;  // products per token
  const bool tied = index.FindOp("output") < 0;  // the head reads token_embd (tied embeddings)
  std::map<int, int> experts_in_layer;
  std::vector<int> expert_layer(index.ops().size(), -1);
  for (size_t o = 0; o < index.ops().size(); ++o) {
    const std::string& id = index.ops()[o].id;
    if (id.find(".moe.expert_") == std::string::npos) continue;
    const int layer = std::atoi(id.c_str() + id.find('_') + 1);  // block_L.moe.expert_E
    expert_layer[o] = layer;
    ++experts_in_layer[layer];
  }
  for (size_t o = 0; o < index.ops().size(); ++o) {
    const StoreOp& op = index.ops()[o];
    if (op.id == "token_embd" && !tied) continue;  // a token reads one row of it
    const double times = expert_layer[o] >= 0 ? static_cast<double>(std::max(hp.n_expert_used, 1)) /
                                                    experts_in_layer[expert_layer[o]]
                                              : 1.0;
    for (const auto& [id, slice] : op.units) {
      const TensorInfo& t = index.tensors()[id].info;
      if (t.ne.size() < 2) continue;
      count[{t.type, static_cast<int64_t>(t.ne[1]), static_cast<int64_t>(t.ne[0])}] += times;
    }
  }
  // One buffer, filled once, that every shape's copies are laid over.
  // Not zeros: a block whose scale is 0 could take a shorter path than real weights do.
  ASSIGN_OR_RETURN(AlignedBuffer w, AlignedBuffer::Allocate(kRotate));
  std::memset(w.data(), 0x11, kRotate);
  struct Timed {
    double n = 0;           // products per token
    uint64_t bytes = 0;     // of one product
    int64_t rows = 0;       // rows timed (a slice of a matrix above kRotate)
    std::vector<WeightView> copies;
    std::vector<double> samples;  // seconds per product of `rows` rows, one per sweep
  };
  std::vector<Timed> timed;
  size_t widest = 0, tallest = 0;
  for (const auto& [shape, n] : count) {
    auto row = RowBytes(shape.type, static_cast<uint64_t>(shape.cols));
    if (!row || *row == 0) continue;  // no kernel for it: not priced
    Timed t;
    t.n = n;
    t.bytes = *row * static_cast<uint64_t>(shape.rows);
    t.rows = t.bytes > kRotate ? std::max<int64_t>(1, kRotate / *row) : shape.rows;
    const uint64_t used = *row * static_cast<uint64_t>(t.rows);
    const uint64_t copies = std::max<uint64_t>(1, kRotate / used);
    for (uint64_t c = 0; c < copies; ++c) {
      WeightView v;
      v.type = shape.type;
      v.data = w.data() + used * c;
      v.bytes = used;
      v.rows = t.rows;
      v.cols = shape.cols;
      t.copies.push_back(v);
    }
    widest = std::max(widest, static_cast<size_t>(shape.cols));
    tallest = std::max(tallest, static_cast<size_t>(t.rows));
    timed.push_back(std::move(t));
  }
  std::vector<float> x(widest, 0.5f), y(tallest);
  // Sweeps over every shape, the median per shape: samples spread over time, as a decode's
  // products are, so the figure is the CPU a decode typically gets, not its best moment (the
  // best of them was 1.2-1.3x optimistic on a VM whose host takes some of its time).
  constexpr int kSweeps = 5;
  for (int sweep = 0; sweep < kSweeps; ++sweep) {
    for (Timed& t : timed) {
      if (sweep == 0)  // warms the pages and the pool
        for (const WeightView& v : t.copies) MatMul(v, x.data(), 1, y.data(), pool);
      const auto t0 = std::chrono::steady_clock::now();
      for (const WeightView& v : t.copies) MatMul(v, x.data(), 1, y.data(), pool);
      const double e = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      t.samples.push_back(e / static_cast<double>(t.copies.size()));
    }
  }
  ComputeProbe p;
  for (Timed& t : timed) {
    // (a slice's time scaled to the whole matrix)
    std::vector<double>& v = t.samples;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const double per =
        v[v.size() / 2] * static_cast<double>(t.bytes) / static_cast<double>(t.copies[0].bytes);
    p.seconds += per * t.n;
    p.bytes += static_cast<uint64_t>(static_cast<double>(t.bytes) * t.n);
    p.products += t.n;
    ++p.shapes;
  }
  if (p.shapes == 0) return InvalidArgument("no matrix product to time");
  return p;
}

// The out-of-core plan for `budget` (a dry run of the runtime), or its error.
struct OutOfCorePlan {
  ResidencyStats stats;
  ResidencyManager::ReadPrediction reads;
  std::vector<std::string> streamed_ops, expert_ops;  // reads' ops by id
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
  OutOfCorePlan p{m->stats(), m->PredictReads(), {}, {}};
  for (int o : p.reads.streamed_ops) p.streamed_ops.push_back(m->index().ops()[o].id);
  for (int o : p.reads.expert_ops) p.expert_ops.push_back(m->index().ops()[o].id);
  return p;
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
  std::vector<std::string> streamed_ids, expert_ids;  // the out-of-core plan's reads
  uint64_t dense = 0, expert_total = 0;
  int n_expert_ops = 0;
  for (const StoreTensor& t : index->tensors()) {
    r.weights += t.info.bytes;
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
      r.dense_disk_bytes = plan->reads.dense_bytes_per_token;
      r.expert_disk_bytes = plan->reads.expert_bytes_per_token;
      double known = o.expert_hit_rate;
      if (known >= 0) {
        r.hit_rate_source = "given (--expert-hit-rate)";
      } else if (auto rec = LoadRoutingRecord(path, st.expert_slots)) {
        known = rec->hit_rate;
        r.hit_rate_source = "measured by a previous run of this file (" + std::to_string(rec->uses) +
                            " expert uses, " + std::to_string(rec->expert_slots) + " slots)";
      }
      if (known >= 0 && plan->reads.routed_bytes_per_token > 0) {
        r.expert_hit_rate = std::min(1.0, known);
        r.expert_disk_bytes = static_cast<uint64_t>(
            static_cast<double>(plan->reads.routed_bytes_per_token) * (1 - r.expert_hit_rate));
        r.disk_bytes = r.dense_disk_bytes + r.expert_disk_bytes;
      }
      streamed_ids = plan->streamed_ops;
      expert_ids = plan->expert_ops;
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
    std::unique_ptr<ThreadPool> own;
    if (o.threads > 0) own = std::make_unique<ThreadPool>(o.threads);
    ThreadPool& pool = own ? *own : ThreadPool::Default();
    r.threads = pool.size();
    auto compute = MeasureTokenCompute(*index, hp, pool);
    if (compute.ok()) {
      r.compute_seconds = compute->seconds;
      r.compute_bytes_per_s = compute->bytes / compute->seconds;
    }
    // The disk as the runtime's read worker meets it: the plan's streamed ops in forward order,
    // and routed experts one at a time in no order (misses land anywhere in the file).
    if (r.verdict == FitReport::Verdict::kOutOfCore) {
      std::vector<int> dense_ops, expert_ops;
      for (const std::string& id : streamed_ids)
        if (int op = index->FindOp(id); op >= 0) dense_ops.push_back(op);
      for (const std::string& id : expert_ids)
        if (int op = index->FindOp(id); op >= 0) expert_ops.push_back(op);
      std::shuffle(expert_ops.begin(), expert_ops.end(), std::mt19937(14));
      // The read rate of `ops` (0 when there is nothing to read or the probe fails).
      auto probe = [&](const std::vector<int>& ops, uint64_t bytes, double warmup,
                       uint64_t min_bytes, double min_seconds, uint64_t max_bytes) -> double {
        if (bytes == 0 || ops.empty()) return 0;
        auto p = ProbeOpReads(*index, ops, warmup, min_bytes, min_seconds, max_bytes,
                              64ull << 20, IoMode::kAuto, nullptr);
        if (!p.ok()) return 0;
        r.disk_direct = p->direct;
        r.disk_probe_bytes += p->bytes;
        return p->bytes_per_s;
      };
      r.dense_read_bytes_per_s = probe(dense_ops, r.dense_disk_bytes, 1.0, 1ull << 30, 2.0, 6ull << 30);
      r.expert_read_bytes_per_s =
          probe(expert_ops, r.expert_disk_bytes, 0.5, 256ull << 20, 1.0, 1ull << 30);
    }
    if (r.verdict != FitReport::Verdict::kImpossible && r.compute_seconds > 0) {
      const double dense_s =
          r.dense_disk_bytes > 0 && r.dense_read_bytes_per_s > 0 ? r.dense_disk_bytes / r.dense_read_bytes_per_s : 0;
      const double expert_s =
          r.expert_disk_bytes > 0 && r.expert_read_bytes_per_s > 0 ? r.expert_disk_bytes / r.expert_read_bytes_per_s : 0;
      r.disk_seconds = dense_s + expert_s;
      if (r.disk_seconds > 0) r.disk_bytes_per_s = r.disk_bytes / r.disk_seconds;
      // Dense ops are read prefetch_depth ops ahead, during the compute of the ops before them.
      // A routed expert's read starts once its layer's router (or the look-ahead's guess one
      // layer ahead) picks it, and the layer's products wait for it: on the MoE out of core
      // the decode took compute + expert reads at the probe's rate (0.78-1.17x of it in five
      // runs), where max(compute, reads) was 1.2-2x optimistic.
      const double token_s = std::max(r.compute_seconds, dense_s) + expert_s;
      r.bound = dense_s + expert_s > r.compute_seconds ? "disk" : "compute";
      r.predicted_tokens_per_s = 1.0 / token_s;
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
  j["per_token"] = {{"weight_bytes", r.touched_bytes},
                    {"disk_bytes", r.disk_bytes},
                    {"dense_disk_bytes", r.dense_disk_bytes},
                    {"expert_disk_bytes", r.expert_disk_bytes},
                    {"expert_hit_rate", r.expert_hit_rate}};
  if (!r.hit_rate_source.empty())
    j["per_token"]["assumption"] = "expert cache hit rate " + r.hit_rate_source;
  else if (r.expert_disk_bytes > 0 || r.expert_hit_rate > 0)
    j["per_token"]["assumption"] =
        "uniform routing: each routed expert is in the cache with probability slots / experts";
  j["measured"] = {{"threads", r.threads},
                   {"compute_seconds_per_token", r.compute_seconds},
                   {"compute_bytes_per_s", r.compute_bytes_per_s},
                   {"dense_read_bytes_per_s", r.dense_read_bytes_per_s},
                   {"expert_read_bytes_per_s", r.expert_read_bytes_per_s},
                   {"disk_probe_bytes", r.disk_probe_bytes},
                   {"disk_direct", r.disk_direct},
                   {"disk_bytes_per_s", r.disk_bytes_per_s},
                   {"method",
                    "compute: one GEMV per weight of a token at its shape, on the run's threads, "
                    "median of 5 sweeps; disk: the plan's streamed ops in order (1 s warm-up, then "
                    "at least 1 GiB and 2 s) and routed experts in no order (0.5 s, then 256 MiB "
                    "and 1 s), O_DIRECT through the runtime's reader, CRC32C after each op as "
                    "its worker does"}};
  j["predicted"] = {{"tokens_per_s", r.predicted_tokens_per_s},
                    {"bound", r.bound},
                    {"compute_seconds", r.compute_seconds},
                    {"disk_seconds", r.disk_seconds},
                    {"model", "max(compute, dense reads) + expert reads: dense reads run "
                              "ahead during compute, a routed expert's products wait for its "
                              "read"}};
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
                  "  predicted decode: %.2f tokens/s, bound by %s (compute %.0f ms/token on %d "
                  "threads, %.1f GB/s of weights; disk %.0f ms/token",
                  r.predicted_tokens_per_s, r.bound.c_str(), 1e3 * r.compute_seconds, r.threads,
                  r.compute_bytes_per_s / 1e9, 1e3 * r.disk_seconds);
    s += b;
    if (r.dense_read_bytes_per_s > 0) {
      std::snprintf(b, sizeof b, ", streamed ops read at %.2f GB/s", r.dense_read_bytes_per_s / 1e9);
      s += b;
    }
    if (r.expert_read_bytes_per_s > 0) {
      std::snprintf(b, sizeof b, ", experts read at %.2f GB/s", r.expert_read_bytes_per_s / 1e9);
      s += b;
    }
    s += ")\n";
    if (r.expert_disk_bytes > 0 && r.hit_rate_source.empty())
      s += "  assumes uniform routing (expert hits = cache slots / experts); a router that keeps "
           "to a few experts reads less and runs faster (a run of the file measures it for the "
           "next answer)\n";
    else if (!r.hit_rate_source.empty())
      s += "  expert cache hit rate " + r.hit_rate_source + "\n";
  }
  if (!r.command.empty()) s += "  run it: " + r.command + "\n";
  return s;
}

}  // namespace substrate
