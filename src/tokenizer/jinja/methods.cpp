// Methods of built-in types reachable from templates (`s.strip()`, `d.get(k)`, `l.index(x)`),
// and Python's `%` and str.format() formatting. Mutating methods are refused, as jinja2's
// ImmutableSandboxedEnvironment refuses them.
#include <algorithm>
#include <cstdio>
#include <set>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/evaluator.h"

namespace substrate::jinja {

namespace {

Value ArgOr(CallArgs& a, const std::string& name, size_t index, Value def) {
  Value v;
  if (a.Take(name, index, &v)) return v;
  return def;
}

// Strips code points in `chars` (None = whitespace) from the ends of s.
std::string StripChars(const std::string& s, const Value& chars, bool left, bool right) {
  if (chars.is_none() || chars.is_undefined()) return StripPySpace(s, left, right);
  std::vector<uint32_t> cps = DecodeUtf8(s), set = DecodeUtf8(ToStr(chars));
  auto in = [&](uint32_t c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && in(cps[b])) ++b;
  if (right)
    while (e > b && in(cps[e - 1])) --e;
  return EncodeUtf8(cps, b, e);
}

// Python str.split / rsplit.
Expected<std::vector<Value>> Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; after maxsplit pieces the rest is kept as it is.
    std::vector<uint32_t> cps = DecodeUtf8(s);
    const size_t n = cps.size();
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < n && IsPySpace(cps[i])) ++i;
        if (i >= n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(EncodeUtf8(cps, i, n));
          break;
        }
        size_t j = i;
        while (j < n && !IsPySpace(cps[j])) ++j;
        parts.push_back(EncodeUtf8(cps, i, j));
        i = j;
      }
    } else {
      size_t e = n;
      std::vector<std::string> rev;
      while (true) {
        while (e > 0 && IsPySpace(cps[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) == maxsplit) {
          rev.push_back(EncodeUtf8(cps, 0, e));
          break;
        }
        size_t b = e;
        while (b > 0 && !IsPySpace(cps[b - 1])) --b;
        rev.push_back(EncodeUtf8(cps, b, e));
        e = b;
      }
      parts.assign(rev.rbegin(), rev.rend());
    }
  } else {
    std::string d = ToStr(sep);
    if (d.empty()) return TemplateError("empty separator");
    if (!from_right) {
      size_t pos = 0;
      int64_t n = 0;
      while (maxsplit < 0 || n < maxsplit) {
        size_t k = s.find(d, pos);
        if (k == std::string::npos) break;
        parts.push_back(s.substr(pos, k - pos));
        pos = k + d.size();
        ++n;
      }
      parts.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      int64_t n = 0;
      std::vector<std::string> rev;
      while (maxsplit < 0 || n < maxsplit) {
        if (end < d.size()) break;
        size_t k = s.rfind(d, end - d.size());
        if (k == std::string::npos) break;
        rev.push_back(s.substr(k + d.size(), end - k - d.size()));
        end = k;
        ++n;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.push_back(Value::Str(std::move(p)));
  return out;
}

int64_t CodePointIndex(const std::string& s, size_t byte_pos) {
  int64_t n = 0;
  for (size_t i = 0; i < byte_pos && i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
  return n;
}

std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (unsigned char c : s) {
    if (std::isalpha(c)) {
      out += static_cast<char>(prev_cased ? std::tolower(c) : std::toupper(c));
      prev_cased = true;
    } else {
      out += static_cast<char>(c);
      prev_cased = false;
    }
  }
  return out;
}

Expected<std::string> StrFormat(Evaluator& ev, const std::string& fmt, CallArgs& a);

Expected<Value> CallStrMethod(Evaluator& ev, const Value& self, const std::string& name, CallArgs& a) {
  const std::string& s = self.str();
  auto str = [](std::string v) { return Value::Str(std::move(v)); };
  if (name == "strip") return str(StripChars(s, ArgOr(a, "chars", 0, Value::None()), true, true));
  if (name == "lstrip") return str(StripChars(s, ArgOr(a, "chars", 0, Value::None()), true, false));
  if (name == "rstrip") return str(StripChars(s, ArgOr(a, "chars", 0, Value::None()), false, true));
  if (name == "split" || name == "rsplit") {
    Value sep = ArgOr(a, "sep", 0, Value::None());
    int64_t maxsplit = ArgOr(a, "maxsplit", 1, Value::Int(-1)).as_int();
    ASSIGN_OR_RETURN(std::vector<Value> parts, Split(s, sep, maxsplit, name == "rsplit"));
    return Value::List(std::move(parts));
  }
  if (name == "splitlines") {
    std::vector<Value> out;
    std::vector<uint32_t> cps = DecodeUtf8(s);
    size_t start = 0;
    bool keepends = ArgOr(a, "keepends", 0, Value::Bool(false)).Truthy();
    for (size_t i = 0; i < cps.size(); ++i) {
      uint32_t c = cps[i];
      bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                 c == 0x85 || c == 0x2028 || c == 0x2029;
      if (!brk) continue;
      size_t e = i;
      if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
      out.push_back(str(EncodeUtf8(cps, start, keepends ? i + 1 : e)));
      start = i + 1;
    }
    if (start < cps.size()) out.push_back(str(EncodeUtf8(cps, start, cps.size())));
    return Value::List(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    Value p = ArgOr(a, "prefix", 0, Value::Str(""));
    std::vector<Value> options = p.is_list() ? p.items() : std::vector<Value>{p};
    for (const auto& o : options) {
      if (!o.is_string())
        return TemplateError(name + " first arg must be str or a tuple of str, not " + o.TypeName());
      const std::string& x = o.str();
      bool hit = name == "startswith" ? s.compare(0, x.size(), x) == 0
                                      : (s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "upper" || name == "lower" || name == "swapcase" || name == "casefold") {
    std::string out = s;
    for (char& c : out) {
      unsigned char u = static_cast<unsigned char>(c);
      if (name == "upper") c = static_cast<char>(std::toupper(u));
      else if (name == "swapcase") c = static_cast<char>(std::isupper(u) ? std::tolower(u) : std::toupper(u));
      else c = static_cast<char>(std::tolower(u));
    }
    return str(out);
  }
  if (name == "title") return str(PyTitle(s));
  if (name == "capitalize") {
    std::string out = s;
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return str(out);
  }
  if (name == "replace") {
    CallArgs fa;
    fa.pos = {self, ArgOr(a, "old", 0, Value::Str("")), ArgOr(a, "new", 1, Value::Str("")),
              ArgOr(a, "count", 2, Value::None())};
    if (fa.pos[3].is_int() && fa.pos[3].as_int() < 0) fa.pos[3] = Value::None();
    return ApplyFilter(ev, "replace", fa);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Value sub = ArgOr(a, "sub", 0, Value::Str(""));
    if (!sub.is_string()) return TemplateError("must be str, not " + sub.TypeName());
    const std::string& x = sub.str();
    if (name == "count") {
      if (x.empty()) return Value::Int(static_cast<int64_t>(DecodeUtf8(s).size()) + 1);
      int64_t n = 0;
      for (size_t k = s.find(x); k != std::string::npos; k = s.find(x, k + x.size())) ++n;
      return Value::Int(n);
    }
    size_t k = (name == "find" || name == "index") ? s.find(x) : s.rfind(x);
    if (k == std::string::npos) {
      if (name == "index" || name == "rindex") return TemplateError("substring not found");
      return Value::Int(-1);
    }
    return Value::Int(CodePointIndex(s, k));
  }
  if (name == "join") {
    Value seq = ArgOr(a, "iterable", 0, Value::List({}));
    ASSIGN_OR_RETURN(std::vector<Value> items, ev.Iterate(seq));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string())
        return TemplateError("sequence item " + std::to_string(i) + ": expected str instance, " +
                             items[i].TypeName() + " found");
      if (i) out += s;
      out += items[i].str();
      RETURN_IF_ERROR(ev.CheckSize(out.size()));
    }
    return str(out);
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric" || name == "isalpha" ||
      name == "isalnum" || name == "isspace") {
    if (s.empty()) return Value::Bool(false);
    for (unsigned char c : s) {
      bool ok = name == "isalpha" ? std::isalpha(c) : name == "isalnum" ? std::isalnum(c)
                : name == "isspace" ? std::isspace(c) : std::isdigit(c);
      if (!ok) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  if (name == "islower" || name == "isupper") {
    bool cased = false;
    for (unsigned char c : s) {
      if (name == "islower" ? std::isupper(c) : std::islower(c)) return Value::Bool(false);
      cased |= std::isalpha(c) != 0;
    }
    return Value::Bool(cased);
  }
  if (name == "zfill" || name == "ljust" || name == "rjust" || name == "center") {
    int64_t width = std::min<int64_t>(ArgOr(a, "width", 0, Value::Int(0)).as_int(), 1 << 20);
    std::string fill = ToStr(ArgOr(a, "fillchar", 1, Value::Str(" ")));
    int64_t n = static_cast<int64_t>(DecodeUtf8(s).size());
    if (width <= n) return self;
    size_t pad = static_cast<size_t>(width - n);
    auto rep = [&](size_t k, const std::string& f) {
      std::string r;
      for (size_t i = 0; i < k; ++i) r += f;
      return r;
    };
    if (name == "zfill") {
      size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
      return str(s.substr(0, sign) + std::string(pad, '0') + s.substr(sign));
    }
    if (name == "ljust") return str(s + rep(pad, fill));
    if (name == "rjust") return str(rep(pad, fill) + s);
    size_t left = pad / 2 + (pad & static_cast<size_t>(width) & 1);
    return str(rep(left, fill) + s + rep(pad - left, fill));
  }
  if (name == "partition" || name == "rpartition") {
    std::string sep = ToStr(ArgOr(a, "sep", 0, Value::Str("")));
    if (sep.empty()) return TemplateError("empty separator");
    size_t k = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (k == std::string::npos) {
      if (name == "partition") return Value::List({str(s), str(""), str("")}, SeqKind::kTuple);
      return Value::List({str(""), str(""), str(s)}, SeqKind::kTuple);
    }
    return Value::List({str(s.substr(0, k)), str(sep), str(s.substr(k + sep.size()))}, SeqKind::kTuple);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string x = ToStr(ArgOr(a, "prefix", 0, Value::Str("")));
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return str(s.substr(x.size()));
    if (name == "removesuffix" && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return str(s.substr(0, s.size() - x.size()));
    return self;
  }
  if (name == "format") {
    ASSIGN_OR_RETURN(std::string out, StrFormat(ev, s, a));
    return str(out);
  }
  return TemplateError("'str' object has no attribute '" + name + "'");
}

Expected<Value> CallDictMethod(const Value& self, const std::string& name, CallArgs& a) {
  const DictData& d = self.dict();
  if (name == "get") {
    Value key = ArgOr(a, "key", 0, Value::None());
    Value def = ArgOr(a, "default", 1, Value::None());
    const Value* v = d.Find(key);
    return v ? *v : def;
  }
  std::vector<Value> out;
  for (const auto& [k, v] : d.entries) {
    if (name == "items") out.push_back(Value::List({k, v}, SeqKind::kTuple));
    else if (name == "keys") out.push_back(k);
    else if (name == "values") out.push_back(v);
  }
  if (name == "copy") {
    auto c = std::make_shared<DictData>(d);
    return Value::Dict(std::move(c));
  }
  return Value::Iterator(std::move(out), "dict_" + name);
}

Expected<Value> CallListMethod(const Value& self, const std::string& name, CallArgs& a) {
  Value x = ArgOr(a, "value", 0, Value::None());
  const auto& items = self.items();
  if (name == "count") {
    int64_t n = 0;
    for (const auto& v : items) n += Equals(v, x);
    return Value::Int(n);
  }
  for (size_t i = 0; i < items.size(); ++i)
    if (Equals(items[i], x)) return Value::Int(static_cast<int64_t>(i));
  return TemplateError(Repr(x) + " is not in list");
}

const std::set<std::string> kStrMethods = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper",
    "lower", "swapcase", "casefold", "title", "capitalize", "replace", "find", "rfind", "index", "rindex",
    "count", "join", "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "islower",
    "isupper", "zfill", "ljust", "rjust", "center", "partition", "rpartition", "removeprefix",
    "removesuffix", "format"};
const std::set<std::string> kDictMethods = {"get", "items", "keys", "values", "copy"};
const std::set<std::string> kDictUnsafe = {"pop", "popitem", "setdefault", "update", "clear"};
const std::set<std::string> kListMethods = {"index", "count"};
const std::set<std::string> kListUnsafe = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};

Value Unsafe(const Value& obj, const std::string& name) {
  return Value::Undefined("access to attribute '" + name + "' of '" + obj.TypeName() + "' object is unsafe.");
}

}  // namespace

Value GetMethod(const Value& obj, const std::string& name) {
  if (obj.is_string() && kStrMethods.count(name)) {
    return Value::Function(name, [obj, name](Evaluator& ev, CallArgs& a) { return CallStrMethod(ev, obj, name, a); },
                           "builtin_function_or_method");
  }
  if (obj.is_mapping()) {
    if (kDictMethods.count(name))
      return Value::Function(name, [obj, name](Evaluator&, CallArgs& a) { return CallDictMethod(obj, name, a); },
                             "builtin_function_or_method");
    if (kDictUnsafe.count(name)) return Unsafe(obj, name);
  }
  if (obj.is_list() && obj.list().kind != SeqKind::kIterator) {
    if (kListMethods.count(name))
      return Value::Function(name, [obj, name](Evaluator&, CallArgs& a) { return CallListMethod(obj, name, a); },
                             "builtin_function_or_method");
    if (kListUnsafe.count(name) && obj.list().kind == SeqKind::kList) return Unsafe(obj, name);
  }
  return Value();
}

Expected<std::string> PercentFormat(const std::string& fmt, const Value& args) {
  std::vector<Value> pos;
  const Value* mapping = nullptr;
  if (args.is_list() && args.list().kind == SeqKind::kTuple) pos = args.items();
  else if (args.is_mapping()) mapping = &args;
  else pos = {args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) return TemplateError("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    const Value* arg = nullptr;
    Value keyed;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) return TemplateError("incomplete format key");
      if (!mapping) return TemplateError("format requires a mapping");
      const Value* v = mapping->dict().Find(fmt.substr(i + 1, close - i - 1));
      if (!v) return TemplateError("'" + fmt.substr(i + 1, close - i - 1) + "'");
      keyed = *v;
      arg = &keyed;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) spec += fmt[i++];
    while (i < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[i])) || fmt[i] == '.')) spec += fmt[i++];
    if (i >= fmt.size()) return TemplateError("incomplete format");
    char type = fmt[i];
    if (!arg) {
      if (next >= pos.size()) return TemplateError("not enough arguments for format string");
      arg = &pos[next++];
    }
    char buf[512];
    if (type == 's' || type == 'r' || type == 'a') {
      std::string s = type == 's' ? ToStr(*arg) : Repr(*arg);
      // Width/precision apply to the string; format it ourselves for long strings.
      std::string flags = spec.substr(1);
      size_t dot = flags.find('.');
      std::string width_part = flags.substr(0, dot);
      bool left = width_part.find('-') != std::string::npos;
      width_part.erase(std::remove_if(width_part.begin(), width_part.end(), [](char c) { return !std::isdigit(static_cast<unsigned char>(c)); }),
                       width_part.end());
      if (dot != std::string::npos) {
        size_t prec = static_cast<size_t>(std::atoi(flags.c_str() + dot + 1));
        std::vector<uint32_t> cps = DecodeUtf8(s);
        if (cps.size() > prec) s = EncodeUtf8(cps, 0, prec);
      }
      size_t width = std::min<size_t>(static_cast<size_t>(std::atoi(width_part.c_str())), 1 << 20);
      size_t n = DecodeUtf8(s).size();
      if (n < width) s = left ? s + std::string(width - n, ' ') : std::string(width - n, ' ') + s;
      out += s;
    } else if (std::string("diuxXoc").find(type) != std::string::npos) {
      if (!arg->is_number()) {
        if (type == 'c' && arg->is_string()) {
          out += arg->str();
          continue;
        }
        return TemplateError(std::string("%") + type + " format: a real number is required, not " + arg->TypeName());
      }
      long long v = arg->is_float() ? static_cast<long long>(arg->as_float()) : arg->as_int();
      if (type == 'c') {
        AppendUtf8(out, static_cast<uint32_t>(v));
        continue;
      }
      std::string t = type == 'u' || type == 'i' ? "d" : std::string(1, type);
      std::snprintf(buf, sizeof(buf), (spec + "ll" + t).c_str(), v);
      out += buf;
    } else if (std::string("eEfFgG").find(type) != std::string::npos) {
      if (!arg->is_number())
        return TemplateError(std::string("must be real number, not ") + arg->TypeName());
      std::snprintf(buf, sizeof(buf), (spec + type).c_str(), arg->as_float());
      out += buf;
    } else {
      return TemplateError(std::string("unsupported format character '") + type + "'");
    }
  }
  if (!mapping && next < pos.size()) return TemplateError("not all arguments converted during string formatting");
  return out;
}

namespace {

// str.format(): {} / {0} / {name} fields with an optional [[fill]align][width][.precision][type].
Expected<std::string> StrFormat(Evaluator& ev, const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) return TemplateError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec;
    size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    size_t dot = field.find_first_of(".[");
    std::string head = field.substr(0, dot);
    Value v;
    if (head.empty()) {
      if (auto_index >= a.pos.size()) return TemplateError("Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = a.pos[auto_index++];
    } else if (std::isdigit(static_cast<unsigned char>(head[0]))) {
      size_t k = static_cast<size_t>(std::atoi(head.c_str()));
      if (k >= a.pos.size()) return TemplateError("Replacement index " + head + " out of range for positional args tuple");
      v = a.pos[k];
    } else {
      bool found = false;
      for (auto& [k, val] : a.kw)
        if (k == head) {
          v = val;
          found = true;
        }
      if (!found) return TemplateError("'" + head + "'");
    }
    if (dot != std::string::npos) {
      ASSIGN_OR_RETURN(v, ev.GetAttributePath(v, field.substr(dot + 1)));
    }
    std::string s;
    if (!spec.empty() && v.is_number() && spec.find_first_of("fFeEgGdxXo%") != std::string::npos) {
      char type = spec.back();
      std::string pf = "%" + spec;
      if (type == 'd' || type == 'x' || type == 'X' || type == 'o') {
        pf = "%" + spec.substr(0, spec.size() - 1) + "ll" + type;
        char buf[256];
        std::snprintf(buf, sizeof(buf), pf.c_str(), static_cast<long long>(v.as_int()));
        s = buf;
      } else {
        char buf[256];
        std::snprintf(buf, sizeof(buf), pf.c_str(), v.as_float());
        s = buf;
      }
    } else {
      s = ToStr(v);
      size_t width = 0;
      char align = v.is_number() ? '>' : '<';
      char fill = ' ';
      std::string sp = spec;
      if (sp.size() >= 2 && (sp[1] == '<' || sp[1] == '>' || sp[1] == '^')) {
        fill = sp[0];
        align = sp[1];
        sp = sp.substr(2);
      } else if (!sp.empty() && (sp[0] == '<' || sp[0] == '>' || sp[0] == '^')) {
        align = sp[0];
        sp = sp.substr(1);
      }
      width = std::min<size_t>(static_cast<size_t>(std::atoi(sp.c_str())), 1 << 20);
      size_t n = DecodeUtf8(s).size();
      if (n < width) {
        size_t pad = width - n;
        if (align == '<') s += std::string(pad, fill);
        else if (align == '>') s = std::string(pad, fill) + s;
        else s = std::string(pad / 2, fill) + s + std::string(pad - pad / 2, fill);
      }
    }
    out += s;
    RETURN_IF_ERROR(ev.CheckSize(out.size()));
  }
  return out;
}

}  // namespace

}  // namespace substrate::jinja
