// ParseToolCalls: each format's call section read by hand (the model's text may stop anywhere),
// with JSON values delimited by ScanJsonValue so that arguments stream as they are written.
#include <algorithm>
#include <initializer_list>

#include "serve/json_scan.h"
#include "serve/tool_format.h"
#include "serve/tool_markers.h"

namespace substrate::serve {

using nlohmann::json;

namespace {

// Where a scan stands: done, needs more text, or not the expected syntax.
enum class Got { kDone, kMore, kBad };

// text[pos..] against `word`: kDone when it starts with it, kMore when text ends inside it.
Got Expect(std::string_view t, size_t pos, std::string_view word) {
  const size_t n = std::min(word.size(), t.size() - std::min(pos, t.size()));
  if (t.substr(pos, n) != word.substr(0, n)) return Got::kBad;
  return n == word.size() ? Got::kDone : Got::kMore;
}

// The length of the longest suffix of `text` that is a proper prefix of one of `words`: text
// held back from content, since it may yet become a marker.
size_t HoldBack(std::string_view text, const std::vector<std::string>& words) {
  size_t hold = 0;
  for (const std::string& w : words)
    for (size_t k = std::min(w.size() - 1, text.size()); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view(w).substr(0, k)) {
        hold = k;
        break;
      }
  return hold;
}

struct Section {
  std::vector<ToolCall> calls;
  bool has_partial = false;
  ToolCall partial;
  std::string error;
};

// One call written as a JSON object: its name under one of `name_keys`, its arguments under
// one of `args_keys` (a JSON string holding JSON is unwrapped).
Got ScanCallObject(std::string_view t, size_t pos,
                   std::initializer_list<std::string_view> name_keys,
                   std::initializer_list<std::string_view> args_keys, size_t* end, Section* s) {
  auto is = [](std::initializer_list<std::string_view> keys, const std::string& k) {
    return std::find(keys.begin(), keys.end(), k) != keys.end();
  };
  if (pos >= t.size()) return Got::kMore;
  if (t[pos] != '{') {
    s->error = "expected a JSON object";
    return Got::kBad;
  }
  std::string name;
  bool has_name = false, has_args = false;
  std::string args;
  size_t p = SkipJsonSpace(t, pos + 1);
  auto bad = [&](const std::string& why) {
    s->error = why;
    return Got::kBad;
  };
  for (;;) {
    if (p >= t.size()) return Got::kMore;
    if (t[p] == '}') {
      p += 1;
      break;
    }
    size_t e = p;
    JsonScan k = ScanJsonValue(t, p, &e);
    if (k == JsonScan::kIncomplete) return Got::kMore;
    if (k == JsonScan::kInvalid || t[p] != '"') return bad("malformed JSON in a tool call");
    const json key_json = json::parse(t.substr(p, e - p), nullptr, false);
    if (!key_json.is_string()) return bad("malformed JSON in a tool call");
    const std::string key = key_json.get<std::string>();
    p = SkipJsonSpace(t, e);
    if (p >= t.size()) return Got::kMore;
    if (t[p] != ':') return bad("malformed JSON in a tool call");
    p = SkipJsonSpace(t, p + 1);
    if (p >= t.size()) return Got::kMore;
    const size_t vb = p;
    e = p;
    JsonScan v = ScanJsonValue(t, p, &e);
    if (v == JsonScan::kInvalid) return bad("malformed JSON in a tool call");
    if (v == JsonScan::kIncomplete) {
      // The value is still being written: stream an object's arguments as they come.
      if (is(args_keys, key) && has_name && (t[vb] == '{' || t[vb] == '[')) {
        s->has_partial = true;
        s->partial = {name, std::string(t.substr(vb))};
      }
      return Got::kMore;
    }
    const std::string_view raw = t.substr(vb, e - vb);
    if (is(name_keys, key)) {
      json n = json::parse(raw, nullptr, false);
      if (!n.is_string()) return bad("a tool call's name must be a string");
      name = n.get<std::string>();
      has_name = true;
    } else if (is(args_keys, key)) {
      if (raw[0] == '"') {
        const json str = json::parse(raw, nullptr, false);
        if (!str.is_string()) return bad("malformed JSON in a tool call");
        json inner = json::parse(str.get<std::string>(), nullptr, false);
        if (!inner.is_object()) return bad("a tool call's arguments must be a JSON object");
        args = inner.dump();
      } else {
        if (raw[0] != '{') return bad("a tool call's arguments must be a JSON object");
        args = std::string(raw);
      }
      has_args = true;
    }
    p = SkipJsonSpace(t, e);
    if (p >= t.size()) return Got::kMore;
    if (t[p] == ',') {
      p = SkipJsonSpace(t, p + 1);
    } else if (t[p] != '}') {
      return bad("malformed JSON in a tool call");
    }
  }
  if (!has_name) return bad("a tool call without a name");
  s->calls.push_back({name, has_args ? args : "{}"});
  *end = p;
  return Got::kDone;
}

// A JSON array of call objects.
Got ScanCallArray(std::string_view t, size_t pos, std::initializer_list<std::string_view> name_keys,
                  std::initializer_list<std::string_view> args_keys, size_t* end, Section* s) {
  if (pos >= t.size()) return Got::kMore;
  if (t[pos] != '[') {
    s->error = "expected a JSON array of tool calls";
    return Got::kBad;
  }
  size_t p = SkipJsonSpace(t, pos + 1);
  for (;;) {
    if (p >= t.size()) return Got::kMore;
    if (t[p] == ']') {
      *end = p + 1;
      return Got::kDone;
    }
    size_t e = p;
    Got g = ScanCallObject(t, p, name_keys, args_keys, &e, s);
    if (g != Got::kDone) return g;
    p = SkipJsonSpace(t, e);
    if (p >= t.size()) return Got::kMore;
    if (t[p] == ',')
      p = SkipJsonSpace(t, p + 1);
    else if (t[p] != ']') {
      s->error = "expected ',' or ']' between tool calls";
      return Got::kBad;
    }
  }
}

// Reads up to `stop` (exclusive): the text between, in *out.
Got Until(std::string_view t, size_t pos, std::string_view stop, std::string* out, size_t* end) {
  const size_t at = t.find(stop, pos);
  if (at == std::string_view::npos) return Got::kMore;
  *out = std::string(t.substr(pos, at - pos));
  *end = at + stop.size();
  return Got::kDone;
}

// A run of sections `one` separated by whitespace (and `between`, when given).
template <typename One>
Got Repeated(std::string_view t, size_t pos, std::string_view opener, std::string_view between,
             bool final, size_t* end, Section* s, One one) {
  size_t p = pos;
  bool first = true;
  for (;;) {
    size_t q = SkipJsonSpace(t, p);
    if (!first && !between.empty()) {
      Got g = Expect(t, q, between);
      if (g == Got::kBad) break;
      if (g == Got::kMore) return final ? (*end = p, Got::kDone) : Got::kMore;
      q = SkipJsonSpace(t, q + between.size());
    }
    Got g = Expect(t, q, opener);
    if (g == Got::kBad) {
      if (first) {
        s->error = "expected '" + std::string(opener) + "'";
        return Got::kBad;
      }
      break;
    }
    if (g == Got::kMore) {
      if (first || !final) return Got::kMore;
      break;
    }
    size_t e = q;
    g = one(q + opener.size(), &e);
    if (g != Got::kDone) return g;
    p = e;
    *end = p;
    first = false;
  }
  *end = p;
  return Got::kDone;
}

Got LlamaPython(std::string_view t, size_t pos, bool final, size_t* end, Section* s) {
  size_t p = SkipJsonSpace(t, pos);
  if (p < t.size() && t[p] == '{') {
    return Repeated(t, p, "", ";", final, end, s, [&](size_t q, size_t* e) {
      return ScanCallObject(t, q, {"name"}, {"parameters", "arguments"}, e, s);
    });
  }
  if (!final) return Got::kMore;  // built-in calls and code are read whole
  std::string_view rest = t.substr(p);
  const size_t dot = rest.find(".call(");
  if (dot != std::string_view::npos && rest.back() == ')') {
    // name.call(key="value", n=3): Llama's built-in tools.
    json args = json::object();
    std::string_view inner = rest.substr(dot + 6, rest.size() - dot - 7);
    size_t i = 0;
    while (i < inner.size()) {
      const size_t eq = inner.find('=', i);
      if (eq == std::string_view::npos) break;
      std::string key(inner.substr(i, eq - i));
      key.erase(0, key.find_first_not_of(" ,"));
      size_t ve = eq + 1;
      json value;
      if (ve < inner.size() && (inner[ve] == '"' || inner[ve] == '\'')) {
        const char q = inner[ve];
        size_t close = inner.find(q, ve + 1);
        if (close == std::string_view::npos) close = inner.size();
        value = std::string(inner.substr(ve + 1, close - ve - 1));
        ve = close + 1;
      } else {
        size_t comma = inner.find(',', ve);
        if (comma == std::string_view::npos) comma = inner.size();
        value = json::parse(inner.substr(ve, comma - ve), nullptr, false);
        if (value.is_discarded()) value = std::string(inner.substr(ve, comma - ve));
        ve = comma;
      }
      args[key] = value;
      i = ve + 1;
    }
    s->calls.push_back({std::string(rest.substr(0, dot)), args.dump()});
  } else {
    s->calls.push_back({"python", json{{"code", std::string(rest)}}.dump()});
  }
  *end = t.size();
  return Got::kDone;
}

// One format's call section starting at `pos` (where a trigger was found).
Got ParseSection(ToolFormat f, std::string_view t, size_t pos, bool final, size_t* end,
                 Section* s) {
  switch (f) {
    case ToolFormat::kGeneric:
    case ToolFormat::kHermes:
      return Repeated(t, pos, "<tool_call>", "", final, end, s, [&](size_t q, size_t* e) {
        q = SkipJsonSpace(t, q);
        Got g = ScanCallObject(t, q, {"name"}, {"arguments", "parameters"}, e, s);
        if (g != Got::kDone) return g;
        q = SkipJsonSpace(t, *e);
        g = Expect(t, q, "</tool_call>");
        if (g == Got::kBad) s->error = "expected '</tool_call>'";
        if (g == Got::kDone) *e = q + 12;
        return g;
      });
    case ToolFormat::kLlama3: {
      Got g = Expect(t, pos, "<|python_tag|>");
      if (g == Got::kDone) return LlamaPython(t, pos + 14, final, end, s);
      if (g == Got::kMore) return Got::kMore;
      return Repeated(t, pos, "", ";", final, end, s, [&](size_t q, size_t* e) {
        return ScanCallObject(t, q, {"name"}, {"parameters", "arguments"}, e, s);
      });
    }
    case ToolFormat::kMistral:
    case ToolFormat::kMistralArgs:
      return Repeated(t, pos, "[TOOL_CALLS]", "", final, end, s, [&](size_t q, size_t* e) {
        q = SkipJsonSpace(t, q);
        if (q >= t.size()) return Got::kMore;
        if (t[q] == '[') return ScanCallArray(t, q, {"name"}, {"arguments", "parameters"}, e, s);
        // name[ARGS]{...}, optionally name[CALL_ID]id[ARGS]{...}
        std::string name, id;
        Got g = Until(t, q, "[", &name, e);
        if (g != Got::kDone) return g;
        q = *e - 1;
        if (Expect(t, q, "[CALL_ID]") == Got::kDone) {
          g = Until(t, q + 9, "[ARGS]", &id, e);
          if (g != Got::kDone) return g;
        } else {
          g = Expect(t, q, "[ARGS]");
          if (g != Got::kDone) {
            if (g == Got::kBad) s->error = "expected '[ARGS]' after a tool name";
            return g;
          }
          *e = q + 6;
        }
        const std::string json_name = json(name).dump();
        // Reuse the object scanner on the arguments alone.
        q = SkipJsonSpace(t, *e);
        size_t ve = q;
        JsonScan v = ScanJsonValue(t, q, &ve);
        if (v == JsonScan::kInvalid || (q < t.size() && t[q] != '{')) {
          s->error = "a tool call's arguments must be a JSON object";
          return Got::kBad;
        }
        if (v == JsonScan::kIncomplete) {
          s->has_partial = true;
          s->partial = {name, std::string(t.substr(q))};
          return Got::kMore;
        }
        s->calls.push_back({name, std::string(t.substr(q, ve - q))});
        *e = ve;
        return Got::kDone;
      });
    case ToolFormat::kDeepSeekR1:
    case ToolFormat::kDeepSeekV3: {
      size_t p = pos;
      Got g = Expect(t, p, kDsCallsBegin);
      if (g == Got::kMore) return g;
      if (g == Got::kDone) p += kDsCallsBegin.size();
      g = Repeated(t, p, kDsCallBegin, "", final, end, s, [&](size_t q, size_t* e) {
        std::string head;
        Got h = Until(t, q, kDsSep, &head, e);
        if (h != Got::kDone) return h;
        q = SkipJsonSpace(t, *e);
        std::string name = head;
        if (q < t.size() && t[q] != '{') {  // R1: type<sep>name\n```json\n{..}\n```
          h = Until(t, q, "\n", &name, e);
          if (h != Got::kDone) return h;
          q = SkipJsonSpace(t, *e);
          h = Expect(t, q, "```json");
          if (h == Got::kMore) return h;
          if (h == Got::kDone) q = SkipJsonSpace(t, q + 7);
        }
        if (q >= t.size()) return Got::kMore;
        size_t ve = q;
        JsonScan v = ScanJsonValue(t, q, &ve);
        if (v == JsonScan::kInvalid || t[q] != '{') {
          s->error = "a tool call's arguments must be a JSON object";
          return Got::kBad;
        }
        if (v == JsonScan::kIncomplete) {
          s->has_partial = true;
          s->partial = {name, std::string(t.substr(q))};
          return Got::kMore;
        }
        s->calls.push_back({name, std::string(t.substr(q, ve - q))});
        q = SkipJsonSpace(t, ve);
        h = Expect(t, q, "```");
        if (h == Got::kMore) return h;
        if (h == Got::kDone) q = SkipJsonSpace(t, q + 3);
        h = Expect(t, q, kDsCallEnd);
        if (h == Got::kBad) s->error = "expected the tool-call end marker";
        if (h == Got::kDone) *e = q + kDsCallEnd.size();
        return h;
      });
      if (g != Got::kDone) return g;
      const size_t q = SkipJsonSpace(t, *end);
      Got c = Expect(t, q, kDsCallsEnd);
      if (c == Got::kDone) *end = q + kDsCallsEnd.size();
      if (c == Got::kMore && !final) return Got::kMore;
      return Got::kDone;
    }
    case ToolFormat::kFunctionaryV31:
      return Repeated(t, pos, "<function=", "", final, end, s, [&](size_t q, size_t* e) {
        std::string name;
        Got g = Until(t, q, ">", &name, e);
        if (g != Got::kDone) return g;
        q = SkipJsonSpace(t, *e);
        size_t ve = q;
        JsonScan v = ScanJsonValue(t, q, &ve);
        if (v == JsonScan::kInvalid || (q < t.size() && t[q] != '{')) {
          s->error = "a tool call's arguments must be a JSON object";
          return Got::kBad;
        }
        if (v == JsonScan::kIncomplete) {
          if (q < t.size()) {
            s->has_partial = true;
            s->partial = {name, std::string(t.substr(q))};
          }
          return Got::kMore;
        }
        s->calls.push_back({name, std::string(t.substr(q, ve - q))});
        q = SkipJsonSpace(t, ve);
        g = Expect(t, q, "</function>");
        if (g == Got::kBad) s->error = "expected '</function>'";
        if (g == Got::kDone) *e = q + 11;
        return g;
      });
    case ToolFormat::kCommandR7B: {
      Got g = Expect(t, pos, "<|START_ACTION|>");
      if (g != Got::kDone) return g;
      size_t e = pos;
      g = ScanCallArray(t, SkipJsonSpace(t, pos + 16), {"tool_name"}, {"parameters"}, &e, s);
      if (g != Got::kDone) return g;
      const size_t q = SkipJsonSpace(t, e);
      g = Expect(t, q, "<|END_ACTION|>");
      if (g == Got::kMore && final) g = Got::kDone;
      if (g == Got::kBad) s->error = "expected '<|END_ACTION|>'";
      *end = g == Got::kDone && q + 14 <= t.size() ? q + 14 : t.size();
      return g;
    }
    case ToolFormat::kCommandRPlus: {
      Got g = Expect(t, pos, "Action:");
      if (g != Got::kDone) return g;
      size_t q = SkipJsonSpace(t, pos + 7);
      g = Expect(t, q, "```json");
      if (g == Got::kMore) return g;
      if (g == Got::kDone) q = SkipJsonSpace(t, q + 7);
      size_t e = q;
      g = ScanCallArray(t, q, {"tool_name"}, {"parameters"}, &e, s);
      if (g != Got::kDone) return g;
      q = SkipJsonSpace(t, e);
      g = Expect(t, q, "```");
      if (g == Got::kMore && !final) return g;
      *end = g == Got::kDone ? q + 3 : e;
      // "directly-answer" is the template's way to say: no tool.
      s->calls.erase(std::remove_if(s->calls.begin(), s->calls.end(),
                                    [](const ToolCall& c) { return c.name == "directly-answer"; }),
                     s->calls.end());
      return Got::kDone;
    }
    case ToolFormat::kFirefunction: {
      Got g = Expect(t, pos, "functools");
      if (g != Got::kDone) return g;
      return ScanCallArray(t, pos + 9, {"name"}, {"arguments", "parameters"}, end, s);
    }
    case ToolFormat::kFunctionaryV32:
      break;  // read whole by ParseFunctionaryV32
  }
  s->error = "unknown tool format";
  return Got::kBad;
}

// Functionary v3.2: segments "name\n..." separated by ">>>"; "all" segments are text.
ToolParse ParseFunctionaryV32(std::string_view t, bool final) {
  ToolParse out;
  Section s;
  size_t p = 0;
  for (;;) {
    Got g = Expect(t, p, ">>>");
    if (g == Got::kMore && !final) return out;
    if (g == Got::kDone) p += 3;
    const size_t nl = t.find('\n', p);
    if (nl == std::string_view::npos) {
      if (final && p < t.size()) out.content += std::string(t.substr(p));
      return out;
    }
    const std::string name(t.substr(p, nl - p));
    p = nl + 1;
    if (name == "all") {
      size_t next = t.find(">>>", p);
      if (next == std::string_view::npos) {
        const size_t hold = final ? 0 : HoldBack(t.substr(p), {">>>"});
        out.content += std::string(t.substr(p, t.size() - p - hold));
        return out;
      }
      out.content += std::string(t.substr(p, next - p));
      p = next;
      continue;
    }
    const size_t q = SkipJsonSpace(t, p);
    size_t ve = q;
    JsonScan v = ScanJsonValue(t, q, &ve);
    if (v == JsonScan::kIncomplete && !final) {
      if (q < t.size() && t[q] == '{') {
        out.has_partial = true;
        out.partial = {name, std::string(t.substr(q))};
      }
      return out;
    }
    if (v != JsonScan::kComplete || t[q] != '{') {
      out.error = "the arguments of '" + name + "' are not a JSON object";
      return out;
    }
    out.calls.push_back({name, std::string(t.substr(q, ve - q))});
    p = SkipJsonSpace(t, ve);
    if (p >= t.size()) return out;
  }
}

// Templates without tool support: a bare JSON answer may still be a call.
bool GenericJson(std::string_view text, std::vector<ToolCall>* calls) {
  std::string t(text);
  const size_t b = t.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return false;
  t = t.substr(b);
  if (t.rfind("```", 0) == 0) {
    const size_t nl = t.find('\n');
    const size_t close = t.rfind("```");
    if (nl == std::string::npos || close <= nl) return false;
    t = t.substr(nl + 1, close - nl - 1);
  }
  json j = json::parse(t, nullptr, false);
  if (j.is_discarded()) return false;
  auto one = [&](const json& c) {
    if (!c.is_object()) return false;
    const json* f = c.contains("function") && c["function"].is_object() ? &c["function"] : &c;
    if (!f->contains("name") || !(*f)["name"].is_string()) return false;
    json args = f->value("arguments", f->value("parameters", json::object()));
    if (args.is_string()) args = json::parse(args.get<std::string>(), nullptr, false);
    if (!args.is_object()) return false;
    calls->push_back({(*f)["name"].get<std::string>(), args.dump()});
    return true;
  };
  if (j.is_object() && j.contains("tool_calls") && j["tool_calls"].is_array()) {
    for (const json& c : j["tool_calls"])
      if (!one(c)) return false;
    return !calls->empty();
  }
  if (j.is_object() && j.contains("tool_call")) return one(j["tool_call"]);
  if (j.is_array()) {
    for (const json& c : j)
      if (!one(c)) return false;
    return !calls->empty();
  }
  return j.is_object() && one(j);
}

}  // namespace

ToolParse ParseToolCalls(ToolFormat f, std::string_view text, bool final) {
  if (f == ToolFormat::kFunctionaryV32) return ParseFunctionaryV32(text, final);
  ToolParse out;
  std::vector<std::string> triggers = ToolCallTriggers(f);
  // Llama's JSON calls (and the generic bare JSON) are the whole answer: only at the start.
  const bool json_at_start = f == ToolFormat::kLlama3 || f == ToolFormat::kGeneric;
  if (f == ToolFormat::kLlama3) triggers = {"<|python_tag|>"};
  // Text kept out of content: Command-R7B wraps its answer in response markers.
  std::vector<std::string> strip;
  if (f == ToolFormat::kCommandR7B) strip = {"<|START_RESPONSE|>", "<|END_RESPONSE|>"};
  auto add_content = [&](std::string_view c) {
    std::string s(c);
    for (const std::string& m : strip)
      for (size_t at; (at = s.find(m)) != std::string::npos;) s.erase(at, m.size());
    out.content += s;
  };
  std::vector<std::string> hold_words = triggers;
  hold_words.insert(hold_words.end(), strip.begin(), strip.end());

  size_t p = 0;
  if (json_at_start) {
    const size_t b = SkipJsonSpace(text, 0);
    if (b == text.size() && !final) return out;  // nothing but space yet
    if (b < text.size() && (text[b] == '{' || (f == ToolFormat::kGeneric && text[b] == '`'))) {
      if (!final) return out;  // maybe a call: held until the end
      if (f == ToolFormat::kGeneric) {
        if (GenericJson(text, &out.calls)) return out;
      } else {
        Section s;
        size_t e = b;
        Got g = ParseSection(f, text, b, true, &e, &s);
        if (g == Got::kDone && !s.calls.empty()) {
          out.calls = std::move(s.calls);
          add_content(text.substr(e));
          return out;
        }
      }
      // Not a call after all: plain text.
    }
  }
  for (;;) {
    size_t at = std::string_view::npos;
    for (const std::string& tr : triggers) at = std::min(at, text.find(tr, p));
    if (at == std::string_view::npos) {
      std::string_view rest = text.substr(p);
      if (!final) rest.remove_suffix(HoldBack(rest, hold_words));
      add_content(rest);
      return out;
    }
    add_content(text.substr(p, at - p));
    Section s;
    size_t end = at;
    Got g = ParseSection(f, text, at, final, &end, &s);
    for (ToolCall& c : s.calls) out.calls.push_back(std::move(c));
    if (g == Got::kMore && !final) {
      out.has_partial = s.has_partial;
      out.partial = std::move(s.partial);
      return out;
    }
    if (g != Got::kDone) {
      out.error = s.error.empty() ? "the tool call is incomplete" : s.error;
      return out;
    }
    p = end;
  }
}

}  // namespace substrate::serve
