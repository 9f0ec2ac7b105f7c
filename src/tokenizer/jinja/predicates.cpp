// Built-in tests (`x is defined`, ...) and global functions (range, dict, namespace, joiner).
// GCC 12 misreports string concatenation as overlapping memcpy (GCC bug 105329).
#pragma GCC diagnostic ignored "-Wrestrict"
#include <cctype>
#include <cmath>
#include <map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/evaluator.h"

namespace substrate::jinja {

namespace {

using TestFn = Expected<bool> (*)(Evaluator&, CallArgs&);

const Value& Subject(CallArgs& a) { return a.pos[0]; }
Expected<Value> Operand(CallArgs& a, const char* test) {
  if (a.pos.size() < 2) return TemplateError(std::string("test '") + test + "' needs an argument");
  return a.pos[1];
}

Expected<bool> TDefined(Evaluator&, CallArgs& a) { return !Subject(a).is_undefined(); }
Expected<bool> TUndefined(Evaluator&, CallArgs& a) { return Subject(a).is_undefined(); }
Expected<bool> TNone(Evaluator&, CallArgs& a) { return Subject(a).is_none(); }
Expected<bool> TBoolean(Evaluator&, CallArgs& a) { return Subject(a).is_bool(); }
Expected<bool> TTrue(Evaluator&, CallArgs& a) { return Subject(a).is_bool() && Subject(a).as_bool(); }
Expected<bool> TFalse(Evaluator&, CallArgs& a) { return Subject(a).is_bool() && !Subject(a).as_bool(); }
Expected<bool> TInteger(Evaluator&, CallArgs& a) { return Subject(a).is_int(); }
Expected<bool> TFloat(Evaluator&, CallArgs& a) { return Subject(a).is_float(); }
Expected<bool> TNumber(Evaluator&, CallArgs& a) { return Subject(a).is_number(); }
Expected<bool> TString(Evaluator&, CallArgs& a) { return Subject(a).is_string(); }
Expected<bool> TMapping(Evaluator&, CallArgs& a) { return Subject(a).is_mapping(); }
// Undefined counts as callable in jinja2 (calling it raises the undefined error).
Expected<bool> TCallable(Evaluator&, CallArgs& a) { return Subject(a).is_function() || Subject(a).is_undefined(); }
Expected<bool> TEscaped(Evaluator&, CallArgs& a) { return Subject(a).is_safe(); }
Expected<bool> TIterable(Evaluator&, CallArgs& a) {
  const Value& v = Subject(a);
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_mapping();
}
Expected<bool> TSequence(Evaluator&, CallArgs& a) {
  const Value& v = Subject(a);
  return v.is_undefined() || v.is_string() || v.is_mapping() ||
         (v.is_list() && v.list().kind != SeqKind::kIterator);
}
Expected<bool> TLower(Evaluator&, CallArgs& a) {
  const std::string s = ToStr(Subject(a));
  bool cased = false;
  for (unsigned char c : s) {
    if (std::isupper(c)) return false;
    cased |= std::islower(c) != 0;
  }
  return cased;
}
Expected<bool> TUpper(Evaluator&, CallArgs& a) {
  const std::string s = ToStr(Subject(a));
  bool cased = false;
  for (unsigned char c : s) {
    if (std::islower(c)) return false;
    cased |= std::isupper(c) != 0;
  }
  return cased;
}
Expected<bool> TOdd(Evaluator&, CallArgs& a) {
  const Value& v = Subject(a);
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_number()) return TemplateError("not all arguments converted during string formatting");
  return v.is_float() ? std::fmod(v.as_float(), 2.0) != 0 : (v.as_int() % 2) != 0;
}
Expected<bool> TEven(Evaluator& ev, CallArgs& a) {
  ASSIGN_OR_RETURN(bool odd, TOdd(ev, a));
  return !odd;
}
Expected<bool> TDivisibleBy(Evaluator&, CallArgs& a) {
  ASSIGN_OR_RETURN(Value n, Operand(a, "divisibleby"));
  ASSIGN_OR_RETURN(Value m, BinaryOp("%", Subject(a), n, 1u << 20));
  return m.is_number() && m.as_float() == 0;
}
Expected<bool> TEq(Evaluator&, CallArgs& a) {
  ASSIGN_OR_RETURN(Value o, Operand(a, "=="));
  return Equals(Subject(a), o);
}
Expected<bool> TNe(Evaluator&, CallArgs& a) {
  ASSIGN_OR_RETURN(Value o, Operand(a, "!="));
  return !Equals(Subject(a), o);
}
Expected<bool> Ordered(CallArgs& a, const char* op) {
  ASSIGN_OR_RETURN(Value o, Operand(a, op));
  ASSIGN_OR_RETURN(int c, Compare(Subject(a), o, op));
  std::string s(op);
  return s == "<" ? c < 0 : s == "<=" ? c <= 0 : s == ">" ? c > 0 : c >= 0;
}
Expected<bool> TLt(Evaluator&, CallArgs& a) { return Ordered(a, "<"); }
Expected<bool> TLe(Evaluator&, CallArgs& a) { return Ordered(a, "<="); }
Expected<bool> TGt(Evaluator&, CallArgs& a) { return Ordered(a, ">"); }
Expected<bool> TGe(Evaluator&, CallArgs& a) { return Ordered(a, ">="); }
Expected<bool> TIn(Evaluator&, CallArgs& a) {
  ASSIGN_OR_RETURN(Value seq, Operand(a, "in"));
  return Contains(seq, Subject(a));
}
Expected<bool> TSameAs(Evaluator&, CallArgs& a) {
  ASSIGN_OR_RETURN(Value o, Operand(a, "sameas"));
  const Value& v = Subject(a);
  if (v.type() != o.type()) return false;
  if (v.is_list()) return &v.list() == &o.list();
  if (v.is_dict()) return &v.dict() == &o.dict();
  if (v.is_function()) return &v.function() == &o.function();
  return Equals(v, o);
}
Expected<bool> TFilter(Evaluator&, CallArgs& a) { return Subject(a).is_string() && HasFilter(Subject(a).str()); }
Expected<bool> TTest(Evaluator&, CallArgs& a) { return Subject(a).is_string() && HasTest(Subject(a).str()); }

const std::map<std::string, TestFn>& Tests() {
  static const std::map<std::string, TestFn> tests = {
      {"defined", TDefined},   {"undefined", TUndefined}, {"none", TNone},
      {"boolean", TBoolean},   {"true", TTrue},           {"false", TFalse},
      {"integer", TInteger},   {"float", TFloat},         {"number", TNumber},
      {"string", TString},     {"mapping", TMapping},     {"iterable", TIterable},
      {"sequence", TSequence}, {"callable", TCallable},   {"escaped", TEscaped},
      {"lower", TLower},       {"upper", TUpper},         {"odd", TOdd},
      {"even", TEven},         {"divisibleby", TDivisibleBy}, {"eq", TEq},
      {"equalto", TEq},        {"==", TEq},               {"ne", TNe},
      {"!=", TNe},             {"lt", TLt},               {"lessthan", TLt},
      {"<", TLt},              {"le", TLe},               {"<=", TLe},
      {"gt", TGt},             {"greaterthan", TGt},      {">", TGt},
      {"ge", TGe},             {">=", TGe},               {"in", TIn},
      {"sameas", TSameAs},     {"filter", TFilter},       {"test", TTest},
  };
  return tests;
}

// Python's range(), capped as jinja2's sandbox caps it.
Expected<Value> Range(Evaluator&, CallArgs& a) {
  for (const auto& v : a.pos)
    if (!v.is_int() && !v.is_bool())
      return TemplateError("'" + v.TypeName() + "' object cannot be interpreted as an integer");
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].as_int();
  } else if (a.pos.size() == 2 || a.pos.size() == 3) {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
  } else {
    return TemplateError("range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
  }
  if (step == 0) return TemplateError("range() arg 3 must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000)
      return TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    out.push_back(Value::Int(i));
  }
  return Value::List(std::move(out));
}

Expected<Value> MakeDict(Evaluator&, CallArgs& a) {
  Value d = Value::NewDict();
  for (const auto& p : a.pos) {
    if (!p.is_mapping()) return TemplateError("dict() positional argument must be a mapping");
    for (const auto& [k, v] : p.dict().entries) d.dict().Set(k, v);
  }
  for (auto& [k, v] : a.kw) d.dict().Set(Value::Str(k), v);
  return d;
}

Expected<Value> MakeNamespace(Evaluator& ev, CallArgs& a) {
  ASSIGN_OR_RETURN(Value d, MakeDict(ev, a));
  d.dict().kind = DictKind::kNamespace;
  ev.TrackNamespace(d.dict_ptr());
  return d;
}

Expected<Value> MakeJoiner(Evaluator&, CallArgs& a) {
  std::string sep = a.pos.empty() ? ", " : ToStr(a.pos[0]);
  for (auto& [k, v] : a.kw)
    if (k == "sep") sep = ToStr(v);
  auto used = std::make_shared<bool>(false);
  return Value::Function("joiner", [sep, used](Evaluator&, CallArgs&) -> Expected<Value> {
    if (!*used) {
      *used = true;
      return Value::Str("");
    }
    return Value::Str(sep);
  });
}

}  // namespace

bool HasTest(const std::string& name) { return Tests().count(name) > 0; }

Expected<bool> ApplyTest(Evaluator& ev, const std::string& name, CallArgs& args) {
  auto it = Tests().find(name);
  if (it == Tests().end()) return TemplateError("No test named '" + name + "'.");
  if (args.pos.empty()) return TemplateError("test '" + name + "' needs a value");
  return it->second(ev, args);
}

void AddBuiltinGlobals(DictData& globals) {
  globals.Set(Value::Str("range"), Value::Function("range", Range));
  globals.Set(Value::Str("dict"), Value::Function("dict", MakeDict));
  globals.Set(Value::Str("namespace"), Value::Function("namespace", MakeNamespace));
  globals.Set(Value::Str("joiner"), Value::Function("joiner", MakeJoiner));
}

}  // namespace substrate::jinja
