// Built-in filters, tests, methods and global functions of the Jinja engine.
#pragma once

#include <string>

#include "tokenizer/jinja/value.h"

namespace substrate::jinja {

class Evaluator;

bool HasFilter(const std::string& name);
bool HasTest(const std::string& name);

// Applies filter `name` to args.pos[0] (the piped value) with the remaining arguments.
Expected<Value> ApplyFilter(Evaluator& ev, const std::string& name, CallArgs& args);
// Applies test `name` to args.pos[0].
Expected<bool> ApplyTest(Evaluator& ev, const std::string& name, CallArgs& args);

// obj.name for built-in types: a bound method of str/dict/list, or an Undefined naming the
// missing attribute. Dict keys are looked up by the caller.
Value GetMethod(const Value& obj, const std::string& name);

// Globals every template sees: range, dict, namespace, joiner, cycler.
void AddBuiltinGlobals(DictData& globals);

// Python's `%` string formatting (printf style), used by the `%` operator and `format` filter.
Expected<std::string> PercentFormat(const std::string& fmt, const Value& args);

// Jinja/MarkupSafe escaping of & < > " ' (the `escape` filter and safe-string concatenation).
std::string HtmlEscape(const std::string& s);

}  // namespace substrate::jinja
