// Shared by `substrate run`, `chat` and `perplexity`: generation flags, model loading and prompt
// encoding (plain or through the model's chat template).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "runtime/engine.h"

namespace substrate::cli {

struct GenerationFlags {
  std::string model;
  int64_t n_ctx = 0;  // 0: min(model's training context, 4096)
  int threads = 0;
  DType kv_type = DType::kF32;  // --kv-type f32|f16
  std::string prompt_cache;      // --prompt-cache FILE: session restored before, saved after
  std::string draft_model;       // --draft-model M: drafts for speculative decoding
  bool draft_mtp = false;        // --draft-mtp: drafts from the model's own next-n layer
  GenerateOptions generate;
};

// The flags that take a value, plus `extra`.
std::vector<std::string> GenerationFlagsWithValue(std::vector<std::string> extra);
Expected<GenerationFlags> ParseGenerationFlags(const Flags& f);
// `--kv-type` (alias --cache-type): the KV cache's row type, f32 (default, exact) or f16.
Expected<DType> ParseKvType(const Flags& f);
// `--draft-model M | --draft-mtp [--draft-max K]`: K (default kDefaultDraftMax with a drafter, 0
// without: off; with K and no drafter, prompt lookup drafts), the draft model's path, and whether
// the model's own next-n (MTP) layer drafts.
constexpr int kDefaultDraftMax = 4;
Status ParseDraftFlags(const Flags& f, int* draft_max, std::string* draft_model, bool* draft_mtp);
// `--verify off|all|margin [--verify-window W] [--verify-tau T] [--verify-tier N]
// [--draft-tier N]`: deferred verification (VerifyOptions).
Expected<VerifyOptions> ParseVerifyFlags(const Flags& f);
// With verification on, a store's resident ops keep the draft tier, and the verify tier's
// residuals where the budget holds them (ResidencyOptions::keep_residuals); the others are
// read for its passes.
void KeepDraftTierResident(const VerifyOptions& v, EngineOptions* opt);

// Loads the model (weights resident) and opens a session of the requested context, restored
// from --prompt-cache when that file holds a session of this model (a file of another model,
// KV type or larger context is ignored with a note; a damaged one is an error).
// `opt` carries what other flags set (a weight-source factory from --store, a ledger).
Expected<std::pair<std::unique_ptr<Engine>, std::unique_ptr<Session>>> LoadForGeneration(
    const GenerationFlags& g, EngineOptions opt = {});
// Saves the session to --prompt-cache, when given.
Status SavePromptCache(const GenerationFlags& g, const Engine& e, Session& s);

struct ChatMessage {
  std::string role;
  std::string content;
};

// Text -> ids with the model's BOS convention; control-token text in `text` stays plain text.
Expected<std::vector<int32_t>> EncodePlain(const Engine& e, const std::string& text);
// Renders `messages` with the model's chat template and encodes the result (control tokens
// recognised).
Expected<std::vector<int32_t>> EncodeChat(const Engine& e, const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt);
Expected<std::string> RenderChat(const Engine& e, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);

// {"n_prompt", "n_reused", "n_generated", "prompt_tokens_per_s", "tokens_per_s", "stop_reason",
//  "memory": ledger JSON, "peak_bytes"}
nlohmann::json StatsJson(Engine& e, const GenerateStats& st);

}  // namespace substrate::cli
