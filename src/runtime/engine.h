// Engine: the runtime session every command opens a model through (run, chat, perplexity,
// bench and the server). It opens a GGUF file, an HF folder or a packed store under a RAM
// budget (optionally with a compiled plan), and owns what a run needs: the compute backend, the
// weight source (every tensor resident, or the out-of-core ResidencyManager streaming a store
// inside the budget), the memory ledger's cap, the model, its tokenizer and the token loop
// (sampling, stop strings, speculative decoding). A Session holds one conversation's KV cache,
// reused across calls when prompts share a prefix; sessions' caches are inside the same budget.
// With a draft model (EngineOptions::draft_model) the engine owns it too, and each session its
// drafting cache.
//
//   ASSIGN_OR_RETURN(auto engine, Engine::Load("model.gguf", {}));
//   ASSIGN_OR_RETURN(auto session, engine->NewSession(4096));
//   ASSIGN_OR_RETURN(auto ids, engine->tokenizer()->Encode("def f():"));
//   engine->Generate(*session, ids, {}, [](int32_t id, const std::string& text) {
//     std::fputs(text.c_str(), stdout); return true; });  // false stops generation
//
// Threading: one Generate per Engine at a time (the model's scratch is shared), unless every
// concurrent Generate runs its passes through one PassRunner that serializes them (a server's
// PassBatcher, runtime/pass_batcher.h, which also batches them).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/resident_weight_source.h"
#include "model/sampler.h"
#include "runtime/residency_manager.h"
#include "runtime/runtime_monitor.h"
#include "runtime/tier_controller.h"
#include "runtime/verifier.h"
#include "tokenizer/tokenizer.h"

namespace substrate {

class DraftModel;
class NextnDrafter;

// The adaptive runtime (runtime/tier_controller.h, verifier.h): ops run at the store's skeleton
// and a verifier probe escalates the ones it finds drifting, within an escalation pool.
struct AdaptiveOptions {
  enum class Verifier { kResidual, kLinear, kScripted };
  bool on = false;
  Verifier verifier = Verifier::kResidual;
  std::string probes;                                // kLinear: a `substrate train-probe` file
  std::map<std::string, std::vector<float>> script;  // kScripted: op id -> disagreement per token
  int sample_rows = 16;                              // kResidual: rows sampled per op
  // Routed MoE experts climb their residual tiers too, watched on the tokens routed to them
  // (kResidual samples expert_sample_rows rows of each expert's gate).
  bool escalate_experts = true;
  int expert_sample_rows = 4;
  // An escalation's residual is used from the first token it has arrived for; until then the
  // op runs on its skeleton (no stall), unless this is set (or a plan says wait).
  bool wait_for_escalations = false;
  TierControllerOptions controller;  // pool_bytes 0: K times the largest escalation
  bool monitor = true;               // the runtime monitor (out of core only)
  RuntimeMonitorOptions monitor_options;
};

struct EngineOptions {
  // The compute backend: "cpu" or "cuda" (GPU `gpu`), see backend/backend_factory.h.
  std::string device = "cpu";
  int gpu = 0;
  // A GPU's memory budget (--max-vram; 0: the device's memory): weights past what it holds
  // beside the KV cache and activations stay in host memory and are uploaded per op.
  uint64_t max_vram = 0;
  int n_threads = 0;               // 0: ThreadPool::Default()
  ThreadPool* pool = nullptr;      // not owned: run on this pool (n_threads is then unused)
  MemoryLedger* ledger = nullptr;  // nullptr: MemoryLedger::Global()
  bool require_tokenizer = true;   // false: token-level use of models without a vocabulary
  DType kv_type = DType::kF32;     // sessions' KV cache rows: kF32 (exact) or kF16 (half size)

  // The RAM budget: the ledger's cap, which every byte of weights, KV cache and scratch is
  // charged against (0: no cap). A resident model that does not fit fails with OutOfMemory.
  uint64_t max_ram = 0;
  // A packed store (store/pack.h) to run out of core: its weights stream through a
  // ResidencyManager inside max_ram (required with it); the model path may be empty or the
  // store's model.gguf. `residency` carries the plan, trace, prefetch and I/O choices and the
  // tier served (its budget and reserve are filled in here).
  std::string store;
  // Without a store, under max_ram: a GGUF whose weights and reserve do not fit the budget runs
  // out of core read in place (ResidencyManager::OpenGguf: tier 0 is the file's own bytes); kAlways
  // reads it in place even when it would fit, kNever loads it resident (and fails if it does not fit).
  enum class InPlace { kAuto, kAlways, kNever };
  InPlace gguf_in_place = InPlace::kAuto;
  ResidencyOptions residency;
  // What the runtime reserves beside the weights: the KV caches of `n_sessions` sessions of
  // n_ctx positions (0: min(model's training context, 4096)), scratch for their passes, and
  // extra_reserve bytes of the caller's own charges (bench's bandwidth probe).
  int64_t n_ctx = 0;
  int n_sessions = 1;
  uint64_t extra_reserve = 0;
  AdaptiveOptions adaptive;
  // Cache-aware routing out of core (Model::set_cache_aware_routing): the selection bonus of an
  // expert in memory; 0 routes exactly.
  float cache_aware_routing = 0;
  // Speculative decoding with a draft model (runtime/draft_model.h): a smaller model with the
  // same vocabulary, loaded resident inside the same budget before the target, whose plan gets
  // what the drafter leaves. GenerateOptions::draft_max then drafts from it.
  std::string draft_model;
  // Speculative decoding drafted by the model's own next-n (multi-token prediction) layer
  // (runtime/nextn_draft.h), for a model whose file carries one, resident.
  bool draft_mtp = false;
};

// One conversation: its KV cache and the tokens in it.
struct Session {
  KvCache cache;
  std::vector<float> logits;  // logits after the last evaluated token
  // Deferred verification: the verify tier's own cache, holding only verified tokens (a prefix
  // of the conversation), made at the first verified generation.
  std::unique_ptr<KvCache> verify_cache;
  // With a draft model: its cache, kept in step with `cache` by each draft (DraftModel::Draft).
  std::unique_ptr<KvCache> draft_cache;
  // With next-n drafting: the next-n layer's cache, in step with `cache` (NextnDrafter).
  std::unique_ptr<KvCache> nextn_cache;
};

// Deferred verification (the localvm design): a low tier drafts tokens; the top tier checks
// windows of them in one pass each (reading, out of core, only the residuals above the resident
// skeleton) and rolls back at the first disagreement. Greedy output is the verify tier's own;
// sampled output is distributed as the verify tier's (Sampler::Verify).
struct VerifyOptions {
  enum class Mode {
    kOff,
    kAll,     // every token is checked, W at a time; only checked tokens are shown
    kMargin,  // only low-margin tokens (top-1 minus top-2 log-probability < tau) need checking:
              // one opens a window that is checked once it is W tokens long; tokens before
              // it are shown unchecked
  };
  Mode mode = Mode::kOff;
  int window = 8;
  float tau = 2.0f;
  int draft_tier = 0;
  int verify_tier = -1;  // -1: the weight source's default (a store's top tier)
  // Tests: rewrites the i-th drafted token (a scripted disagreement); null in real use.
  std::function<int32_t(int64_t i, int32_t token)> edit_draft;
};

// Constrained decoding (GenerateOptions::processor). Apply sees the logits of every position a
// token is chosen from (sampled, or verifying a draft), before the choice and before on_choice,
// and may lower any of them (-inf forbids a token); Accept hears each token shown, in order.
// With drafting, row j is offered only after the tokens before it were accepted, so a grammar's
// state always matches the row it masks.
class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  virtual void Apply(float* logits, int64_t n_vocab, const std::vector<int32_t>& history) = 0;
  virtual void Accept(int32_t token) = 0;
};

// Runs a session's model passes for Generate (GenerateOptions::passes). Without one, Generate
// runs each pass itself; a server runs the passes of all its slots through one PassBatcher,
// which evaluates those that are due together as one multi-sequence pass.
class PassRunner {
 public:
  virtual ~PassRunner() = default;
  // Model::Forward of one sequence, then Engine::AfterToken(token_step). A token step (decode,
  // drafts) computes each row as a one-token pass would (ExactTokenRows); a prompt's is free to
  // use the prefill GEMM.
  virtual Status Forward(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                         std::vector<float>* logits, bool token_step) = 0;
  // Runs `fn` with the model to itself: no other pass starts before it returns (tier changes).
  virtual Status Exclusive(const std::function<Status()>& fn) = 0;
  // A generation begins / ends: a batcher waits for the passes of the generations under way.
  virtual void BeginGeneration() {}
  virtual void EndGeneration() {}
};

struct GenerateOptions {
  SamplingParams sampling;
  int max_tokens = 128;
  std::vector<std::string> stop;  // stop strings: generation ends before any of them is shown
  bool stop_at_eog = true;        // end on the model's end-of-generation tokens
  // > 0: speculative decoding with drafts of up to this many tokens, verified in one forward
  // pass each step: from the engine's draft model when it has one (EngineOptions::draft_model),
  // else from the context (prompt lookup, model/prompt_lookup.h). The tokens are those plain
  // decoding picks (sampled ones distributed alike, Sampler::Verify); on the CPU a drafted row
  // is computed as a one-token pass computes it (ExactTokenRows), so greedy output is the same.
  int draft_max = 0;
  // Optional (not owned): runs the model passes (the prompt's, then each decode step); a server
  // batches its slots' passes with it.
  PassRunner* passes = nullptr;
  // Optional: called with the logits a token was chosen from, before the token is shown (and
  // not for end-of-generation tokens).
  std::function<void(const float* logits, int32_t token)> on_choice;
  // Optional: constrains the choices (see LogitsProcessor); not owned.
  LogitsProcessor* processor = nullptr;
  VerifyOptions verify;
};

struct GenerateStats {
  int64_t n_prompt = 0;  // prompt tokens
  int64_t n_reused = 0;  // of which found in the session's cache (not recomputed)
  int64_t n_generated = 0;
  double prompt_seconds = 0;
  double decode_seconds = 0;
  int64_t n_forwards = 0;          // decode forward passes
  int64_t n_drafted = 0;           // drafted tokens evaluated
  int64_t n_accepted = 0;          // of which shown
  int64_t n_draft_passes = 0;      // the draft model's passes (catch-up and one per draft token)
  double draft_seconds = 0;        // spent in them (part of decode_seconds)
  std::string stop_reason;         // "eog", "stop", "length", "callback", "context"
  double first_token_seconds = 0;  // from the call to the first shown token
  // Deferred verification.
  int64_t n_verify_passes = 0;
  int64_t n_verified = 0;  // drafted tokens a verify pass checked
  int64_t n_rollbacks = 0;
  int64_t n_rollback_lost = 0;  // drafted tokens discarded by rollbacks
  uint64_t verify_bytes = 0;    // bytes the runtime read during verify passes
  double verify_seconds = 0;    // spent in verify passes (part of decode_seconds)

  // Adds another generation's counts and seconds (a sum over several; first_token_seconds and
  // stop_reason are per generation and stay as they are).
  void Add(const GenerateStats& o) {
    n_prompt += o.n_prompt;
    n_reused += o.n_reused;
    n_generated += o.n_generated;
    prompt_seconds += o.prompt_seconds;
    decode_seconds += o.decode_seconds;
    n_forwards += o.n_forwards;
    n_drafted += o.n_drafted;
    n_accepted += o.n_accepted;
    n_draft_passes += o.n_draft_passes;
    draft_seconds += o.draft_seconds;
    n_verify_passes += o.n_verify_passes;
    n_verified += o.n_verified;
    n_rollbacks += o.n_rollbacks;
    n_rollback_lost += o.n_rollback_lost;
    verify_bytes += o.verify_bytes;
    verify_seconds += o.verify_seconds;
  }
};

// Called per generated token with the text that became complete (may be empty); return false to
// stop generating (text held back then is dropped). At the end, text still held back by the
// decoder (an incomplete character, as U+FFFD) comes with token -1.
using TokenCallback = std::function<bool(int32_t token, const std::string& text)>;

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> Load(const std::string& path, const EngineOptions& opt);
  // A MoE read in place from its GGUF leaves what its routing did for `fit` (routing_record.h).
  ~Engine();
  // The plan Load would choose (PlanText), reading no weight: out of core a dry run of the
  // runtime (the same choice, nothing allocated or read), resident nothing loaded.
  static Expected<std::string> Plan(const std::string& path, const EngineOptions& opt);
  // The plan this engine runs: out of core ResidencyManager::PlanText, else one line saying
  // every weight is resident.
  std::string PlanText() const;

  const ModelFile& file() const { return *file_; }
  const Metadata& metadata() const { return file_->metadata(); }
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  // nullptr when the model has no vocabulary (and require_tokenizer was false).
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  MemoryLedger& ledger() { return *ledger_; }
  WeightSource& weights() { return *weights_; }
  // The out-of-core runtime, when the weights come from a store (else null): its counters.
  ResidencyManager* runtime() { return runtime_; }
  const ResidencyManager* runtime() const { return runtime_; }
  ThreadPool& pool() { return *pool_; }
  DType kv_type() const { return kv_type_; }
  // The draft model (EngineOptions::draft_model), or null.
  DraftModel* draft_model() { return draft_.get(); }
  Backend& backend() { return *backend_; }
  // The adaptive runtime's controller (null without EngineOptions::adaptive).
  TierController* tier_controller() { return controller_.get(); }
  // After each evaluated pass (the token loops call it; so may other loops over the model): the
  // verifier's token ends, the controller decays its escalations, and the runtime monitor
  // judges the latency and disk bandwidth of decode tokens that follow one another (demoting
  // every escalation and holding new ones while either is critical). A prompt's pass is not
  // such a token (decode_step false), and restarts the monitor's clock.
  void AfterToken(bool decode_step = true);
  // The adaptive runtime's monitor (null without it, or resident).
  const RuntimeMonitor* runtime_monitor() const { return monitor_.get(); }

  // n_ctx <= 0: the model's training context.
  Expected<std::unique_ptr<Session>> NewSession(int64_t n_ctx);

  // Evaluates `prompt` (reusing the longest prefix already in the session), then samples up to
  // max_tokens tokens. Fails when the prompt does not fit the session's context.
  Expected<GenerateStats> Generate(Session& s, const std::vector<int32_t>& prompt,
                                   const GenerateOptions& opt, const TokenCallback& on_token);

  // Makes the session hold exactly `prompt` and its last logits (reusing the cached prefix),
  // evaluating through `passes` when given. Returns how many prompt tokens were reused.
  Expected<int64_t> Prefill(Session& s, const std::vector<int32_t>& prompt,
                            PassRunner* passes = nullptr);

 private:
  Engine() = default;
  // Load; plan_only stops once the weight source is chosen (Plan).
  static Expected<std::unique_ptr<Engine>> Open(const std::string& path, const EngineOptions& opt,
                                                bool plan_only);
  Status SetUpAdaptive(const AdaptiveOptions& a);
  // `passes`, or when null the engine's own runner (each pass at once).
  PassRunner& PassesOf(PassRunner* passes);
  // Generate with opt.verify on (runtime/deferred_verify.cpp).
  Expected<GenerateStats> GenerateDeferred(Session& s, const std::vector<int32_t>& prompt,
                                           const GenerateOptions& opt,
                                           const TokenCallback& on_token);
  std::unique_ptr<ModelFile> file_;
  std::unique_ptr<WeightSource> weights_;
  ResidencyManager* runtime_ = nullptr;  // weights_, when it streams a store
  std::string in_place_path_;            // the GGUF runtime_ reads in place, if it does
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_ = nullptr;
  MemoryLedger* ledger_ = nullptr;
  std::unique_ptr<Backend> backend_;  // runs on pool_; outlives model_
  DType kv_type_ = DType::kF32;
  std::unique_ptr<Model> model_;
  std::unique_ptr<TierController> controller_;  // after model_: it writes its tier table
  std::unique_ptr<VerifierProbe> verifier_;
  std::unique_ptr<RuntimeMonitor> monitor_;
  // The monitor's measures at the end of the previous pass.
  std::chrono::steady_clock::time_point last_token_;
  uint64_t last_read_bytes_ = 0;
  double last_read_seconds_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PassRunner> direct_passes_;  // PassesOf's default
  // Declared last: destroyed first, while the ledger and pool it uses are still there.
  std::unique_ptr<DraftModel> draft_;
  std::unique_ptr<NextnDrafter> nextn_;  // EngineOptions::draft_mtp
  std::string draft_path_;       // EngineOptions::draft_model
  uint64_t draft_reserve_ = 0;   // the budget it takes (estimated by a plan-only Open)
};

// The length of the longest suffix of `text` that is a prefix of some stop string (text that
// must be held back until the next token tells whether a stop string follows).
size_t StopPrefixHold(const std::string& text, const std::vector<std::string>& stop);

}  // namespace substrate
