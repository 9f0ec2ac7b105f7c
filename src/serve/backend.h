// The server's view of a model: a small interface the HTTP/protocol/queue layer is written
// against, so that it can be tested with a deterministic backend and run on the real engine
// (serve/model_backend.h) without knowing how tokens are made.
//
// Threading: Tokenize, RenderChat and the accessors are called from many HTTP threads at once
// and must be thread-safe. A Session is used by one slot worker at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/grammar.h"
#include "serve/tool_format.h"

namespace substrate::serve {

struct SamplingParams {
  int max_tokens = 16;       // hard cap on generated tokens (the server clamps it to the context)
  float temperature = 1.0f;  // <= 0 means greedy
  float top_p = 1.0f;        // nucleus mass, (0, 1]
  int top_k = 0;             // 0 = off
  uint64_t seed = 0;
  bool has_seed = false;     // false: the backend picks a seed (non-deterministic)
  // OpenAI logprobs: -1 = off; otherwise each generated token's log-probability and this many
  // most likely alternatives (0..20), from the model's distribution (log-softmax of the logits,
  // before temperature and the sampling filters).
  int logprobs = -1;
  std::map<int32_t, float> logit_bias;  // OpenAI logit_bias: added to those tokens' logits
  // Constrained decoding: the answer is a sentence of `grammar` (null: free text). With
  // triggers, the grammar applies from the first trigger in the answer on (auto tool calls).
  std::shared_ptr<const Grammar> grammar;
  std::vector<std::string> grammar_triggers;
};

struct TokenLogprob {
  int32_t token = -1;
  std::string bytes;  // the token's text as bytes (may be part of a UTF-8 character)
  float logprob = 0.0f;
};

// One generated token's log-probability and the most likely alternatives, most likely first.
struct StepLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

// Why generation ended, as seen by the backend. A callback returning false ends it with
// kCallerStopped; the server knows whether that was a stop string or a client gone.
enum class BackendFinish { kEndOfText, kLength, kCallerStopped };

struct GenerateResult {
  int prompt_tokens = 0;
  int cached_tokens = 0;     // prompt tokens whose KV entries were reused (slot or disk cache)
  int disk_cached_tokens = 0;  // of which restored from the prompt cache on disk
  int generated_tokens = 0;  // tokens passed to the callback
  BackendFinish finish = BackendFinish::kLength;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  uint64_t masks = 0;        // constrained decoding: token masks applied
  double mask_seconds = 0;   // and the time they took
};

// Called once per generated token (never for the end-of-text token) with the complete UTF-8
// text that token finishes (possibly empty while a multi-byte character is incomplete), and
// its log-probabilities when SamplingParams::logprobs >= 0 (else nullptr).
// Returning false stops generation at once. At the end, text still held back by the decoder
// (an incomplete character, as U+FFFD) comes with token -1 and no log-probabilities.
using TokenCallback =
    std::function<bool(int32_t token, std::string_view text, const StepLogprobs* logprobs)>;

// One slot's generation state: the KV cache it keeps between calls, so that a prompt extending
// the previous one only evaluates the new tokens.
class Session {
 public:
  virtual ~Session() = default;
  // Generates a continuation of `prompt`, reusing the KV cache for the longest prefix shared
  // with the tokens already cached. Fails (without crashing) on a prompt the model cannot take.
  virtual Expected<GenerateResult> Generate(const std::vector<int32_t>& prompt,
                                            const SamplingParams& params,
                                            const TokenCallback& on_token) = 0;
  // The tokens whose KV entries are cached now (the scheduler routes a request to the slot
  // that shares the longest prefix with it).
  virtual std::vector<int32_t> CachedTokens() const = 0;
  // Slot files (POST /slots/{id}?action=save|restore): the KV cache and its tokens written to
  // `path` (checksummed, atomically), and read back into this session. Restore fails with
  // InvalidArgument saying why for a file of another model, KV type or a larger context.
  virtual Status Save(const std::string& path) {
    return Unimplemented("this backend cannot save slots");
  }
  virtual Status Restore(const std::string& path) {
    return Unimplemented("this backend cannot restore slots");
  }
  // Work that need not delay the answer (writing the prompt cache): called after the answer
  // was handed over, before the slot takes another request.
  virtual void AfterAnswer() {}
};

// A rendered and encoded conversation, and what the template tells about the answer.
struct ChatPrompt {
  std::vector<int32_t> tokens;
  ToolFormat tool_format = ToolFormat::kGeneric;  // how the model writes tool calls
  bool thinking_open = false;  // the prompt ends inside a reasoning block (<think>)
  std::string think_open = "<think>";
  std::string think_close = "</think>";
};

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;

  // The name clients see in /v1/models and responses.
  virtual std::string ModelId() const = 0;
  // Tokens one sequence may hold (prompt + generated).
  virtual int ContextLength() const = 0;
  // Token ids are in [0, VocabSize()).
  virtual int VocabSize() const = 0;

  // Plain text -> ids, as `substrate run -p` encodes a prompt: BOS when the model adds one;
  // control-token text ("<|im_end|>") stays plain text.
  virtual Expected<std::vector<int32_t>> EncodeText(const std::string& text) const = 0;

  // A conversation through the model's chat template, encoded (control tokens recognised),
  // ending with the assistant's turn opened. `messages` are in the shape GenerationRequest
  // holds them (tool calls and results included); `tools` is null or the tools in OpenAI's
  // shape, which reach the model through its template (or, for a template without tool
  // support, a system message describing them).
  virtual Expected<ChatPrompt> EncodeChat(const nlohmann::json& messages,
                                          const nlohmann::ordered_json& tools = nullptr) const = 0;

  // A new slot state; called once per parallel slot when the server starts.
  virtual Expected<std::unique_ptr<Session>> NewSession() = 0;

  // What the engine is doing, for /v1/runtime/events and the web page: an object with any of
  // "ops" {"resident", "streamed", "expert"}, "expert_cache" {"hits", "misses"}, "disk"
  // {"bytes_read", "stall_us", "op_hits", "op_misses"}, "prompt_cache" {...}, "constraint"
  // {...}. Thread-safe; cheap (called a few times a second).
  virtual nlohmann::json RuntimeStats() const { return nlohmann::json::object(); }

  // Counters of the runtime under the model (/metrics: substrate_runtime_<name>): disk reads,
  // hits and misses of streamed ops and experts, stalls. Empty for a resident model.
  virtual std::vector<std::pair<std::string, double>> RuntimeCounters() const { return {}; }
};

}  // namespace substrate::serve
