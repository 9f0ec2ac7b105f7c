// Arithmetic, concatenation, containment and slicing with Python's semantics and messages.
#include <climits>
#include <cmath>
#include <optional>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/evaluator.h"

namespace substrate::jinja {

namespace {

Status Unsupported(const std::string& op, const Value& a, const Value& b) {
  return TemplateError("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" + b.TypeName() + "'");
}

Expected<Value> Repeat(const Value& seq, int64_t n, size_t max_bytes) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (!seq.str().empty() && static_cast<uint64_t>(n) > max_bytes / seq.str().size())
      return TemplateError("string repetition result exceeds the limit of " + std::to_string(max_bytes) + " bytes");
    std::string out;
    out.reserve(seq.str().size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::Str(std::move(out), seq.is_safe());
  }
  if (!seq.items().empty() && static_cast<uint64_t>(n) > (max_bytes / 16) / seq.items().size())
    return TemplateError("list repetition result too large");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::List(std::move(out), seq.list().kind);
}

double FloorMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

Expected<Value> BinaryOp(const std::string& op, const Value& a, const Value& b, size_t max_bytes) {
  if (op == "~") {
    std::string s = ToStr(a) + ToStr(b);
    if (s.size() > max_bytes) return TemplateError("string concatenation exceeds the size limit");
    return Value::Str(std::move(s));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > max_bytes) return TemplateError("string concatenation exceeds the size limit");
      if (a.is_safe() && !b.is_safe()) return Value::Str(a.str() + HtmlEscape(b.str()), true);
      if (b.is_safe() && !a.is_safe()) return Value::Str(HtmlEscape(a.str()) + b.str(), true);
      return Value::Str(a.str() + b.str(), a.is_safe());
    }
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return TemplateError("integer overflow in +");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_float() + b.as_float());
    if (a.is_list() && b.is_list() && a.list().kind == b.list().kind && a.list().kind != SeqKind::kIterator) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::List(std::move(items), a.list().kind);
    }
    if (a.is_string() && !a.is_safe())
      return TemplateError("can only concatenate str (not \"" + b.TypeName() + "\") to str");
    if (a.is_list() && a.list().kind != SeqKind::kIterator)
      return TemplateError("can only concatenate " + a.TypeName() + " (not \"" + b.TypeName() + "\") to " + a.TypeName());
    return Unsupported("+", a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return TemplateError("integer overflow in -");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_float() - b.as_float());
    return Unsupported("-", a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return TemplateError("integer overflow in *");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_float() * b.as_float());
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return Repeat(a, b.as_int(), max_bytes);
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return Repeat(b, a.as_int(), max_bytes);
    if (a.is_string() || b.is_string() || a.is_list() || b.is_list())
      return TemplateError("can't multiply sequence by non-int of type '" +
                           ((a.is_string() || a.is_list()) ? b.TypeName() : a.TypeName()) + "'");
    return Unsupported("*", a, b);
  }
  if (op == "/") {
    if (!nums) return Unsupported("/", a, b);
    if (b.as_float() == 0) return TemplateError(ints ? "division by zero" : "float division by zero");
    return Value::Float(a.as_float() / b.as_float());
  }
  if (op == "//") {
    if (!nums) return Unsupported("//", a, b);
    if (ints) {
      if (b.as_int() == 0) return TemplateError("integer division or modulo by zero");
      int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) return TemplateError("integer overflow in //");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::Int(q);
    }
    if (b.as_float() == 0) return TemplateError("float floor division by zero");
    return Value::Float(std::floor(a.as_float() / b.as_float()));
  }
  if (op == "%") {
    if (a.is_string()) {
      ASSIGN_OR_RETURN(std::string s, PercentFormat(a.str(), b));
      return Value::Str(std::move(s), a.is_safe());
    }
    if (!nums) return Unsupported("%", a, b);
    if (ints) {
      if (b.as_int() == 0) return TemplateError("integer division or modulo by zero");
      int64_t x = a.as_int(), y = b.as_int();
      if (y == -1) return Value::Int(0);
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Int(m);
    }
    if (b.as_float() == 0) return TemplateError("float modulo");
    return Value::Float(FloorMod(a.as_float(), b.as_float()));
  }
  if (op == "**") {
    if (!nums) return Unsupported("** or pow()", a, b);
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), r = 1;
      for (int64_t e = b.as_int(); e > 0; --e) {
        if (__builtin_mul_overflow(r, base, &r)) return TemplateError("integer overflow in **");
        if (r == 0 || r == 1) break;
      }
      return Value::Int(r);
    }
    if (a.as_float() == 0 && b.as_float() < 0) return TemplateError("0.0 cannot be raised to a negative power");
    return Value::Float(std::pow(a.as_float(), b.as_float()));
  }
  return Internal("jinja: unknown operator " + op);
}

Expected<bool> Contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kUndefined: return false;
    case Value::Type::kString:
      if (!item.is_string())
        return TemplateError("'in <string>' requires string as left operand, not " + item.TypeName());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Type::kList:
      for (const auto& v : container.items())
        if (Equals(v, item)) return true;
      return false;
    case Value::Type::kDict:
      if (container.is_mapping()) return container.dict().Find(item) != nullptr;
      break;
    default: break;
  }
  return TemplateError("argument of type '" + container.TypeName() + "' is not iterable");
}

Expected<Value> SliceValue(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> Expected<std::optional<int64_t>> {
    if (v.is_none() || v.is_undefined()) return std::optional<int64_t>();
    if (v.is_int() || v.is_bool()) return std::optional<int64_t>(v.as_int());
    return TemplateError(std::string("slice ") + what +
                         " indices must be integers or None or have an __index__ method");
  };
  ASSIGN_OR_RETURN(auto start, as_index(start_v, "start"));
  ASSIGN_OR_RETURN(auto stop, as_index(stop_v, "stop"));
  ASSIGN_OR_RETURN(auto step_o, as_index(step_v, "step"));
  int64_t step = step_o.value_or(1);
  if (step == 0) return TemplateError("slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = DecodeUtf8(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_list() && obj.list().kind != SeqKind::kIterator) {
    n = static_cast<int64_t>(obj.items().size());
  } else {
    return Value::Undefined(obj.TypeName() + " object has no element slice");
  }
  auto clamp = [&](std::optional<int64_t> v, int64_t def, bool upper) -> int64_t {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    (void)upper;
    return x;
  };
  int64_t b = clamp(start, step > 0 ? 0 : n - 1, false);
  int64_t e = clamp(stop, step > 0 ? n : -1, true);
  std::vector<int64_t> idx;
  if (step > 0)
    for (int64_t i = b; i < e; i += step) idx.push_back(i);
  else
    for (int64_t i = b; i > e; i += step) idx.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) AppendUtf8(out, cps[static_cast<size_t>(i)]);
    return Value::Str(std::move(out), obj.is_safe());
  }
  std::vector<Value> out;
  for (int64_t i : idx) out.push_back(obj.items()[static_cast<size_t>(i)]);
  return Value::List(std::move(out), obj.list().kind);
}

}  // namespace substrate::jinja
