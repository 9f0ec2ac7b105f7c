#include "serve/model_backend.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <random>

#include "core/log.h"
#include "runtime/engine.h"
#include "runtime/kv_session.h"
#include "runtime/residency_manager.h"
#include "serve/token_constraint.h"
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

using ojson = nlohmann::ordered_json;

// Whether a template reads `tools` (the word, not "tool_calls").
bool ReadsTools(const std::string& src) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = src.find("tools"); at != std::string::npos; at = src.find("tools", at + 1))
    if ((at == 0 || !word(src[at - 1])) && (at + 5 >= src.size() || !word(src[at + 5]))) return true;
  return false;
}

// For a template that does not render tools: what they are and how to call them, as a system
// message.
std::string ToolsSystemText(const ojson& tools, ToolFormat f) {
  std::string s = "You can call the following tools.";
  if (f == ToolFormat::kGeneric || f == ToolFormat::kHermes)
    s += " To call one, answer with\n<tool_call>\n{\"name\": <tool name>, \"arguments\": "
         "<arguments as a JSON object>}\n</tool_call>\n(one block per call) and nothing else.";
  s += "\nTools:";
  for (const auto& t : tools) {
    s += '\n';
    s += t["function"].dump();
  }
  return s;
}

// Tool calls of an assistant message written as text (for templates without tool support).
std::string CallsAsText(const nlohmann::json& calls) {
  std::string out;
  for (const auto& c : calls) {
    ojson call = {{"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]}};
    if (!out.empty()) out += '\n';
    out += "<tool_call>\n";
    out += call.dump();
    out += "\n</tool_call>";
  }
  return out;
}

}  // namespace

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
    go.passes = b_->batcher_.get();  // continuous batching with the other slots
    // Constrained decoding and logit_bias, through the engine's logits processor.
    std::unique_ptr<TokenConstraint> constraint;
    if (p.grammar || !p.logit_bias.empty()) {
      for (const auto& [id, bias] : p.logit_bias)
        if (id < 0 || id >= n_vocab)
          return InvalidArgument("logit_bias names token " + std::to_string(id) +
                                 ", outside the vocabulary (" + std::to_string(n_vocab) + " tokens)");
      ASSIGN_OR_RETURN(auto vocab, b_->constraint_vocab());
      constraint = std::make_unique<TokenConstraint>(std::move(vocab), p.grammar, p.logit_bias,
                                                     p.grammar_triggers);
      RETURN_IF_ERROR(constraint->status());
      constraint->set_ledger(&engine.ledger());
      go.processor = constraint.get();
    }
    StepLogprobs lp;
    std::vector<int32_t> order;
    if (p.logprobs >= 0)
      go.on_choice = [&](const float* logits, int32_t t) {
        StepLogprobsOf(tok, logits, n_vocab, t, p.logprobs, order, &lp);
      };
    // The prompt cache on disk: restore a longer prefix than this slot holds.
    int disk_tokens = 0;
    if (DiskPromptCache* pc = b_->prompt_cache_.get()) {
      const std::vector<int32_t>& have = s_->cache.tokens();
      size_t common = 0;
      while (common < have.size() && common < prompt.size() && have[common] == prompt[common]) ++common;
      if (auto hit = pc->Lookup(prompt, common)) {
        std::string why;
        auto loaded = LoadKvSession(hit->path, engine, *s_, &why);
        if (loaded.ok() && *loaded) {
          disk_tokens = static_cast<int>(std::min(hit->common, prompt.size() - 1));
          pc->Restored(*hit, static_cast<size_t>(disk_tokens));
        } else {
          // Another model's file, or one removed meanwhile: evaluate instead.
          LOG_WARN("serve: prompt cache entry %s not used: %s", hit->path.c_str(),
                   loaded.ok() ? why.c_str() : loaded.status().ToString().c_str());
        }
      }
    }
    bool caller_stopped = false;
    auto st = engine.Generate(*s_, prompt, go, [&](int32_t t, const std::string& text) {
      if (constraint && !constraint->status().ok()) return false;  // fail closed
      if (on_token(t, text, t >= 0 && p.logprobs >= 0 ? &lp : nullptr)) return true;
      caller_stopped = true;
      return false;
    });
    if (!st.ok()) return st.status();
    if (constraint && !constraint->status().ok())
      return constraint->status().WithContext("constrained decoding");
    GenerateResult r;
    r.prompt_tokens = static_cast<int>(prompt.size());
    r.cached_tokens = static_cast<int>(st->n_reused);
    r.generated_tokens = static_cast<int>(st->n_generated);
    r.finish = caller_stopped                ? BackendFinish::kCallerStopped
               : st->stop_reason == "eog"   ? BackendFinish::kEndOfText
                                             : BackendFinish::kLength;
    r.prefill_seconds = st->prompt_seconds;
    r.decode_seconds = st->decode_seconds;
    r.disk_cached_tokens = std::min(disk_tokens, r.cached_tokens);
    if (constraint) {
      r.masks = constraint->stats().masks;
      r.mask_seconds = constraint->stats().mask_seconds;
      b_->masks_ += r.masks;
      b_->mask_ns_ += static_cast<uint64_t>(r.mask_seconds * 1e9);
    }
    // Keep what was evaluated for later prompts (and later runs) that start the same way, once
    // the answer is out (AfterAnswer).
    store_pending_ = b_->prompt_cache_ &&
                     st->n_prompt - st->n_reused >= static_cast<int64_t>(DiskPromptCache::kMinGain);
    return r;
  }

  std::vector<int32_t> CachedTokens() const override { return s_->cache.tokens(); }

  void AfterAnswer() override {
    if (!store_pending_) return;
    store_pending_ = false;
    Status saved = b_->prompt_cache_->Store(s_->cache.tokens(), [&](const std::string& path) {
      return SaveKvSession(path, *b_->engine_, *s_);
    });
    if (!saved.ok()) LOG_WARN("serve: prompt cache: %s", saved.ToString().c_str());
  }

  Status Save(const std::string& path) override {
    return SaveKvSession(path, *b_->engine_, *s_);
  }
  Status Restore(const std::string& path) override {
    std::string why;
    ASSIGN_OR_RETURN(bool loaded, LoadKvSession(path, *b_->engine_, *s_, &why));
    if (!loaded) return InvalidArgument("slot file '" + path + "' cannot be restored: " + why);
    return Status::Ok();
  }

 private:
  ModelBackend* b_;
  std::unique_ptr<substrate::Session> s_;
  bool store_pending_ = false;
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
  b->batcher_ = std::make_unique<PassBatcher>(b->engine_.get(), options.batching);
  if (!options.prompt_cache_dir.empty()) {
    auto fp = ModelFingerprint(*b->engine_);
    if (!fp.ok()) return fp.status().WithContext("--prompt-cache-dir");
    auto pc = DiskPromptCache::Open(options.prompt_cache_dir, *fp, options.prompt_cache_bytes);
    if (!pc.ok()) return pc.status().WithContext("--prompt-cache-dir");
    b->prompt_cache_ = std::move(*pc);
  }
  const int64_t train = b->engine_->model().hparams().n_ctx_train;
  int64_t ctx = options.context > 0 ? options.context : std::min<int64_t>(train > 0 ? train : 4096, 4096);
  if (ctx < 2 || ctx > (1 << 22))
    return InvalidArgument("serve: context of " + std::to_string(ctx) + " tokens is out of range");
  b->context_ = static_cast<int>(ctx);
  const std::string& named = options.path.empty() ? options.engine.store : options.path;
  b->model_id_ = options.model_id.empty() ? FileStem(named) : options.model_id;
  // A model without a usable template still serves /v1/completions; chat requests get the
  // reason as a 400.
  const std::string tmpl = options.chat_template.empty()
                               ? b->engine_->metadata().GetString("tokenizer.chat_template", "")
                               : options.chat_template;
  if (tmpl.empty()) {
    b->template_status_ =
        InvalidArgument("the model has no chat template (tokenizer.chat_template); use /v1/completions");
  } else {
    auto parsed = ChatTemplate::Parse(tmpl);
    if (parsed.ok()) {
      b->chat_template_ = std::make_unique<ChatTemplate>(std::move(*parsed));
      b->tool_format_ = DetectToolFormat(tmpl);
      b->template_renders_tools_ = ReadsTools(tmpl);
      if (tmpl.find("<|START_THINKING|>") != std::string::npos) {
        b->think_open_ = "<|START_THINKING|>";
        b->think_close_ = "<|END_THINKING|>";
      }
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

namespace {

// The messages as a template sees them. With `as_text` (a template that does not read `tools`,
// or fails on them), the tools are described in a system message and earlier calls and
// results are written as text.
ojson TemplateMessages(const nlohmann::json& messages, const ojson& tools, bool as_text,
                       ToolFormat format) {
  ojson msgs = ojson::array();
  if (as_text) {
    const std::string about = ToolsSystemText(tools, format);
    if (!messages.empty() && messages[0]["role"] == "system") {
      std::string sys = messages[0]["content"].get<std::string>();
      sys += "\n\n";
      sys += about;
      msgs.push_back({{"role", "system"}, {"content", sys}});
    } else {
      msgs.push_back({{"role", "system"}, {"content", about}});
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (as_text && i == 0 && m["role"] == "system") continue;
    if (as_text && m["role"] == "tool") {
      std::string r = "<tool_response>\n";
      r += m["content"].get<std::string>();
      r += "\n</tool_response>";
      if (!msgs.empty() && msgs.back()["role"] == "user" && i > 0 && messages[i - 1]["role"] == "tool")
        msgs.back()["content"] = msgs.back()["content"].get<std::string>() + "\n" + r;
      else
        msgs.push_back({{"role", "user"}, {"content", r}});
      continue;
    }
    if (as_text && m.contains("tool_calls")) {
      std::string text = m["content"].is_string() ? m["content"].get<std::string>() : "";
      if (!text.empty()) text += '\n';
      text += CallsAsText(m["tool_calls"]);
      msgs.push_back({{"role", "assistant"}, {"content", text}});
      continue;
    }
    msgs.push_back(ojson::parse(m.dump()));
  }
  return msgs;
}

}  // namespace

Expected<ChatPrompt> ModelBackend::EncodeChat(const nlohmann::json& messages,
                                              const ojson& tools) const {
  if (!template_status_.ok()) return template_status_;
  const Tokenizer& tok = *engine_->tokenizer();
  const bool with_tools = tools.is_array() && !tools.empty();
  auto render = [&](bool as_text) -> Expected<std::string> {
    // As transformers renders it (and `substrate run --chat`): the conversation, the tools,
    // the generation prompt, and the model's BOS/EOS text.
    ojson ctx;
    ctx["messages"] = TemplateMessages(messages, tools, as_text, tool_format_);
    if (with_tools && !as_text) ctx["tools"] = tools;
    ctx["add_generation_prompt"] = true;
    ctx["bos_token"] = tok.bos() >= 0 ? tok.Piece(tok.bos()) : "";
    ctx["eos_token"] = tok.eos() >= 0 ? tok.Piece(tok.eos()) : "";
    auto text = chat_template_->Render(ctx);
    if (text.ok()) return text;
    // Templates that concatenate a call's arguments into the prompt want them as a string.
    bool retried = false;
    for (auto& m : ctx["messages"])
      if (m.contains("tool_calls"))
        for (auto& c : m["tool_calls"])
          if (!c["function"]["arguments"].is_string()) {
            c["function"]["arguments"] = c["function"]["arguments"].dump();
            retried = true;
          }
    if (retried) return chat_template_->Render(ctx);
    return text;
  };
  const bool as_text = with_tools && !template_renders_tools_;
  auto text = render(as_text);
  // A template that fails on the tools (as some do in Python too) learns of them as text.
  if (!text.ok() && with_tools && !as_text) text = render(true);
  if (!text.ok()) return text.status().WithContext("chat template");
  EncodeOptions o;
  // The template writes BOS itself where the model wants one.
  o.add_special = !(tok.bos() >= 0 && text->rfind(tok.Piece(tok.bos()), 0) == 0);
  o.parse_special = true;
  ASSIGN_OR_RETURN(std::vector<TokenId> ids, tok.Encode(*text, o));
  ChatPrompt out;
  out.tokens.assign(ids.begin(), ids.end());
  out.tool_format = tool_format_;
  out.think_open = think_open_;
  out.think_close = think_close_;
  std::string_view t = *text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  out.thinking_open = t.size() >= think_open_.size() &&
                      t.substr(t.size() - think_open_.size()) == think_open_;
  return out;
}

Expected<std::shared_ptr<const ConstraintVocab>> ModelBackend::constraint_vocab() const {
  std::lock_guard<std::mutex> lock(vocab_mu_);
  if (!vocab_) {
    auto v = ConstraintVocab::FromTokenizer(*engine_->tokenizer(),
                                            static_cast<int32_t>(engine_->model().hparams().n_vocab));
    auto charge = engine_->ledger().Charge("grammar", v->bytes());
    if (!charge.ok()) return charge.status().WithContext("constrained decoding's vocabulary");
    vocab_charge_ = std::move(*charge);
    vocab_ = std::move(v);
  }
  return vocab_;
}

Expected<std::unique_ptr<Session>> ModelBackend::NewSession() {
  ASSIGN_OR_RETURN(auto s, engine_->NewSession(context_));
  return std::unique_ptr<Session>(new ModelSession(this, std::move(s)));
}

nlohmann::json ModelBackend::RuntimeStats() const {
  nlohmann::json j = nlohmann::json::object();
  if (const ResidencyManager* rm = engine_->runtime()) {
    const ResidencyStats s = rm->stats();
    j["ops"] = {{"resident", s.n_ops_resident}, {"streamed", s.n_ops_streamed},
                {"expert", s.n_ops_expert}};
    j["expert_cache"] = {{"hits", s.expert_hits}, {"misses", s.expert_misses},
                         {"slots", s.expert_slots}};
    j["disk"] = {{"bytes_read", s.stream_bytes_read}, {"stall_us", s.stall_us},
                 {"op_hits", s.hits}, {"op_misses", s.misses}, {"demand_loads", s.demand_loads}};
    j["tier"] = s.serve_tier;
  } else {
    // Every op resident: the blocks, the embedding and the output.
    j["ops"] = {{"resident", engine_->model().hparams().n_layer + 2}, {"streamed", 0}, {"expert", 0}};
    j["expert_cache"] = {{"hits", 0}, {"misses", 0}, {"slots", 0}};
    j["disk"] = {{"bytes_read", 0}, {"stall_us", 0}, {"op_hits", 0}, {"op_misses", 0},
                 {"demand_loads", 0}};
  }
  const PassBatcherStats bs = batcher_->stats();
  j["batching"] = {{"steps", bs.steps},
                   {"rows", bs.rows},
                   {"sequences", bs.sequences},
                   {"max_sequences", bs.max_sequences},
                   {"mean_sequences", bs.steps ? static_cast<double>(bs.sequences) / bs.steps : 0.0},
                   {"token_steps", bs.token_steps},
                   {"prompt_chunks_with_decode", bs.prompt_chunks},
                   {"exclusive", bs.exclusive},
                   {"gather_seconds", bs.gather_seconds},
                   {"compute_seconds", bs.compute_seconds}};
  // Each op's tier now, counted by tier, and what the adaptive runtime has escalated.
  (void)batcher_->Exclusive([&] {
    std::map<int, int> by_tier;
    for (uint8_t t : engine_->model().op_tiers()) ++by_tier[t];
    nlohmann::json tiers = nlohmann::json::object();
    for (const auto& [t, n] : by_tier) tiers[std::to_string(t)] = n;
    j["op_tiers"] = tiers;
    if (const TierController* c = engine_->tier_controller()) {
      const TierControllerStats& s = c->stats();
      nlohmann::json now = nlohmann::json::array();
      for (int op : c->escalated())
        now.push_back({{"op", engine_->model().ops()[op].id}, {"tier", c->tier(op)}});
      j["adaptive"] = {{"escalations", s.escalations}, {"decays", s.decays},
                       {"refused", s.refused},         {"evictions", s.evictions},
                       {"escalated", now}};
    }
    return Status::Ok();
  });
  j["constraint"] = {{"masks", masks_.load()}, {"mask_seconds", mask_ns_.load() * 1e-9}};
  if (prompt_cache_) {
    const PromptCacheStats p = prompt_cache_->stats();
    j["prompt_cache"] = {{"hits", p.hits},       {"misses", p.misses},
                         {"stores", p.stores},   {"evictions", p.evictions},
                         {"entries", p.entries}, {"bytes", p.bytes},
                         {"restored_tokens", p.restored_tokens}};
  }
  return j;
}

}  // namespace substrate::serve
