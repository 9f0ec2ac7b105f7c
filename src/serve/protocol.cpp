#include "serve/protocol.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>

#include "model/sampler.h"
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
constexpr size_t kMaxStops = 16;

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

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::number_float: return "number";
    default: return "integer";
  }
}

// Field readers: absent (or null) leaves the default; a wrong type is an error naming it.
class Reader {
 public:
  explicit Reader(const json& obj) : obj_(obj) {}
  const ApiError& error() const { return error_; }
  bool failed() const { return failed_; }

  const json* Find(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool Require(const char* key) {
    if (Find(key)) return true;
    return Fail(std::string("missing required field '") + key + "'", key);
  }
  bool Bool(const char* key, bool* out) {
    const json* v = Find(key);
    if (!v) return true;
    if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
    *out = v->get<bool>();
    return true;
  }
  bool String(const char* key, std::string* out) {
    const json* v = Find(key);
    if (!v) return true;
    if (!v->is_string()) return WrongType(key, "a string", *v);
    *out = v->get<std::string>();
    return true;
  }
  bool Int(const char* key, int64_t lo, int64_t hi, int64_t* out, bool* given = nullptr) {
    const json* v = Find(key);
    if (!v) return true;
    if (!v->is_number_integer()) return WrongType(key, "an integer", *v);
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
      return OutOfRange(key, lo, hi);
    int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return OutOfRange(key, lo, hi);
    *out = x;
    if (given) *given = true;
    return true;
  }
  bool Number(const char* key, double lo, double hi, float* out) {
    const json* v = Find(key);
    if (!v) return true;
    if (!v->is_number()) return WrongType(key, "a number", *v);
    double x = v->get<double>();
    if (!(x >= lo && x <= hi))
      return Fail(std::string("'") + key + "' must be between " + Fmt(lo) + " and " + Fmt(hi), key);
    *out = static_cast<float>(x);
    return true;
  }
  bool Fail(std::string message, std::string param = "") {
    if (!failed_) error_ = BadRequest(std::move(message), std::move(param));
    failed_ = true;
    return false;
  }
  bool WrongType(const std::string& key, const char* want, const json& v) {
    return Fail("'" + key + "' must be " + want + ", got " + TypeName(v), key);
  }

 private:
  static std::string Fmt(double x) {
    std::string s = std::to_string(x);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  bool OutOfRange(const char* key, int64_t lo, int64_t hi) {
    return Fail(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                    std::to_string(hi),
                key);
  }
  const json& obj_;
  ApiError error_;
  bool failed_ = false;
};

// Content as a plain string: a string, or an array of text parts ({"type":"text","text":..}).
bool ContentText(Reader& r, const json& content, const std::string& where, std::string* out) {
  if (content.is_null()) return true;
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (!content.is_array()) return r.WrongType(where, "a string or an array of text blocks", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return r.WrongType(at, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return r.Fail("missing required field '" + at + ".type'", at + ".type");
    if (*type != "text")
      return r.Fail("unsupported content type '" + type->get<std::string>() + "' in " + at +
                        " (only text is supported)",
                    at + ".type");
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return r.Fail("'" + at + ".text' must be a string", at + ".text");
    out->append(text->get<std::string>());
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
  if (v->size() > kMaxStops)
    return r.Fail(std::string("'") + key + "' holds at most " + std::to_string(kMaxStops) +
                      " strings",
                  key);
  for (const auto& s : *v) {
    if (!s.is_string()) return r.WrongType(key, "an array of strings", *v);
    out->push_back(s.get<std::string>());
  }
  return true;
}

bool ParseMessages(Reader& r, const json& body, bool anthropic, json* out) {
  if (!r.Require("messages")) return false;
  const json& msgs = body["messages"];
  if (!msgs.is_array()) return r.WrongType("messages", "an array", msgs);
  if (msgs.empty()) return r.Fail("'messages' must not be empty", "messages");
  *out = json::array();
  if (anthropic) {
    const json* sys = r.Find("system");
    if (sys) {
      std::string text;
      if (!ContentText(r, *sys, "system", &text)) return false;
      out->push_back({{"role", "system"}, {"content", text}});
    }
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return r.WrongType(at, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || role->is_null())
      return r.Fail("missing required field '" + at + ".role'", at + ".role");
    if (!role->is_string()) return r.WrongType(at + ".role", "a string", *role);
    const std::string rs = role->get<std::string>();
    bool known = anthropic ? (rs == "user" || rs == "assistant")
                           : (rs == "system" || rs == "developer" || rs == "user" ||
                              rs == "assistant" || rs == "tool");
    if (!known) return r.Fail("unknown role '" + rs + "' in " + at + ".role", at + ".role");
    auto content = m.find("content");
    if (content == m.end() && (anthropic || rs != "assistant"))
      return r.Fail("missing required field '" + at + ".content'", at + ".content");
    std::string text;
    if (content != m.end() && !ContentText(r, *content, at + ".content", &text)) return false;
    // Chat templates know "system"; OpenAI's newer "developer" role means the same.
    out->push_back({{"role", rs == "developer" ? "system" : rs}, {"content", text}});
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
    if (!r.Int("n", 1, 1, &n)) return done(false);
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
    return done(ParsePrompt(r, j, out));
  }
  return done(ParseMessages(r, j, anthropic, &out->messages));
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

namespace {

const char* OpenAIFinish(Finish f) { return f == Finish::kLength ? "length" : "stop"; }

const char* AnthropicStop(Finish f) {
  switch (f) {
    case Finish::kEndOfText: return "end_turn";
    case Finish::kStopSequence: return "stop_sequence";
    case Finish::kLength: return "max_tokens";
  }
  return "end_turn";
}

json OpenAIUsage(const CompletionInfo& i) {
  return {{"prompt_tokens", i.prompt_tokens},
          {"completion_tokens", i.completion_tokens},
          {"total_tokens", i.prompt_tokens + i.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", i.cached_tokens}}}};
}

json AnthropicUsage(const CompletionInfo& i, int output_tokens) {
  return {{"input_tokens", i.prompt_tokens - i.cached_tokens},
          {"cache_read_input_tokens", i.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"output_tokens", output_tokens}};
}

json OpenAIChunkBase(const CompletionInfo& i, const char* object) {
  return {{"id", i.id}, {"object", object}, {"created", i.created}, {"model", i.model},
          {"system_fingerprint", "substrate"}};
}

// OpenAI's logprobs object for the tokens of one response or chunk: chat's "content" list, or
// completions' parallel lists (text_offset counts bytes of the completion from `offset`).
json LogprobsJson(Api api, const std::vector<StepLogprobs>* lps, size_t offset) {
  if (!lps) return nullptr;
  auto bytes = [](const std::string& b) {
    json a = json::array();
    for (unsigned char c : b) a.push_back(static_cast<int>(c));
    return a;
  };
  if (api == Api::kOpenAIChat) {
    json content = json::array();
    for (const StepLogprobs& s : *lps) {
      json top = json::array();
      for (const TokenLogprob& t : s.top)
        top.push_back({{"token", SanitizeUtf8(t.bytes)}, {"logprob", t.logprob}, {"bytes", bytes(t.bytes)}});
      content.push_back({{"token", SanitizeUtf8(s.chosen.bytes)},
                         {"logprob", s.chosen.logprob},
                         {"bytes", bytes(s.chosen.bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (const StepLogprobs& s : *lps) {
    tokens.push_back(SanitizeUtf8(s.chosen.bytes));
    token_lps.push_back(s.chosen.logprob);
    json top = json::object();
    for (const TokenLogprob& t : s.top) top[SanitizeUtf8(t.bytes)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += s.chosen.bytes.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops},
          {"text_offset", offsets}};
}

std::string Data(const json& j) { return "data: " + j.dump() + "\n\n"; }
std::string Event(const char* name, const json& j) {
  return std::string("event: ") + name + "\ndata: " + j.dump() + "\n\n";
}

}  // namespace

std::string ResponseBody(Api api, const CompletionInfo& i, const std::string& raw_text,
                         const std::vector<StepLogprobs>* logprobs) {
  std::string text = SanitizeUtf8(raw_text);
  switch (api) {
    case Api::kOpenAIChat: {
      json j = OpenAIChunkBase(i, "chat.completion");
      j["choices"] = json::array({{{"index", 0},
                                   {"message", {{"role", "assistant"}, {"content", text}}},
                                   {"logprobs", LogprobsJson(api, logprobs, 0)},
                                   {"finish_reason", OpenAIFinish(i.finish)}}});
      j["usage"] = OpenAIUsage(i);
      return j.dump();
    }
    case Api::kOpenAICompletion: {
      json j = OpenAIChunkBase(i, "text_completion");
      j["choices"] = json::array({{{"index", 0},
                                   {"text", text},
                                   {"logprobs", LogprobsJson(api, logprobs, 0)},
                                   {"finish_reason", OpenAIFinish(i.finish)}}});
      j["usage"] = OpenAIUsage(i);
      return j.dump();
    }
    case Api::kAnthropicMessages: {
      json j = {{"id", i.id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", i.model},
                {"content", json::array({{{"type", "text"}, {"text", text}}})},
                {"stop_reason", AnthropicStop(i.finish)},
                {"stop_sequence", i.finish == Finish::kStopSequence ? json(i.stop_sequence)
                                                                    : json(nullptr)},
                {"usage", AnthropicUsage(i, i.completion_tokens)}};
      return j.dump();
    }
  }
  return "{}";
}

std::string StreamStart(Api api, const CompletionInfo& i) {
  switch (api) {
    case Api::kOpenAIChat: {
      json j = OpenAIChunkBase(i, "chat.completion.chunk");
      j["choices"] = json::array({{{"index", 0},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
      return Data(j);
    }
    case Api::kOpenAICompletion:
      return "";
    case Api::kAnthropicMessages: {
      json msg = {{"id", i.id},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", i.model},
                  {"content", json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", AnthropicUsage(i, 0)}};
      return Event("message_start", {{"type", "message_start"}, {"message", msg}}) +
             Event("content_block_start", {{"type", "content_block_start"},
                                           {"index", 0},
                                           {"content_block", {{"type", "text"}, {"text", ""}}}});
    }
  }
  return "";
}

std::string StreamDelta(Api api, const CompletionInfo& i, std::string_view raw_text,
                        const std::vector<StepLogprobs>* logprobs, size_t text_offset) {
  std::string text = SanitizeUtf8(raw_text);
  switch (api) {
    case Api::kOpenAIChat: {
      json j = OpenAIChunkBase(i, "chat.completion.chunk");
      j["choices"] = json::array({{{"index", 0},
                                   {"delta", {{"content", text}}},
                                   {"logprobs", LogprobsJson(api, logprobs, 0)},
                                   {"finish_reason", nullptr}}});
      return Data(j);
    }
    case Api::kOpenAICompletion: {
      json j = OpenAIChunkBase(i, "text_completion");
      j["choices"] = json::array({{{"index", 0},
                                   {"text", text},
                                   {"logprobs", LogprobsJson(api, logprobs, text_offset)},
                                   {"finish_reason", nullptr}}});
      return Data(j);
    }
    case Api::kAnthropicMessages:
      return Event("content_block_delta", {{"type", "content_block_delta"},
                                           {"index", 0},
                                           {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  return "";
}

std::string StreamEnd(Api api, const CompletionInfo& i, bool include_usage) {
  switch (api) {
    case Api::kOpenAIChat:
    case Api::kOpenAICompletion: {
      const bool chat = api == Api::kOpenAIChat;
      json j = OpenAIChunkBase(i, chat ? "chat.completion.chunk" : "text_completion");
      json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", OpenAIFinish(i.finish)}};
      if (chat) choice["delta"] = json::object();
      else choice["text"] = "";
      j["choices"] = json::array({choice});
      std::string out = Data(j);
      if (include_usage) {
        json u = OpenAIChunkBase(i, chat ? "chat.completion.chunk" : "text_completion");
        u["choices"] = json::array();
        u["usage"] = OpenAIUsage(i);
        out += Data(u);
      }
      return out + "data: [DONE]\n\n";
    }
    case Api::kAnthropicMessages: {
      json delta = {{"stop_reason", AnthropicStop(i.finish)},
                    {"stop_sequence", i.finish == Finish::kStopSequence ? json(i.stop_sequence)
                                                                        : json(nullptr)}};
      return Event("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}) +
             Event("message_delta", {{"type", "message_delta"},
                                     {"delta", delta},
                                     {"usage", {{"output_tokens", i.completion_tokens}}}}) +
             Event("message_stop", {{"type", "message_stop"}});
    }
  }
  return "";
}

std::string StreamError(Api api, const ApiError& e) {
  if (api == Api::kAnthropicMessages)
    return "event: error\ndata: " + ErrorBody(api, e) + "\n\n";
  return "data: " + ErrorBody(api, e) + "\n\n";
}

std::string StreamPing(Api api) {
  if (api == Api::kAnthropicMessages) return Event("ping", {{"type", "ping"}});
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
