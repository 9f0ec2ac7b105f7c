// Tree-walking evaluator for parsed templates, with jinja2's scoping: a for-loop iteration,
// a macro call and a `with` block each get a child frame (assignments inside do not leak out),
// `if` does not. Work is bounded: steps, macro call depth and string sizes have limits, so a
// hostile template fails with an error instead of hanging or exhausting memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace substrate::jinja {

struct RenderLimits {
  uint64_t max_steps = 20'000'000;         // statements + loop iterations + calls
  int max_call_depth = 200;                // nested macro calls (Python would hit RecursionError)
  size_t max_string_bytes = 64u << 20;     // any single string, the output included
};

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};
using FramePtr = std::shared_ptr<Frame>;

class Evaluator {
 public:
  Evaluator(std::shared_ptr<DictData> globals, RenderLimits limits)
      : globals_(std::move(globals)), limits_(limits) {}
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  Status Render(const Body& body, std::string* out);

  // Python-level operations, shared with the built-in filters.
  Expected<Value> Call(const Value& fn, CallArgs& args);
  Expected<Value> GetAttr(const Value& obj, const std::string& name);
  Expected<Value> GetItem(const Value& obj, const Value& key);
  // jinja2's attribute getter for filters (`map(attribute='a.b')`): dotted, digits index.
  Expected<Value> GetAttributePath(const Value& obj, const std::string& path);
  // The items a for-loop over v visits (dict keys, string characters, ...).
  Expected<std::vector<Value>> Iterate(const Value& v);
  Status CheckSize(size_t bytes) const;
  Status Step();
  // Namespaces are cleared when the render ends (they may reference themselves).
  void TrackNamespace(const std::shared_ptr<DictData>& ns);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Status Exec(const Body& body, const FramePtr& frame, std::string& out, Flow* flow);
  Status ExecStmt(const Stmt& s, const FramePtr& frame, std::string& out, Flow* flow);
  Status ExecFor(const Stmt& s, const FramePtr& frame, std::string& out);
  Status ExecSet(const Stmt& s, const FramePtr& frame, std::string& out);
  Status Assign(const Stmt& s, const std::vector<std::string>& targets, bool unpack, Value v, Frame& frame);
  Value MakeMacro(const Stmt& s, const FramePtr& frame);
  Expected<Value> Eval(const Expr& e, const FramePtr& frame);
  Expected<Value> EvalCall(const Expr& e, const FramePtr& frame, const Value* caller);
  Status EvalArgs(const Expr& e, size_t first, const FramePtr& frame, CallArgs* args);
  Expected<Value> EvalSlice(const Expr& e, const FramePtr& frame);
  Expected<Value> ApplyFilterChain(const Expr& chain, Value input, const FramePtr& frame);
  Value Lookup(const std::string& name, const FramePtr& frame) const;

  std::shared_ptr<DictData> globals_;
  RenderLimits limits_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  Value placeholder_;
  std::vector<FramePtr> pinned_frames_;  // frames that define macros
  std::vector<std::weak_ptr<DictData>> namespaces_;
};

// Binary and comparison operators with Python semantics (operators.cpp).
Expected<Value> BinaryOp(const std::string& op, const Value& a, const Value& b, size_t max_bytes);
Expected<bool> Contains(const Value& container, const Value& item);
// Python's sequence slicing of lists, tuples and strings.
Expected<Value> SliceValue(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace substrate::jinja
