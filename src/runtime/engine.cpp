#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "backend/backend_factory.h"
#include "kernels/matmul.h"
#include "model/prompt_lookup.h"
#include "runtime/draft_model.h"
#include "runtime/nextn_draft.h"
#include "runtime/routing_record.h"
#include "runtime/token_emitter.h"

namespace substrate {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// The matrix every token's logits read whole: the output projection, or the embedding table
// where the model ties them. A GPU under --max-vram holds it first (ResidentWeightSource).
const TensorInfo* OutputMatrix(const ModelFile& f) {
  const TensorInfo* embd = nullptr;
  for (const TensorInfo& t : f.tensors()) {
    if (t.name == "output.weight") return &t;
    if (t.name == "token_embd.weight") embd = &t;
  }
  return embd;
}

// Hidden rows a session keeps for its next-n drafter: a prompt batch and the passes since the
// last draft use far fewer.
constexpr int64_t kNextnHiddenRows = 2 * Model::kMaxBatch;

// The staging buffer a GPU under --max-vram uploads the weights it does not hold into: two of
// the largest per-layer matrices (or expert slices), so that a layer's gate and up products
// travel in one copy each. Larger batches are split (CudaBackend::MatMulBatch).
uint64_t VramStaging(const ModelFile& f) {
  const TensorInfo* out = OutputMatrix(f);
  uint64_t largest = 0;
  for (const TensorInfo& t : f.tensors()) {
    if (&t == out || t.name == "token_embd.weight") continue;  // adopted first / read by rows
    if (t.ne.size() == 2) largest = std::max(largest, t.bytes);
    if (t.ne.size() == 3) largest = std::max(largest, t.slice_bytes());
  }
  return std::max<uint64_t>(2 * largest, 16u << 20);
}

}  // namespace

size_t StopPrefixHold(const std::string& text, const std::vector<std::string>& stop) {
  size_t hold = 0;
  for (const std::string& s : stop) {
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), text.size()); k > hold; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

namespace {

// Each pass at once, on the calling thread.
class DirectPasses : public PassRunner {
 public:
  explicit DirectPasses(Engine* e) : e_(e) {}
  Status Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                 std::vector<float>* logits, bool token_step) override {
    std::optional<ExactTokenRows> exact;
    if (token_step) exact.emplace();
    RETURN_IF_ERROR(e_->model().Forward(tokens, n, cache, all_logits, logits));
    e_->AfterToken(token_step);
    return Status::Ok();
  }
  Status Exclusive(const std::function<Status()>& fn) override { return fn(); }

 private:
  Engine* e_;
};

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::Load(const std::string& path, const EngineOptions& opt) {
  return Open(path, opt, /*plan_only=*/false);
}

Engine::~Engine() {
  if (!runtime_ || in_place_path_.empty()) return;
  const ResidencyStats st = runtime_->stats();
  const uint64_t uses = st.expert_hits + st.expert_late + st.expert_misses;
  if (uses == 0) return;
  // A use found its expert without a read of its own unless it missed or took a hinted read.
  const double read = static_cast<double>(st.expert_misses + st.expert_hint_used);
  SaveRoutingRecord(in_place_path_,
                    {st.expert_slots, uses, std::clamp(1.0 - read / static_cast<double>(uses), 0.0, 1.0)});
}

Expected<std::string> Engine::Plan(const std::string& path, const EngineOptions& opt) {
  MemoryLedger ledger;  // a dry run charges nothing, but leaves the caller's cap alone
  EngineOptions o = opt;
  o.ledger = &ledger;
  ASSIGN_OR_RETURN(auto e, Open(path, o, /*plan_only=*/true));
  return e->PlanText();
}

std::string Engine::PlanText() const {
  const std::string draft =
      draft_path_.empty() ? std::string()
                          : "draft model: " + draft_path_ + ", resident: " +
                                FormatBytes(draft_reserve_) +
                                " of the budget (weights, scratch, its KV caches)\n";
  if (runtime_) return draft + runtime_->PlanText();
  uint64_t weights = 0;
  for (const TensorInfo& t : file_->tensors()) weights += t.bytes;
  std::string device;
  if (const MemoryLedger* d = backend_ ? backend_->device_ledger() : nullptr; d && d->cap()) {
    const auto acc = d->Accounts();
    const auto it = acc.find("weights");
    const uint64_t held = it == acc.end() ? 0 : it->second.current;
    device = "; device budget " + FormatBytes(d->cap()) + ": " + FormatBytes(held) +
             " of the weights held there, the rest uploaded from host memory by each op that "
             "reads them";
  }
  return draft + "plan: resident, every weight in memory (" + FormatBytes(weights) + ")" +
         (ledger_->cap() ? ", budget " + FormatBytes(ledger_->cap()) : std::string()) + device +
         "\n";
}

Expected<std::unique_ptr<Engine>> Engine::Open(const std::string& path_in, const EngineOptions& opt,
                                               bool plan_only) {
  std::unique_ptr<Engine> e(new Engine());
  e->ledger_ = opt.ledger ? opt.ledger : &MemoryLedger::Global();
  e->kv_type_ = opt.kv_type;
  if (opt.max_ram > 0) e->ledger_->set_cap(opt.max_ram);
  std::string path = path_in;
  if (!opt.store.empty()) {
    if (opt.max_ram == 0)
      return InvalidArgument("a store runs under a budget: give --max-ram SIZE");
    const std::string in_store = opt.store + "/model.gguf";
    if (!path.empty() && path != in_store)
      return InvalidArgument("give either -m MODEL or --store STORE/, not both");
    path = in_store;
  }
  if (opt.pool) {
    e->pool_ = opt.pool;
  } else if (opt.n_threads > 0) {
    e->own_pool_ = std::make_unique<ThreadPool>(opt.n_threads);
    e->pool_ = e->own_pool_.get();
  } else {
    e->pool_ = &ThreadPool::Default();
  }
  auto file = ModelFile::Open(path);
  if (!file.ok()) return file.status().WithContext("opening model '" + path + "'");
  e->file_ = std::move(file).value();
  // Architecture and tensor checks first, so an unsupported model fails before any weight read.
  auto hp = ModelHParams::FromMetadata(e->file_->metadata());
  if (!hp.ok()) return hp.status().WithContext(path);
  // Out of core: a store, or a GGUF under a budget its weights and the reserve do not fit.
  const int64_t ctx = opt.n_ctx > 0 ? opt.n_ctx : std::min<int64_t>(hp->n_ctx_train, 4096);
  const uint64_t kv = KvCache::Bytes(*hp, ctx, opt.kv_type);
  uint64_t reserve =
      EstimateRunReserve(*hp, ctx, std::min<int64_t>(ctx, Model::kMaxBatch), opt.kv_type) +
      kv * static_cast<uint64_t>(std::max(opt.n_sessions, 1) - 1) + opt.extra_reserve;
  {
    BackendChoice choice{opt.device, opt.gpu};
    if (opt.max_vram) {
      if (!opt.store.empty() || opt.max_ram > 0)
        return InvalidArgument(
            "--max-vram runs a resident model with part of its weights in host memory; with "
            "--store or --max-ram the weights stream from disk through host memory instead");
      if (!opt.draft_model.empty())
        return InvalidArgument("--max-vram with --draft-model: not supported yet");
      choice.vram_staging = VramStaging(*e->file_);
      choice.max_vram = opt.max_vram;
      choice.vram_reserve = reserve + choice.vram_staging;
      const TensorInfo* out = OutputMatrix(*e->file_);
      const uint64_t out_bytes = out ? out->bytes : 0;
      constexpr uint64_t kBackendWork = 128u << 20;  // its arena, work memory, cuBLAS's
      if (opt.max_vram < choice.vram_reserve + out_bytes + kBackendWork)
        return InvalidArgument("--max-vram " + FormatBytes(opt.max_vram) + " is too small for " +
                               path + ": the KV cache and activations (" + FormatBytes(reserve) +
                               "), staging for weights read per op (" +
                               FormatBytes(choice.vram_staging) + "), the output matrix (" +
                               FormatBytes(out_bytes) +
                               ") and the backend's work memory need at least " +
                               FormatBytes(choice.vram_reserve + out_bytes + kBackendWork));
    }
    auto backend = CreateBackend(choice, e->pool_, e->ledger_);
    if (!backend.ok()) return backend.status();
    e->backend_ = std::move(backend).value();
  }
  if (opt.draft_mtp && !opt.draft_model.empty())
    return InvalidArgument("give either --draft-model or --draft-mtp: one drafter at a time");
  // Under --max-vram one-token products may be split with the host CPU (the hybrid), so a
  // verify pass's rows are not computed as plain decoding's are: greedy output would not be exact.
  if (opt.draft_mtp && opt.max_vram)
    return InvalidArgument("--draft-mtp with --max-vram: not supported yet");
  if (opt.draft_mtp) {
    // Per session the next-n layer's KV cache and the hidden rows kept for it.
    reserve += static_cast<uint64_t>(std::max(opt.n_sessions, 1)) *
               (KvCache::Bytes(NextnCacheHParams(*hp), ctx, opt.kv_type) +
                static_cast<uint64_t>(kNextnHiddenRows * hp->n_embd) * sizeof(float));
  }
  // A draft model is charged first, resident; the target plans with what it leaves.
  if (!opt.draft_model.empty()) {
    EngineOptions d = opt;
    d.n_ctx = ctx;
    d.ledger = e->ledger_;
    if (plan_only) {
      ASSIGN_OR_RETURN(e->draft_reserve_, DraftModel::EstimateReserve(opt.draft_model, d));
    } else {
      ASSIGN_OR_RETURN(e->draft_, DraftModel::Load(opt.draft_model, path, *e->file_, d, e->pool_));
      e->draft_reserve_ = e->draft_->reserve_bytes();
    }
    e->draft_path_ = opt.draft_model;
    reserve += e->draft_reserve_;
  }
  bool in_place = false;
  if (opt.store.empty() && opt.max_ram > 0 && std::filesystem::is_regular_file(path) &&
      opt.gguf_in_place != EngineOptions::InPlace::kNever) {
    uint64_t weights = 0;
    for (const TensorInfo& t : e->file_->tensors()) weights += t.bytes;
    in_place =
        opt.gguf_in_place == EngineOptions::InPlace::kAlways || weights + reserve > opt.max_ram;
  }
  // Cores the compute threads leave to the reading threads (ResidencyOptions::adopt_expert_reads).
  const bool reading_cores =
      static_cast<int>(std::thread::hardware_concurrency()) > e->pool_->size();
  if (!opt.store.empty() || in_place) {
    ResidencyOptions ro = opt.residency;
    // Adaptive: the skeletons resident; escalations read their residuals.
    if (opt.adaptive.on && ro.resident_max_tier < 0) ro.resident_max_tier = 0;
    if (opt.adaptive.on) {
      ro.lower_tier_by_default = !opt.adaptive.wait_for_escalations;
      // The escalation pool's memory: one slab per concurrent escalation, kept between tokens.
      ro.residual_slabs = opt.adaptive.controller.max_concurrent;
    }
    ro.budget_bytes = opt.max_ram;
    // Each session's KV cache, plus the scratch of one pass at a time.
    ro.reserve_bytes = reserve;
    ro.dry_run = plan_only;
    ro.with_nextn = opt.draft_mtp;
    if (!e->backend_->device_ledger()) ro.backend = e->backend_.get();  // a host backend
    ro.adopt_expert_reads |= reading_cores;
    auto m = in_place ? ResidencyManager::OpenGguf(path, e->ledger_, ro)
                      : ResidencyManager::Open(opt.store, e->ledger_, ro);
    if (!m.ok()) return m.status().WithContext(path);
    if (!ro.backend && (*m)->index().has_interleaved())
      return InvalidArgument("store '" + opt.store + "' holds experts in the CPU kernels' layout "
                             "(packed with --cpu-layout), which the " + e->backend_->name() +
                             " backend does not read: pack it again without --cpu-layout");
    e->runtime_ = m->get();
    e->weights_ = std::move(m).value();
    if (in_place && !plan_only) e->in_place_path_ = path;
  } else if (plan_only) {
    return e;  // resident: nothing to choose
  } else {
    ResidentWeightSource::Options ro;
    ro.backend = e->backend_.get();
    ro.load_nextn = opt.draft_mtp;
    auto weights = ResidentWeightSource::Load(*e->file_, e->ledger_, ro);
    // The resident layout may take more than the file's bytes (repacked kernels' layouts): a
    // GGUF that then misses the budget by a little runs in place instead.
    if (!weights.ok() && weights.status().code() == StatusCode::kOutOfMemory && opt.store.empty() &&
        opt.max_ram > 0 && std::filesystem::is_regular_file(path) &&
        opt.gguf_in_place == EngineOptions::InPlace::kAuto) {
      ResidencyOptions rr = opt.residency;
      rr.budget_bytes = opt.max_ram;
      rr.reserve_bytes = reserve;
      rr.with_nextn = opt.draft_mtp;
      if (!e->backend_->device_ledger()) rr.backend = e->backend_.get();
      rr.adopt_expert_reads |= reading_cores;
      auto m = ResidencyManager::OpenGguf(path, e->ledger_, rr);
      if (!m.ok()) return m.status().WithContext(path);
      e->runtime_ = m->get();
      e->weights_ = std::move(m).value();
      e->in_place_path_ = path;
    } else if (!weights.ok()) {
      return weights.status().WithContext(path);
    } else {
      e->weights_ = std::move(weights).value();
    }
  }
  if (plan_only) return e;
  auto model =
      Model::Create(e->file_->metadata(), e->weights_.get(), e->backend_.get(), e->ledger_);
  if (!model.ok()) return model.status().WithContext(path);
  e->model_ = std::move(model).value();
  if (opt.draft_mtp) {
    RETURN_IF_ERROR(e->model_->EnableNextn().WithContext("--draft-mtp: " + path));
    e->nextn_ = std::make_unique<NextnDrafter>(e->model_.get());
  }
  if (e->draft_ && e->draft_->engine().model().hparams().n_vocab != e->model_->hparams().n_vocab)
    return InvalidArgument(
        "the draft model and the target have different vocabularies: the draft model scores " +
        std::to_string(e->draft_->engine().model().hparams().n_vocab) + " tokens, the target " +
        std::to_string(e->model_->hparams().n_vocab) + " (target " + path + ", draft model " +
        opt.draft_model + ")");
  e->direct_passes_ = std::make_unique<DirectPasses>(e.get());
  e->model_->set_cache_aware_routing(opt.cache_aware_routing);
  if (opt.adaptive.on) RETURN_IF_ERROR(e->SetUpAdaptive(opt.adaptive).WithContext(path));
  auto tok = Tokenizer::FromMetadata(e->file_->metadata());
  if (tok.ok()) {
    e->tokenizer_ = std::move(tok).value();
  } else if (opt.require_tokenizer) {
    return tok.status().WithContext(path + ": tokenizer");
  }
  return e;
}

Status Engine::SetUpAdaptive(const AdaptiveOptions& a) {
  Model& m = *model_;
  const int top = weights_->DefaultTier();
  if (top < 1 || weights_->OpBytes(m.ops().front().id, top) == 0)
    return InvalidArgument(
        "--adaptive escalates ops along a store's residual tiers: give a store "
        "with residuals (substrate pack) through --store");
  // Every op starts at the skeleton; blocks the verifier watches (and routed experts, when asked)
  // may climb to the top tier.
  const size_t n = m.ops().size();
  std::fill(m.op_tiers().begin(), m.op_tiers().end(), 0);
  std::vector<uint8_t> ceiling(n, 0);
  std::vector<std::vector<uint64_t>> cost(n,
                                          std::vector<uint64_t>(static_cast<size_t>(top) + 1, 0));
  uint64_t largest = 0;
  auto escalatable = [&](int op) {
    if (op < 0) return;
    ceiling[op] = static_cast<uint8_t>(top);
    const uint64_t base = weights_->OpBytes(m.ops()[op].id, 0);
    for (int k = 1; k <= top; ++k) cost[op][k] = weights_->OpBytes(m.ops()[op].id, k) - base;
    largest = std::max(largest, cost[op][top]);
  };
  for (const LayerWeights& w : m.layers()) {
    for (int op : {w.attn_op, w.ffn_op, w.router_op}) escalatable(op);
    for (int e = 0; a.escalate_experts && w.expert_op0 >= 0 && e < m.hparams().n_expert; ++e)
      escalatable(w.expert_op0 + e);
  }
  TierControllerOptions co = a.controller;
  if (co.pool_bytes == 0) co.pool_bytes = largest * static_cast<uint64_t>(co.max_concurrent);
  // Out of core the pool's memory is the runtime's residual slabs (charged as slabs); resident,
  // the controller charges it.
  ASSIGN_OR_RETURN(TierController c,
                   TierController::Create(&m.op_tiers(), std::move(ceiling), std::move(cost), co,
                                          runtime_ ? nullptr : ledger_));
  controller_ = std::make_unique<TierController>(std::move(c));
  switch (a.verifier) {
    case AdaptiveOptions::Verifier::kResidual: {
      ASSIGN_OR_RETURN(verifier_, ResidualSampleVerifier::Create(
                                      controller_.get(), m, top, a.sample_rows, ledger_,
                                      a.escalate_experts ? a.expert_sample_rows : 0));
      break;
    }
    case AdaptiveOptions::Verifier::kLinear: {
      ASSIGN_OR_RETURN(LinearProbes probes, LinearProbes::Load(a.probes));
      ASSIGN_OR_RETURN(verifier_, LinearProbeVerifier::Create(controller_.get(), m, probes));
      break;
    }
    case AdaptiveOptions::Verifier::kScripted: {
      std::map<int, std::vector<float>> schedule;
      for (const auto& [id, values] : a.script) {
        const int op = m.OpIndex(id);
        if (op < 0)
          return InvalidArgument("the verifier script names op '" + id +
                                 "', which this model lacks");
        schedule[op] = values;
      }
      verifier_ = std::make_unique<ScriptedVerifier>(controller_.get(), std::move(schedule));
      break;
    }
  }
  m.set_observer(verifier_.get());
  if (runtime_ && a.monitor) monitor_ = std::make_unique<RuntimeMonitor>(a.monitor_options);
  if (runtime_ && runtime_->tracing()) {
    controller_->set_listener(
        [](void* ctx, int op, int from, int to, TierSwitch why) {
          auto* e = static_cast<Engine*>(ctx);
          e->runtime_->TraceRuntime("tier", "\"op\":" + JsonQuote(e->model_->ops()[op].id) +
                                                ",\"from\":" + std::to_string(from) +
                                                ",\"to\":" + std::to_string(to) + ",\"why\":\"" +
                                                TierSwitchName(why) + "\"");
        },
        this);
  }
  return Status::Ok();
}

void Engine::AfterToken(bool decode_step) {
  if (!controller_) return;
  verifier_->NextToken();
  controller_->EndToken();
  if (monitor_) {
    const auto now = std::chrono::steady_clock::now();
    const ResidencyStats& rs = runtime_->stats();
    const uint64_t bytes = rs.stream_bytes_read - last_read_bytes_;
    const double read_s = rs.read_seconds - last_read_seconds_;
    // Only a decode step that follows another is timed: a prompt's pass, or the first step
    // after one, says nothing about per-token latency.
    if (decode_step && last_token_.time_since_epoch().count() != 0 &&
        monitor_->OnToken(std::chrono::duration<double>(now - last_token_).count(), bytes,
                          read_s)) {
      const bool critical = monitor_->state() != RuntimeState::kNormal;
      if (critical) controller_->ForceDemoteAll();
      controller_->set_hold(critical);
      if (runtime_->tracing()) {  // formatting allocates: only when tracing
        char fields[160];
        std::snprintf(
            fields, sizeof fields, "\"state\":\"%s\",\"latency_ratio\":%.3f,\"bw_ratio\":%.3f",
            RuntimeStateName(monitor_->state()), monitor_->latency_ratio(), monitor_->bw_ratio());
        runtime_->TraceRuntime("monitor", fields);
      }
    }
    last_token_ = decode_step ? now : std::chrono::steady_clock::time_point{};
    last_read_bytes_ = rs.stream_bytes_read;
    last_read_seconds_ = rs.read_seconds;
  }
  if (runtime_ && runtime_->tracing()) {
    const TierControllerStats& s = controller_->stats();
    char fields[160];
    std::snprintf(fields, sizeof fields,
                  "\"pool_used\":%llu,\"pool_bytes\":%llu,\"escalated\":%d,\"held\":%s",
                  static_cast<unsigned long long>(s.pool_used),
                  static_cast<unsigned long long>(controller_->options().pool_bytes), s.escalated,
                  controller_->held() ? "true" : "false");
    runtime_->TraceRuntime("token", fields);
  }
}

Expected<std::unique_ptr<Session>> Engine::NewSession(int64_t n_ctx) {
  if (n_ctx <= 0) n_ctx = model_->hparams().n_ctx_train;
  ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(model_->hparams(), n_ctx, *backend_, kv_type_));
  auto s = std::make_unique<Session>(Session{std::move(cache), {}, nullptr, nullptr, nullptr});
  if (draft_) {
    ASSIGN_OR_RETURN(s->draft_cache, draft_->NewCache(n_ctx));
  }
  if (nextn_) {
    ASSIGN_OR_RETURN(s->nextn_cache, nextn_->NewCache(n_ctx, kv_type_));
    s->cache.set_keep_hidden(true, kNextnHiddenRows);
  }
  return s;
}


PassRunner& Engine::PassesOf(PassRunner* passes) { return passes ? *passes : *direct_passes_; }

Expected<int64_t> Engine::Prefill(Session& s, const std::vector<int32_t>& prompt,
                                  PassRunner* passes) {
  if (prompt.empty()) return InvalidArgument("empty prompt: at least one token is needed");
  if (static_cast<int64_t>(prompt.size()) > s.cache.n_ctx()) {
    return InvalidArgument("prompt of " + std::to_string(prompt.size()) +
                           " tokens does not fit the context of " +
                           std::to_string(s.cache.n_ctx()) + " tokens (use a larger -c)");
  }
  const auto& have = s.cache.tokens();
  size_t common = 0;
  while (common < have.size() && common < prompt.size() && have[common] == prompt[common]) ++common;
  // The last prompt token is always evaluated: its logits pick the first new token.
  if (common == prompt.size()) --common;
  if (!s.nextn_cache) {
    s.cache.Truncate(static_cast<int64_t>(common));
    RETURN_IF_ERROR(PassesOf(passes).Forward(prompt.data() + common,
                                             static_cast<int64_t>(prompt.size() - common), s.cache,
                                             false, &s.logits, /*token_step=*/false));
    return static_cast<int64_t>(common);
  }
  // Next-n drafting: its entries need the target's hidden rows from the first entry that no
  // longer holds; a reused prefix whose rows are gone is evaluated again. The prompt goes in
  // batches, each followed by the entries it allows, so the rows kept stay one batch.
  GenerateStats ignored;
  const int64_t valid = NextnDrafter::KeepValid(*s.nextn_cache, prompt);
  if (!s.cache.HoldsHidden(valid, static_cast<int64_t>(common)))
    common = std::min<size_t>(common, static_cast<size_t>(valid));
  s.cache.Truncate(static_cast<int64_t>(common));
  for (size_t done = common; done < prompt.size();) {
    const size_t n = std::min<size_t>(Model::kMaxBatch, prompt.size() - done);
    RETURN_IF_ERROR(PassesOf(passes).Forward(prompt.data() + done, static_cast<int64_t>(n),
                                             s.cache, false, &s.logits, /*token_step=*/false));
    done += n;
    RETURN_IF_ERROR(nextn_->CatchUp(*s.nextn_cache, s.cache, prompt, static_cast<int64_t>(done),
                                    PassesOf(passes), &ignored));
  }
  return static_cast<int64_t>(common);
}

Expected<GenerateStats> Engine::Generate(Session& s, const std::vector<int32_t>& prompt,
                                         const GenerateOptions& opt,
                                         const TokenCallback& on_token) {
  PassRunner& passes = PassesOf(opt.passes);
  passes.BeginGeneration();
  struct End {
    PassRunner& p;
    ~End() { p.EndGeneration(); }
  } end{passes};
  if (opt.verify.mode != VerifyOptions::Mode::kOff) {
    // The processor's state follows shown tokens; deferred verification drafts ahead and rolls
    // back, which it cannot follow yet.
    if (opt.processor)
      return InvalidArgument(
          "constrained decoding (grammar, response_format, tool calls, logit_bias) does not run "
          "with deferred verification yet");
    return GenerateDeferred(s, prompt, opt, on_token);
  }
  GenerateStats st;
  st.n_prompt = static_cast<int64_t>(prompt.size());
  const auto start = std::chrono::steady_clock::now();
  auto t0 = start;
  ASSIGN_OR_RETURN(st.n_reused, Prefill(s, prompt, &passes));
  st.prompt_seconds = Seconds(t0);

  t0 = std::chrono::steady_clock::now();
  Sampler sampler(opt.sampling);
  std::vector<int32_t> history = prompt;
  const int64_t V = model_->hparams().n_vocab;
  TokenEmitter emitter(tokenizer_.get(), opt, on_token, &history, &st);
  auto emit = [&](int32_t tok, const float* logits) {
    if (st.n_generated == 0) st.first_token_seconds = Seconds(start);
    return emitter.Emit(tok, logits);
  };

  // Each step evaluates the last shown token (not yet in the cache) plus, with drafting, the
  // drafted tokens after it, in one forward pass; row j's logits then verify draft j. The first
  // rejected draft is replaced by the verifier's own choice and the rows after it are dropped,
  // so the tokens shown are exactly those plain decoding would show (Sampler::Verify).
  std::vector<float> rows;
  if (opt.processor && opt.max_tokens > 0) opt.processor->Apply(s.logits.data(), V, history);
  if (opt.max_tokens > 0 && emit(sampler.Sample(s.logits.data(), V, history), s.logits.data())) {
    for (;;) {
      const int64_t n_past = s.cache.n_past();
      if (n_past >= s.cache.n_ctx()) {
        st.stop_reason = "context";
        break;
      }
      std::vector<int32_t> batch{history.back()};
      const int64_t room =
          std::min<int64_t>(opt.max_tokens - st.n_generated - 1, s.cache.n_ctx() - n_past - 1);
      if (opt.draft_max > 0 && room > 0) {
        const int k = static_cast<int>(std::min<int64_t>(opt.draft_max, room));
        std::vector<int32_t> draft;
        if (draft_ && s.draft_cache) {
          ASSIGN_OR_RETURN(draft, draft_->Draft(*s.draft_cache, history, k, passes, &st));
        } else if (nextn_ && s.nextn_cache) {
          ASSIGN_OR_RETURN(draft,
                           nextn_->Draft(*s.nextn_cache, s.cache, history, k, passes, &st));
        } else {
          draft = PromptLookupDraft(history, k);
        }
        batch.insert(batch.end(), draft.begin(), draft.end());
      }
      const int64_t n_draft = static_cast<int64_t>(batch.size()) - 1;
      std::vector<float>* out = n_draft > 0 ? &rows : &s.logits;
      // Rows exact (a drafted row as a one-token pass computes it), then AfterToken: the
      // controller's tier changes happen inside the pass's turn, so with several sessions
      // (serve's slots) no other pass sees the tiers change under it.
      RETURN_IF_ERROR(passes.Forward(batch.data(), n_draft + 1, s.cache, n_draft > 0, out,
                                     /*token_step=*/true));
      ++st.n_forwards;
      st.n_drafted += n_draft;
      bool more = true;
      int64_t j = 0;
      for (; j <= n_draft; ++j) {
        float* logits = out->data() + j * V;
        if (opt.processor) opt.processor->Apply(logits, V, history);
        const int32_t tok = j < n_draft ? sampler.Verify(logits, V, history, batch[j + 1])
                                        : sampler.Sample(logits, V, history);
        const bool accepted = j < n_draft && tok == batch[j + 1];
        st.n_accepted += accepted;
        more = emit(tok, logits);
        if (!accepted || !more) break;
      }
      // The cache holds batch[0..n_draft]; only batch[0..j] match what was shown.
      if (j < n_draft) s.cache.Truncate(n_past + 1 + j);
      if (!more) break;
    }
  }
  emitter.Finish();
  st.decode_seconds = Seconds(t0);
  return st;
}

}  // namespace substrate
