// Built-in filters, with jinja2's behaviour (filters.py) and `transformers`' tojson.
#include <algorithm>
#include <cmath>
#include <cfenv>
#include <map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/evaluator.h"

namespace substrate::jinja {

namespace {

using FilterFn = Expected<Value> (*)(Evaluator&, CallArgs&);

// Argument `name` at position `index` (the piped value is position 0), or `def`.
Value Arg(CallArgs& a, const std::string& name, size_t index, Value def = Value()) {
  Value v;
  if (a.Take(name, index, &v)) return v;
  return def;
}

std::string AsciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string AsciiUpper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Python's str.splitlines() boundaries.
std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> out;
  std::vector<uint32_t> cps = DecodeUtf8(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    out.push_back(EncodeUtf8(cps, start, i));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(EncodeUtf8(cps, start, cps.size()));
  return out;
}

// Sort key for the case-insensitive filters.
Value Folded(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::Str(AsciiLower(v.str()));
  return v;
}

Expected<Value> FDefault(Evaluator&, CallArgs& a) {
  Value def = Arg(a, "default_value", 1, Value::Str(""));
  bool boolean = Arg(a, "boolean", 2, Value::Bool(false)).Truthy();
  if (a.pos[0].is_undefined() || (boolean && !a.pos[0].Truthy())) return def;
  return a.pos[0];
}

Expected<Value> FTrim(Evaluator&, CallArgs& a) {
  Value chars = Arg(a, "chars", 1);
  std::string s = ToStr(a.pos[0]);
  if (chars.is_undefined() || chars.is_none()) return Value::Str(StripPySpace(s, true, true), a.pos[0].is_safe());
  std::vector<uint32_t> cps = DecodeUtf8(s), set = DecodeUtf8(ToStr(chars));
  size_t b = 0, e = cps.size();
  auto in = [&](uint32_t c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  while (b < e && in(cps[b])) ++b;
  while (e > b && in(cps[e - 1])) --e;
  return Value::Str(EncodeUtf8(cps, b, e));
}

Expected<Value> FLength(Evaluator&, CallArgs& a) {
  ASSIGN_OR_RETURN(int64_t n, a.pos[0].Length());
  return Value::Int(n);
}

Expected<Value> FUpper(Evaluator&, CallArgs& a) { return Value::Str(AsciiUpper(ToStr(a.pos[0]))); }
Expected<Value> FLower(Evaluator&, CallArgs& a) { return Value::Str(AsciiLower(ToStr(a.pos[0]))); }

Expected<Value> FCapitalize(Evaluator&, CallArgs& a) {
  std::string s = AsciiLower(ToStr(a.pos[0]));
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return Value::Str(s);
}

// jinja2's title: words start after runs of "-", whitespace, "(", "{", "[", "<".
Expected<Value> FTitle(Evaluator&, CallArgs& a) {
  std::string s = ToStr(a.pos[0]);
  std::string out;
  bool word_start = true;
  for (char c : s) {
    bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || std::isspace(static_cast<unsigned char>(c));
    if (sep) {
      out += c;
      word_start = true;
    } else {
      out += static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c))
                                          : std::tolower(static_cast<unsigned char>(c)));
      word_start = false;
    }
  }
  return Value::Str(out);
}

Expected<Value> FString(Evaluator&, CallArgs& a) {
  if (a.pos[0].is_string()) return a.pos[0];
  return Value::Str(ToStr(a.pos[0]));
}

Expected<Value> FSafe(Evaluator&, CallArgs& a) { return Value::Str(ToStr(a.pos[0]), true); }

Expected<Value> FEscape(Evaluator&, CallArgs& a) {
  if (a.pos[0].is_safe()) return a.pos[0];
  return Value::Str(HtmlEscape(ToStr(a.pos[0])), true);
}

Expected<Value> FForceEscape(Evaluator&, CallArgs& a) { return Value::Str(HtmlEscape(ToStr(a.pos[0])), true); }

Expected<Value> FPprint(Evaluator&, CallArgs& a) { return Value::Str(Repr(a.pos[0])); }

Expected<Value> FList(Evaluator& ev, CallArgs& a) {
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  return Value::List(std::move(items));
}

Expected<Value> FFirst(Evaluator& ev, CallArgs& a) {
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Expected<Value> FLast(Evaluator& ev, CallArgs& a) {
  if (a.pos[0].is_list() && a.pos[0].list().kind == SeqKind::kIterator)
    return TemplateError("'" + a.pos[0].TypeName() + "' object is not reversible");
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Expected<Value> FJoin(Evaluator& ev, CallArgs& a) {
  std::string sep = ToStr(Arg(a, "d", 1, Value::Str("")));
  Value attribute = Arg(a, "attribute", 2, Value::None());
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    if (!attribute.is_none()) {
      ASSIGN_OR_RETURN(Value v, ev.GetAttributePath(items[i], ToStr(attribute)));
      out += ToStr(v);
    } else {
      out += ToStr(items[i]);
    }
    RETURN_IF_ERROR(ev.CheckSize(out.size()));
  }
  return Value::Str(std::move(out));
}

Expected<Value> FReplace(Evaluator& ev, CallArgs& a) {
  std::string s = ToStr(a.pos[0]);
  std::string from = ToStr(Arg(a, "old", 1));
  std::string to = ToStr(Arg(a, "new", 2));
  Value count_v = Arg(a, "count", 3, Value::None());
  int64_t count = count_v.is_none() ? -1 : count_v.as_int();
  std::string out;
  if (from.empty()) {
    std::vector<uint32_t> cps = DecodeUtf8(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) AppendUtf8(out, cps[i]);
      RETURN_IF_ERROR(ev.CheckSize(out.size()));
    }
    return Value::Str(std::move(out));
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out += to;
    pos = k + from.size();
    ++done;
    RETURN_IF_ERROR(ev.CheckSize(out.size()));
  }
  out.append(s, pos, std::string::npos);
  return Value::Str(std::move(out));
}

Expected<Value> FInt(Evaluator&, CallArgs& a) {
  Value def = Arg(a, "default", 1, Value::Int(0));
  Value base_v = Arg(a, "base", 2, Value::Int(10));
  const Value& v = a.pos[0];
  if (v.is_int() || v.is_bool()) return Value::Int(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) return def;
    return Value::Int(static_cast<int64_t>(v.as_float()));
  }
  if (v.is_string()) {
    std::string s = StripPySpace(v.str(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (s.empty()) return def;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(s.c_str(), &end, static_cast<int>(base_v.as_int()));
    if (*end == '\0' && errno == 0) return Value::Int(x);
    double d = std::strtod(s.c_str(), &end);
    if (*end == '\0' && std::isfinite(d)) return Value::Int(static_cast<int64_t>(d));
  }
  return def;
}

Expected<Value> FFloat(Evaluator&, CallArgs& a) {
  Value def = Arg(a, "default", 1, Value::Float(0.0));
  const Value& v = a.pos[0];
  if (v.is_number()) return Value::Float(v.as_float());
  if (v.is_string()) {
    std::string s = StripPySpace(v.str(), true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::Float(d);
  }
  return def;
}

Expected<Value> FAbs(Evaluator&, CallArgs& a) {
  const Value& v = a.pos[0];
  if (v.is_float()) return Value::Float(std::fabs(v.as_float()));
  if (v.is_number()) return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
  return TemplateError("bad operand type for abs(): '" + v.TypeName() + "'");
}

Expected<Value> FRound(Evaluator&, CallArgs& a) {
  int64_t precision = Arg(a, "precision", 1, Value::Int(0)).as_int();
  std::string method = ToStr(Arg(a, "method", 2, Value::Str("common")));
  const Value& v = a.pos[0];
  if (!v.is_number()) return TemplateError("type " + v.TypeName() + " doesn't define __round__ method");
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_float() * scale;
  if (method == "ceil") x = std::ceil(x);
  else if (method == "floor") x = std::floor(x);
  else if (method == "common") x = std::nearbyint(x);  // round-half-even, as Python's round()
  else return TemplateError("method must be common, ceil or floor");
  return Value::Float(x / scale);
}

Expected<Value> FTojson(Evaluator&, CallArgs& a) {
  JsonFormat fmt;
  Value indent = Arg(a, "indent", 2, Value::None());
  Value ensure_ascii = Arg(a, "ensure_ascii", 1, Value::Bool(false));
  Value separators = Arg(a, "separators", 3, Value::None());
  Value sort_keys = Arg(a, "sort_keys", 4, Value::Bool(false));
  fmt.ensure_ascii = ensure_ascii.Truthy();
  fmt.sort_keys = sort_keys.Truthy();
  if (!indent.is_none() && !indent.is_undefined()) {
    fmt.has_indent = true;
    fmt.item_sep = ",";
    if (indent.is_string()) fmt.indent = indent.str();
    else fmt.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent.as_int(), 1024))), ' ');
  }
  if (separators.is_list() && separators.items().size() == 2) {
    fmt.item_sep = ToStr(separators.items()[0]);
    fmt.key_sep = ToStr(separators.items()[1]);
  }
  ASSIGN_OR_RETURN(std::string s, ToJson(a.pos[0], fmt));
  return Value::Str(std::move(s));
}

Expected<Value> FItems(Evaluator&, CallArgs& a) {
  if (a.pos[0].is_undefined()) return Value::Iterator({});
  if (!a.pos[0].is_mapping()) return TemplateError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, v] : a.pos[0].dict().entries) out.push_back(Value::List({k, v}, SeqKind::kTuple));
  return Value::Iterator(std::move(out));
}

Expected<Value> FDictsort(Evaluator&, CallArgs& a) {
  bool case_sensitive = Arg(a, "case_sensitive", 1, Value::Bool(false)).Truthy();
  std::string by = ToStr(Arg(a, "by", 2, Value::Str("key")));
  bool reverse = Arg(a, "reverse", 3, Value::Bool(false)).Truthy();
  if (!a.pos[0].is_mapping()) return TemplateError("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> pairs;
  for (const auto& [k, v] : a.pos[0].dict().entries) pairs.push_back(Value::List({k, v}, SeqKind::kTuple));
  size_t idx = by == "value" ? 1 : 0;
  Status err;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    auto c = Compare(Folded(x.items()[idx], case_sensitive), Folded(y.items()[idx], case_sensitive), "<");
    if (!c.ok()) {
      err = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  RETURN_IF_ERROR(err);
  return Value::List(std::move(pairs));
}

Expected<Value> FSort(Evaluator& ev, CallArgs& a) {
  bool reverse = Arg(a, "reverse", 1, Value::Bool(false)).Truthy();
  bool case_sensitive = Arg(a, "case_sensitive", 2, Value::Bool(false)).Truthy();
  Value attribute = Arg(a, "attribute", 3, Value::None());
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& it : items) {
    Value key = it;
    if (!attribute.is_none()) {
      ASSIGN_OR_RETURN(key, ev.GetAttributePath(it, ToStr(attribute)));
    }
    keyed.emplace_back(Folded(key, case_sensitive), it);
  }
  Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    auto c = Compare(x.first, y.first, "<");
    if (!c.ok()) {
      err = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  RETURN_IF_ERROR(err);
  std::vector<Value> out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return Value::List(std::move(out));
}

Expected<Value> MinMax(Evaluator& ev, CallArgs& a, bool want_max) {
  bool case_sensitive = Arg(a, "case_sensitive", 1, Value::Bool(false)).Truthy();
  Value attribute = Arg(a, "attribute", 2, Value::None());
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  Value best = items[0], best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = items[i];
    if (!attribute.is_none()) {
      ASSIGN_OR_RETURN(key, ev.GetAttributePath(items[i], ToStr(attribute)));
    }
    key = Folded(key, case_sensitive);
    if (i == 0) {
      best_key = key;
      continue;
    }
    ASSIGN_OR_RETURN(int c, Compare(key, best_key, want_max ? ">" : "<"));
    if (want_max ? c > 0 : c < 0) {
      best = items[i];
      best_key = key;
    }
  }
  return best;
}
Expected<Value> FMax(Evaluator& ev, CallArgs& a) { return MinMax(ev, a, true); }
Expected<Value> FMin(Evaluator& ev, CallArgs& a) { return MinMax(ev, a, false); }

Expected<Value> FSum(Evaluator& ev, CallArgs& a) {
  Value attribute = Arg(a, "attribute", 1, Value::None());
  Value total = Arg(a, "start", 2, Value::Int(0));
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  for (auto& it : items) {
    Value v = it;
    if (!attribute.is_none()) {
      ASSIGN_OR_RETURN(v, ev.GetAttributePath(it, ToStr(attribute)));
    }
    ASSIGN_OR_RETURN(total, BinaryOp("+", total, v, 64u << 20));
  }
  return total;
}

Expected<Value> FUnique(Evaluator& ev, CallArgs& a) {
  bool case_sensitive = Arg(a, "case_sensitive", 1, Value::Bool(false)).Truthy();
  Value attribute = Arg(a, "attribute", 2, Value::None());
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  std::vector<Value> seen, out;
  for (auto& it : items) {
    Value key = it;
    if (!attribute.is_none()) {
      ASSIGN_OR_RETURN(key, ev.GetAttributePath(it, ToStr(attribute)));
    }
    key = Folded(key, case_sensitive);
    bool dup = false;
    for (const auto& s : seen)
      if (Equals(s, key)) dup = true;
    if (dup) continue;
    seen.push_back(key);
    out.push_back(it);
  }
  return Value::Iterator(std::move(out));
}

Expected<Value> FReverse(Evaluator& ev, CallArgs& a) {
  const Value& v = a.pos[0];
  if (v.is_string()) {
    std::vector<uint32_t> cps = DecodeUtf8(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value::Str(EncodeUtf8(cps));
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(v));
  std::reverse(items.begin(), items.end());
  if (v.is_list() && v.list().kind == SeqKind::kIterator) return Value::List(std::move(items));
  return Value::Iterator(std::move(items), v.is_mapping() ? "dict_reversekeyiterator" : "list_reverseiterator");
}

// select / reject / selectattr / rejectattr share this: keep items whose test result is `want`.
Expected<Value> SelectImpl(Evaluator& ev, CallArgs& a, bool by_attr, bool want) {
  if (!a.pos[0].Truthy()) return Value::Iterator({});  // jinja2 skips falsy input (None too)
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  size_t next = 1;
  std::string attr;
  if (by_attr) {
    if (a.pos.size() < 2) return TemplateError("Missing parameter for attribute name");
    attr = ToStr(a.pos[1]);
    next = 2;
  }
  std::string test = a.pos.size() > next ? ToStr(a.pos[next]) : "";
  if (!test.empty() && !HasTest(test)) return TemplateError("No test named '" + test + "'.");
  std::vector<Value> out;
  for (auto& it : items) {
    Value subject = it;
    if (by_attr) {
      ASSIGN_OR_RETURN(subject, ev.GetAttributePath(it, attr));
    }
    bool r;
    if (test.empty()) {
      r = subject.Truthy();
    } else {
      CallArgs targs;
      targs.pos.push_back(subject);
      for (size_t i = next + 1; i < a.pos.size(); ++i) targs.pos.push_back(a.pos[i]);
      targs.kw = a.kw;
      ASSIGN_OR_RETURN(r, ApplyTest(ev, test, targs));
    }
    if (r == want) out.push_back(it);
  }
  return Value::Iterator(std::move(out));
}
Expected<Value> FSelect(Evaluator& ev, CallArgs& a) { return SelectImpl(ev, a, false, true); }
Expected<Value> FReject(Evaluator& ev, CallArgs& a) { return SelectImpl(ev, a, false, false); }
Expected<Value> FSelectattr(Evaluator& ev, CallArgs& a) { return SelectImpl(ev, a, true, true); }
Expected<Value> FRejectattr(Evaluator& ev, CallArgs& a) { return SelectImpl(ev, a, true, false); }

Expected<Value> FMap(Evaluator& ev, CallArgs& a) {
  if (!a.pos[0].Truthy()) return Value::Iterator({});  // jinja2 skips falsy input (None too)
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  Value attribute, def;
  bool has_attr = a.Take("attribute", SIZE_MAX, &attribute);
  bool has_def = a.Take("default", SIZE_MAX, &def);
  std::vector<Value> out;
  if (has_attr) {
    for (auto& it : items) {
      ASSIGN_OR_RETURN(Value v, ev.GetAttributePath(it, ToStr(attribute)));
      if (v.is_undefined() && has_def) v = def;
      out.push_back(std::move(v));
    }
    return Value::Iterator(std::move(out));
  }
  if (a.pos.size() < 2) return TemplateError("map requires a filter argument");
  std::string filter = ToStr(a.pos[1]);
  if (!HasFilter(filter)) return TemplateError("No filter named '" + filter + "'.");
  for (auto& it : items) {
    CallArgs fargs;
    fargs.pos.push_back(it);
    for (size_t i = 2; i < a.pos.size(); ++i) fargs.pos.push_back(a.pos[i]);
    fargs.kw = a.kw;
    ASSIGN_OR_RETURN(Value v, ApplyFilter(ev, filter, fargs));
    out.push_back(std::move(v));
  }
  return Value::Iterator(std::move(out));
}

Expected<Value> FBatch(Evaluator& ev, CallArgs& a) {
  int64_t n = Arg(a, "linecount", 1, Value::Int(1)).as_int();
  Value fill = Arg(a, "fill_with", 2, Value::None());
  if (n <= 0) return TemplateError("batch size must be positive");
  ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(a.pos[0]));
  std::vector<Value> out, cur;
  for (auto& it : items) {
    cur.push_back(it);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::List(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
    out.push_back(Value::List(std::move(cur)));
  }
  return Value::Iterator(std::move(out));
}

Expected<Value> FIndent(Evaluator&, CallArgs& a) {
  Value width = Arg(a, "width", 1, Value::Int(4));
  bool first = Arg(a, "first", 2, Value::Bool(false)).Truthy();
  bool blank = Arg(a, "blank", 3, Value::Bool(false)).Truthy();
  std::string ind = width.is_string() ? width.str()
                                      : std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 4096)), ' ');
  std::string s = ToStr(a.pos[0]) + "\n";  // as jinja2: so that splitlines keeps a trailing empty line
  std::vector<std::string> lines = SplitLines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
  }
  if (first) rv = ind + rv;
  return Value::Str(std::move(rv), a.pos[0].is_safe());
}

Expected<Value> FCenter(Evaluator&, CallArgs& a) {
  int64_t width = Arg(a, "width", 1, Value::Int(80)).as_int();
  std::string s = ToStr(a.pos[0]);
  int64_t n = static_cast<int64_t>(DecodeUtf8(s).size());
  if (width <= n) return Value::Str(s);
  width = std::min<int64_t>(width, 1 << 20);
  int64_t marg = width - n;
  int64_t left = marg / 2 + (marg & width & 1);
  return Value::Str(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(marg - left), ' '));
}

Expected<Value> FTruncate(Evaluator&, CallArgs& a) {
  int64_t length = Arg(a, "length", 1, Value::Int(255)).as_int();
  bool killwords = Arg(a, "killwords", 2, Value::Bool(false)).Truthy();
  std::string end = ToStr(Arg(a, "end", 3, Value::Str("...")));
  int64_t leeway = Arg(a, "leeway", 4, Value::Int(5)).as_int();
  int64_t end_len = static_cast<int64_t>(DecodeUtf8(end).size());
  if (length < end_len) return TemplateError("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  std::vector<uint32_t> cps = DecodeUtf8(ToStr(a.pos[0]));
  int64_t n = static_cast<int64_t>(cps.size());
  if (n <= length + leeway) return Value::Str(ToStr(a.pos[0]));
  int64_t keep = std::max<int64_t>(0, length - static_cast<int64_t>(DecodeUtf8(end).size()));
  std::string head = EncodeUtf8(cps, 0, static_cast<size_t>(keep));
  if (!killwords) {
    size_t sp = head.rfind(' ');
    if (sp != std::string::npos) head.resize(sp);
  }
  return Value::Str(head + end);
}

Expected<Value> FWordcount(Evaluator&, CallArgs& a) {
  std::string s = ToStr(a.pos[0]);
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : s) {
    bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::Int(n);
}

Expected<Value> FFormat(Evaluator&, CallArgs& a) {
  Value args;
  if (!a.kw.empty()) {
    args = Value::NewDict();
    for (auto& [k, v] : a.kw) args.dict().Set(Value::Str(k), v);
  } else {
    args = Value::List(std::vector<Value>(a.pos.begin() + 1, a.pos.end()), SeqKind::kTuple);
  }
  ASSIGN_OR_RETURN(std::string s, PercentFormat(ToStr(a.pos[0]), args));
  return Value::Str(std::move(s));
}

Expected<Value> FAttr(Evaluator& ev, CallArgs& a) { return ev.GetAttr(a.pos[0], ToStr(Arg(a, "name", 1))); }

const std::map<std::string, FilterFn>& Filters() {
  static const std::map<std::string, FilterFn> filters = {
      {"abs", FAbs},         {"attr", FAttr},         {"batch", FBatch},
      {"capitalize", FCapitalize}, {"center", FCenter}, {"count", FLength},
      {"d", FDefault},       {"default", FDefault},   {"dictsort", FDictsort},
      {"e", FEscape},        {"escape", FEscape},     {"first", FFirst},
      {"float", FFloat},     {"forceescape", FForceEscape}, {"format", FFormat},
      {"indent", FIndent},   {"int", FInt},           {"items", FItems},
      {"join", FJoin},       {"last", FLast},         {"length", FLength},
      {"list", FList},       {"lower", FLower},       {"map", FMap},
      {"max", FMax},         {"min", FMin},           {"pprint", FPprint},
      {"reject", FReject},   {"rejectattr", FRejectattr}, {"replace", FReplace},
      {"reverse", FReverse}, {"round", FRound},       {"safe", FSafe},
      {"select", FSelect},   {"selectattr", FSelectattr}, {"sort", FSort},
      {"string", FString},   {"sum", FSum},           {"title", FTitle},
      {"tojson", FTojson},   {"trim", FTrim},         {"truncate", FTruncate},
      {"unique", FUnique},   {"upper", FUpper},       {"wordcount", FWordcount},
  };
  return filters;
}

}  // namespace

bool HasFilter(const std::string& name) { return Filters().count(name) > 0; }

Expected<Value> ApplyFilter(Evaluator& ev, const std::string& name, CallArgs& args) {
  auto it = Filters().find(name);
  if (it == Filters().end()) return TemplateError("No filter named '" + name + "'.");
  if (args.pos.empty()) return TemplateError("filter '" + name + "' needs a value");
  // Filters that stringify treat Undefined as ""; those that iterate treat it as empty.
  // Everything else that would operate on it raises the undefined error, as jinja2 does.
  return it->second(ev, args);
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace substrate::jinja
