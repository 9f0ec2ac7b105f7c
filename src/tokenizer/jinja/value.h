// Values of the Jinja engine, with Python semantics: what jinja2 (as `transformers` runs it)
// would print, compare and serialize. Lists and dicts are shared immutable data (the sandbox
// that renders chat templates forbids mutation), except namespaces, which `set ns.x = ...`
// mutates in place — so copies of a Value share their namespace, as in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace substrate::jinja {

class Value;
class Evaluator;

// Sequence flavours: a tuple prints with parentheses; an iterator (what jinja2's map, select,
// items... return) has no len() and is not JSON serializable, like a Python generator.
enum class SeqKind : uint8_t { kList, kTuple, kIterator };
// Dict flavours: a namespace() or an attribute-only object such as `loop`.
enum class DictKind : uint8_t { kDict, kNamespace, kObject };

struct ListData {
  std::vector<Value> items;
  SeqKind kind = SeqKind::kList;
  std::string iter_type = "generator";  // Python type name of an iterator
};

struct DictData {
  std::vector<std::pair<Value, Value>> entries;  // insertion order, as a Python dict
  DictKind kind = DictKind::kDict;
  const Value* Find(const Value& key) const;
  const Value* Find(const std::string& key) const;
  void Set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Removes and returns keyword `name`, or positional `index` when present, else nullptr-like
  // (an Undefined Value with has == false).
  bool Take(const std::string& name, size_t index, Value* out);
};

using NativeFn = std::function<Expected<Value>(Evaluator&, CallArgs&)>;
struct FunctionData {
  std::string name;
  std::string type_name;  // "function", "Macro", "method": for errors and repr
  NativeFn fn;
};

class Value {
 public:
  enum class Type : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // Undefined with no hint
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s, bool safe = false);
  static Value List(std::vector<Value> items, SeqKind kind = SeqKind::kList);
  static Value Iterator(std::vector<Value> items, std::string type_name = "generator");
  static Value Dict(std::shared_ptr<DictData> d);
  static Value NewDict(DictKind kind = DictKind::kDict);
  static Value Function(std::string name, NativeFn fn, std::string type_name = "function");

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  bool is_number() const { return type_ == Type::kBool || type_ == Type::kInt || type_ == Type::kFloat; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_mapping() const { return type_ == Type::kDict && dict_->kind == DictKind::kDict; }
  bool is_namespace() const { return type_ == Type::kDict && dict_->kind == DictKind::kNamespace; }
  bool is_function() const { return type_ == Type::kFunction; }
  bool is_safe() const { return safe_; }  // markupsafe.Markup

  bool as_bool() const { return b_; }
  int64_t as_int() const { return type_ == Type::kBool ? (b_ ? 1 : 0) : i_; }
  double as_float() const { return type_ == Type::kFloat ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return s_; }  // string contents, or Undefined's message
  const std::vector<Value>& items() const { return list_->items; }
  const ListData& list() const { return *list_; }
  DictData& dict() const { return *dict_; }
  const std::shared_ptr<DictData>& dict_ptr() const { return dict_; }
  const FunctionData& function() const { return *fn_; }

  // Python's truthiness.
  bool Truthy() const;
  // Python's type name ("NoneType", "str", "dict", "generator", ...), for error messages.
  std::string TypeName() const;
  // Length for len(): strings count code points. Fails for iterators and scalars.
  Expected<int64_t> Length() const;

 private:
  Type type_ = Type::kUndefined;
  bool b_ = false;
  bool safe_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<FunctionData> fn_;
};

// Python str(v) (Undefined prints as empty) and repr(v).
std::string ToStr(const Value& v);
std::string Repr(const Value& v);
std::string FormatFloat(double f);  // Python float repr: 1.0, 0.1, 1e+20, inf, nan
// Python ==, and <-style ordering (fails for incomparable types, as Python's TypeError).
bool Equals(const Value& a, const Value& b);
Expected<int> Compare(const Value& a, const Value& b, const char* op);

// Python json.dumps(v, ensure_ascii=False, indent, separators, sort_keys), as `transformers`
// installs it as the `tojson` filter. indent: empty = None, else the indent string.
struct JsonFormat {
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
Expected<std::string> ToJson(const Value& v, const JsonFormat& fmt);

// Status for a jinja2 runtime error: the message is exactly what Python would raise.
Status TemplateError(std::string message);
// The error of using an Undefined value in an operation (its hint).
Status UndefinedError(const Value& undefined);

// Unicode helpers over UTF-8 strings (Python strings are code point sequences).
std::vector<uint32_t> DecodeUtf8(const std::string& s);
std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin = 0, size_t end = SIZE_MAX);
void AppendUtf8(std::string& out, uint32_t cp);
bool IsPySpace(uint32_t cp);
// Byte offset of the first character at or after `pos` that is not Python whitespace.
size_t SkipPySpace(const std::string& s, size_t pos);
// Python's str.strip() / lstrip() / rstrip() without arguments.
std::string StripPySpace(const std::string& s, bool left, bool right);

}  // namespace substrate::jinja
