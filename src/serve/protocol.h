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
#include "serve/tool_format.h"

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

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };
// What the answer must be: free text, any JSON object, JSON valid against a schema, or a
// sentence of a grammar (the `grammar` field).
enum class OutputFormat { kText, kJsonObject, kJsonSchema, kGrammar };

struct GenerationRequest {
  Api api = Api::kOpenAIChat;
  std::string model;
  bool stream = false;
  bool include_usage = false;      // OpenAI stream_options.include_usage
  bool max_tokens_given = false;   // otherwise: as many as the context leaves
  int n = 1;                       // OpenAI: answers to generate
  SamplingParams sampling;
  std::vector<std::string> stop;
  // Exactly one of these holds the prompt:
  // chat: messages in the shape chat templates take (transformers'): {"role", "content": text
  // or null, "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": {..}}}],
  // "tool_call_id", "name"}, Anthropic's system and content blocks folded in.
  nlohmann::json messages;
  std::string prompt_text;         // completions
  std::vector<int32_t> prompt_ids; // completions given as token ids
  bool has_prompt_ids = false;

  // Tools (chat APIs), in OpenAI's shape [{"type": "function", "function": {...}}].
  std::vector<ToolSpec> tools;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;    // kNamed
  bool parallel_tool_calls = true;
  OutputFormat format = OutputFormat::kText;
  nlohmann::ordered_json schema;   // kJsonSchema (key order kept: properties come in order)
  std::string grammar;             // kGrammar
};

// Parses and validates a request body; on failure fills *error (400, naming the field).
bool ParseRequest(Api api, std::string_view body, GenerationRequest* out, ApiError* error);

// The tools as chat templates take them: [{"type": "function", "function": {"name",
// "description", "parameters"}}] (null when there are none).
nlohmann::ordered_json ToolsJson(const std::vector<ToolSpec>& tools);

// The body of an error response in the API's own shape.
std::string ErrorBody(Api api, const ApiError& error);

// How the answer ended, in protocol terms.
enum class Finish { kEndOfText, kStopSequence, kLength };

struct CompletionInfo {
  std::string id;         // "chatcmpl-..", "cmpl-..", "msg_.."
  int64_t created = 0;    // unix seconds
  std::string model;
  int prompt_tokens = 0;
  int cached_tokens = 0;      // prompt tokens whose KV entries were reused (not evaluated)
  int completion_tokens = 0;  // over all choices
  double prompt_seconds = 0;  // prefill time (the slowest choice's)
  double decode_seconds = 0;
};

std::string NewId(Api api);

std::string StreamError(Api api, const ApiError& error);
// Keeps the connection busy while queued; a failed write is how a gone client is noticed.
std::string StreamPing(Api api);

// /v1/models in OpenAI's shape, or Anthropic's when the client sent anthropic-version.
std::string ModelsBody(const std::string& model_id, int context_length, bool anthropic);

}  // namespace substrate::serve
