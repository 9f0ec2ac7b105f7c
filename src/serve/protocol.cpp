#include "serve/protocol.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>

#include "model/sampler.h"
#include "serve/protocol_reader.h"
#include "serve/stop_matcher.h"

namespace substrate::serve {

using nlohmann::json;

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.type = "invalid_request_error";
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

namespace {

constexpr int kMaxNesting = 64;
constexpr size_t kMaxStops = 4;        // OpenAI's limit for `stop`
constexpr size_t kMaxStopSequences = 16;  // Anthropic's stop_sequences
constexpr int64_t kMaxChoices = 16;     // OpenAI `n`

// nlohmann's parser is iterative, but a body of a million '[' still builds a million-deep
// value; refuse absurd nesting before parsing (request bodies are a few levels deep).
bool NestingWithin(std::string_view s, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}


bool ParseStops(Reader& r, const char* key, std::vector<std::string>* out) {
  const json* v = r.Find(key);
  if (!v) return true;
  if (v->is_string()) {
    out->push_back(v->get<std::string>());
    return true;
  }
  if (!v->is_array()) return r.WrongType(key, "a string or an array of strings", *v);
  const size_t max = std::string(key) == "stop" ? kMaxStops : kMaxStopSequences;
  if (v->size() > max)
    return r.Fail(std::string("'") + key + "' holds at most " + std::to_string(max) +
                      " strings",
                  key);
  for (const auto& s : *v) {
    if (!s.is_string()) return r.WrongType(key, "an array of strings", *v);
    out->push_back(s.get<std::string>());
  }
  return true;
}

bool ParsePrompt(Reader& r, const json& body, GenerationRequest* out) {
  if (!r.Require("prompt")) return false;
  const json& p = body["prompt"];
  if (p.is_string()) {
    out->prompt_text = p.get<std::string>();
    return true;
  }
  auto ids = [&](const json& arr) {
    for (const auto& t : arr) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        return r.Fail("'prompt' token ids must be non-negative integers", "prompt");
      out->prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    out->has_prompt_ids = true;
    return true;
  };
  if (p.is_array() && !p.empty()) {
    if (p.size() == 1 && p[0].is_string()) {
      out->prompt_text = p[0].get<std::string>();
      return true;
    }
    if (p[0].is_number_integer()) return ids(p);
    if (p.size() == 1 && p[0].is_array()) return ids(p[0]);
    if (p.size() > 1 && p[0].is_string())
      return r.Fail("only one prompt per request is supported", "prompt");
  }
  return r.WrongType("prompt", "a string or an array of token ids", p);
}

}  // namespace

bool ParseRequest(Api api, std::string_view body, GenerationRequest* out, ApiError* error) {
  *out = GenerationRequest();
  out->api = api;
  if (!NestingWithin(body, kMaxNesting)) {
    *error = BadRequest("request body nests deeper than " + std::to_string(kMaxNesting) + " levels");
    return false;
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = BadRequest("request body is not valid JSON");
    return false;
  }
  if (!j.is_object()) {
    *error = BadRequest(std::string("request body must be a JSON object, got ") + TypeName(j));
    return false;
  }
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  Reader r(j);
  const bool anthropic = api == Api::kAnthropicMessages;
  auto done = [&](bool ok) {
    if (!ok) *error = r.error();
    return ok;
  };
  if (anthropic && !r.Require("model")) return done(false);
  if (!r.String("model", &out->model) || !r.Bool("stream", &out->stream)) return done(false);

  int64_t max_tokens = 0;
  if (anthropic) {
    if (!r.Require("max_tokens") || !r.Int("max_tokens", 1, INT32_MAX, &max_tokens, &out->max_tokens_given))
      return done(false);
  } else {
    if (!r.Int("max_tokens", 1, INT32_MAX, &max_tokens, &out->max_tokens_given)) return done(false);
    if (api == Api::kOpenAIChat &&
        !r.Int("max_completion_tokens", 1, INT32_MAX, &max_tokens, &out->max_tokens_given))
      return done(false);
    if (api == Api::kOpenAICompletion && !out->max_tokens_given) {
      max_tokens = 16;  // OpenAI's documented default for /v1/completions
      out->max_tokens_given = true;
    }
  }
  out->sampling.max_tokens = static_cast<int>(max_tokens);

  if (!r.Number("temperature", 0.0, anthropic ? 1.0 : 2.0, &out->sampling.temperature) ||
      !r.Number("top_p", 0.0, kMaxTopP, &out->sampling.top_p))
    return done(false);
  int64_t top_k = 0;  // the ranges run's flags share (model/sampler.h)
  if (!r.Int("top_k", 0, kMaxTopK, &top_k)) return done(false);
  out->sampling.top_k = static_cast<int>(top_k);
  int64_t seed = 0;
  if (!r.Int("seed", INT64_MIN, INT64_MAX, &seed, &out->sampling.has_seed)) return done(false);
  out->sampling.seed = static_cast<uint64_t>(seed);

  if (!ParseStops(r, anthropic ? "stop_sequences" : "stop", &out->stop)) return done(false);
  if (api == Api::kOpenAIChat) {
    bool logprobs = false, top_given = false;
    int64_t top = 0;
    if (!r.Bool("logprobs", &logprobs) || !r.Int("top_logprobs", 0, 20, &top, &top_given))
      return done(false);
    if (top_given && !logprobs)
      return done(r.Fail("'top_logprobs' needs 'logprobs': true", "top_logprobs"));
    out->sampling.logprobs = logprobs ? static_cast<int>(top) : -1;
  } else if (api == Api::kOpenAICompletion) {
    int64_t top = -1;
    if (!r.Int("logprobs", 0, 5, &top)) return done(false);
    out->sampling.logprobs = static_cast<int>(top);
  }
  if (!anthropic) {
    int64_t n = 1;
    if (!r.Int("n", 1, kMaxChoices, &n)) return done(false);
    out->n = static_cast<int>(n);
    if (!ParseLogitBias(r, &out->sampling)) return done(false);
    const json* so = r.Find("stream_options");
    if (so) {
      if (!so->is_object()) return done(r.WrongType("stream_options", "an object", *so));
      Reader sr(*so);
      if (!sr.Bool("include_usage", &out->include_usage)) {
        *error = sr.error();
        return false;
      }
    }
  }
  if (api == Api::kOpenAICompletion) {
    bool echo = false;
    if (!r.Bool("echo", &echo)) return done(false);
    if (echo) return done(r.Fail("'echo' is not supported", "echo"));
    return done(ParsePrompt(r, j, out) && ParseCompletionFormat(r, ordered, out));
  }
  return done(ParseChatBody(r, j, ordered, anthropic, out));
}

std::string ErrorBody(Api api, const ApiError& e) {
  json body;
  if (api == Api::kAnthropicMessages) {
    body = {{"type", "error"}, {"error", {{"type", e.type}, {"message", SanitizeUtf8(e.message)}}}};
  } else {
    body = {{"error",
             {{"message", SanitizeUtf8(e.message)},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  }
  return body.dump();
}

std::string NewId(Api api) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}() ^
                               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  uint64_t x = salt + 0x9E3779B97F4A7C15ull * (counter.fetch_add(1) + 1);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(x));
  switch (api) {
    case Api::kOpenAIChat: return std::string("chatcmpl-") + hex;
    case Api::kOpenAICompletion: return std::string("cmpl-") + hex;
    case Api::kAnthropicMessages: return std::string("msg_") + hex;
  }
  return hex;
}

std::string StreamError(Api api, const ApiError& e) {
  if (api == Api::kAnthropicMessages)
    return "event: error\ndata: " + ErrorBody(api, e) + "\n\n";
  return "data: " + ErrorBody(api, e) + "\n\n";
}

std::string StreamPing(Api api) {
  if (api == Api::kAnthropicMessages) return "event: ping\ndata: {\"type\":\"ping\"}\n\n";
  return ": ping\n\n";  // an SSE comment: clients ignore it
}

std::string ModelsBody(const std::string& model_id, int context_length, bool anthropic) {
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  json data = json::array();
  if (anthropic) {
    data.push_back({{"type", "model"},
                    {"id", model_id},
                    {"display_name", model_id},
                    {"created_at", "1970-01-01T00:00:00Z"}});
    return json{{"data", data}, {"has_more", false}, {"first_id", model_id}, {"last_id", model_id}}
        .dump();
  }
  data.push_back({{"id", model_id},
                  {"object", "model"},
                  {"created", now},
                  {"owned_by", "substrate"},
                  {"context_length", context_length}});
  return json{{"object", "list"}, {"data", data}}.dump();
}

}  // namespace substrate::serve
