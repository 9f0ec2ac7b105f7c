// ResidencyManager: a WeightSource over a tiered store (store/pack.h) under a byte budget — the
// out-of-core runtime. At open it keeps a resident set of ops in memory (the plan's, or one chosen
// to fill the budget), allocates streaming slabs once (ledger "stream_slabs": prefetch depth + 1
// slabs the size of the largest streamed op at its served tier, or as many as a plan's prefetch
// windows hold at once when the budget allows) and an expert cache of fixed slots for routed MoE
// experts (ledger "expert_cache"). While the model runs, BeginOp(op i) waits for op i's slab (a
// miss: counted, stall recorded) and issues reads of later streamed ops — wrapping around to the
// next token — so they run during the current ops' compute: an op a plan schedules when the op
// its prefetch names as start_during begins ("" = the token's first op), any other op once it is
// within prefetch_depth streamed ops (the depth rule). Issued reads are served earliest deadline
// first; EndOp evicts per the plan's evict_after (default: the op itself).
//
// Every byte is charged to the ledger; a budget that cannot hold the minimum (resident set,
// slabs, minimum expert slots and the reserve for KV cache and scratch) is an OutOfMemory error
// at open naming the budget and the request. A read error or checksum mismatch surfaces at the
// next Acquire as the op's error (Corruption naming file, tensor and offset).
//
// Threading: BeginOp/EndOp/Acquire/HintExperts come from the forward pass's thread; reads run on
// the scheduler's worker thread(s), which shut down when the manager is destroyed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/aligned_buffer.h"
#include "core/env.h"
#include "core/memory_ledger.h"
#include "model/hparams.h"
#include "model/weight_source.h"
#include "runtime/expert_cache.h"
#include "runtime/fallback_planner.h"
#include "runtime/prefetch_scheduler.h"
#include "runtime/row_reader.h"
#include "runtime/trace_writer.h"
#include "store/store_index.h"

namespace substrate {

struct ResidencyOptions {
  uint64_t budget_bytes = 0;   // 0: the ledger's cap (one of the two must be set)
  uint64_t reserve_bytes = 0;  // left for KV cache and scratch (EstimateRunReserve)
  int prefetch_depth = 2;      // streamed ops read ahead of the current one
  int serve_tier = -1;         // -1: the store's top tier; past the ladder: InvalidArgument
  // Resident ops keep tiers 0..resident_max_tier in memory (-1: every served tier); their
  // higher tiers are read into slabs, residuals only, for the passes that run them there
  // (deferred verification's top-tier passes, escalations).
  int resident_max_tier = -1;
  // Resident ops also keep their residual tiers, largest first, where that costs the expert
  // cache nothing: the slabs shrink to the largest residual still streamed (to none once all are
  // kept), and with no routed experts to stream the whole budget may hold them. For deferred
  // verification, whose every verify pass would otherwise read each resident op's residuals.
  bool keep_residuals = false;
  // A late read of an op the plan gives no fallback (or with no plan) is waited for unless
  // this is set: then it goes to a lower tier, down to skipping the residual of a resident
  // skeleton for that token (the adaptive runtime's escalations: no stall for an escalation).
  bool lower_tier_by_default = false;
  // Slabs beyond the read-ahead ones in which ops whose skeleton is resident keep their residual
  // tiers from token to token while they want them: the adaptive runtime's escalation pool (one
  // per concurrent escalation), so a residual is read once per escalation, not once per token.
  // 0: every token reads them again (deferred verification reads whole windows at once).
  int residual_slabs = 0;
  std::string plan_path;   // a PlanBundle JSON: its resident set, evict_after and fallbacks
  std::string trace_path;  // JSONL trace (runtime/trace_writer.h), "" for none
  IoMode io_mode = IoMode::kAuto;
  // Reading threads; each reads its request and verifies its checksum. On a 2 GB/s disk one
  // (with 16 requests in flight) matched dd iflag=direct and more changed nothing; on a 6-8 GB/s
  // NVMe one thread's read-and-verify capped expert streaming at ~2 GB/s and four reached 3.3
  // (bench/RESULTS.md, "MoE out of core under 2 and 8 GiB").
  int io_threads = 4;
  // How many layers ahead the model guesses routed experts (WeightSource::LookaheadLayers):
  // deeper guesses give a read more time and are right less often. -1: one, or none where the
  // cache is tight (below).
  int lookahead_layers = -1;
  bool direct_io = true;
  // Unset: kDecayed where the cache is tight (fewer slots than kTightTokens tokens' experts),
  // kLru otherwise. Where a token's experts crowd the cache, recency evicts what the next token
  // uses again, and the look-ahead's guesses evict it too and take the disk's time: decayed use
  // counts without guesses read a third less there (bench/RESULTS.md, "... the expert cache's policy where a token's
  // experts crowd it").
  std::optional<ExpertCache::Policy> expert_policy;
  static constexpr int kTightTokens = 4;
  double expert_half_life_tokens = 8;  // kDecayed's half-life, in tokens
  int expert_slots = 0;  // 0: as many as the budget leaves
  Env* env = nullptr;    // the store's files, reads and trace; nullptr: Env::Default()
  // Plans only: chooses the resident set, slabs and expert slots (stats()) and stops before
  // allocating or reading anything, for `substrate fit`. Such a manager serves no weights.
  bool dry_run = false;
  // A next-n (MTP) layer for drafting: its experts go through the expert cache like any layer's;
  // its other ops (run once per draft, between the tokens' passes) stay resident, charged before
  // the resident set is chosen. Without it a store's next-n ops are never loaded, and a GGUF
  // read in place gives them no op.
  bool with_nextn = false;
  // The host backend that computes with the weights: once read, each resident op's tier-0
  // matrices go to its AdoptResidentWeight (the CPU backend interleaves them in place for its
  // decode and prefill kernels), as a resident model's do. Null: plain rows. Not a backend with
  // memory of its own: it would copy them there, outside this budget.
  Backend* backend = nullptr;
  // Experts read into the cache's slots go to that backend too, once per read
  // (AdoptStreamedWeight: the CPU interleaves them), so they run on the kernels a resident
  // expert gets and compute what it computes, bit for bit. Set: on the reading thread, which is
  // worth it where the reading threads have cores the compute does not use. Unset: by the compute
  // threads, before the expert's first product after its read (qwen2moe-a2.7b Q4_0 at 3 GiB on
  // 2 cores: the products 28.6 -> 22.1 ms a token for 2.4 ms of rearranging; on the reading
  // threads there it took from the compute what the faster kernels gave back).
  bool adopt_expert_reads = false;
  // Without a plan, where the budget cannot hold every op: the token embedding (when nothing
  // else uses it: not a tied output) is read by rows (runtime/row_reader.h), one small read a
  // token, and its bytes go to the expert cache and the resident set instead.
  bool embedding_rows = true;
};

struct ResidencyStats {
  int n_ops_resident = 0, n_ops_streamed = 0, n_ops_expert = 0;
  uint64_t resident_bytes = 0;
  uint64_t slab_bytes = 0;
  int n_slabs = 0;
  int expert_slots = 0;
  uint64_t expert_slot_bytes = 0;
  uint64_t open_bytes_read = 0;    // the resident set, read at open
  uint64_t stream_bytes_read = 0;  // read since open (slabs, expert slots, demand loads)
  double read_seconds = 0;         // time the workers spent reading (all reads)
  double read_busy_seconds = 0;    // wall time with at least one read running
  double read_bandwidth = 0;       // bytes/s over that time
  uint64_t hits = 0, misses = 0;   // streamed ops found ready / not ready at BeginOp
  int64_t stall_us = 0;            // time BeginOp/Acquire waited for reads
  uint64_t predicted_late = 0;     // admission: reads predicted to miss their deadline
  uint64_t demoted = 0;            // of which served at a lower tier (fallback use_lower_tier)
  uint64_t skipped = 0;            // of which ran at their resident skeleton, the residual skipped
  uint64_t residuals_kept = 0;     // escalated residuals kept in their slab for the next token
  uint64_t demand_loads = 0;       // tensors acquired outside their op's window
  uint64_t expert_hits = 0, expert_misses = 0, expert_late = 0, expert_hinted = 0;
  uint64_t expert_hint_used = 0;  // hinted reads whose expert was then acquired
  // Guessed reads dropped once the routing was known: unstarted, and stopped while running.
  uint64_t expert_hint_dropped = 0;
  uint64_t expert_hint_abandoned = 0;
  uint64_t expert_relayouts = 0;  // expert reads the backend rearranged (either way)
  // The token embedding read by rows (ResidencyOptions::embedding_rows): its bytes, not held,
  // and the rows read since open with the bytes that took (in stream_bytes_read too).
  uint64_t rows_op_bytes = 0;
  uint64_t rows_read = 0, row_bytes_read = 0;
  bool uring = false;
  bool direct = false;
  int serve_tier = 0;
  int slabs_wanted = 0;  // what a plan's prefetch windows hold at once (0 without a plan)
  // The expert cache's policy and the look-ahead depth chosen (ResidencyOptions).
  ExpertCache::Policy expert_policy = ExpertCache::Policy::kLru;
  int lookahead_layers = 0;
  // The look-ahead's guesses (HintExperts) scored against the routing that followed, in passes
  // of one token: per depth d (guessed d layers ahead; [0] unused), the experts guessed, the
  // experts routed to in the layers guessed at that depth, and those both named. Precision is
  // right / guessed, recall right / routed.
  struct GuessScore {
    uint64_t guessed = 0, routed = 0, right = 0;
  };
  static constexpr int kScoredDepths = 4;
  GuessScore lookahead[kScoredDepths + 1] = {};
};

class ResidencyManager : public WeightSource, private ReadFinisher {
 public:
  static Expected<std::unique_ptr<ResidencyManager>> Open(const std::string& store_dir,
                                                          MemoryLedger* ledger,
                                                          const ResidencyOptions& options);
  // The same runtime over a GGUF file read in place (StoreIndex::OpenGguf): one tier, the
  // file's own bytes.
  static Expected<std::unique_ptr<ResidencyManager>> OpenGguf(const std::string& path,
                                                              MemoryLedger* ledger,
                                                              const ResidencyOptions& options);
  // Over an index already open; `what` names it in errors.
  static Expected<std::unique_ptr<ResidencyManager>> OpenIndex(std::unique_ptr<StoreIndex> index,
                                                               MemoryLedger* ledger,
                                                               const ResidencyOptions& options,
                                                               const std::string& what);
  ~ResidencyManager() override;

  const Metadata& metadata() const { return index_->meta().metadata(); }
  const StoreIndex& index() const { return *index_; }
  const ResidencyOptions& options() const { return options_; }
  int serve_tier() const { return serve_; }

  TensorId Resolve(const std::string& name) const override { return index_->Resolve(name); }
  const TensorInfo& Info(TensorId id) const override { return index_->tensors()[id].info; }
  Expected<WeightHandle> Acquire(TensorId id, int slice = -1, int tier = kDefaultTier) override;
  int DefaultTier() const override { return serve_; }
  void BeginOp(const std::string& op_id) override;
  void EndOp(const std::string& op_id) override;
  void HintExperts(int layer, const int32_t* experts, int n) override;
  // In memory: resident, or in an expert slot (read, or being read after a hint). False when
  // the expert cache has a slot for every expert.
  bool CachedExperts(int layer, uint8_t* cached) override;
  bool ExpertsReady(int layer, const int32_t* experts, int n, uint8_t* ready) override;
  void BindOpTiers(const std::vector<OpSpec>& ops, const uint8_t* tiers) override;
  bool ReadsRows(TensorId id) const override;
  Status ReadRows(TensorId id, const int32_t* rows, int64_t n, uint8_t* dst) override;
  uint64_t OpBytes(const std::string& op_id, int tier) const override {
    const int o = index_->FindOp(op_id);
    return o < 0 ? 0 : index_->ops()[o].SlabBytes(tier);
  }
  // Look-ahead guesses are worth their GEMV only when some experts are not cached.
  int LookaheadLayers() const override {
    return stats_.n_ops_expert > stats_.expert_slots ? stats_.lookahead_layers : 0;
  }

  ResidencyStats stats() const;
  std::string StatsJson() const;
  // What a decoded token is predicted to read from disk under the plan chosen at open (also by
  // a dry run): every streamed dense op (and a resident op's tiers above those it keeps), and
  // the routed experts the cache misses at the hit rate of uniform routing over its slots.
  struct ReadPrediction {
    uint64_t bytes_per_token = 0;  // dense + expert
    double expert_hit_rate = 0;
    // The two kinds of read, which the runtime issues differently: dense ops streamed ahead
    // of need (prefetch depth), routed experts read once the router picks them (misses).
    uint64_t dense_bytes_per_token = 0;
    uint64_t expert_bytes_per_token = 0;  // routed_bytes_per_token * (1 - expert_hit_rate)
    uint64_t routed_bytes_per_token = 0;  // the routed experts a token uses, cached or not
    std::vector<int> streamed_ops;  // index ops a token reads into slabs, in forward order
    std::vector<int> expert_ops;    // index ops of the routed experts
  };
  ReadPrediction PredictReads() const;
  // That plan, for --print-plan: what stays resident, by op kind and bytes; what streams,
  // through how many slabs, read how far ahead; the expert cache; and PredictReads.
  std::string PlanText() const;
  // The trace's buffered events reach the file (also done at destruction).
  Status FlushTrace();
  // Writes an adaptive-runtime event to the trace, if there is one (TraceWriter::Runtime).
  void TraceRuntime(const char* ev, const std::string& fields);
  bool tracing() const { return trace_ != nullptr; }

 private:
  // HintExperts with the layer's real routing: drops the unstarted guessed reads of its other
  // experts; returns how many.
  int DropWrongGuesses(int layer, const int32_t* experts, int n);
  // Under mu_: keeps a guess for `layer` (a hint for a layer after the current one), or scores
  // the layer's kept guesses once its real routing is hinted (ResidencyStats::lookahead).
  void ScoreGuess(int layer, const int32_t* experts, int n);
  // Whether `layer` is a layer and some of its experts live on disk (the cache lacks room for all).
  bool StreamsExpertsOf(int layer) const;
  // kUnused: a next-n layer's op a store holds, when not drafting from it (never loaded).
  // kRows: a token embedding read by rows (rows_), in no slab and no sequence.
  enum class Where { kResident, kStreamed, kExpert, kUnused, kRows };
  struct OpState {
    Where where = Where::kResident;
    int kind = -1;  // its OpKind, -1 for an op the model's op list does not name (a store's misc)
    int seq = -1;  // position in seq_ (dense ops), -1 for experts and unsequenced ops
    int layer = -1;
    AlignedBuffer resident;
    // Per unit of the op (as in StoreOp::units), the layout its tier 0 has in `resident`.
    std::vector<WeightLayout> resident_layout;
    int slab = -1;          // slab holding it (streamed)
    int64_t abs = -1;       // absolute sequence position it was scheduled for
    int tier = 0;           // the top tier of its slab's read
    int asked = 0;          // the tier the op wanted when that read was issued (Want)
    int resident_top = -1;  // tiers 0..resident_top held in `resident` (-1: none)
    int evict_at = -1;      // op whose EndOp evicts it (default itself)
    // The plan's prefetch: the sequence position whose BeginOp issues this op's read (same token,
    // before the op), or -1 for the depth rule.
    int issue_seq = -1;
    // Where a plan's start_during naming this op lands in the sequence: itself for dense ops, the
    // layer's router for an expert (which may not run on a given token).
    int anchor_seq = -1;
    bool kept = false;            // its slab was kept from its previous token (residual_slabs)
    double compute_us = 0;        // moving average of BeginOp..EndOp minus stalls
    bool timed = false;           // compute_us measured at least once
    // The current window (BeginOp..EndOp), per op: a batch of experts is open at once.
    int64_t win_start = 0, win_stall = 0;
    bool win_hit = true;
    int win_tier = 0;
  };
  struct Slab {
    AlignedBuffer buf;
    int op = -1;
    ReadTicket ticket;
  };
  struct Demand {
    int op = -1;
    int tier = 0;
    AlignedBuffer buf;
    ReadTicket ticket;
  };

  ResidencyManager() = default;
  Status Setup(MemoryLedger* ledger, const ResidencyOptions& options);
  Status ChooseResidency(uint64_t budget, uint64_t fixed, int min_expert_slots);
  // ResidencyOptions::embedding_rows: the token embedding's op becomes kRows (out of the
  // sequence) when the budget cannot hold every op and nothing else reads its tensor.
  void ChooseEmbeddingRows(uint64_t budget, uint64_t reserve);
  // Hands the resident ops' tier-0 matrices, read, to options_.backend (resident_layout).
  void AdoptResident();
  // Who hands a matrix to options_.backend: the load (resident), a reading thread once the read
  // is done, or the compute thread before the first product after the read.
  enum class Adopter { kLoad, kReadingThread, kFirstUse };
  // Hands op o's tier-0 matrices at `tier0` (where its tier 0 was read) to options_.backend;
  // layout[i]: what unit i's got.
  void AdoptMatrices(int o, uint8_t* tier0, Adopter by, std::vector<WeightLayout>* layout);
  // A reading thread, an expert read into slot r.finish_arg: its matrices into the backend's
  // layout (the slot's `layout`), so the products run on the kernels a resident expert gets.
  void Finish(const ReadRequest& r) override;
  // ResidencyOptions::keep_residuals: raises resident ops' resident_top to the served tier.
  void KeepResiduals(uint64_t budget, uint64_t reserve, uint64_t expert_min);
  Status ApplyPlan(const std::string& path);
  void AdvanceTo(int seq);
  void ScheduleAhead();
  int FreeSlab() const;
  // Slabs without a plan: the read-ahead's (prefetch_depth + 1) and the kept residuals'.
  int DefaultSlabs() const { return options_.prefetch_depth + 1 + options_.residual_slabs; }
  int KeptSlabs() const;  // slabs holding an escalation's residual for its next token
  int SlabsWanted() const;
  int Admit(int op, int64_t abs);
  // Queues a read, tagged with the op begun last (the trace's "during"). slot >= 0: an expert
  // slot's read of tier 0 up, whose matrices the backend adopts on the reading thread once read
  // (Finish) where adopt_expert_reads is set, else at their first Acquire.
  void Submit(int64_t deadline, int op, int tier, uint8_t* dst, ReadTicket* t, int first_tier = 0,
              int slot = -1);
  Status BeginExpert(int op);
  // Reads op into expert slot `slot` at its tier, for `deadline`: in one read, or (an expert
  // that may run on its skeleton while its residual is late) the kept tiers and an Upgrade.
  void ReadExpert(int slot, int op, int64_t deadline);
  // Reads the slot's tiers above those it holds up to `tier`, into its room above them.
  void Upgrade(int slot, int tier, int64_t deadline);
  // Folds a finished upgrade into the slot's tiers (its read error, if it failed).
  Status SettleUpgrade(int slot);
  Expected<const uint8_t*> DemandLoad(int op, int* tier);
  int64_t NowUs() const;
  // The tier op o runs at now: the model's per-op table (BindOpTiers), within the served ladder
  // and the op's own (an op packed without residuals, such as a token embedding, is whole at
  // tier 0).
  int Want(int o) const {
    const int top = std::min(serve_, std::max(0, index_->ops()[o].n_tiers - 1));
    return tiers_ && model_op_[o] >= 0 ? std::min<int>(tiers_[model_op_[o]], top) : top;
  }
  // Whether op o's buffer, read for tier `asked`, is behind a later raise of its tier.
  bool Raised(int o, int asked) const { return Want(o) > asked; }
  // Whether dense op o reads into a slab at its current tier: a streamed op always, a resident
  // one when it runs above the tiers it keeps.
  bool Streams(int o) const {
    return st_[o].where != Where::kExpert && st_[o].where != Where::kRows &&
           Want(o) > st_[o].resident_top;
  }
  // Bytes of the tiers a resident op keeps, and of what a slab read of op o holds.
  uint64_t ResidentBytes(int op) const {
    return index_->ops()[op].SlabBytes(std::max(st_[op].resident_top, keep_));
  }
  uint64_t StreamedBytes(int op) const;
  // Bytes of op o's tiers above those every resident op keeps: what a slab holds for its
  // residual reads while it is resident.
  uint64_t ResidualBytes(int op) const {
    return OpBytes(op) - index_->ops()[op].SlabOffset(keep_ + 1);
  }
  uint64_t OpBytes(int op) const { return index_->ops()[op].SlabBytes(serve_); }

  // Declared before the scheduler, destroyed after it: workers may still write into them.
  std::unique_ptr<StoreIndex> index_;
  std::unique_ptr<TraceWriter> trace_;
  MemoryLedger* ledger_ = nullptr;
  ResidencyOptions options_;
  uint64_t budget_ = 0;  // in effect: options_.budget_bytes, else the ledger's cap
  ModelHParams hp_;
  int serve_ = 0;
  int keep_ = 0;  // resident ops keep tiers 0..keep_ (ResidencyOptions::resident_max_tier)
  const uint8_t* tiers_ = nullptr;  // the model's per-op tiers (BindOpTiers)
  std::vector<int> model_op_;       // store op -> index in that table, -1
  std::vector<OpState> st_;
  std::vector<int> seq_;                       // dense ops in forward order
  bool plan_schedules_ = false;                // some op's read follows the plan's start_during
  std::vector<std::vector<int>> evict_lists_;  // per op: ops evicted at its EndOp
  std::vector<std::vector<int>> expert_ops_;   // [layer][expert] -> op, -1
  int ops_per_layer_ = 1;
  std::vector<std::unique_ptr<Slab>> slabs_;
  uint64_t slab_bytes_ = 0;
  std::unique_ptr<ExpertCache> experts_;
  int rows_op_ = -1;                  // the kRows op, -1 for none
  std::unique_ptr<RowReader> rows_;   // its reader (not in a dry run)
  std::vector<std::unique_ptr<Demand>> demand_;
  FallbackPlanner fallback_;  // per op: wait for a late read, or lower its tier / skip it
  RuntimeClock::time_point origin_;
  std::unique_ptr<PrefetchScheduler> sched_;

  mutable std::mutex mu_;
  int64_t pos_ = -1;  // absolute position of the current dense op
  int cur_op_ = -1;   // the op begun last (stalls of demand loads are charged to it)
  int cur_layer_ = -1;
  std::vector<Status> op_error_;  // per op: a read error of its current window, for Acquire
  ResidencyStats stats_;
  // Guesses awaiting their layer's routing: [layer * (kScoredDepths + 1) + depth].
  std::vector<std::vector<int32_t>> pending_guess_;
  uint64_t open_bytes_ = 0;
  std::atomic<uint64_t> relayouts_{0};  // counted by the reading threads (Finish) and Acquire
};

// Bytes a run charges beside the weights: the KV cache of n_ctx positions in rows of kv_type
// (exactly what KvCache charges) plus scratch for batches of n_batch tokens (an estimate with
// headroom), for ResidencyOptions::reserve_bytes.
uint64_t EstimateRunReserve(const ModelHParams& hp, int64_t n_ctx, int64_t n_batch,
                            DType kv_type = DType::kF32);

}  // namespace substrate
