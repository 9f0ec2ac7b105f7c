// Statement execution and expression evaluation.
#include "tokenizer/jinja/evaluator.h"

#include "tokenizer/jinja/builtins.h"

namespace substrate::jinja {

namespace {

std::string ObjectTypeRepr(const Value& obj) {
  if (obj.is_none()) return "None";
  if (obj.is_namespace()) return "jinja2.utils.Namespace object";
  if (obj.is_dict() && obj.dict().kind == DictKind::kObject) return "jinja2.runtime.LoopContext object";
  return obj.TypeName() + " object";
}

Value MissingAttribute(const Value& obj, const std::string& name) {
  std::string msg = "'";  // built stepwise: GCC 12 misreports `"lit" + str + ...` (-Wrestrict)
  msg += ObjectTypeRepr(obj);
  msg += "' has no attribute '";
  msg += name;
  msg += "'";
  return Value::Undefined(std::move(msg));
}

Value MissingElement(const Value& obj, const Value& key) {
  return Value::Undefined(ObjectTypeRepr(obj) + " has no element " + Repr(key));
}

}  // namespace

Status Evaluator::Step() {
  if (++steps_ > limits_.max_steps)
    return TemplateError("template exceeded its step limit (" + std::to_string(limits_.max_steps) +
                         "): runaway loop?");
  return Status::Ok();
}

Status Evaluator::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_string_bytes)
    return TemplateError("template output exceeds the limit of " + std::to_string(limits_.max_string_bytes) + " bytes");
  return Status::Ok();
}

Evaluator::~Evaluator() {
  // Namespaces may hold themselves (`set ns.me = ns`); clearing breaks such cycles.
  for (auto& weak : namespaces_)
    if (auto ns = weak.lock()) ns->entries.clear();
}

void Evaluator::TrackNamespace(const std::shared_ptr<DictData>& ns) { namespaces_.push_back(ns); }

Status Evaluator::Render(const Body& body, std::string* out) {
  auto root = std::make_shared<Frame>();
  Flow flow = Flow::kNormal;
  return Exec(body, root, *out, &flow);
}

Value Evaluator::Lookup(const std::string& name, const FramePtr& frame) const {
  for (const Frame* f = frame.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  if (const Value* v = globals_->Find(name)) return *v;
  return Value::Undefined("'" + name + "' is undefined");
}

Status Evaluator::Exec(const Body& body, const FramePtr& frame, std::string& out, Flow* flow) {
  for (const auto& s : body) {
    RETURN_IF_ERROR(ExecStmt(*s, frame, out, flow));
    if (*flow != Flow::kNormal) break;
  }
  return Status::Ok();
}

Status Evaluator::ExecStmt(const Stmt& s, const FramePtr& frame, std::string& out, Flow* flow) {
  RETURN_IF_ERROR(Step());
  switch (s.kind) {
    case StmtKind::kText:
      out += s.text;
      return CheckSize(out.size());
    case StmtKind::kPrint: {
      ASSIGN_OR_RETURN(Value v, Eval(*s.expr, frame));
      out += ToStr(v);
      return CheckSize(out.size());
    }
    case StmtKind::kIf:
      for (size_t i = 0; i < s.conds.size(); ++i) {
        ASSIGN_OR_RETURN(Value c, Eval(*s.conds[i], frame));
        if (c.Truthy()) return Exec(s.bodies[i], frame, out, flow);
      }
      return Exec(s.else_body, frame, out, flow);
    case StmtKind::kFor: return ExecFor(s, frame, out);
    case StmtKind::kSet: return ExecSet(s, frame, out);
    case StmtKind::kMacro:
      frame->vars[s.text] = MakeMacro(s, frame);
      return Status::Ok();
    case StmtKind::kCallBlock: {
      // `caller()` renders the block's body in a child of the current frame.
      const Stmt* stmt = &s;
      FramePtr outer = frame;
      Value caller = Value::Function(
          "caller",
          [this, stmt, outer](Evaluator&, CallArgs& args) -> Expected<Value> {
            auto f = std::make_shared<Frame>();
            f->parent = outer;
            for (size_t i = 0; i < stmt->params.size(); ++i) {
              Value v;
              if (!args.Take(stmt->params[i].first, i, &v)) {
                if (stmt->params[i].second) {
                  ASSIGN_OR_RETURN(v, Eval(*stmt->params[i].second, f));
                } else {
                  v = Value::Undefined("parameter '" + stmt->params[i].first + "' was not provided");
                }
              }
              f->vars[stmt->params[i].first] = std::move(v);
            }
            std::string body_out;
            Flow fl = Flow::kNormal;
            RETURN_IF_ERROR(Exec(stmt->body, f, body_out, &fl));
            return Value::Str(std::move(body_out));
          },
          "Macro");
      ASSIGN_OR_RETURN(Value r, EvalCall(*s.expr, frame, &caller));
      out += ToStr(r);
      return CheckSize(out.size());
    }
    case StmtKind::kFilterBlock: {
      std::string body_out;
      RETURN_IF_ERROR(Exec(s.body, frame, body_out, flow));
      ASSIGN_OR_RETURN(Value r, ApplyFilterChain(*s.expr, Value::Str(std::move(body_out)), frame));
      out += ToStr(r);
      return CheckSize(out.size());
    }
    case StmtKind::kWith: {
      auto f = std::make_shared<Frame>();
      f->parent = frame;
      for (size_t i = 0; i < s.targets.size(); ++i) {
        ASSIGN_OR_RETURN(Value v, Eval(*s.values[i], frame));
        f->vars[s.targets[i]] = std::move(v);
      }
      return Exec(s.body, f, out, flow);
    }
    case StmtKind::kBreak: *flow = Flow::kBreak; return Status::Ok();
    case StmtKind::kContinue: *flow = Flow::kContinue; return Status::Ok();
    case StmtKind::kBlockPassthrough: return Exec(s.body, frame, out, flow);
  }
  return Internal("jinja: unknown statement kind");
}

Status Evaluator::Assign(const Stmt& s, const std::vector<std::string>& targets, bool unpack, Value v,
                         Frame& frame) {
  if (!unpack) {
    frame.vars[targets[0]] = std::move(v);
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.size() < targets.size())
    return TemplateError("not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                         std::to_string(items.size()) + ")");
  if (items.size() > targets.size())
    return TemplateError("too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = std::move(items[i]);
  return Status::Ok();
}

Status Evaluator::ExecSet(const Stmt& s, const FramePtr& frame, std::string& out) {
  Value v;
  if (s.block_set) {
    std::string body_out;
    Flow fl = Flow::kNormal;
    RETURN_IF_ERROR(Exec(s.body, frame, body_out, &fl));
    v = Value::Str(std::move(body_out));
    if (s.expr) {
      ASSIGN_OR_RETURN(v, ApplyFilterChain(*s.expr, std::move(v), frame));
    }
  } else {
    ASSIGN_OR_RETURN(v, Eval(*s.expr, frame));
  }
  if (!s.text.empty()) {  // set ns.attr = v
    Value ns = Lookup(s.targets[0], frame);
    if (!ns.is_namespace()) return TemplateError("cannot assign attribute on non-namespace object");
    ns.dict().Set(Value::Str(s.text), std::move(v));
    return Status::Ok();
  }
  return Assign(s, s.targets, s.unpack, std::move(v), *frame);
}

Status Evaluator::ExecFor(const Stmt& s, const FramePtr& frame, std::string& out) {
  ASSIGN_OR_RETURN(Value seq, Eval(*s.expr, frame));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(seq));
  if (s.cond) {  // `for x in xs if cond`: filtered before the loop, so loop.length counts survivors
    std::vector<Value> kept;
    for (auto& item : items) {
      RETURN_IF_ERROR(Step());
      auto f = std::make_shared<Frame>();
      f->parent = frame;
      RETURN_IF_ERROR(Assign(s, s.targets, s.unpack, item, *f));
      ASSIGN_OR_RETURN(Value c, Eval(*s.cond, f));
      if (c.Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto f = std::make_shared<Frame>();
    f->parent = frame;
    Flow fl = Flow::kNormal;
    return Exec(s.else_body, f, out, &fl);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  // loop.changed(...) and loop.cycle(...) keep state across iterations.
  auto last_changed = std::make_shared<std::pair<bool, Value>>(false, Value());
  auto index = std::make_shared<int64_t>(0);
  Value cycle = Value::Function("cycle", [index](Evaluator&, CallArgs& a) -> Expected<Value> {
    if (a.pos.empty()) return TemplateError("no items for cycling given");
    return a.pos[static_cast<size_t>(*index % static_cast<int64_t>(a.pos.size()))];
  });
  Value changed = Value::Function("changed", [last_changed](Evaluator&, CallArgs& a) -> Expected<Value> {
    Value cur = Value::List(a.pos);
    if (last_changed->first && Equals(last_changed->second, cur)) return Value::Bool(false);
    *last_changed = {true, cur};
    return Value::Bool(true);
  });
  for (int64_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(Step());
    *index = i;
    auto f = std::make_shared<Frame>();
    f->parent = frame;
    RETURN_IF_ERROR(Assign(s, s.targets, s.unpack, items[static_cast<size_t>(i)], *f));
    if (!s.uses_loop) {
      Flow fl = Flow::kNormal;
      RETURN_IF_ERROR(Exec(s.body, f, out, &fl));
      if (fl == Flow::kBreak) break;
      continue;
    }
    auto loop = std::make_shared<DictData>();
    loop->kind = DictKind::kObject;
    auto put = [&](const char* k, Value v) { loop->entries.emplace_back(Value::Str(k), std::move(v)); };
    put("index", Value::Int(i + 1));
    put("index0", Value::Int(i));
    put("revindex", Value::Int(n - i));
    put("revindex0", Value::Int(n - i - 1));
    put("first", Value::Bool(i == 0));
    put("last", Value::Bool(i == n - 1));
    put("length", Value::Int(n));
    put("depth", Value::Int(1));
    put("depth0", Value::Int(0));
    put("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("there is no previous item"));
    put("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::Undefined("there is no next item"));
    put("cycle", cycle);
    put("changed", changed);
    f->vars["loop"] = Value::Dict(std::move(loop));
    Flow fl = Flow::kNormal;
    RETURN_IF_ERROR(Exec(s.body, f, out, &fl));
    if (fl == Flow::kBreak) break;
  }
  return Status::Ok();
}

Value Evaluator::MakeMacro(const Stmt& s, const FramePtr& frame) {
  const Stmt* stmt = &s;
  // The macro sees the frame it was defined in (live, so later top-level sets are visible).
  // The frame holds the macro, so the macro holds it weakly and the evaluator keeps it alive:
  // a shared_ptr both ways would be a cycle, leaked on every render.
  pinned_frames_.push_back(frame);
  std::weak_ptr<Frame> weak_frame = frame;
  return Value::Function(
      s.text,
      [this, stmt, weak_frame](Evaluator&, CallArgs& args) -> Expected<Value> {
        FramePtr def_frame = weak_frame.lock();
        if (!def_frame) return Internal("jinja: macro '" + stmt->text + "' outlived its frame");
        if (call_depth_ >= limits_.max_call_depth)
          return TemplateError("maximum recursion depth exceeded");  // Python's RecursionError text
        auto f = std::make_shared<Frame>();
        f->parent = def_frame;
        Value caller;
        bool has_caller = false;
        for (size_t i = 0; i < args.kw.size(); ++i) {
          if (args.kw[i].first == "caller") {
            caller = args.kw[i].second;
            has_caller = true;
            args.kw.erase(args.kw.begin() + static_cast<long>(i));
            break;
          }
        }
        const size_t np = stmt->params.size();
        for (size_t i = 0; i < np; ++i) {
          const auto& [pname, pdefault] = stmt->params[i];
          Value v;
          if (!args.Take(pname, i, &v)) {
            if (pdefault) {
              ASSIGN_OR_RETURN(v, Eval(*pdefault, f));
            } else {
              v = Value::Undefined("parameter '" + pname + "' was not provided");
            }
          }
          f->vars[pname] = std::move(v);
        }
        std::vector<Value> extra;
        for (size_t i = np; i < args.pos.size(); ++i) extra.push_back(args.pos[i]);
        f->vars["varargs"] = Value::List(std::move(extra), SeqKind::kTuple);
        Value kwargs = Value::NewDict();
        for (auto& [k, v] : args.kw) kwargs.dict().Set(Value::Str(k), v);
        f->vars["kwargs"] = std::move(kwargs);
        if (has_caller) f->vars["caller"] = std::move(caller);
        std::string out;
        Flow fl = Flow::kNormal;
        ++call_depth_;
        Status st = Exec(stmt->body, f, out, &fl);
        --call_depth_;
        RETURN_IF_ERROR(st);
        return Value::Str(std::move(out));
      },
      "Macro");
}

Expected<Value> Evaluator::Call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) return UndefinedError(fn);
  if (!fn.is_function()) return TemplateError(std::string("'").append(fn.TypeName()).append("' object is not callable"));
  RETURN_IF_ERROR(Step());
  return fn.function().fn(*this, args);
}

Expected<Value> Evaluator::GetAttr(const Value& obj, const std::string& name) {
  switch (obj.type()) {
    case Value::Type::kUndefined: return UndefinedError(obj);
    case Value::Type::kDict: {
      if (obj.is_mapping()) {
        Value m = GetMethod(obj, name);  // Python finds dict methods before keys
        if (!m.is_undefined() || !m.str().empty()) return m;
      }
      if (const Value* v = obj.dict().Find(name)) return *v;
      return MissingAttribute(obj, name);
    }
    default: {
      Value m = GetMethod(obj, name);
      if (m.is_undefined() && m.str().empty()) return MissingAttribute(obj, name);
      return m;
    }
  }
}

Expected<Value> Evaluator::GetItem(const Value& obj, const Value& key) {
  switch (obj.type()) {
    case Value::Type::kUndefined: return UndefinedError(obj);
    case Value::Type::kDict:
      if (const Value* v = obj.dict().Find(key)) return *v;
      break;
    case Value::Type::kList:
      if (obj.list().kind != SeqKind::kIterator && (key.is_int() || key.is_bool())) {
        int64_t n = static_cast<int64_t>(obj.items().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
        return MissingElement(obj, key);
      }
      break;
    case Value::Type::kString:
      if (key.is_int() || key.is_bool()) {
        std::vector<uint32_t> cps = DecodeUtf8(obj.str());
        int64_t n = static_cast<int64_t>(cps.size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::Str(EncodeUtf8(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
        return MissingElement(obj, key);
      }
      break;
    default: break;
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  return MissingElement(obj, key);
}

Expected<Value> Evaluator::GetAttributePath(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    Value key = digits ? Value::Int(std::stoll(part)) : Value::Str(part);
    ASSIGN_OR_RETURN(cur, GetItem(cur, key));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Expected<std::vector<Value>> Evaluator::Iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined: return std::vector<Value>{};
    case Value::Type::kList: return v.items();
    case Value::Type::kString: {
      std::vector<Value> out;
      for (uint32_t cp : DecodeUtf8(v.str())) {
        std::string s;
        AppendUtf8(s, cp);
        out.push_back(Value::Str(std::move(s)));
      }
      return out;
    }
    case Value::Type::kDict:
      if (v.is_mapping()) {
        std::vector<Value> out;
        for (const auto& [k, val] : v.dict().entries) out.push_back(k);
        return out;
      }
      break;
    default: break;
  }
  return TemplateError("'" + v.TypeName() + "' object is not iterable");
}

Status Evaluator::EvalArgs(const Expr& e, size_t first, const FramePtr& frame, CallArgs* args) {
  for (size_t i = first; i < e.args.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[i], frame));
    args->pos.push_back(std::move(v));
  }
  if (e.star_args) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.star_args, frame));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    for (auto& item : items) args->pos.push_back(std::move(item));
  }
  for (const auto& [k, ke] : e.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*ke, frame));
    args->kw.emplace_back(k, std::move(v));
  }
  if (e.star_kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.star_kwargs, frame));
    if (!v.is_mapping()) return TemplateError("argument after ** must be a mapping, not " + v.TypeName());
    for (const auto& [k, val] : v.dict().entries) args->kw.emplace_back(ToStr(k), val);
  }
  return Status::Ok();
}

Expected<Value> Evaluator::EvalCall(const Expr& e, const FramePtr& frame, const Value* caller) {
  ASSIGN_OR_RETURN(Value fn, Eval(*e.args[0], frame));
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(e, 1, frame, &args));
  if (caller) args.kw.emplace_back("caller", *caller);
  return Call(fn, args);
}

Expected<Value> Evaluator::ApplyFilterChain(const Expr& chain, Value input, const FramePtr& frame) {
  Value saved = placeholder_;
  placeholder_ = std::move(input);
  auto r = Eval(chain, frame);
  placeholder_ = std::move(saved);
  return r;
}

Expected<Value> Evaluator::EvalSlice(const Expr& e, const FramePtr& frame) {
  ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
  Value parts[3] = {Value::None(), Value::None(), Value::None()};
  for (int i = 0; i < 3; ++i) {
    if (e.args[static_cast<size_t>(i) + 1]) {
      ASSIGN_OR_RETURN(parts[i], Eval(*e.args[static_cast<size_t>(i) + 1], frame));
    }
  }
  if (obj.is_undefined()) return UndefinedError(obj);
  return SliceValue(obj, parts[0], parts[1], parts[2]);
}

Expected<Value> Evaluator::Eval(const Expr& e, const FramePtr& frame) {
  switch (e.kind) {
    case ExprKind::kLiteral: return e.value;
    case ExprKind::kName: return Lookup(e.name, frame);
    case ExprKind::kPlaceholder: return placeholder_;
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const auto& a : e.args) {
        ASSIGN_OR_RETURN(Value v, Eval(*a, frame));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items), e.kind == ExprKind::kTuple ? SeqKind::kTuple : SeqKind::kList);
    }
    case ExprKind::kDict: {
      Value d = Value::NewDict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        ASSIGN_OR_RETURN(Value k, Eval(*e.args[i], frame));
        if (k.is_list() || k.is_mapping()) return TemplateError("unhashable type: '" + k.TypeName() + "'");
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], frame));
        d.dict().Set(std::move(k), std::move(v));
      }
      return d;
    }
    case ExprKind::kGetattr: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
      return GetAttr(obj, e.name);
    }
    case ExprKind::kGetitem: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
      ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], frame));
      return GetItem(obj, key);
    }
    case ExprKind::kSlice: return EvalSlice(e, frame);
    case ExprKind::kCall: return EvalCall(e, frame, nullptr);
    case ExprKind::kFilter: {
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, 0, frame, &args));
      RETURN_IF_ERROR(Step());
      return ApplyFilter(*this, e.name, args);
    }
    case ExprKind::kTest: {
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, 0, frame, &args));
      ASSIGN_OR_RETURN(bool r, ApplyTest(*this, e.name, args));
      return Value::Bool(r != e.negated);
    }
    case ExprKind::kUnary: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], frame));
      if (e.name == "not") return Value::Bool(!v.Truthy());
      if (v.is_undefined()) return UndefinedError(v);
      if (!v.is_number()) return TemplateError("bad operand type for unary " + e.name + ": '" + v.TypeName() + "'");
      if (e.name == "+") return v.is_float() ? v : Value::Int(v.as_int());
      return v.is_float() ? Value::Float(-v.as_float()) : Value::Int(-v.as_int());
    }
    case ExprKind::kBinary: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
      if (e.name == "and") {
        if (!a.Truthy()) return a;
        return Eval(*e.args[1], frame);
      }
      if (e.name == "or") {
        if (a.Truthy()) return a;
        return Eval(*e.args[1], frame);
      }
      ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], frame));
      return BinaryOp(e.name, a, b, limits_.max_string_bytes);
    }
    case ExprKind::kCompare: {
      ASSIGN_OR_RETURN(Value left, Eval(*e.args[0], frame));
      for (size_t i = 0; i < e.ops.size(); ++i) {
        ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1], frame));
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==") r = Equals(left, right);
        else if (op == "!=") r = !Equals(left, right);
        else if (op == "in" || op == "notin") {
          ASSIGN_OR_RETURN(bool c, Contains(right, left));
          r = (op == "in") == c;
        } else {
          ASSIGN_OR_RETURN(int c, Compare(left, right, op.c_str()));
          r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case ExprKind::kCondExpr: {
      ASSIGN_OR_RETURN(Value c, Eval(*e.args[0], frame));
      if (c.Truthy()) return Eval(*e.args[1], frame);
      if (e.args[2]) return Eval(*e.args[2], frame);
      return Value::Undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Internal("jinja: unknown expression kind");
}

}  // namespace substrate::jinja
