// The three HTTP APIs (OpenAI chat completions and completions, Anthropic messages): request
// parsing and validation into one GenerationRequest, and the responses, stream events and
// errors in each API's own shape. Pure functions of their inputs: no sockets, no model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/backend.h"

namespace substrate::serve {

enum class Api { kOpenAIChat, kOpenAICompletion, kAnthropicMessages };

// An error as the client sees it: HTTP status plus the API's error type and a message.
struct ApiError {
  int http_status = 400;
  std::string type;     // "invalid_request_error", "authentication_error", ...
  std::string message;
  std::string code;     // OpenAI "code" ("context_length_exceeded"); empty = null
  std::string param;    // OpenAI "param" (the offending field); empty = null
};

ApiError BadRequest(std::string message, std::string param = "");

struct GenerationRequest {
  Api api = Api::kOpenAIChat;
  std::string model;
  bool stream = false;
  bool include_usage = false;      // OpenAI stream_options.include_usage
  bool max_tokens_given = false;   // otherwise: as many as the context leaves
  SamplingParams sampling;
  std::vector<std::string> stop;
  // Exactly one of these holds the prompt:
  nlohmann::json messages;         // chat: [{"role","content":"text"}], system folded in
  std::string prompt_text;         // completions
  std::vector<int32_t> prompt_ids; // completions given as token ids
  bool has_prompt_ids = false;
};

// Parses and validates a request body; on failure fills *error (400, naming the field).
bool ParseRequest(Api api, std::string_view body, GenerationRequest* out, ApiError* error);

// The body of an error response in the API's own shape.
std::string ErrorBody(Api api, const ApiError& error);

// How the answer ended, in protocol terms.
enum class Finish { kEndOfText, kStopSequence, kLength };

struct CompletionInfo {
  std::string id;         // "chatcmpl-..", "cmpl-..", "msg_.."
  int64_t created = 0;    // unix seconds
  std::string model;
  Finish finish = Finish::kLength;
  std::string stop_sequence;
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int completion_tokens = 0;
};

std::string NewId(Api api);

// Non-streaming response body. `logprobs` (OpenAI APIs; nullptr when not asked for): one entry
// per generated token.
std::string ResponseBody(Api api, const CompletionInfo& info, const std::string& text,
                         const std::vector<StepLogprobs>* logprobs = nullptr);

// Server-sent events. Each returns complete events ("data: ...\n\n"), ready to write.
std::string StreamStart(Api api, const CompletionInfo& info);
// `logprobs`: the entries of the tokens since the last delta (nullptr when not asked for);
// text_offset: bytes of completion text sent before this delta (completions' text_offset).
std::string StreamDelta(Api api, const CompletionInfo& info, std::string_view text,
                        const std::vector<StepLogprobs>* logprobs = nullptr,
                        size_t text_offset = 0);
std::string StreamEnd(Api api, const CompletionInfo& info, bool include_usage);
std::string StreamError(Api api, const ApiError& error);
// Keeps the connection busy while queued; a failed write is how a gone client is noticed.
std::string StreamPing(Api api);

// /v1/models in OpenAI's shape, or Anthropic's when the client sent anthropic-version.
std::string ModelsBody(const std::string& model_id, int context_length, bool anthropic);

}  // namespace substrate::serve
