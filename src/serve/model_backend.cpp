#include "serve/model_backend.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "runtime/engine.h"
#include "tokenizer/chat_template.h"

namespace substrate::serve {

namespace {

std::string FileStem(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.find_last_of('/');
  std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0) name.resize(dot);
  return name.empty() ? "model" : name;
}

// The log-softmax of `logits` at `chosen` and the `n_top` most likely tokens, their bytes
// decoded one token at a time.
void StepLogprobsOf(const Tokenizer& tok, const float* logits, int64_t n_vocab, int32_t chosen,
                    int n_top, std::vector<int32_t>& order, StepLogprobs* out) {
  const float max = *std::max_element(logits, logits + n_vocab);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  auto entry = [&](int32_t id) {
    TokenLogprob e;
    e.token = id;
    const TokenId ids[1] = {id};
    auto bytes = tok.Decode(ids, {.strip_leading_space = false});
    if (bytes.ok()) e.bytes = std::move(*bytes);
    e.logprob = static_cast<float>(logits[id] - log_z);
    return e;
  };
  out->chosen = entry(chosen);
  out->top.clear();
  const int k = static_cast<int>(std::min<int64_t>(n_top, n_vocab));
  if (k <= 0) return;
  order.resize(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
  for (int i = 0; i < k; ++i) out->top.push_back(entry(order[static_cast<size_t>(i)]));
}

}  // namespace

void FifoMutex::lock() {
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t ticket = next_ticket_++;
  cv_.wait(l, [&] { return serving_ == ticket; });
}

void FifoMutex::unlock() {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++serving_;
  }
  cv_.notify_all();
}

class ModelSession : public Session {
 public:
  ModelSession(ModelBackend* b, std::unique_ptr<substrate::Session> s) : b_(b), s_(std::move(s)) {}

  Expected<GenerateResult> Generate(const std::vector<int32_t>& prompt, const SamplingParams& p,
                                    const TokenCallback& on_token) override {
    Engine& engine = *b_->engine_;
    const Tokenizer& tok = *engine.tokenizer();
    const int64_t n_vocab = engine.model().hparams().n_vocab;
    for (int32_t id : prompt)
      if (id < 0 || id >= n_vocab)
        return InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary (" +
                               std::to_string(n_vocab) + " tokens)");
    GenerateOptions go;
    go.max_tokens = p.max_tokens;
    // OpenAI/Anthropic semantics: only the filters the request names (no min-p, no top-k
    // unless asked, no repetition penalty).
    go.sampling.temperature = p.temperature;
    go.sampling.top_k = p.top_k;
    go.sampling.top_p = p.top_p;
    go.sampling.min_p = 0.0f;
    go.sampling.repeat_penalty = 1.0f;
    go.sampling.seed = p.has_seed ? p.seed : std::random_device{}();
    go.draft_max = b_->draft_max_;
    go.verify = b_->verify_;
    // Slots take model passes in turn.
    go.run_pass = [this](const std::function<Status()>& pass) {
      std::lock_guard<FifoMutex> lock(b_->forward_mu_);
      return pass();
    };
    StepLogprobs lp;
    std::vector<int32_t> order;
    if (p.logprobs >= 0)
      go.on_choice = [&](const float* logits, int32_t t) {
        StepLogprobsOf(tok, logits, n_vocab, t, p.logprobs, order, &lp);
      };
    bool caller_stopped = false;
    auto st = engine.Generate(*s_, prompt, go, [&](int32_t t, const std::string& text) {
      if (on_token(t, text, t >= 0 && p.logprobs >= 0 ? &lp : nullptr)) return true;
      caller_stopped = true;
      return false;
    });
    if (!st.ok()) return st.status();
    GenerateResult r;
    r.prompt_tokens = static_cast<int>(prompt.size());
    r.cached_tokens = static_cast<int>(st->n_reused);
    r.generated_tokens = static_cast<int>(st->n_generated);
    r.finish = caller_stopped                ? BackendFinish::kCallerStopped
               : st->stop_reason == "eog"   ? BackendFinish::kEndOfText
                                             : BackendFinish::kLength;
    r.prefill_seconds = st->prompt_seconds;
    r.decode_seconds = st->decode_seconds;
    return r;
  }

  std::vector<int32_t> CachedTokens() const override { return s_->cache.tokens(); }

 private:
  ModelBackend* b_;
  std::unique_ptr<substrate::Session> s_;
};

Expected<std::unique_ptr<ModelBackend>> ModelBackend::Load(const ModelBackendOptions& options) {
  std::unique_ptr<ModelBackend> b(new ModelBackend());
  EngineOptions eo = options.engine;
  eo.n_threads = options.threads;
  eo.ledger = options.ledger;
  eo.require_tokenizer = true;
  eo.kv_type = options.kv_type;
  eo.n_ctx = options.context;
  eo.n_sessions = options.slots;
  if (options.draft_max < 0 || options.draft_max > 64)
    return InvalidArgument("serve: --draft-max must be 0..64");
  b->draft_max_ = options.draft_max;
  b->verify_ = options.verify;
  ASSIGN_OR_RETURN(b->engine_, Engine::Load(options.path, eo));
  const int64_t train = b->engine_->model().hparams().n_ctx_train;
  int64_t ctx = options.context > 0 ? options.context : std::min<int64_t>(train > 0 ? train : 4096, 4096);
  if (ctx < 2 || ctx > (1 << 22))
    return InvalidArgument("serve: context of " + std::to_string(ctx) + " tokens is out of range");
  b->context_ = static_cast<int>(ctx);
  const std::string& named = options.path.empty() ? options.engine.store : options.path;
  b->model_id_ = options.model_id.empty() ? FileStem(named) : options.model_id;
  // A model without a usable template still serves /v1/completions; chat requests get the
  // reason as a 400.
  const std::string tmpl = b->engine_->metadata().GetString("tokenizer.chat_template", "");
  if (tmpl.empty()) {
    b->template_status_ =
        InvalidArgument("the model has no chat template (tokenizer.chat_template); use /v1/completions");
  } else {
    auto parsed = ChatTemplate::Parse(tmpl);
    if (parsed.ok()) {
      b->chat_template_ = std::make_unique<ChatTemplate>(std::move(*parsed));
    } else {
      b->template_status_ = parsed.status().WithContext("the model's chat template");
    }
  }
  return b;
}

ModelBackend::~ModelBackend() = default;

std::vector<std::pair<std::string, double>> ModelBackend::RuntimeCounters() const {
  const ResidencyManager* rm = engine_->runtime();
  if (!rm) return {};
  const ResidencyStats s = rm->stats();
  auto d = [](auto v) { return static_cast<double>(v); };
  return {{"ops_resident", d(s.n_ops_resident)},
          {"ops_streamed", d(s.n_ops_streamed)},
          {"ops_expert", d(s.n_ops_expert)},
          {"resident_bytes", d(s.resident_bytes)},
          {"stream_bytes_read_total", d(s.stream_bytes_read)},
          {"read_seconds_total", s.read_seconds},
          {"read_bandwidth_bytes_per_second", s.read_bandwidth},
          {"op_hits_total", d(s.hits)},
          {"op_misses_total", d(s.misses)},
          {"stall_seconds_total", d(s.stall_us) * 1e-6},
          {"expert_hits_total", d(s.expert_hits)},
          {"expert_misses_total", d(s.expert_misses)},
          {"expert_late_total", d(s.expert_late)},
          {"expert_slots", d(s.expert_slots)},
          {"demand_loads_total", d(s.demand_loads)},
          {"serve_tier", d(s.serve_tier)}};
}

int ModelBackend::VocabSize() const {
  return static_cast<int>(engine_->model().hparams().n_vocab);
}

Expected<std::vector<int32_t>> ModelBackend::EncodeText(const std::string& text) const {
  EncodeOptions o;
  o.add_special = true;
  o.parse_special = false;
  ASSIGN_OR_RETURN(std::vector<TokenId> ids, engine_->tokenizer()->Encode(text, o));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

Expected<std::vector<int32_t>> ModelBackend::EncodeChat(const nlohmann::json& messages) const {
  if (!template_status_.ok()) return template_status_;
  const Tokenizer& tok = *engine_->tokenizer();
  // As transformers renders it (and `substrate run --chat`): the conversation, the generation
  // prompt, and the model's BOS/EOS text.
  nlohmann::ordered_json ctx;
  ctx["messages"] = nlohmann::ordered_json::array();
  for (const auto& m : messages)
    ctx["messages"].push_back({{"role", m["role"]}, {"content", m["content"]}});
  ctx["add_generation_prompt"] = true;
  ctx["bos_token"] = tok.bos() >= 0 ? tok.Piece(tok.bos()) : "";
  ctx["eos_token"] = tok.eos() >= 0 ? tok.Piece(tok.eos()) : "";
  auto text = chat_template_->Render(ctx);
  if (!text.ok()) return text.status().WithContext("chat template");
  EncodeOptions o;
  // The template writes BOS itself where the model wants one.
  o.add_special = !(tok.bos() >= 0 && text->rfind(tok.Piece(tok.bos()), 0) == 0);
  o.parse_special = true;
  ASSIGN_OR_RETURN(std::vector<TokenId> ids, tok.Encode(*text, o));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

Expected<std::unique_ptr<Session>> ModelBackend::NewSession() {
  ASSIGN_OR_RETURN(auto s, engine_->NewSession(context_));
  return std::unique_ptr<Session>(new ModelSession(this, std::move(s)));
}

}  // namespace substrate::serve
