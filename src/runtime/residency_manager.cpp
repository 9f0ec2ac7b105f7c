#include "runtime/residency_manager.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <numeric>
#include <unordered_map>

#include "compiler/plan_bundle.h"
#include "kernels/interleaved.h"
#include "model/op_id.h"

namespace substrate {

Expected<std::unique_ptr<ResidencyManager>> ResidencyManager::Open(
    const std::string& store_dir, MemoryLedger* ledger, const ResidencyOptions& options) {
  StoreIndexOptions io;
  io.max_tier = options.serve_tier < 0 ? 2 : options.serve_tier;
  io.direct_io = options.direct_io;
  io.env = options.env;
  ASSIGN_OR_RETURN(auto index, StoreIndex::Open(store_dir, io));
  return OpenIndex(std::move(index), ledger, options, "store '" + store_dir + "'");
}

Expected<std::unique_ptr<ResidencyManager>> ResidencyManager::OpenGguf(
    const std::string& path, MemoryLedger* ledger, const ResidencyOptions& options) {
  StoreIndexOptions io;
  io.max_tier = 0;
  io.direct_io = options.direct_io;
  io.env = options.env;
  io.checksums = !options.dry_run;
  io.with_nextn = options.with_nextn;
  ASSIGN_OR_RETURN(auto index, StoreIndex::OpenGguf(path, io));
  return OpenIndex(std::move(index), ledger, options, "'" + path + "' read in place");
}

Expected<std::unique_ptr<ResidencyManager>> ResidencyManager::OpenIndex(
    std::unique_ptr<StoreIndex> index, MemoryLedger* ledger, const ResidencyOptions& options,
    const std::string& what) {
  std::unique_ptr<ResidencyManager> m(new ResidencyManager());
  m->origin_ = RuntimeClock::now();
  m->index_ = std::move(index);
  Status st = m->Setup(ledger, options);
  if (!st.ok()) return st.WithContext("runtime: " + what);
  return m;
}

ResidencyManager::~ResidencyManager() {
  sched_.reset();  // joins the workers before the buffers they write into go
}

void ResidencyManager::TraceRuntime(const char* ev, const std::string& fields) {
  if (trace_) trace_->Runtime(ev, fields, NowUs());
}

int64_t ResidencyManager::NowUs() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(RuntimeClock::now() - origin_)
      .count();
}

Status ResidencyManager::Setup(MemoryLedger* ledger, const ResidencyOptions& options) {
  ledger_ = ledger;
  options_ = options;
  options_.prefetch_depth = std::clamp(options.prefetch_depth, 1, 64);
  const uint64_t budget = options.budget_bytes ? options.budget_bytes : ledger->cap();
  if (budget == 0) return InvalidArgument("a byte budget is needed (--max-ram, or a ledger cap)");
  budget_ = budget;
  ASSIGN_OR_RETURN(hp_, ModelHParams::FromMetadata(index_->meta().metadata()));
  hp_.list_nextn = true;  // a store may hold them: seen here, used only with_nextn
  if (options.serve_tier < -1 || options.serve_tier >= index_->n_tiers())
    return InvalidArgument("tier " + std::to_string(options.serve_tier) +
                           " asked for, but the store's ladder has " + index_->LadderText());
  serve_ = options.serve_tier < 0 ? index_->n_tiers() - 1 : options.serve_tier;
  keep_ = options.resident_max_tier < 0 ? serve_ : std::min(options.resident_max_tier, serve_);
  stats_.serve_tier = serve_;

  const auto& ops = index_->ops();
  st_ = std::vector<OpState>(ops.size());
  op_error_.assign(ops.size(), Status::Ok());
  fallback_.Reset(static_cast<int>(ops.size()));
  evict_lists_.assign(ops.size(), {});
  expert_ops_.assign(static_cast<size_t>(hp_.n_layer),
                     std::vector<int>(static_cast<size_t>(std::max(hp_.n_expert, 0)), -1));
  auto has = [&](const std::string& n) { return index_->Resolve(n) != kNoTensor; };
  int n_expert_ops = 0;
  uint64_t expert_slot = 0;
  uint64_t nextn_resident = 0;  // a next-n layer's ops but its experts: resident, unsequenced
  for (const OpSpec& spec : ListOps(hp_, has)) {
    const int o = index_->FindOp(spec.id);
    if (o < 0) continue;  // every tensor it names lives in an earlier op
    st_[o].layer = spec.layer;
    st_[o].kind = static_cast<int>(spec.kind);
    if (spec.layer >= hp_.n_layer && !options.with_nextn) {
      st_[o].where = Where::kUnused;
      continue;
    }
    if (spec.layer >= hp_.n_layer && spec.kind != OpKind::kMoeExpert) {
      nextn_resident += OpBytes(o);
      continue;
    }
    fallback_.set_lowers(o, options_.lower_tier_by_default);  // a plan may say otherwise
    if (spec.kind == OpKind::kMoeExpert) {
      st_[o].where = Where::kExpert;
      st_[o].anchor_seq = std::max(0, static_cast<int>(seq_.size()) - 1);
      if (spec.layer >= 0 && spec.layer < hp_.n_layer && spec.expert >= 0 &&
          spec.expert < hp_.n_expert)
        expert_ops_[spec.layer][spec.expert] = o;
      expert_slot = std::max(expert_slot, OpBytes(o));
      ++n_expert_ops;
      continue;
    }
    st_[o].seq = st_[o].anchor_seq = static_cast<int>(seq_.size());
    st_[o].where = Where::kStreamed;
    seq_.push_back(o);
  }
  if (options.embedding_rows && options.plan_path.empty())
    ChooseEmbeddingRows(budget, options.reserve_bytes);
  ops_per_layer_ = std::max(1, static_cast<int>(seq_.size()) / std::max(1, hp_.n_layer));
  for (size_t o = 0; o < ops.size(); ++o) st_[o].evict_at = static_cast<int>(o);

  const int min_slots =
      n_expert_ops == 0 ? 0 : std::min(n_expert_ops, std::max(2, hp_.n_expert_used + 1));
  if (!options.plan_path.empty()) {
    RETURN_IF_ERROR(ApplyPlan(options.plan_path));
  } else {
    RETURN_IF_ERROR(ChooseResidency(budget, options.reserve_bytes + nextn_resident, min_slots));
    if (options.keep_residuals)
      KeepResiduals(budget, options.reserve_bytes + nextn_resident, expert_slot * min_slots);
  }
  // Ops no sequence names (a store's "misc") are kept resident: nothing would schedule them.
  for (size_t o = 0; o < ops.size(); ++o)
    if (st_[o].where == Where::kStreamed && st_[o].seq < 0) st_[o].where = Where::kResident;

  uint64_t resident = 0;
  slab_bytes_ = 0;
  for (size_t o = 0; o < ops.size(); ++o) {
    OpState& s = st_[o];
    if (s.where == Where::kResident) {
      s.resident_top = std::max(s.resident_top, keep_);
      resident += ResidentBytes(static_cast<int>(o));
      ++stats_.n_ops_resident;
    } else if (s.where == Where::kStreamed) {
      ++stats_.n_ops_streamed;
    } else if (s.where == Where::kExpert) {
      ++stats_.n_ops_expert;
    }
    if (s.where == Where::kResident || s.where == Where::kStreamed) {
      slab_bytes_ = std::max(slab_bytes_, StreamedBytes(static_cast<int>(o)));
      evict_lists_[s.evict_at].push_back(static_cast<int>(o));
    }
  }
  int n_slabs = slab_bytes_ > 0 ? DefaultSlabs() : 0;
  if (n_slabs > 0 && !options.plan_path.empty()) {
    // A plan's windows (early prefetches, late evictions) may hold more streamed ops at once. When
    // the budget cannot hold that many slabs, its early reads wait for a slab to free.
    stats_.slabs_wanted = std::max(n_slabs, SlabsWanted() + options_.residual_slabs);
    const uint64_t with = resident + slab_bytes_ * static_cast<uint64_t>(stats_.slabs_wanted) +
                          options.reserve_bytes + expert_slot * static_cast<uint64_t>(min_slots);
    if (with <= budget) n_slabs = stats_.slabs_wanted;
  }
  uint64_t rows_held = 0;
  if (rows_op_ >= 0) {
    stats_.rows_op_bytes = OpBytes(rows_op_);
    rows_held = RowReader::HeldBytes(stats_.rows_op_bytes);
  }
  const uint64_t fixed = resident + slab_bytes_ * n_slabs + options.reserve_bytes + rows_held;
  int slots = options.expert_slots > 0 ? std::min(options.expert_slots, n_expert_ops) : 0;
  if (n_expert_ops > 0 && slots == 0) {
    const uint64_t left = budget > fixed ? budget - fixed : 0;
    slots = static_cast<int>(std::min<uint64_t>(left / std::max<uint64_t>(expert_slot, 1),
                                                static_cast<uint64_t>(n_expert_ops)));
  }
  const uint64_t need = fixed + expert_slot * static_cast<uint64_t>(std::max(slots, min_slots));
  if (need > budget || (n_expert_ops > 0 && slots < min_slots))
    return OutOfMemory("budget " + FormatBytes(budget) + " cannot hold the resident set (" +
                       FormatBytes(resident) + "), " + std::to_string(n_slabs) + " slabs of " +
                       FormatBytes(slab_bytes_) + ", " + std::to_string(min_slots) +
                       " expert slots of " + FormatBytes(expert_slot) + " and the reserve (" +
                       FormatBytes(options.reserve_bytes) + "): " + FormatBytes(need) + " asked");

  int uses_per_token = 0;  // expert ops a decoded token begins
  for (int l = 0; l < hp_.n_layer; ++l)
    if (hp_.is_moe_layer(l)) uses_per_token += hp_.n_expert_used;
  const bool tight = slots < ResidencyOptions::kTightTokens * uses_per_token;
  stats_.expert_policy = options.expert_policy.value_or(tight ? ExpertCache::Policy::kDecayed
                                                              : ExpertCache::Policy::kLru);
  stats_.lookahead_layers =
      options.lookahead_layers >= 0 ? options.lookahead_layers : (tight ? 0 : 1);
  if (options.dry_run) {
    stats_.n_slabs = n_slabs;
    stats_.slab_bytes = slab_bytes_;
    stats_.expert_slots = slots;
    stats_.expert_slot_bytes = expert_slot;
    stats_.resident_bytes = resident;
    return Status::Ok();
  }
  if (!options.trace_path.empty()) {
    ASSIGN_OR_RETURN(trace_, TraceWriter::Open(options.trace_path, options.env));
  }
  sched_ = std::make_unique<PrefetchScheduler>(*index_, options.io_mode, options.io_threads,
                                               trace_.get(), origin_, options.env);
  // Every destination (a slab, an expert slot's read and its upgrade, an op's resident or
  // demand buffer) holds at most one queued read: no allocation in the token loop.
  sched_->Reserve(static_cast<size_t>(n_slabs + 2 * slots) + ops.size());
  stats_.uring = sched_->uring();
  stats_.direct = index_->n_files() > 0 && index_->file(0).direct();

  // The embedding's rows first: its reader's one pass over the table needs a read buffer for
  // a moment, which must come and go before the rest fills the budget.
  if (rows_op_ >= 0) {
    const auto [id, slice] = index_->ops()[rows_op_].units[0];
    const StoreTensor& t = index_->tensors()[id];
    const auto rows = static_cast<int64_t>(t.info.ne[1]);
    auto rr = RowReader::Open(*index_, t.units[0].tier[0], rows, t.units[0].tier[0].bytes / rows,
                              options.io_mode, ledger_, options.env);
    if (!rr.ok()) return rr.status().WithContext("token embedding read by rows");
    rows_ = std::move(rr).value();
  }
  // Fixed allocations first (slabs, cache), then the resident set, all through the ledger.
  for (int i = 0; i < n_slabs; ++i) {
    auto s = std::make_unique<Slab>();
    auto buf = AlignedBuffer::Allocate(slab_bytes_, ledger_, "stream_slabs");
    if (!buf.ok()) return buf.status().WithContext("stream slab " + std::to_string(i));
    s->buf = std::move(buf).value();
    slabs_.push_back(std::move(s));
  }
  stats_.n_slabs = n_slabs;
  stats_.slab_bytes = slab_bytes_;
  ASSIGN_OR_RETURN(experts_, ExpertCache::Create(slots, expert_slot, static_cast<int>(ops.size()),
                                                 ledger_, stats_.expert_policy,
                                                 options.expert_half_life_tokens *
                                                     std::max(1, uses_per_token)));
  stats_.expert_slots = slots;
  stats_.expert_slot_bytes = experts_->slot_bytes();

  std::vector<std::unique_ptr<ReadTicket>> tickets;
  int64_t deadline = INT64_MIN / 2;
  for (size_t o = 0; o < ops.size(); ++o) {
    OpState& s = st_[o];
    if (s.where != Where::kResident) continue;
    auto buf = AlignedBuffer::Allocate(ResidentBytes(static_cast<int>(o)), ledger_, "weights");
    if (!buf.ok()) return buf.status().WithContext("resident op '" + ops[o].id + "'");
    s.resident = std::move(buf).value();
    tickets.push_back(std::make_unique<ReadTicket>());
    Submit(deadline++, static_cast<int>(o), s.resident_top, s.resident.data(),
           tickets.back().get());
  }
  // Every ticket is waited for, even after an error: the workers must not write into buffers
  // (or tickets) this function's failure would free.
  Status first;
  for (auto& t : tickets) {
    Status st = sched_->Wait(t.get(), nullptr);
    if (first.ok() && !st.ok()) first = st;
  }
  RETURN_IF_ERROR(first);
  if (options_.backend) AdoptResident();
  stats_.resident_bytes = resident;
  open_bytes_ = sched_->bytes_read();
  return Status::Ok();
}

void ResidencyManager::AdoptResident() {
  for (size_t o = 0; o < st_.size(); ++o) {
    OpState& s = st_[o];
    if (s.where != Where::kResident || s.resident_top < 0) continue;
    AdoptMatrices(static_cast<int>(o), s.resident.data(), Adopter::kLoad, &s.resident_layout);
  }
}

void ResidencyManager::Finish(const ReadRequest& r) {
  AdoptMatrices(r.op, r.dst, Adopter::kReadingThread, &experts_->slot(r.finish_arg).layout);
}

void ResidencyManager::AdoptMatrices(int o, uint8_t* tier0, Adopter by,
                                     std::vector<WeightLayout>* layout) {
  const StoreOp& op = index_->ops()[o];
  layout->assign(op.units.size(), WeightLayout::kRows);
  bool rearranged = false;
  for (size_t i = 0; i < op.units.size(); ++i) {
    const auto [id, slice] = op.units[i];
    uint64_t offset_el = 0;
    auto u = index_->FindUnit(id, slice, &offset_el);
    const TensorInfo& t = index_->tensors()[id].info;
    if (!u.ok() || offset_el != 0 || (t.ne.size() != 2 && t.ne.size() != 3)) continue;
    const StoreRange& r = (*u)->tier[0];
    uint8_t* bytes = tier0 + op.SlabOffset(0) + r.slab_pos;
    // A stack of experts kept whole: each expert's matrix on its own, so that a slice of the
    // stack is a whole matrix in the layout (as ResidentWeightSource does).
    const uint64_t n = t.ne.size() == 3 && slice < 0 ? t.ne[2] : 1;
    const auto rows = static_cast<int64_t>(t.ne[1]), cols = static_cast<int64_t>(t.ne[0]);
    // Stored in the layout the backend computes on (a store packed in it): nothing to do.
    if (r.layout != WeightLayout::kRows &&
        options_.backend->AdoptedLayout(r.type, rows, cols) == r.layout) {
      (*layout)[i] = r.layout;
      continue;
    }
    for (uint64_t e = 0; e < n; ++e) {
      uint8_t* m = bytes + e * (r.bytes / n);
      DeinterleaveInPlace(r.layout, r.type, rows, cols, m);
      (*layout)[i] = by == Adopter::kLoad
                         ? options_.backend->AdoptResidentWeight(r.type, rows, cols, m)
                         : options_.backend->AdoptStreamedWeight(r.type, rows, cols, m,
                                                                 by == Adopter::kReadingThread);
      rearranged |= r.layout != (*layout)[i];
    }
  }
  if (by != Adopter::kLoad && rearranged) ++relayouts_;
}

// Without a plan: the largest ops first (each one kept resident also shrinks the slabs), as
// many as fit next to the slabs, the minimum expert slots and the reserve; then smaller ones
// in forward order while the budget lasts.
Status ResidencyManager::ChooseResidency(uint64_t budget, uint64_t reserve, int min_slots) {
  std::vector<int> order(seq_);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return OpBytes(a) > OpBytes(b); });
  // A resident op that keeps fewer tiers than are served still reads its residuals through the
  // slabs: they are at least the largest such part.
  uint64_t residual_slab = 0;
  if (keep_ < serve_)
    for (int o : seq_)
      residual_slab = std::max(residual_slab, ResidualBytes(o));
  uint64_t expert_min = 0;
  for (size_t o = 0; o < st_.size(); ++o)
    if (st_[o].where == Where::kExpert)
      expert_min = std::max(expert_min, OpBytes(static_cast<int>(o)));
  expert_min *= static_cast<uint64_t>(min_slots);
  const uint64_t slabs = static_cast<uint64_t>(DefaultSlabs());
  // cost(k): the k largest resident, the rest streamed through slabs of the (k+1)-th's size.
  int best_k = -1;
  uint64_t prefix = 0, best_used = 0, minimum = UINT64_MAX;
  for (size_t k = 0; k <= order.size(); ++k) {
    const uint64_t slab = std::max(k < order.size() ? OpBytes(order[k]) : 0, residual_slab);
    const uint64_t used = prefix + slabs * slab + reserve + expert_min;
    minimum = std::min(minimum, used);
    if (used <= budget) {
      best_k = static_cast<int>(k);
      best_used = used;
    }
    if (k < order.size()) prefix += ResidentBytes(order[k]);
  }
  if (best_k < 0)
    return OutOfMemory(
        "budget " + FormatBytes(budget) + " is below this model's minimum of " +
        FormatBytes(minimum) + ": " + std::to_string(slabs) + " slabs of the largest op (" +
        FormatBytes(order.empty() ? 0 : OpBytes(order[0])) + "), the reserve (" +
        FormatBytes(reserve) + ") and " + std::to_string(min_slots) + " expert slots need more");
  for (int k = 0; k < best_k; ++k) st_[order[k]].where = Where::kResident;
  uint64_t used = best_used;
  for (int o : seq_) {
    if (st_[o].where == Where::kResident) continue;
    if (used + ResidentBytes(o) > budget) continue;
    // Keeping the slab-sized op resident would not shrink the slabs; smaller ones only.
    if (best_k < static_cast<int>(order.size()) && o == order[best_k]) continue;
    st_[o].where = Where::kResident;
    used += ResidentBytes(o);
  }
  return Status::Ok();
}

void ResidencyManager::KeepResiduals(uint64_t budget, uint64_t reserve, uint64_t expert_min) {
  if (keep_ >= serve_) return;
  std::vector<int> kept;  // candidates: resident ops with residual tiers, largest residual first
  uint64_t resident = 0, streamed = 0;
  for (int op : seq_) {
    if (st_[op].where == Where::kResident) {
      resident += ResidentBytes(op);
      if (ResidualBytes(op) > 0) kept.push_back(op);
    } else {
      streamed = std::max(streamed, OpBytes(op));
    }
  }
  std::stable_sort(kept.begin(), kept.end(),
                   [&](int a, int b) { return ResidualBytes(a) > ResidualBytes(b); });
  const uint64_t slabs = static_cast<uint64_t>(DefaultSlabs());
  // With k kept, the slabs hold the larger of the streamed ops and the (k+1)-th residual.
  auto used = [&](size_t k, uint64_t kept_bytes) {
    const uint64_t slab = std::max(streamed, k < kept.size() ? ResidualBytes(kept[k]) : 0);
    return resident + kept_bytes + slabs * slab + reserve + expert_min;
  };
  // Routed experts (expert_min > 0) take what the budget leaves: keep no more than the
  // shrinking slabs free.
  const uint64_t limit = expert_min > 0 ? std::min(budget, used(0, 0)) : budget;
  size_t best = 0;
  uint64_t bytes = 0;
  for (size_t k = 1; k <= kept.size(); ++k) {
    bytes += ResidualBytes(kept[k - 1]);
    if (used(k, bytes) <= limit) best = k;
  }
  for (size_t k = 0; k < best; ++k) st_[kept[k]].resident_top = serve_;
}

// A plan's resident set (its ops' tier-0 residency), evict_after and deadline fallbacks.
Status ResidencyManager::ApplyPlan(const std::string& path) {
  ASSIGN_OR_RETURN(compiler::PlanBundle plan, compiler::LoadPlan(path));
  std::unordered_map<std::string, std::string> op_of;  // catalog id -> op id
  std::unordered_map<std::string, bool> resident;      // op id -> tier 0 resident
  for (const compiler::CatalogTensor& c : plan.tensor_catalog) {
    op_of[c.id] = c.op_id;
    if (c.tier == 0) resident[c.op_id] = c.residency == compiler::Residency::kResident;
  }
  for (int o : seq_) {
    auto it = resident.find(index_->ops()[o].id);
    // An op the plan does not cover (norms-only ops of some layouts) is small: resident.
    st_[o].where = it == resident.end() || it->second ? Where::kResident : Where::kStreamed;
  }
  for (const compiler::OpBundle& b : plan.op_bundles) {
    const int o = index_->FindOp(b.op_id);
    if (o < 0 || b.tiers.empty()) continue;
    const compiler::Tier& t =
        b.tiers[std::min<size_t>(static_cast<size_t>(serve_), b.tiers.size() - 1)];
    fallback_.SetFromPlan(o, t.fallback, plan.fallback_policy.deadline_miss);
    // The read covers tiers 0..served at once: it starts with the earliest prefetch among them.
    if (st_[o].where == Where::kStreamed && st_[o].seq >= 0) {
      int start = INT_MAX;
      for (size_t k = 0; k < b.tiers.size() && static_cast<int>(k) <= serve_; ++k)
        for (const compiler::Prefetch& p : b.tiers[k].prefetch) {
          if (p.start_during.empty()) {
            start = 0;
            continue;
          }
          const int a = index_->FindOp(p.start_during);
          if (a >= 0 && st_[a].anchor_seq >= 0) start = std::min(start, st_[a].anchor_seq);
        }
      // A start the store's order does not put before the op (another model's plan): depth rule.
      if (start < st_[o].seq) {
        st_[o].issue_seq = start;
        plan_schedules_ = true;
      }
    }
    for (const std::string& e : b.tiers[0].evict_after) {
      auto it = op_of.find(e);
      if (it == op_of.end()) continue;
      const int x = index_->FindOp(it->second);
      // Only later evictions within one token's sequence; anything else keeps the default.
      if (x >= 0 && x != o && st_[x].seq >= 0 && st_[o].seq > st_[x].seq) st_[x].evict_at = o;
    }
  }
  return Status::Ok();
}

void ResidencyManager::AdvanceTo(int seq) {
  const int64_t n = static_cast<int64_t>(seq_.size());
  if (pos_ < 0) {
    pos_ = seq;
  } else {
    const int64_t d = (seq - pos_ % n + n) % n;
    // Positions skipped (an op the model did not run): release what was read for them.
    for (int64_t q = pos_ + 1; q < pos_ + d; ++q) {
      OpState& s = st_[seq_[q % n]];
      if (s.where != Where::kExpert && s.slab >= 0 && s.abs == q) {
        sched_->Cancel(&slabs_[s.slab]->ticket);
        slabs_[s.slab]->op = -1;
        s.slab = -1;
      }
    }
    pos_ += d;
  }
}

void ResidencyManager::BeginOp(const std::string& op_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const int o = index_->FindOp(op_id);
  if (o < 0) return;
  OpState& s = st_[o];
  cur_op_ = o;
  s.win_start = NowUs();
  s.win_stall = 0;
  s.win_hit = true;
  s.win_tier = Want(o);
  op_error_[o] = Status::Ok();
  if (s.layer >= 0) cur_layer_ = s.layer;
  if (s.where == Where::kExpert) {
    op_error_[o] = BeginExpert(o);
    return;
  }
  if (s.where == Where::kRows) return;  // ReadRows reads what the op needs
  if (s.seq >= 0) AdvanceTo(s.seq);
  s.kept = false;  // in use again: EndOp decides whether to keep it once more
  // An op with a resident skeleton whose late residual may go to a lower tier never waits for
  // it: it runs on its skeleton this token (the admission's skip, an escalation decided after
  // the read-ahead point, or a read still in flight, which is kept for the next token), and a
  // read made at a lower tier than the op now wants serves that tier.
  const bool may_skip = fallback_.may_skip(o, s.resident_top);
  if (Streams(o) && may_skip &&
      (s.slab < 0 || (s.abs == pos_ && !sched_->Ready(&slabs_[s.slab]->ticket)))) {
    if (s.slab >= 0) s.abs = pos_ + static_cast<int64_t>(seq_.size());
    fallback_.SkipMissing(o, s.resident_top, pos_);
    s.win_tier = s.resident_top;
    s.win_hit = false;
    ++stats_.misses;
  } else if (Streams(o)) {
    if (s.slab >= 0 && s.abs == pos_ && Raised(o, s.asked) && !may_skip) {
      // Read ahead before its tier was raised: read again at the new tier.
      sched_->Cancel(&slabs_[s.slab]->ticket);
      slabs_[s.slab]->op = -1;
      s.slab = -1;
    }
    if (s.slab < 0 || s.abs != pos_) {
      // Not read ahead (the first op, or slabs were busy): read now, at the head of the queue.
      if (s.slab < 0) {
        int free_slab = FreeSlab();
        // Every slab taken (a plan's early reads when the budget held fewer slabs than its
        // windows): the read with the latest deadline gives its slab up and is issued again later.
        int64_t latest = pos_;
        for (size_t i = 0; i < slabs_.size() && free_slab < 0; ++i)
          if (slabs_[i]->op >= 0 && st_[slabs_[i]->op].abs > latest)
            latest = st_[slabs_[i]->op].abs;
        for (size_t i = 0; i < slabs_.size() && free_slab < 0 && latest > pos_; ++i) {
          if (slabs_[i]->op < 0 || st_[slabs_[i]->op].abs != latest) continue;
          sched_->Cancel(&slabs_[i]->ticket);
          st_[slabs_[i]->op].slab = -1;
          slabs_[i]->op = -1;
          free_slab = static_cast<int>(i);
        }
        if (free_slab >= 0) {
          s.slab = free_slab;
          s.tier = s.asked = Want(o);
          slabs_[free_slab]->op = o;
          Submit(INT64_MIN / 2, o, s.tier, slabs_[free_slab]->buf.data(),
                 &slabs_[free_slab]->ticket, s.resident_top + 1);
        }
      }
      s.abs = pos_;
    }
    if (s.slab >= 0) {
      ReadTicket* t = &slabs_[s.slab]->ticket;
      if (!sched_->Ready(t)) {
        s.win_hit = false;
        sched_->Expedite(t, INT64_MIN / 2);
        int64_t waited = 0;
        op_error_[o] = sched_->Wait(t, &waited);
        s.win_stall += waited;
      } else {
        op_error_[o] = sched_->Wait(t, nullptr);
      }
      s.win_tier = s.tier;
    }
    // else: no slab free (a plan's late evictions); Acquire demand-loads.
    s.win_hit ? ++stats_.hits : ++stats_.misses;
  }
  ScheduleAhead();
}

void ResidencyManager::ReadExpert(int slot, int o, int64_t deadline) {
  const int want = Want(o);
  // An expert that may run on its skeleton while its residual is late (the fallback of an
  // escalation) reads the tiers the runtime keeps first, its residual tiers as an upgrade.
  const int base = fallback_.lowers(o) ? std::min(want, keep_) : want;
  experts_->Assign(slot, o, base, pos_);
  Submit(deadline, o, base, experts_->slot(slot).data, &experts_->slot(slot).ticket, 0, slot);
  if (want > base) Upgrade(slot, want, deadline);
}

void ResidencyManager::Upgrade(int slot, int tier, int64_t deadline) {
  ExpertCache::Slot& sl = experts_->slot(slot);
  sl.upgrade_tier = tier;
  Submit(deadline, sl.op, tier, sl.data + index_->ops()[sl.op].SlabOffset(sl.tier + 1),
         &sl.upgrade, sl.tier + 1);
}

Status ResidencyManager::SettleUpgrade(int slot) {
  ExpertCache::Slot& sl = experts_->slot(slot);
  Status st = sched_->Wait(&sl.upgrade, nullptr);
  if (st.ok()) sl.tier = sl.upgrade_tier;
  sl.upgrade_tier = 0;
  sched_->Cancel(&sl.upgrade);  // done already; makes the ticket idle
  return st;
}

Status ResidencyManager::BeginExpert(int o) {
  OpState& s = st_[o];
  const int want = Want(o);
  int slot = experts_->Find(o);
  if (slot >= 0) {
    ExpertCache::Slot& sl = experts_->slot(slot);
    if (sl.hint_unused) {
      sl.hint_unused = false;
      ++experts_->hint_used;
    }
    if (sched_->Ready(&sl.ticket)) {
      ++experts_->hits;
    } else {
      ++experts_->late;
      s.win_hit = false;
      sched_->Expedite(&sl.ticket, INT64_MIN / 2);
    }
    // Cached below the tier the op now runs at (escalated): its residual tiers are read into the
    // slot's room above them, while the tiers it holds go on serving.
    if (sl.upgrade_tier == 0 && sl.tier < want) Upgrade(slot, want, INT64_MIN / 2);
  } else {
    ++experts_->misses;
    s.win_hit = false;
    // Every slot may be busy with hinted reads (a prefill routes to many experts): wait for one.
    auto in_flight = [&](ReadTicket* t) {
      return !sched_->Ready(t) && t->state != ReadTicket::kIdle &&
             t->state != ReadTicket::kFailed;
    };
    while ((slot = experts_->TakeVictim(pos_)) < 0) {
      ReadTicket* busy = nullptr;
      for (int i = 0; i < experts_->n_slots() && !busy; ++i) {
        ExpertCache::Slot& b = experts_->slot(i);
        if (b.pins > 0) continue;
        if (in_flight(&b.ticket)) busy = &b.ticket;
        else if (in_flight(&b.upgrade)) busy = &b.upgrade;
      }
      // Every slot pinned (a prefill batch begins more experts than there are slots):
      // Acquire reads this one into a buffer of its own, freed at the batch's EndOp.
      if (!busy) return Status::Ok();
      int64_t waited = 0;
      sched_->Expedite(busy, INT64_MIN / 2);
      (void)sched_->Wait(busy, &waited);
      s.win_stall += waited;
    }
    ReadExpert(slot, o, INT64_MIN / 2);
  }
  ExpertCache::Slot& sl = experts_->slot(slot);
  int64_t waited = 0;
  Status st = sched_->Wait(&sl.ticket, &waited);
  s.win_stall += waited;
  if (st.ok() && sl.upgrade_tier > 0) {
    // The residual of an escalation: waited for only when the op may not run on the tiers the
    // slot holds (FallbackPlanner); otherwise used from the first token it has arrived for.
    // Before the first pass nothing decodes (a verifier's setup reads): it is waited for.
    if (want > sl.tier && !sched_->Ready(&sl.upgrade) &&
        (pos_ < 0 || !fallback_.SkipMissing(o, sl.tier, pos_))) {
      s.win_hit = false;
      sched_->Expedite(&sl.upgrade, INT64_MIN / 2);
      st = sched_->Wait(&sl.upgrade, &waited);
      s.win_stall += waited;
    }
    if (st.ok() && sched_->Ready(&sl.upgrade)) st = SettleUpgrade(slot);
  }
  s.win_tier = std::min(sl.tier, want);
  if (!st.ok()) {
    // Leave no half-read expert behind: the slot is emptied so the next use reads again.
    sched_->Cancel(&sl.ticket);
    sched_->Cancel(&sl.upgrade);
    experts_->Clear(slot);
    return st;
  }
  ++sl.pins;  // until this op's EndOp: a batch of experts may be open at once
  experts_->Touch(slot, pos_);
  return Status::Ok();
}

void ResidencyManager::HintExperts(int layer, const int32_t* experts, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (layer < 0 || layer >= hp_.n_layer) return;
  ScoreGuess(layer, experts, n);
  if (!experts_ || experts_->n_slots() == 0) return;
  // Due when its layer starts: now for this layer's own hint, d layers on for a guess d ahead.
  const int64_t deadline = pos_ + std::max(0, layer - cur_layer_) * int64_t{ops_per_layer_};
  // Hinted reads may fill all but one slot, so a miss always finds a victim soon.
  int busy = 0;
  for (int i = 0; i < experts_->n_slots(); ++i) {
    const auto st = experts_->slot(i).ticket.state.load();
    busy += st == ReadTicket::kQueued || st == ReadTicket::kRunning;
  }
  if (layer <= cur_layer_) busy -= DropWrongGuesses(layer, experts, n);
  for (int i = 0; i < n; ++i) {
    if (experts[i] < 0 || experts[i] >= hp_.n_expert) continue;
    const int o = expert_ops_[layer][experts[i]];
    if (o < 0) continue;
    int slot = experts_->Find(o);
    if (slot < 0) {
      if (busy + 1 >= experts_->n_slots()) continue;
      // Experts hinted within the look-ahead's reach (and the layer before) stay until used.
      // A guess never evicts an expert used (or read) within the last token's ops: with a cache
      // little larger than a token's experts, guesses that did cycled the cache through them
      // (qwen2moe at 2 GiB: 113 slots for a token's 96 experts, bench/RESULTS.md).
      const int64_t used_before =
          layer > cur_layer_ ? pos_ - static_cast<int64_t>(seq_.size()) : INT64_MAX;
      slot = experts_->TakeVictim(
          pos_ - (1 + std::max(1, stats_.lookahead_layers)) * ops_per_layer_, used_before);
      if (slot < 0) return;
      ReadExpert(slot, o, deadline);
      experts_->slot(slot).hint_pos = pos_;
      experts_->slot(slot).hint_unused = true;
      ++experts_->hinted;
      ++busy;
      continue;
    }
    // Cached below the tier it will run at (a verify pass after drafts at the skeleton, an
    // escalation): its residual is read from the hint on, not from the op's begin.
    ExpertCache::Slot& sl = experts_->slot(slot);
    if (sl.upgrade_tier == 0 && sl.tier < Want(o)) Upgrade(slot, Want(o), deadline);
  }
}

void ResidencyManager::ScoreGuess(int layer, const int32_t* experts, int n) {
  constexpr int kDepths = ResidencyStats::kScoredDepths + 1;
  if (pending_guess_.empty()) pending_guess_.resize(static_cast<size_t>(hp_.n_layer) * kDepths);
  std::vector<int32_t>* kept = &pending_guess_[static_cast<size_t>(layer) * kDepths];
  // A pass of several tokens hints the union of its tokens' experts: not scored.
  const bool one_token = n <= hp_.n_expert_used;
  const int depth = layer - cur_layer_;
  if (depth > 0) {  // a guess: scored once the layer's router has run
    if (depth < kDepths) kept[depth].assign(experts, experts + (one_token ? n : 0));
    return;
  }
  for (int d = 1; d < kDepths; ++d) {
    if (kept[d].empty()) continue;
    if (one_token) {
      ResidencyStats::GuessScore& s = stats_.lookahead[d];
      s.guessed += kept[d].size();
      s.routed += static_cast<uint64_t>(n);
      for (int32_t e : kept[d]) s.right += std::binary_search(experts, experts + n, e);
    }
    kept[d].clear();
  }
}

int ResidencyManager::DropWrongGuesses(int layer, const int32_t* experts, int n) {
  // The layer's real routing is known: guessed reads for its other experts would only delay
  // the misses and take the disk's time, so they are dropped: a queued one at once (its slot
  // freed), a running one at its next range (its slot emptied now, reused once the read has
  // stopped: TakeVictim skips slots whose read is in flight).
  // (A layer's real hint lists its experts in increasing order.) Returns the slots freed now.
  int dropped = 0;
  for (int e = 0; e < hp_.n_expert; ++e) {
    const int o = expert_ops_[layer][e];
    const int slot =
        o >= 0 && !std::binary_search(experts, experts + n, e) ? experts_->Find(o) : -1;
    if (slot < 0) continue;
    ExpertCache::Slot& sl = experts_->slot(slot);
    if (!sl.hint_unused || sl.pins > 0 || sl.upgrade.state.load() != ReadTicket::kIdle) continue;
    const ReadTicket::State was = sched_->Abandon(&sl.ticket);
    sl.hint_unused = false;  // no longer awaited; one read already stays, cached like any other
    if (was == ReadTicket::kIdle) continue;
    experts_->Clear(slot);
    if (was == ReadTicket::kQueued) {
      ++experts_->hint_dropped;
      ++dropped;
    } else {
      ++experts_->hint_abandoned;
    }
  }
  return dropped;
}

bool ResidencyManager::StreamsExpertsOf(int layer) const {
  return experts_ && experts_->n_slots() < stats_.n_ops_expert && layer >= 0 &&
         layer < hp_.n_layer;
}

bool ResidencyManager::CachedExperts(int layer, uint8_t* cached) {
  std::lock_guard<std::mutex> lock(mu_);
  // A cache with room for every expert favours nothing worth a changed choice.
  if (!StreamsExpertsOf(layer)) return false;
  for (int e = 0; e < hp_.n_expert; ++e) {
    const int o = expert_ops_[layer][e];
    cached[e] = o >= 0 && (st_[o].where != Where::kExpert || experts_->Find(o) >= 0);
  }
  return true;
}

bool ResidencyManager::ExpertsReady(int layer, const int32_t* experts, int n, uint8_t* ready) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!StreamsExpertsOf(layer)) return false;
  for (int i = 0; i < n; ++i) {
    const int o = experts[i] >= 0 && experts[i] < hp_.n_expert ? expert_ops_[layer][experts[i]] : -1;
    const int slot = o >= 0 && st_[o].where == Where::kExpert ? experts_->Find(o) : -1;
    ready[i] = o < 0 || st_[o].where != Where::kExpert ||
               (slot >= 0 && sched_->Ready(&experts_->slot(slot).ticket));
  }
  return true;
}

void ResidencyManager::EndOp(const std::string& op_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const int o = index_->FindOp(op_id);
  if (o < 0) return;
  OpState& s = st_[o];
  const int64_t end = NowUs();
  if (trace_) {
    const char* where = s.where == Where::kResident   ? "resident"
                        : s.where == Where::kStreamed ? "stream"
                        : s.where == Where::kRows     ? "rows"
                                                      : "expert";
    OpEvent e;
    e.op = &index_->ops()[o].id;
    e.tier = s.win_tier;
    e.bytes = s.where == Where::kRows && rows_ ? rows_->row_bytes() : OpBytes(o);  // a row
    e.start_us = s.win_start;
    e.end_us = end;
    e.stall_us = s.win_stall;
    e.hit = s.win_hit;
    // Run without its residual: a streamed op on its resident skeleton, an expert on its slot's.
    e.skip = fallback_.skips(o, pos_) &&
             (s.where == Where::kExpert || s.win_tier == s.resident_top);
    e.where = where;
    trace_->Op(e);
  }
  stats_.stall_us += s.win_stall;
  if (s.where == Where::kExpert) {
    const int slot = experts_->Find(o);
    if (slot >= 0 && experts_->slot(slot).pins > 0) --experts_->slot(slot).pins;
  } else {
    const double us = static_cast<double>(std::max<int64_t>(0, end - s.win_start - s.win_stall));
    s.compute_us = s.timed ? 0.8 * s.compute_us + 0.2 * us : us;
    s.timed = true;
  }
  for (int e : evict_lists_[o]) {
    OpState& v = st_[e];
    if (v.where == Where::kExpert || v.slab < 0 || v.abs > pos_) continue;
    // An escalation's residual (tiers above a resident skeleton) stays in its slab for the op's
    // next token while the op still wants no more than it holds, up to residual_slabs of them.
    const int want = Want(e);
    if (v.resident_top >= 0 && want > v.resident_top && want <= v.tier &&
        KeptSlabs() < options_.residual_slabs && sched_->Ready(&slabs_[v.slab]->ticket)) {
      v.abs = pos_ + static_cast<int64_t>(seq_.size());
      v.kept = true;
      ++stats_.residuals_kept;
      continue;
    }
    sched_->Cancel(&slabs_[v.slab]->ticket);  // done already; makes the ticket idle
    slabs_[v.slab]->op = -1;
    v.slab = -1;
  }
  // Handles are released before EndOp (also inside an open batch of experts), so buffers read on
  // demand go at the first EndOp after them.
  demand_.clear();
  op_error_[o] = Status::Ok();
  ScheduleAhead();
}

Expected<const uint8_t*> ResidencyManager::DemandLoad(int o, int* tier) {
  for (const auto& d : demand_)
    if (d->op == o) {
      *tier = d->tier;
      return d->buf.data();
    }
  auto d = std::make_unique<Demand>();
  d->op = o;
  d->tier = Want(o);
  auto buf = AlignedBuffer::Allocate(OpBytes(o), ledger_, "stream");
  if (!buf.ok())
    return buf.status().WithContext("reading op '" + index_->ops()[o].id + "' on demand");
  d->buf = std::move(buf).value();
  Submit(INT64_MIN / 2, o, d->tier, d->buf.data(), &d->ticket);
  int64_t waited = 0;
  Status st = sched_->Wait(&d->ticket, &waited);
  if (cur_op_ >= 0) st_[cur_op_].win_stall += waited;
  RETURN_IF_ERROR(st);
  ++stats_.demand_loads;
  *tier = d->tier;
  demand_.push_back(std::move(d));
  return demand_.back()->buf.data();
}

Expected<WeightHandle> ResidencyManager::Acquire(TensorId id, int slice, int tier) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t offset_el = 0;
  ASSIGN_OR_RETURN(const StoreUnit* u, index_->FindUnit(id, slice, &offset_el));
  const int o = u->op;
  if (o < 0 || st_[o].where == Where::kUnused)
    return NotFound("runtime: tensor '" + index_->tensors()[id].info.name +
                    "' is in no op of the plan (a next-n layer's, planned only with --draft-mtp)");
  OpState& s = st_[o];
  if (!op_error_[o].ok()) return op_error_[o];
  if (s.where == Where::kRows)
    return InvalidArgument("runtime: tensor '" + index_->tensors()[id].info.name +
                           "' is read by rows (the budget does not hold it): ReadRows, not Acquire");
  const StoreOp& op = index_->ops()[o];
  // Tiers 0..resident_top come from the op's resident buffer; higher ones from the read that
  // holds them (an expert slot, a slab, a demand read), whose layout is the slab layout with
  // its first tier at the start (`read` points where tier 0 would be).
  const uint8_t* read = nullptr;
  const std::vector<WeightLayout>* read_layout = nullptr;  // tier 0's in `read`, per unit
  int loaded = s.resident_top;
  const int asked = tier < 0 ? serve_ : tier;
  if (s.where != Where::kExpert && asked <= s.resident_top) {
    // The tiers it keeps serve (a look-ahead guess on the skeleton): no read to wait for.
  } else if (s.where == Where::kExpert) {
    int slot = experts_->Find(o);
    if (slot >= 0 && sched_->Ready(&experts_->slot(slot).ticket)) {
      ExpertCache::Slot& sl = experts_->slot(slot);
      // Tier 0 read into the slot and not yet adopted (where the reading threads do not): now,
      // by the compute threads, so that a cached expert's products never run on plain rows.
      if (options_.backend && s.resident_top < 0 && sl.layout.empty())
        AdoptMatrices(o, sl.data, Adopter::kFirstUse, &sl.layout);
      read = sl.data;
      read_layout = &sl.layout;
      loaded = sl.tier;
    } else {
      ASSIGN_OR_RETURN(read, DemandLoad(o, &loaded));
    }
  } else if (fallback_.skips(o, pos_)) {
    // The residual skipped this token (BeginOp): the resident tiers only.
  } else if (s.slab >= 0) {
    // Read ahead already (perhaps still in flight: a look-ahead acquiring the next op's tensors).
    ReadTicket* t = &slabs_[s.slab]->ticket;
    if (!sched_->Ready(t)) {
      sched_->Expedite(t, INT64_MIN / 2);
      int64_t waited = 0;
      Status st = sched_->Wait(t, &waited);
      if (cur_op_ >= 0) st_[cur_op_].win_stall += waited;
      RETURN_IF_ERROR(st);
    }
    read = slabs_[s.slab]->buf.data() - op.SlabOffset(s.resident_top + 1);
    loaded = s.tier;
  } else if (Want(o) > s.resident_top) {
    ASSIGN_OR_RETURN(read, DemandLoad(o, &loaded));
  }
  const int use = std::min({asked, loaded, u->n_tiers - 1});
  const uint8_t* ptr[3] = {nullptr, nullptr, nullptr};
  for (int k = 0; k <= use; ++k)
    ptr[k] =
        (k <= s.resident_top ? s.resident.data() : read) + op.SlabOffset(k) + u->tier[k].slab_pos;
  WeightView v = index_->MakeView(id, slice, *u, offset_el, use, ptr);
  // Tier 0 in the layout the backend gave its unit: from the resident buffer (AdoptResident)
  // or from an expert slot's read (Finish).
  const std::vector<WeightLayout>* layout = s.resident_top >= 0 ? &s.resident_layout : read_layout;
  if (layout && !layout->empty()) {
    for (size_t i = 0; i < op.units.size(); ++i)
      if (op.units[i].first == id && (op.units[i].second == slice || op.units[i].second < 0))
        v.layout = (*layout)[i];
    if (v.layout != WeightLayout::kRows && offset_el != 0 &&
        index_->tensors()[id].info.ne.size() != 3)
      return InvalidArgument("tensor '" + index_->tensors()[id].info.name +
                             "': rows of an interleaved matrix cannot be sliced");
  }
  return WeightHandle(this, v, 0);
}

bool ResidencyManager::ReadsRows(TensorId id) const {
  return rows_op_ >= 0 && index_->ops()[rows_op_].units[0].first == id;
}

Status ResidencyManager::ReadRows(TensorId id, const int32_t* rows, int64_t n, uint8_t* dst) {
  if (!ReadsRows(id) || !rows_) return Unimplemented("runtime: tensor is not read by rows");
  const int64_t start = NowUs();
  Status st = rows_->Read(rows, n, dst);
  std::lock_guard<std::mutex> lock(mu_);
  if (cur_op_ >= 0) st_[cur_op_].win_stall += NowUs() - start;
  return st;
}

void ResidencyManager::ChooseEmbeddingRows(uint64_t budget, uint64_t reserve) {
  const int o = index_->FindOp(OpIdTokenEmbd());
  if (o < 0 || st_[o].where != Where::kStreamed || st_[o].seq < 0) return;
  const StoreOp& op = index_->ops()[o];
  if (op.units.size() != 1 || op.units[0].second >= 0 || op.n_tiers != 1) return;
  const StoreTensor& t = index_->tensors()[op.units[0].first];
  const uint64_t row_bytes =
      t.info.ne.size() == 2 ? RowBytes(t.info.type, t.info.ne[0]).value_or(0) : 0;
  if (!RowReader::RowFits(row_bytes) || t.units.size() != 1 ||
      t.units[0].tier[0].bytes != row_bytes * t.info.ne[1])
    return;
  // A tied output reads the whole table every token.
  if (index_->Resolve("output.weight") == kNoTensor) return;
  uint64_t all = reserve;
  for (size_t i = 0; i < st_.size(); ++i)
    if (st_[i].where != Where::kUnused) all += OpBytes(static_cast<int>(i));
  if (all <= budget) return;
  const int at = st_[o].seq;
  seq_.erase(seq_.begin() + at);
  for (OpState& s : st_) {
    if (s.seq > at) --s.seq;
    if (s.anchor_seq > at) --s.anchor_seq;
  }
  st_[o].seq = st_[o].anchor_seq = -1;
  st_[o].where = Where::kRows;
  rows_op_ = o;
}

void ResidencyManager::BindOpTiers(const std::vector<OpSpec>& ops, const uint8_t* tiers) {
  std::lock_guard<std::mutex> lock(mu_);
  model_op_.assign(index_->ops().size(), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    const int o = index_->FindOp(ops[i].id);
    if (o >= 0) model_op_[o] = static_cast<int>(i);
  }
  tiers_ = tiers;
}

Status ResidencyManager::FlushTrace() {
  return trace_ ? trace_->Flush() : Status::Ok();
}

}  // namespace substrate
