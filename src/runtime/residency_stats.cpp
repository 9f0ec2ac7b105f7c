// ResidencyManager's counters and the run reserve estimate (kept apart from the streaming logic).
#include <algorithm>
#include <cstdio>

#include "model/kv_cache.h"
#include "runtime/residency_manager.h"

namespace substrate {

uint64_t EstimateRunReserve(const ModelHParams& hp, int64_t n_ctx, int64_t n_batch,
                            DType kv_type) {
  const uint64_t ctx = static_cast<uint64_t>(std::max<int64_t>(n_ctx, 1));
  const uint64_t kv = KvCache::Bytes(hp, static_cast<int64_t>(ctx), kv_type);
  const uint64_t ff = static_cast<uint64_t>(
      std::max({hp.n_ff, hp.n_ff_exp * std::max(hp.n_expert_used, 1), hp.n_ff_shexp, int64_t{1}}));
  const uint64_t b = static_cast<uint64_t>(std::max<int64_t>(n_batch, 1));
  const uint64_t per_token = 8 * static_cast<uint64_t>(hp.n_embd) + 4 * ff +
                             4 * static_cast<uint64_t>(hp.n_head) * (hp.head_dim_k + hp.head_dim_v) +
                             static_cast<uint64_t>(hp.n_head) * ctx;
  return kv + b * per_token * 4 + 2 * static_cast<uint64_t>(hp.n_vocab) * 4 + (8ull << 20);
}

ResidencyStats ResidencyManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ResidencyStats s = stats_;
  if (!sched_) return s;  // a dry run (ResidencyOptions::dry_run): the plan only
  const FallbackCounters& f = fallback_.counters();
  s.predicted_late = f.predicted_late;
  s.demoted = f.demoted;
  s.skipped = f.skipped;
  s.open_bytes_read = open_bytes_;
  if (rows_) {
    s.rows_read = rows_->rows_read();
    s.row_bytes_read = rows_->bytes_read();
  }
  s.stream_bytes_read = sched_->bytes_read() - open_bytes_ + s.row_bytes_read;
  s.read_seconds = sched_->read_seconds();
  s.read_busy_seconds = sched_->busy_seconds();
  s.read_bandwidth = sched_->bandwidth();
  s.expert_hits = experts_->hits;
  s.expert_misses = experts_->misses;
  s.expert_late = experts_->late;
  s.expert_hinted = experts_->hinted;
  s.expert_hint_used = experts_->hint_used;
  s.expert_hint_dropped = experts_->hint_dropped;
  s.expert_hint_abandoned = experts_->hint_abandoned;
  s.expert_relayouts = relayouts_.load();
  return s;
}

std::string ResidencyManager::StatsJson() const {
  const ResidencyStats s = stats();
  char b[1536];
  std::snprintf(
      b, sizeof b,
      "{\"serve_tier\":%d,\"ops_resident\":%d,\"ops_streamed\":%d,\"ops_expert\":%d,"
      "\"resident_bytes\":%llu,\"slabs\":%d,\"slabs_wanted\":%d,\"slab_bytes\":%llu,\"expert_"
      "slots\":%d,"
      "\"expert_slot_bytes\":%llu,\"open_bytes_read\":%llu,\"stream_bytes_read\":%llu,"
      "\"read_seconds\":%.4f,\"read_bandwidth\":%.1f,\"hits\":%llu,\"misses\":%llu,"
      "\"stall_us\":%lld,\"predicted_late\":%llu,\"demoted\":%llu,\"demand_loads\":%llu,"
      "\"expert_hits\":%llu,\"expert_misses\":%llu,\"expert_late\":%llu,\"expert_hinted\":%llu,"
      "\"expert_hint_used\":%llu,\"expert_hint_dropped\":%llu,\"expert_hint_abandoned\":%llu,"
      "\"expert_relayouts\":%llu,"
      "\"uring\":%s,\"direct\":%s,\"source\":\"%s\"",
      s.serve_tier, s.n_ops_resident, s.n_ops_streamed, s.n_ops_expert,
      static_cast<unsigned long long>(s.resident_bytes), s.n_slabs, s.slabs_wanted,
      static_cast<unsigned long long>(s.slab_bytes), s.expert_slots,
      static_cast<unsigned long long>(s.expert_slot_bytes),
      static_cast<unsigned long long>(s.open_bytes_read),
      static_cast<unsigned long long>(s.stream_bytes_read), s.read_seconds, s.read_bandwidth,
      static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.misses),
      static_cast<long long>(s.stall_us), static_cast<unsigned long long>(s.predicted_late),
      static_cast<unsigned long long>(s.demoted), static_cast<unsigned long long>(s.demand_loads),
      static_cast<unsigned long long>(s.expert_hits),
      static_cast<unsigned long long>(s.expert_misses),
      static_cast<unsigned long long>(s.expert_late),
      static_cast<unsigned long long>(s.expert_hinted),
      static_cast<unsigned long long>(s.expert_hint_used),
      static_cast<unsigned long long>(s.expert_hint_dropped),
      static_cast<unsigned long long>(s.expert_hint_abandoned),
      static_cast<unsigned long long>(s.expert_relayouts), s.uring ? "true" : "false",
      s.direct ? "true" : "false", index_->gguf_path().empty() ? "store" : "gguf");
  std::string out = b;
  // Of the time reads ran (wall time with any in flight), the share no op waited for them.
  const double busy_s = s.read_busy_seconds, stall_s = static_cast<double>(s.stall_us) * 1e-6;
  char extra[160];
  std::snprintf(extra, sizeof extra, ",\"read_busy_seconds\":%.4f,\"read_hidden_share\":%.4f",
                busy_s, busy_s > 0 ? std::clamp(1.0 - stall_s / busy_s, 0.0, 1.0) : 1.0);
  out += extra;
  std::snprintf(extra, sizeof extra, ",\"rows_op_bytes\":%llu,\"rows_read\":%llu,\"row_bytes_read\":%llu",
                static_cast<unsigned long long>(s.rows_op_bytes),
                static_cast<unsigned long long>(s.rows_read),
                static_cast<unsigned long long>(s.row_bytes_read));
  out += extra;
  out += std::string(",\"expert_policy\":\"") +
         (s.expert_policy == ExpertCache::Policy::kLru ? "lru" : "decayed") +
         "\",\"lookahead_layers\":" + std::to_string(s.lookahead_layers);
  out += ",\"lookahead\":[";
  bool first = true;
  for (int d = 1; d <= ResidencyStats::kScoredDepths; ++d) {
    const ResidencyStats::GuessScore& g = s.lookahead[d];
    if (g.guessed == 0) continue;
    std::snprintf(extra, sizeof extra,
                  "%s{\"depth\":%d,\"guessed\":%llu,\"routed\":%llu,\"right\":%llu,"
                  "\"precision\":%.4f,\"recall\":%.4f}",
                  first ? "" : ",", d, static_cast<unsigned long long>(g.guessed),
                  static_cast<unsigned long long>(g.routed),
                  static_cast<unsigned long long>(g.right),
                  static_cast<double>(g.right) / static_cast<double>(g.guessed),
                  g.routed ? static_cast<double>(g.right) / static_cast<double>(g.routed) : 0.0);
    out += extra;
    first = false;
  }
  return out + "]}";
}

}  // namespace substrate
