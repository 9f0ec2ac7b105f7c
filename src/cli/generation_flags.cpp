#include "cli/generation_flags.h"

#include <algorithm>
#include <climits>
#include <cstdio>

#include "core/file_io.h"
#include "runtime/kv_session.h"

namespace substrate::cli {

std::vector<std::string> GenerationFlagsWithValue(std::vector<std::string> extra) {
  for (const char* f : {"-m", "--model", "-n", "--n-predict", "--temp", "--temperature", "--seed",
                        "-s", "-c", "--ctx-size", "-t", "--threads", "--top-k", "--top-p",
                        "--min-p", "--repeat-penalty", "--repeat-last-n", "--stop", "--kv-type",
                        "--cache-type", "--draft-max", "--draft-model", "--prompt-cache", "--verify",
                        "--verify-window", "--verify-tau", "--verify-tier", "--draft-tier"}) {
    extra.push_back(f);
  }
  return extra;
}

Expected<DType> ParseKvType(const Flags& f) {
  const std::string t = f.Get({"--kv-type", "--cache-type"}, "f32");
  if (t == "f32") return DType::kF32;
  if (t == "f16") return DType::kF16;
  return InvalidArgument("--kv-type " + t + ": the KV cache holds f32 or f16 rows");
}

Expected<GenerationFlags> ParseGenerationFlags(const Flags& f) {
  GenerationFlags g;
  ASSIGN_OR_RETURN(g.kv_type, ParseKvType(f));
  g.model = f.Get({"-m", "--model"});
  if (g.model.empty() && !f.Has("--store")) return InvalidArgument("no model given (-m MODEL: a .gguf file or a HF folder)");
  ASSIGN_OR_RETURN(long long n_ctx, f.GetInt({"-c", "--ctx-size"}, 0));
  ASSIGN_OR_RETURN(int threads, ThreadsFlag(f));
  ASSIGN_OR_RETURN(long long n, f.GetInt({"-n", "--n-predict"}, 128));
  ASSIGN_OR_RETURN(double temp, f.GetDouble({"--temp", "--temperature"}, 0.0));
  ASSIGN_OR_RETURN(long long seed, f.GetInt({"--seed", "-s"}, 0));
  ASSIGN_OR_RETURN(long long top_k, f.GetInt({"--top-k"}, 40));
  ASSIGN_OR_RETURN(double top_p, f.GetDouble({"--top-p"}, 0.95));
  ASSIGN_OR_RETURN(double min_p, f.GetDouble({"--min-p"}, 0.05));
  ASSIGN_OR_RETURN(double rp, f.GetDouble({"--repeat-penalty"}, 1.0));
  ASSIGN_OR_RETURN(long long rln, f.GetInt({"--repeat-last-n"}, 64));
  if (n_ctx < 0 || n_ctx > (1 << 22))
    return InvalidArgument("-c " + std::to_string(n_ctx) + " out of range");
  if (n < 0 || n > (1 << 24)) return InvalidArgument("-n " + std::to_string(n) + " out of range");
  g.n_ctx = n_ctx;
  g.threads = threads;
  g.generate.max_tokens = static_cast<int>(n);
  SamplingParams& s = g.generate.sampling;
  s.temperature = static_cast<float>(temp);
  s.seed = static_cast<uint64_t>(seed);
  s.top_k = static_cast<int>(std::clamp<long long>(top_k, INT_MIN, INT_MAX));
  s.top_p = static_cast<float>(top_p);
  s.min_p = static_cast<float>(min_p);
  s.repeat_penalty = static_cast<float>(rp);
  s.repeat_last_n = static_cast<int>(std::clamp<long long>(rln, INT_MIN, INT_MAX));
  // The server's rule (model/sampler.h), under the flags' names.
  if (Status valid = ValidateSamplingParams(s); !valid.ok()) {
    std::string m = valid.message();
    for (auto [field, flag] : {std::pair{"temperature", "--temp"},
                               {"top_k", "--top-k"},
                               {"top_p", "--top-p"},
                               {"min_p", "--min-p"},
                               {"repeat_penalty", "--repeat-penalty"},
                               {"repeat_last_n", "--repeat-last-n"}})
      if (m.rfind(field, 0) == 0) m = flag + m.substr(std::string(field).size());
    return InvalidArgument(m);
  }
  g.generate.stop = f.GetAll({"--stop"});
  RETURN_IF_ERROR(ParseDraftFlags(f, &g.generate.draft_max, &g.draft_model, &g.draft_mtp));
  g.prompt_cache = f.Get({"--prompt-cache"});
  ASSIGN_OR_RETURN(g.generate.verify, ParseVerifyFlags(f));
  return g;
}

Status ParseDraftFlags(const Flags& f, int* draft_max, std::string* draft_model, bool* draft_mtp) {
  *draft_model = f.Get({"--draft-model"});
  if (f.Has("--draft-model") && draft_model->empty())
    return InvalidArgument("--draft-model needs a model file (a smaller model with the target's "
                           "vocabulary)");
  *draft_mtp = f.Has("--draft-mtp");
  if (*draft_mtp && !draft_model->empty())
    return InvalidArgument("give either --draft-model or --draft-mtp: one drafter at a time");
  const bool drafter = *draft_mtp || !draft_model->empty();
  ASSIGN_OR_RETURN(long long draft, f.GetInt({"--draft-max"}, drafter ? kDefaultDraftMax : 0));
  if (draft < 0 || draft > 64)
    return InvalidArgument("--draft-max " + std::to_string(draft) + " out of range (0..64)");
  *draft_max = static_cast<int>(draft);
  return Status::Ok();
}

Expected<VerifyOptions> ParseVerifyFlags(const Flags& f) {
  VerifyOptions v;
  const std::string mode = f.Get({"--verify"}, "off");
  if (mode == "all") {
    v.mode = VerifyOptions::Mode::kAll;
  } else if (mode == "margin") {
    v.mode = VerifyOptions::Mode::kMargin;
  } else if (mode != "off") {
    return InvalidArgument("--verify " + mode + ": off, all or margin");
  }
  ASSIGN_OR_RETURN(long long window, f.GetInt({"--verify-window"}, v.window));
  ASSIGN_OR_RETURN(double tau, f.GetDouble({"--verify-tau"}, v.tau));
  ASSIGN_OR_RETURN(long long tier, f.GetInt({"--verify-tier"}, -1));
  ASSIGN_OR_RETURN(long long draft, f.GetInt({"--draft-tier"}, 0));
  if (window < 1 || window > 256) return InvalidArgument("--verify-window must be 1..256");
  if (!(tau >= 0) || tau > 1000) return InvalidArgument("--verify-tau must be a number >= 0");
  if (tier < -1 || tier > 2 || draft < 0 || draft > 2)
    return InvalidArgument("--verify-tier and --draft-tier are tiers of a store's ladder (0..2)");
  const bool any = f.Has("--verify-window") || f.Has("--verify-tau") || f.Has("--verify-tier") ||
                   f.Has("--draft-tier");
  if (any && v.mode == VerifyOptions::Mode::kOff)
    return InvalidArgument("--verify-window, --verify-tau, --verify-tier and --draft-tier need "
                           "--verify all|margin");
  v.window = static_cast<int>(window);
  v.tau = static_cast<float>(tau);
  v.verify_tier = static_cast<int>(tier);
  v.draft_tier = static_cast<int>(draft);
  return v;
}

void KeepDraftTierResident(const VerifyOptions& v, EngineOptions* opt) {
  if (v.mode == VerifyOptions::Mode::kOff) return;
  opt->residency.resident_max_tier = v.draft_tier;
  opt->residency.keep_residuals = true;
}

Expected<std::pair<std::unique_ptr<Engine>, std::unique_ptr<Session>>> LoadForGeneration(
    const GenerationFlags& g, EngineOptions opt) {
  opt.n_threads = g.threads;
  opt.kv_type = g.kv_type;
  opt.draft_model = g.draft_model;
  opt.draft_mtp = g.draft_mtp;
  // Saved sessions are the cache's host bytes (runtime/kv_session.h).
  if (!g.prompt_cache.empty() && opt.device != "cpu")
    return InvalidArgument("--prompt-cache needs --device cpu (the KV cache of --device " +
                           opt.device + " is not in host memory)");
  ASSIGN_OR_RETURN(auto engine, Engine::Load(g.model, opt));
  int64_t n_ctx = g.n_ctx;
  if (n_ctx == 0) n_ctx = std::min<int64_t>(engine->model().hparams().n_ctx_train, 4096);
  ASSIGN_OR_RETURN(auto session, engine->NewSession(n_ctx));
  if (!g.prompt_cache.empty() && FileExists(g.prompt_cache)) {
    std::string why;
    ASSIGN_OR_RETURN(bool restored, LoadKvSession(g.prompt_cache, *engine, *session, &why));
    if (!restored)
      std::fprintf(stderr, "note: --prompt-cache %s not used: %s; it will be overwritten\n",
                   g.prompt_cache.c_str(), why.c_str());
  }
  return std::make_pair(std::move(engine), std::move(session));
}

Status SavePromptCache(const GenerationFlags& g, const Engine& e, Session& s) {
  if (g.prompt_cache.empty()) return Status::Ok();
  return SaveKvSession(g.prompt_cache, e, s).WithContext("--prompt-cache " + g.prompt_cache);
}

Expected<std::vector<int32_t>> EncodePlain(const Engine& e, const std::string& text) {
  if (!e.tokenizer()) return InvalidArgument("model has no tokenizer");
  EncodeOptions o;
  o.add_special = true;
  o.parse_special = false;
  ASSIGN_OR_RETURN(std::vector<TokenId> ids, e.tokenizer()->Encode(text, o));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

Expected<std::vector<int32_t>> EncodeChat(const Engine& e, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) {
  if (!e.tokenizer()) return InvalidArgument("model has no tokenizer");
  ASSIGN_OR_RETURN(std::string text, RenderChat(e, messages, add_generation_prompt));
  EncodeOptions o;
  // The template writes BOS itself where the model wants one.
  const Tokenizer& tok = *e.tokenizer();
  o.add_special = !(tok.bos() >= 0 && text.rfind(tok.Piece(tok.bos()), 0) == 0);
  o.parse_special = true;
  ASSIGN_OR_RETURN(std::vector<TokenId> ids, tok.Encode(text, o));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

nlohmann::json StatsJson(Engine& e, const GenerateStats& st) {
  nlohmann::json j;
  j["n_prompt"] = st.n_prompt;
  j["n_reused"] = st.n_reused;
  j["n_generated"] = st.n_generated;
  j["prompt_seconds"] = st.prompt_seconds;
  j["decode_seconds"] = st.decode_seconds;
  const int64_t evaluated = st.n_prompt - st.n_reused;
  j["prompt_tokens_per_s"] = st.prompt_seconds > 0 ? evaluated / st.prompt_seconds : 0.0;
  j["tokens_per_s"] = st.decode_seconds > 0 ? st.n_generated / st.decode_seconds : 0.0;
  // Decode forward passes: one per generated token but the first, fewer with accepted drafts.
  j["decode_forwards"] = st.n_forwards;
  j["drafted"] = st.n_drafted;
  j["draft_accepted"] = st.n_accepted;
  if (st.n_drafted > 0)
    j["acceptance_rate"] = static_cast<double>(st.n_accepted) / static_cast<double>(st.n_drafted);
  if (st.n_draft_passes > 0) {
    j["draft_model_passes"] = st.n_draft_passes;
    j["draft_model_seconds"] = st.draft_seconds;
  }
  j["first_token_seconds"] = st.first_token_seconds;
  if (st.n_verify_passes > 0 || st.n_rollbacks > 0) {
    j["verify"] = {{"drafted", st.n_drafted},
                   {"verified", st.n_verified},
                   {"verify_passes", st.n_verify_passes},
                   {"rollbacks", st.n_rollbacks},
                   {"rollback_lost", st.n_rollback_lost},
                   {"verify_bytes_read", st.verify_bytes},
                   {"verify_seconds", st.verify_seconds}};
  }
  j["stop_reason"] = st.stop_reason;
  j["peak_bytes"] = e.ledger().peak();
  try {
    j["memory"] = nlohmann::json::parse(e.ledger().ToJson());
  } catch (const nlohmann::json::exception&) {
    j["memory"] = e.ledger().ToJson();
  }
  return j;
}

}  // namespace substrate::cli
