// Python semantics of Jinja values: printing, truthiness, equality, ordering, json.dumps.
#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace substrate::jinja {

namespace {
// Nesting beyond this is refused in printing/serializing (Python raises RecursionError).
constexpr int kMaxDepth = 512;
}  // namespace

const Value* DictData::Find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (Equals(k, key)) return &v;
  return nullptr;
}

const Value* DictData::Find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void DictData::Set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

bool CallArgs::Take(const std::string& name, size_t index, Value* out) {
  for (size_t i = 0; i < kw.size(); ++i) {
    if (kw[i].first == name) {
      *out = std::move(kw[i].second);
      kw.erase(kw.begin() + static_cast<long>(i));
      return true;
    }
  }
  if (index < pos.size()) {
    *out = pos[index];
    return true;
  }
  return false;
}

Value Value::Undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}
Value Value::None() {
  Value v;
  v.type_ = Type::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.type_ = Type::kFloat;
  v.f_ = f;
  return v;
}
Value Value::Str(std::string s, bool safe) {
  Value v;
  v.type_ = Type::kString;
  v.s_ = std::move(s);
  v.safe_ = safe;
  return v;
}
Value Value::List(std::vector<Value> items, SeqKind kind) {
  Value v;
  v.type_ = Type::kList;
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  v.list_->kind = kind;
  return v;
}
Value Value::Iterator(std::vector<Value> items, std::string type_name) {
  Value v = List(std::move(items), SeqKind::kIterator);
  v.list_->iter_type = std::move(type_name);
  return v;
}
Value Value::Dict(std::shared_ptr<DictData> d) {
  Value v;
  v.type_ = Type::kDict;
  v.dict_ = std::move(d);
  return v;
}
Value Value::NewDict(DictKind kind) {
  auto d = std::make_shared<DictData>();
  d->kind = kind;
  return Dict(std::move(d));
}
Value Value::Function(std::string name, NativeFn fn, std::string type_name) {
  Value v;
  v.type_ = Type::kFunction;
  v.fn_ = std::make_shared<FunctionData>(FunctionData{std::move(name), std::move(type_name), std::move(fn)});
  return v;
}

bool Value::Truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone: return false;
    case Type::kBool: return b_;
    case Type::kInt: return i_ != 0;
    case Type::kFloat: return f_ != 0.0;
    case Type::kString: return !s_.empty();
    case Type::kList: return list_->kind == SeqKind::kIterator || !list_->items.empty();
    case Type::kDict: return dict_->kind != DictKind::kDict || !dict_->entries.empty();
    case Type::kFunction: return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (type_) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "NoneType";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return safe_ ? "Markup" : "str";
    case Type::kList:
      if (list_->kind == SeqKind::kTuple) return "tuple";
      if (list_->kind == SeqKind::kIterator) return list_->iter_type;
      return "list";
    case Type::kDict:
      if (dict_->kind == DictKind::kNamespace) return "Namespace";
      if (dict_->kind == DictKind::kObject) return "LoopContext";
      return "dict";
    case Type::kFunction: return fn_->type_name;
  }
  return "object";
}

Expected<int64_t> Value::Length() const {
  switch (type_) {
    case Type::kUndefined: return int64_t{0};
    case Type::kString: {
      int64_t n = 0;
      for (unsigned char c : s_) n += (c & 0xC0) != 0x80;
      return n;
    }
    case Type::kList:
      if (list_->kind == SeqKind::kIterator && list_->iter_type.rfind("dict_", 0) != 0)
        return TemplateError("object of type '" + list_->iter_type + "' has no len()");
      return static_cast<int64_t>(list_->items.size());
    case Type::kDict:
      if (dict_->kind == DictKind::kDict) return static_cast<int64_t>(dict_->entries.size());
      break;
    default: break;
  }
  return TemplateError("object of type '" + TypeName() + "' has no len()");
}

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') {
    out += '-';
    p = 1;
  }
  size_t e = sci.find('e');
  std::string digits;
  for (size_t i = p; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exp = std::atoi(sci.c_str() + e + 1);
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() < int_len) digits.append(int_len - digits.size(), '0');
      out += digits.substr(0, int_len);
      out += '.';
      out += digits.size() > int_len ? digits.substr(int_len) : "0";
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    }
  } else {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

namespace {

std::string ReprString(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + q;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

void ReprInto(const Value& v, std::string& out, int depth);

void StrInto(const Value& v, std::string& out, int depth) {
  switch (v.type()) {
    case Value::Type::kUndefined: return;
    case Value::Type::kString: out += v.str(); return;
    default: ReprInto(v, out, depth);
  }
}

void ReprInto(const Value& v, std::string& out, int depth) {
  if (depth > kMaxDepth) {
    out += "...";
    return;
  }
  switch (v.type()) {
    case Value::Type::kUndefined: out += "Undefined"; return;
    case Value::Type::kNone: out += "None"; return;
    case Value::Type::kBool: out += v.as_bool() ? "True" : "False"; return;
    case Value::Type::kInt: out += std::to_string(v.as_int()); return;
    case Value::Type::kFloat: out += FormatFloat(v.as_float()); return;
    case Value::Type::kString:
      if (v.is_safe()) out += "Markup(" + ReprString(v.str()) + ")";
      else out += ReprString(v.str());
      return;
    case Value::Type::kList: {
      const ListData& l = v.list();
      if (l.kind == SeqKind::kIterator) {
        if (l.iter_type.rfind("dict_", 0) == 0 && l.iter_type.find("iterator") == std::string::npos) {
          out += l.iter_type + "([";  // dict_items([('a', 1)]), as Python prints views
          for (size_t i = 0; i < l.items.size(); ++i) {
            if (i) out += ", ";
            ReprInto(l.items[i], out, depth + 1);
          }
          out += "])";
          return;
        }
        out += "<" + l.iter_type + " object>";
        return;
      }
      bool tuple = l.kind == SeqKind::kTuple;
      out += tuple ? '(' : '[';
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        ReprInto(l.items[i], out, depth + 1);
      }
      if (tuple && l.items.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case Value::Type::kDict: {
      const DictData& d = v.dict();
      if (d.kind == DictKind::kObject) {
        out += "<LoopContext>";
        return;
      }
      if (d.kind == DictKind::kNamespace) out += "<Namespace ";
      out += '{';
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (i) out += ", ";
        ReprInto(d.entries[i].first, out, depth + 1);
        out += ": ";
        ReprInto(d.entries[i].second, out, depth + 1);
      }
      out += '}';
      if (d.kind == DictKind::kNamespace) out += '>';
      return;
    }
    case Value::Type::kFunction:
      if (v.function().type_name == "Macro") out += "<Macro '" + v.function().name + "'>";
      else out += "<" + v.function().type_name + " " + v.function().name + ">";
      return;
  }
}

}  // namespace

std::string ToStr(const Value& v) {
  std::string out;
  StrInto(v, out, 0);
  return out;
}

std::string Repr(const Value& v) {
  std::string out;
  ReprInto(v, out, 0);
  return out;
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return true;
    case Value::Type::kString: return a.str() == b.str();
    case Value::Type::kList: {
      const ListData& x = a.list();
      const ListData& y = b.list();
      if (&x == &y) return true;
      if (x.kind != y.kind || x.kind == SeqKind::kIterator) return false;
      if (x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!Equals(x.items[i], y.items[i])) return false;
      return true;
    }
    case Value::Type::kDict: {
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (&x == &y) return true;
      if (x.kind != DictKind::kDict || y.kind != DictKind::kDict) return false;
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.Find(k);
        if (!other || !Equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Type::kFunction: return &a.function() == &b.function();
    default: return false;
  }
}

Expected<int> Compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.list().kind == b.list().kind &&
      a.list().kind != SeqKind::kIterator) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  return TemplateError(std::string("'") + op + "' not supported between instances of '" +
                       a.TypeName() + "' and '" + b.TypeName() + "'");
}

namespace {

void JsonEscapeByte(unsigned char c, std::string& out) {
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20) {
        char b[8];
        std::snprintf(b, sizeof(b), "\\u%04x", c);
        out += b;
      } else {
        out += static_cast<char>(c);
      }
  }
}

// Python json string encoding; ensure_ascii writes non-ASCII as \uXXXX (surrogate pairs).
void JsonString(const std::string& s, std::string& out, bool ensure_ascii) {
  out += '"';
  if (ensure_ascii) {
    for (uint32_t cp : DecodeUtf8(s)) {
      if (cp < 0x80) {
        JsonEscapeByte(static_cast<unsigned char>(cp), out);
        continue;
      }
      char b[16];
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      out += b;
    }
  } else {
    for (unsigned char c : s) JsonEscapeByte(c, out);
  }
  out += '"';
}

std::string JsonFloat(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return FormatFloat(f);
}

Status NotSerializable(const Value& v) {
  return TemplateError("Object of type " + v.TypeName() + " is not JSON serializable");
}

Status JsonInto(const Value& v, const JsonFormat& fmt, int level, std::string& out) {
  if (level > kMaxDepth) return TemplateError("maximum recursion depth exceeded while encoding a JSON object");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += fmt.indent;
  };
  switch (v.type()) {
    case Value::Type::kNone: out += "null"; return Status::Ok();
    case Value::Type::kBool: out += v.as_bool() ? "true" : "false"; return Status::Ok();
    case Value::Type::kInt: out += std::to_string(v.as_int()); return Status::Ok();
    case Value::Type::kFloat: out += JsonFloat(v.as_float()); return Status::Ok();
    case Value::Type::kString: JsonString(v.str(), out, fmt.ensure_ascii); return Status::Ok();
    case Value::Type::kList: {
      if (v.list().kind == SeqKind::kIterator) return NotSerializable(v);
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += fmt.item_sep;
        if (fmt.has_indent) newline(level + 1);
        RETURN_IF_ERROR(JsonInto(items[i], fmt, level + 1, out));
      }
      if (fmt.has_indent) newline(level);
      out += ']';
      return Status::Ok();
    }
    case Value::Type::kDict: {
      if (v.dict().kind != DictKind::kDict) return NotSerializable(v);
      const auto& entries = v.dict().entries;
      if (entries.empty()) {
        out += "{}";
        return Status::Ok();
      }
      std::vector<std::pair<std::string, const Value*>> kv;
      for (const auto& [k, val] : entries) {
        std::string key;
        switch (k.type()) {
          case Value::Type::kString: key = k.str(); break;
          case Value::Type::kInt: key = std::to_string(k.as_int()); break;
          case Value::Type::kFloat: key = JsonFloat(k.as_float()); break;
          case Value::Type::kBool: key = k.as_bool() ? "true" : "false"; break;
          case Value::Type::kNone: key = "null"; break;
          default:
            return TemplateError("keys must be str, int, float, bool or None, not " + k.TypeName());
        }
        kv.emplace_back(std::move(key), &val);
      }
      if (fmt.sort_keys)
        std::stable_sort(kv.begin(), kv.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < kv.size(); ++i) {
        if (i) out += fmt.item_sep;
        if (fmt.has_indent) newline(level + 1);
        JsonString(kv[i].first, out, fmt.ensure_ascii);
        out += fmt.key_sep;
        RETURN_IF_ERROR(JsonInto(*kv[i].second, fmt, level + 1, out));
      }
      if (fmt.has_indent) newline(level);
      out += '}';
      return Status::Ok();
    }
    default: return NotSerializable(v);
  }
}

}  // namespace

Expected<std::string> ToJson(const Value& v, const JsonFormat& fmt) {
  std::string out;
  RETURN_IF_ERROR(JsonInto(v, fmt, 0, out));
  return out;
}

Status TemplateError(std::string message) { return InvalidArgument(std::move(message)); }

Status UndefinedError(const Value& undefined) {
  return TemplateError(undefined.str().empty() ? "value is undefined" : undefined.str());
}

std::vector<uint32_t> DecodeUtf8(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || i + static_cast<size_t>(n) >= s.size()) {
      out.push_back(c);  // invalid byte: keep it as a code point of its own
      ++i;
      continue;
    }
    uint32_t cp = n == 0 ? c : (c & (0x3F >> n));
    bool ok = true;
    for (int k = 1; k <= n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back(c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  end = std::min(end, cps.size());
  for (size_t i = begin; i < end; ++i) AppendUtf8(out, cps[i]);
  return out;
}

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {
// Decodes the code point starting at byte i (n = its length in bytes); invalid bytes count as
// one code point each.
uint32_t CodePointAt(const std::string& s, size_t i, size_t* n) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len <= 1 || i + len > s.size()) {
    *n = 1;
    return c;
  }
  uint32_t cp = c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) {
      *n = 1;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  *n = len;
  return cp;
}
}  // namespace

size_t SkipPySpace(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    size_t n = 1;
    if (!IsPySpace(CodePointAt(s, pos, &n))) break;
    pos += n;
  }
  return pos;
}

std::string StripPySpace(const std::string& s, bool left, bool right) {
  size_t begin = left ? SkipPySpace(s, 0) : 0;
  size_t end = begin;
  if (right) {
    // The end of the last non-space code point.
    for (size_t i = begin; i < s.size();) {
      size_t n = 1;
      uint32_t cp = CodePointAt(s, i, &n);
      i += n;
      if (!IsPySpace(cp)) end = i;
    }
  } else {
    end = s.size();
  }
  return s.substr(begin, end - begin);
}

}  // namespace substrate::jinja
