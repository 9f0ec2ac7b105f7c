// ResidencyManager::PlanText: the plan chosen at open, as `--print-plan` shows it.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "model/op_id.h"
#include "runtime/residency_manager.h"

namespace substrate {
namespace {

const char* KindName(int kind) {
  switch (kind) {
    case static_cast<int>(OpKind::kTokenEmbd): return "token embedding";
    case static_cast<int>(OpKind::kAttention): return "attention";
    case static_cast<int>(OpKind::kFfn): return "dense FFN";
    case static_cast<int>(OpKind::kMoeRouter): return "MoE router";
    case static_cast<int>(OpKind::kMoeExpert): return "routed experts";
    case static_cast<int>(OpKind::kMoeShared): return "shared experts";
    case static_cast<int>(OpKind::kOutput): return "output";
    case static_cast<int>(OpKind::kNextn): return "next-n head";
    default: return "other";
  }
}

struct KindBytes {
  int ops = 0;
  uint64_t bytes = 0;
};

// "attention 4.0 MiB (4 ops), output 1.0 MiB (1 op)", kinds in forward order, "other" last.
std::string KindList(const std::map<int, KindBytes>& kinds) {
  std::string s;
  auto add = [&](int kind, const KindBytes& k) {
    s += std::string(s.empty() ? "" : ", ") + KindName(kind) + " " + FormatBytes(k.bytes) + " (" +
         std::to_string(k.ops) + (k.ops == 1 ? " op)" : " ops)");
  };
  for (const auto& [kind, k] : kinds)
    if (kind >= 0) add(kind, k);
  if (auto it = kinds.find(-1); it != kinds.end()) add(-1, it->second);
  return s.empty() ? "none" : s;
}

}  // namespace

ResidencyManager::ReadPrediction ResidencyManager::PredictReads() const {
  ReadPrediction r;
  uint64_t expert_bytes = 0;
  int n_expert = 0;
  std::set<int> moe_layers;
  for (size_t i = 0; i < st_.size(); ++i) {
    const OpState& s = st_[i];
    // The embedding read by rows reads a block or two a token: left out, as the reserve is.
    if (s.where == Where::kUnused || s.where == Where::kRows) continue;
    if (s.where == Where::kExpert) {
      expert_bytes += OpBytes(static_cast<int>(i));
      ++n_expert;
      moe_layers.insert(s.layer);
      r.expert_ops.push_back(static_cast<int>(i));
    } else if (serve_ > s.resident_top) {
      // Every dense op runs every token: a streamed one (or a resident one's higher tiers) is read.
      r.dense_bytes_per_token += StreamedBytes(static_cast<int>(i));
    }
  }
  for (int o : seq_)
    if (serve_ > st_[o].resident_top) r.streamed_ops.push_back(o);
  if (n_expert > 0) {
    r.expert_hit_rate = std::min(1.0, static_cast<double>(stats_.expert_slots) / n_expert);
    const double used = static_cast<double>(moe_layers.size()) * std::max(hp_.n_expert_used, 1);
    const double routed = used * (static_cast<double>(expert_bytes) / n_expert);
    r.routed_bytes_per_token = static_cast<uint64_t>(routed);
    r.expert_bytes_per_token = static_cast<uint64_t>(routed * (1 - r.expert_hit_rate));
  }
  r.bytes_per_token = r.dense_bytes_per_token + r.expert_bytes_per_token;
  return r;
}

std::string ResidencyManager::PlanText() const {
  std::map<int, KindBytes> resident, streamed;
  uint64_t resident_bytes = 0, streamed_bytes = 0, expert_bytes = 0;
  int n_expert = 0;
  for (size_t i = 0; i < st_.size(); ++i) {
    const int o = static_cast<int>(i);
    const OpState& s = st_[i];
    if (s.where == Where::kUnused || s.where == Where::kRows) continue;
    if (s.where == Where::kExpert) {
      expert_bytes += OpBytes(o);
      ++n_expert;
    } else if (s.where == Where::kResident) {
      KindBytes& k = resident[s.kind];
      ++k.ops;
      k.bytes += ResidentBytes(o);
      resident_bytes += ResidentBytes(o);
    } else {
      KindBytes& k = streamed[s.kind];
      ++k.ops;
      k.bytes += StreamedBytes(o);
      streamed_bytes += StreamedBytes(o);
    }
  }
  const ReadPrediction reads = PredictReads();

  std::string source;
  if (index_->gguf_path().empty()) {
    source = "store '" + index_->dir() + "', tier " + std::to_string(serve_);
  } else {
    const int n_files = static_cast<int>(index_->n_files());
    source = "'" + index_->meta().path() + "'" +
             (n_files > 1 ? " (split in " + std::to_string(n_files) + " files)" : "") +
             " read in place";
  }
  std::string t = "plan (" +
                  (options_.plan_path.empty() ? std::string("automatic") : options_.plan_path) +
                  ") for " + source + ", budget " + FormatBytes(budget_) + ":\n";
  t += "  resident        " + FormatBytes(resident_bytes) + ": " + KindList(resident) + "\n";
  char b[256];
  if (streamed.empty()) {
    t += "  streamed        none: every op but the routed experts is resident\n";
  } else {
    t += "  streamed        " + FormatBytes(streamed_bytes) + ": " + KindList(streamed) + "\n";
    std::snprintf(b, sizeof b, "  slabs           %d of %s, reads issued %d streamed ops ahead%s\n",
                  stats_.n_slabs, FormatBytes(stats_.slab_bytes).c_str(), options_.prefetch_depth,
                  plan_schedules_ ? " (or where the plan's prefetch says)" : "");
    t += b;
  }
  if (rows_op_ >= 0) {
    std::snprintf(b, sizeof b, "  read by rows    %s: '%s', a %s block or two a token\n",
                  FormatBytes(stats_.rows_op_bytes).c_str(), index_->ops()[rows_op_].id.c_str(),
                  FormatBytes(RowReader::kBlockBytes).c_str());
    t += b;
  }
  if (n_expert > 0) {
    std::snprintf(b, sizeof b,
                  "  expert cache    %d slots of %s for %d routed experts (%s), %s, guessing %d "
                  "layer%s ahead\n",
                  stats_.expert_slots, FormatBytes(stats_.expert_slot_bytes).c_str(), n_expert,
                  FormatBytes(expert_bytes).c_str(),
                  stats_.expert_policy == ExpertCache::Policy::kLru ? "least recently used"
                                                                    : "decayed use counts",
                  stats_.lookahead_layers, stats_.lookahead_layers == 1 ? "" : "s");
    t += b;
  }
  t += "  reserve         " + FormatBytes(options_.reserve_bytes) + " (KV cache and scratch)\n";
  std::snprintf(b, sizeof b, "  per token       %s read from disk (predicted%s)\n",
                FormatBytes(reads.bytes_per_token).c_str(),
                n_expert > 0 ? (", expert cache hit rate " +
                                std::to_string(static_cast<int>(100 * reads.expert_hit_rate)) +
                                "% under uniform routing").c_str()
                             : "");
  t += b;
  return t;
}

}  // namespace substrate
