// Internal to src/serve: typed field readers for request bodies, shared by the request
// parsers (protocol.cpp, protocol_chat.cpp). Absent or null fields leave the default; a wrong
// type or range is an error naming the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/protocol.h"

namespace substrate::serve {

using nlohmann::json;

inline const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_float:
      return "number";
    default:
      return "integer";
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

// protocol_chat.cpp: the chat APIs' messages, tools, tool_choice, parallel_tool_calls,
// response_format and grammar; the completions API's response_format and grammar; logit_bias.
// `ordered`: the same body parsed keeping key order (schemas are read from it).
bool ParseChatBody(Reader& r, const json& body, const nlohmann::ordered_json& ordered,
                   bool anthropic, GenerationRequest* out);
bool ParseCompletionFormat(Reader& r, const nlohmann::ordered_json& ordered,
                           GenerationRequest* out);
bool ParseLogitBias(Reader& r, SamplingParams* out);

}  // namespace substrate::serve
