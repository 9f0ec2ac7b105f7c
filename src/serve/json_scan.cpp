#include "serve/json_scan.h"

#include <string>

namespace substrate::serve {

size_t SkipJsonSpace(std::string_view t, size_t pos) {
  while (pos < t.size() && (t[pos] == ' ' || t[pos] == '\t' || t[pos] == '\n' || t[pos] == '\r'))
    ++pos;
  return pos;
}

namespace {

bool PrefixOf(std::string_view word, std::string_view t, size_t pos, size_t* end, JsonScan* r) {
  const size_t n = std::min(word.size(), t.size() - pos);
  if (t.substr(pos, n) != word.substr(0, n)) {
    *r = JsonScan::kInvalid;
    return true;
  }
  *r = n == word.size() ? JsonScan::kComplete : JsonScan::kIncomplete;
  *end = pos + n;
  return true;
}

JsonScan Number(std::string_view t, size_t pos, size_t* end) {
  size_t p = pos;
  *end = pos;
  auto digits = [&] {
    size_t b = p;
    while (p < t.size() && t[p] >= '0' && t[p] <= '9') ++p;
    return p - b;
  };
  if (p < t.size() && t[p] == '-') ++p;
  if (p == t.size()) return JsonScan::kIncomplete;
  if (t[p] == '0')
    ++p;
  else if (digits() == 0)
    return JsonScan::kInvalid;
  if (p < t.size() && t[p] == '.') {
    ++p;
    if (digits() == 0) return p == t.size() ? JsonScan::kIncomplete : JsonScan::kInvalid;
  }
  if (p < t.size() && (t[p] == 'e' || t[p] == 'E')) {
    ++p;
    if (p < t.size() && (t[p] == '+' || t[p] == '-')) ++p;
    if (digits() == 0) return p == t.size() ? JsonScan::kIncomplete : JsonScan::kInvalid;
  }
  *end = p;
  // A number at the very end may still grow.
  return p == t.size() ? JsonScan::kIncomplete : JsonScan::kComplete;
}

}  // namespace

JsonScan ScanJsonValue(std::string_view t, size_t pos, size_t* end) {
  if (pos >= t.size()) return JsonScan::kIncomplete;
  const char c = t[pos];
  JsonScan r;
  if (c == 't' && PrefixOf("true", t, pos, end, &r)) return r;
  if (c == 'f' && PrefixOf("false", t, pos, end, &r)) return r;
  if (c == 'n' && PrefixOf("null", t, pos, end, &r)) return r;
  if (c == '-' || (c >= '0' && c <= '9')) return Number(t, pos, end);
  if (c == '"') {
    for (size_t p = pos + 1; p < t.size(); ++p) {
      if (t[p] == '\\') {
        ++p;
      } else if (t[p] == '"') {
        *end = p + 1;
        return JsonScan::kComplete;
      } else if (static_cast<unsigned char>(t[p]) < 0x20) {
        return JsonScan::kInvalid;
      }
    }
    return JsonScan::kIncomplete;
  }
  if (c != '{' && c != '[') return JsonScan::kInvalid;
  // Containers: members checked value by value, so that garbage is caught early.
  const bool object = c == '{';
  const char close = object ? '}' : ']';
  size_t p = SkipJsonSpace(t, pos + 1);
  if (p == t.size()) return JsonScan::kIncomplete;
  if (t[p] == close) {
    *end = p + 1;
    return JsonScan::kComplete;
  }
  for (;;) {
    size_t e = 0;
    if (object) {
      if (t[p] != '"') return JsonScan::kInvalid;
      JsonScan k = ScanJsonValue(t, p, &e);
      if (k != JsonScan::kComplete) return k;
      p = SkipJsonSpace(t, e);
      if (p == t.size()) return JsonScan::kIncomplete;
      if (t[p] != ':') return JsonScan::kInvalid;
      p = SkipJsonSpace(t, p + 1);
      if (p == t.size()) return JsonScan::kIncomplete;
    }
    e = p;
    JsonScan v = ScanJsonValue(t, p, &e);
    if (v == JsonScan::kInvalid) return v;
    if (v == JsonScan::kIncomplete) {
      // A number is complete once something follows it.
      if (e > p && e < t.size())
        v = JsonScan::kComplete;
      else
        return JsonScan::kIncomplete;
    }
    p = SkipJsonSpace(t, e);
    if (p == t.size()) return JsonScan::kIncomplete;
    if (t[p] == close) {
      *end = p + 1;
      return JsonScan::kComplete;
    }
    if (t[p] != ',') return JsonScan::kInvalid;
    p = SkipJsonSpace(t, p + 1);
    if (p == t.size()) return JsonScan::kIncomplete;
  }
}

}  // namespace substrate::serve
