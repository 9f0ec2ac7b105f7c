// The parsed form of a template: expressions and statements, as jinja2's parser builds them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace substrate::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kLiteral,      // value
  kName,         // name
  kList,         // args
  kTuple,        // args
  kDict,         // args: key0, value0, key1, value1, ...
  kGetattr,      // args[0].name
  kGetitem,      // args[0][args[1]]
  kSlice,        // args[0][args[1]:args[2]:args[3]] (null parts omitted)
  kCall,         // args[0](args[1..], kwargs)
  kFilter,       // args[0] | name(args[1..], kwargs)
  kTest,         // args[0] is [not] name(args[1..], kwargs)
  kUnary,        // op args[0]: "not", "-", "+"
  kBinary,       // args[0] op args[1]: + - * / // % ** ~ and or
  kCompare,      // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
  kCondExpr,     // args[1] if args[0] else args[2] (args[2] may be null)
  kPlaceholder,  // the value piped into a {% filter %} block or a `set x | f` block
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                   // kLiteral
  std::string name;              // kName, kGetattr, kFilter, kTest; op of kUnary/kBinary
  bool negated = false;          // kTest: `is not`
  std::vector<ExprPtr> args;     // see ExprKind
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr star_args, star_kwargs;  // kCall: *args, **kwargs
  std::vector<std::string> ops;  // kCompare
};

enum class StmtKind {
  kText,       // text
  kPrint,      // expr
  kIf,         // conds[i] -> bodies[i]; else_body
  kFor,        // targets in expr [if cond]; body; else_body
  kSet,        // targets (or ns.attr) = expr; or block set: body with filter chain `expr`
  kMacro,      // name(params = defaults): body
  kCallBlock,  // expr = the call; params = caller's params; body = caller's body
  kFilterBlock,  // expr = filter chain over a placeholder; body
  kWith,       // targets = values; body
  kBreak,
  kContinue,
  kBlockPassthrough,  // {% generation %}: renders its body
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                 // kText; kMacro name; kSet namespace attribute
  ExprPtr expr;                     // kPrint, kFor iterable, kSet value, kCallBlock call, filters
  ExprPtr cond;                     // kFor filter
  std::vector<ExprPtr> conds;       // kIf
  std::vector<Body> bodies;         // kIf
  Body body, else_body;
  std::vector<std::string> targets;  // kFor/kSet names; kWith names
  bool unpack = false;              // targets form a tuple
  bool block_set = false;           // kSet: {% set x %}body{% endset %}
  bool uses_loop = true;            // kFor: the body mentions `loop` (else it is not built)
  std::vector<ExprPtr> values;      // kWith values
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro/kCallBlock (default may be null)
};

}  // namespace substrate::jinja
