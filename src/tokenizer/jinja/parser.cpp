// Recursive-descent parser following jinja2's grammar (parser.py), statement by statement.
#include "tokenizer/jinja/parser.h"

#include <algorithm>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/lexer.h"

namespace substrate::jinja {

namespace {

ExprPtr MakeExpr(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Expected<Body> ParseAll() {
    ASSIGN_OR_RETURN(Body body, SubParse({}));
    if (cur().type != TokenType::kEnd) return Fail("unexpected tag '" + cur().text + "'");
    return body;
  }

 private:
  // --- token helpers ---
  const Token& cur() const { return toks_[pos_]; }
  const Token& look() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsOp(const char* op) const { return cur().type == TokenType::kOp && cur().text == op; }
  bool IsName(const char* n) const { return cur().type == TokenType::kName && cur().text == n; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    next();
    return true;
  }
  bool SkipName(const char* n) {
    if (!IsName(n)) return false;
    next();
    return true;
  }
  Status Fail(const std::string& what) const {
    return InvalidArgument("template syntax error (line " + std::to_string(cur().line) + "): " + what);
  }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kEnd: return "end of template";
      case TokenType::kBlockEnd: return "end of statement block";
      case TokenType::kVarEnd: return "end of print statement";
      case TokenType::kString: return "string";
      case TokenType::kInt: return "integer";
      case TokenType::kFloat: return "float";
      default: return "'" + t.text + "'";
    }
  }
  Status ExpectOp(const char* op) {
    if (SkipOp(op)) return Status::Ok();
    return Fail(std::string("expected '") + op + "', got " + Describe(cur()));
  }
  Status ExpectBlockEnd() {
    if (cur().type == TokenType::kBlockEnd) {
      next();
      return Status::Ok();
    }
    return Fail("expected end of statement block, got " + Describe(cur()));
  }
  Expected<std::string> ExpectName() {
    if (cur().type != TokenType::kName) return Fail("expected a name, got " + Describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }

  struct DepthGuard {
    explicit DepthGuard(int& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
    int& depth;
  };

  // --- statements ---
  // Parses until a block tag whose name is in `end` (left as the current token).
  Expected<Body> SubParse(const std::vector<std::string>& end) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxParseDepth) return Fail("blocks nested too deeply");
    Body body;
    while (cur().type != TokenType::kEnd) {
      const Token& t = cur();
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::kVarBegin) {
        int line = t.line;
        next();
        ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, false));
        if (cur().type != TokenType::kVarEnd) return Fail("expected end of print statement, got " + Describe(cur()));
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = line;
        s->expr = std::move(e);
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        next();
        if (cur().type == TokenType::kName &&
            std::find(end.begin(), end.end(), cur().text) != end.end())
          return body;
        ASSIGN_OR_RETURN(StmtPtr s, ParseStatement(end));
        if (s) body.push_back(std::move(s));
      } else {
        return Fail("unexpected " + Describe(t));
      }
    }
    if (!end.empty()) {
      std::string want;
      for (const auto& e : end) want += (want.empty() ? "'" : " or '") + e + "'";
      return Fail("unexpected end of template, expected " + want);
    }
    return body;
  }

  // Body up to one of `end`; with drop_needle the end tag's name is consumed as well.
  Expected<Body> ParseStatements(const std::vector<std::string>& end, bool drop_needle) {
    RETURN_IF_ERROR(ExpectBlockEnd());
    ASSIGN_OR_RETURN(Body body, SubParse(end));
    if (drop_needle) next();
    return body;
  }

  Expected<StmtPtr> ParseStatement(const std::vector<std::string>& end) {
    if (cur().type != TokenType::kName) return Fail("tag name expected, got " + Describe(cur()));
    const std::string tag = cur().text;
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    next();
    if (tag == "if") {
      s->kind = StmtKind::kIf;
      while (true) {
        ASSIGN_OR_RETURN(ExprPtr c, ParseTuple(false, false, {}, false));
        ASSIGN_OR_RETURN(Body b, ParseStatements({"elif", "else", "endif"}, false));
        s->conds.push_back(std::move(c));
        s->bodies.push_back(std::move(b));
        if (SkipName("elif")) continue;
        if (SkipName("else")) {
          ASSIGN_OR_RETURN(s->else_body, ParseStatements({"endif"}, true));
        } else {
          next();  // endif
        }
        break;
      }
    } else if (tag == "for") {
      s->kind = StmtKind::kFor;
      RETURN_IF_ERROR(ParseTargets(s.get(), "in"));
      if (!SkipName("in")) return Fail("expected 'in', got " + Describe(cur()));
      ASSIGN_OR_RETURN(s->expr, ParseTuple(false, false, {"recursive", "if"}, false));
      if (SkipName("if")) {
        ASSIGN_OR_RETURN(s->cond, ParseExpression(true));
      }
      if (IsName("recursive")) return Fail("recursive for loops are not supported");
      ++loop_depth_;
      size_t body_start = pos_;
      auto body = ParseStatements({"endfor", "else"}, false);
      --loop_depth_;
      s->uses_loop = false;
      for (size_t i = body_start; i < pos_; ++i)
        if (toks_[i].type == TokenType::kName && toks_[i].text == "loop") s->uses_loop = true;
      if (!body.ok()) return body.status();
      s->body = std::move(body).value();
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(s->else_body, ParseStatements({"endfor"}, true));
      } else {
        next();
      }
    } else if (tag == "set") {
      s->kind = StmtKind::kSet;
      if (cur().type == TokenType::kName && look().type == TokenType::kOp && look().text == ".") {
        s->targets.push_back(cur().text);
        next();
        next();
        ASSIGN_OR_RETURN(s->text, ExpectName());
      } else {
        RETURN_IF_ERROR(ParseTargets(s.get(), "="));
      }
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(s->expr, ParseTuple(false, true, {}, false));
      } else {
        if (!s->text.empty()) return Fail("block set cannot assign a namespace attribute");
        if (s->unpack) return Fail("block set needs a single name");
        if (IsOp("|")) {
          ASSIGN_OR_RETURN(s->expr, ParseFilter(MakeExpr(ExprKind::kPlaceholder, s->line), false));
        }
        ASSIGN_OR_RETURN(s->body, ParseStatements({"endset"}, true));
        s->block_set = true;
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::kMacro;
      ASSIGN_OR_RETURN(s->text, ExpectName());
      RETURN_IF_ERROR(ParseSignature(s.get()));
      int saved = loop_depth_;
      loop_depth_ = 0;
      auto body = ParseStatements({"endmacro"}, true);
      loop_depth_ = saved;
      if (!body.ok()) return body.status();
      s->body = std::move(body).value();
    } else if (tag == "call") {
      s->kind = StmtKind::kCallBlock;
      if (IsOp("(")) RETURN_IF_ERROR(ParseSignature(s.get()));
      ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
      if (s->expr->kind != ExprKind::kCall) return Fail("expected call");
      ASSIGN_OR_RETURN(s->body, ParseStatements({"endcall"}, true));
    } else if (tag == "filter") {
      s->kind = StmtKind::kFilterBlock;
      ASSIGN_OR_RETURN(s->expr, ParseFilter(MakeExpr(ExprKind::kPlaceholder, s->line), true));
      ASSIGN_OR_RETURN(s->body, ParseStatements({"endfilter"}, true));
    } else if (tag == "with") {
      s->kind = StmtKind::kWith;
      while (cur().type != TokenType::kBlockEnd) {
        if (!s->targets.empty()) RETURN_IF_ERROR(ExpectOp(","));
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        RETURN_IF_ERROR(ExpectOp("="));
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        s->targets.push_back(std::move(name));
        s->values.push_back(std::move(v));
      }
      ASSIGN_OR_RETURN(s->body, ParseStatements({"endwith"}, true));
    } else if (tag == "generation") {
      s->kind = StmtKind::kBlockPassthrough;
      ASSIGN_OR_RETURN(s->body, ParseStatements({"endgeneration"}, true));
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return Fail("'" + tag + "' outside of a loop");
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    } else if (tag == "extends" || tag == "include" || tag == "import" || tag == "from" || tag == "block") {
      return Fail("tag '" + tag + "' is not supported in chat templates");
    } else {
      std::string msg = "Encountered unknown tag '" + tag + "'.";
      if (!end.empty()) msg += " Jinja was looking for the following tags: '" + end[0] + "'.";
      return Fail(msg);
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // Assignment targets: a name or a flat tuple of names, `a, b` or `(a, b)`.
  Status ParseTargets(Stmt* s, const char* end) {
    bool paren = SkipOp("(");
    while (true) {
      ASSIGN_OR_RETURN(std::string n, ExpectName());
      s->targets.push_back(std::move(n));
      if (!SkipOp(",")) break;
      s->unpack = true;
      if ((paren && IsOp(")")) || IsName(end) || IsOp(end)) break;
    }
    if (paren) {
      RETURN_IF_ERROR(ExpectOp(")"));
      s->unpack = true;
    }
    return Status::Ok();
  }

  Status ParseSignature(Stmt* s) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!s->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(std::string n, ExpectName());
      ExprPtr def;
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(def, ParseExpression(true));
      } else if (!s->params.empty() && s->params.back().second) {
        return Fail("non-default argument follows default argument");
      }
      s->params.emplace_back(std::move(n), std::move(def));
    }
    next();
    return Status::Ok();
  }

  // --- expressions ---
  bool IsTupleEnd(const std::vector<std::string>& extra) const {
    if (cur().type == TokenType::kVarEnd || cur().type == TokenType::kBlockEnd || cur().type == TokenType::kEnd)
      return true;
    if (IsOp(")")) return true;
    for (const auto& e : extra)
      if ((cur().type == TokenType::kName || cur().type == TokenType::kOp) && cur().text == e) return true;
    return false;
  }

  Expected<ExprPtr> ParseTuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra,
                               bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra)) break;
      if (simplified) {
        ASSIGN_OR_RETURN(ExprPtr e, ParsePrimary());
        args.push_back(std::move(e));
      } else {
        ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
        args.push_back(std::move(e));
      }
      if (IsOp(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) return Fail("expected an expression, got " + Describe(cur()));
    }
    auto t = MakeExpr(ExprKind::kTuple, line);
    t->args = std::move(args);
    return t;
  }

  Expected<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxParseDepth) return Fail("expression nested too deeply");
    if (!with_condexpr) return ParseOr();
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (IsName("if")) {
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(other, ParseExpression(true));
      }
      auto c = MakeExpr(ExprKind::kCondExpr, line);
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(expr));
      c->args.push_back(std::move(other));
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr Binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto b = MakeExpr(ExprKind::kBinary, line);
    b->name = op;
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return b;
  }

  Expected<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = Binary("or", std::move(left), std::move(right), line);
    }
    return left;
  }

  Expected<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = Binary("and", std::move(left), std::move(right), line);
    }
    return left;
  }

  Expected<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(depth_);
      if (depth_ > kMaxParseDepth) return Fail("expression nested too deeply");
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      auto u = MakeExpr(ExprKind::kUnary, line);
      u->name = "not";
      u->args.push_back(std::move(operand));
      return u;
    }
    return ParseCompare();
  }

  Expected<ExprPtr> ParseCompare() {
    int line = cur().line;
    ASSIGN_OR_RETURN(ExprPtr expr, ParseMath1());
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (IsName("in")) {
        op = "in";
        next();
      } else if (IsName("not") && look().type == TokenType::kName && look().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath1());
      ops.push_back(op);
      operands.push_back(std::move(rhs));
    }
    if (ops.empty()) return expr;
    auto c = MakeExpr(ExprKind::kCompare, line);
    c->args.push_back(std::move(expr));
    for (auto& o : operands) c->args.push_back(std::move(o));
    c->ops = std::move(ops);
    return c;
  }

  Expected<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = Binary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  Expected<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left = Binary("~", std::move(left), std::move(right), line);
    }
    return left;
  }

  Expected<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = Binary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  Expected<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      int line = cur().line;
      next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = Binary("**", std::move(left), std::move(right), line);
    }
    return left;
  }

  Expected<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxParseDepth) return Fail("expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      auto u = MakeExpr(ExprKind::kUnary, cur().line);
      u->name = cur().text;
      next();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      u->args.push_back(std::move(operand));
      node = std::move(u);
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
      ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    }
    if (with_filter) return ParseFilterExpr(std::move(node));
    return node;
  }

  Expected<ExprPtr> ParsePrimary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == TokenType::kName) {
      auto e = MakeExpr(ExprKind::kLiteral, line);
      if (t.text == "true" || t.text == "True") e->value = Value::Bool(true);
      else if (t.text == "false" || t.text == "False") e->value = Value::Bool(false);
      else if (t.text == "none" || t.text == "None") e->value = Value::None();
      else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      next();
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (cur().type == TokenType::kString) {
        s += cur().text;
        next();
      }
      auto e = MakeExpr(ExprKind::kLiteral, line);
      e->value = Value::Str(std::move(s));
      return e;
    }
    if (t.type == TokenType::kInt || t.type == TokenType::kFloat) {
      auto e = MakeExpr(ExprKind::kLiteral, line);
      e->value = t.type == TokenType::kInt ? Value::Int(t.int_value) : Value::Float(t.float_value);
      next();
      return e;
    }
    if (SkipOp("(")) {
      ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, true));
      RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (SkipOp("[")) {
      auto e = MakeExpr(ExprKind::kList, line);
      while (!IsOp("]")) {
        if (!e->args.empty()) RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("]")) break;
        ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
        e->args.push_back(std::move(item));
      }
      next();
      return e;
    }
    if (SkipOp("{")) {
      auto e = MakeExpr(ExprKind::kDict, line);
      while (!IsOp("}")) {
        if (!e->args.empty()) RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("}")) break;
        ASSIGN_OR_RETURN(ExprPtr k, ParseExpression(true));
        RETURN_IF_ERROR(ExpectOp(":"));
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->args.push_back(std::move(k));
        e->args.push_back(std::move(v));
      }
      next();
      return e;
    }
    return Fail("unexpected " + Describe(t));
  }

  Expected<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Expected<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        ASSIGN_OR_RETURN(node, ParseFilter(std::move(node), false));
      } else if (IsName("is")) {
        ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Expected<ExprPtr> ParseSubscript(ExprPtr node) {
    int line = cur().line;
    if (SkipOp(".")) {
      if (cur().type == TokenType::kName) {
        auto e = MakeExpr(ExprKind::kGetattr, line);
        e->name = cur().text;
        e->args.push_back(std::move(node));
        next();
        return e;
      }
      if (cur().type == TokenType::kInt) {
        auto e = MakeExpr(ExprKind::kGetitem, line);
        auto k = MakeExpr(ExprKind::kLiteral, line);
        k->value = Value::Int(cur().int_value);
        e->args.push_back(std::move(node));
        e->args.push_back(std::move(k));
        next();
        return e;
      }
      return Fail("expected name or number after '.', got " + Describe(cur()));
    }
    next();  // '['
    std::vector<ExprPtr> parts;
    while (!IsOp("]")) {
      if (!parts.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(ExprPtr p, ParseSubscribed());
      parts.push_back(std::move(p));
    }
    next();
    if (parts.empty()) return Fail("expected a subscript");
    ExprPtr key;
    if (parts.size() == 1) {
      key = std::move(parts[0]);
    } else {
      key = MakeExpr(ExprKind::kTuple, line);
      key->args = std::move(parts);
    }
    if (key->kind == ExprKind::kSlice) {
      key->args.insert(key->args.begin(), std::move(node));
      return key;
    }
    auto e = MakeExpr(ExprKind::kGetitem, line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(key));
    return e;
  }

  // One subscript: an expression, or a slice `a:b:c` (returned as kSlice without its object).
  Expected<ExprPtr> ParseSubscribed() {
    int line = cur().line;
    std::vector<ExprPtr> args;
    if (IsOp(":")) {
      next();
      args.push_back(nullptr);
    } else {
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      if (!IsOp(":")) return e;
      next();
      args.push_back(std::move(e));
    }
    if (IsOp(":") || IsOp("]") || IsOp(",")) {
      args.push_back(nullptr);
    } else {
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      args.push_back(std::move(e));
    }
    if (SkipOp(":") && !IsOp("]") && !IsOp(",")) {
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      args.push_back(std::move(e));
    } else {
      args.push_back(nullptr);
    }
    auto s = MakeExpr(ExprKind::kSlice, line);
    s->args = std::move(args);
    return s;
  }

  Status ParseCallArgs(Expr* e) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool need_comma = false;
    while (!IsOp(")")) {
      if (need_comma) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (SkipOp("*")) {
        ASSIGN_OR_RETURN(e->star_args, ParseExpression(true));
      } else if (SkipOp("**")) {
        ASSIGN_OR_RETURN(e->star_kwargs, ParseExpression(true));
      } else if (cur().type == TokenType::kName && look().type == TokenType::kOp && look().text == "=") {
        std::string key = cur().text;
        next();
        next();
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!e->kwargs.empty()) return Fail("positional argument follows keyword argument");
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->args.push_back(std::move(v));
      }
      need_comma = true;
    }
    next();
    return Status::Ok();
  }

  Expected<ExprPtr> ParseCall(ExprPtr node) {
    auto e = MakeExpr(ExprKind::kCall, cur().line);
    e->args.push_back(std::move(node));
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  Expected<std::string> ParseDottedName() {
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      next();
      ASSIGN_OR_RETURN(std::string part, ExpectName());
      name += "." + part;
    }
    return name;
  }

  Expected<ExprPtr> ParseFilter(ExprPtr node, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      int line = cur().line;
      ASSIGN_OR_RETURN(std::string name, ParseDottedName());
      if (!HasFilter(name)) return Fail("No filter named '" + name + "'.");
      auto f = MakeExpr(ExprKind::kFilter, line);
      f->name = name;
      f->args.push_back(std::move(node));
      if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
      node = std::move(f);
    }
    return node;
  }

  Expected<ExprPtr> ParseTest(ExprPtr node) {
    int line = cur().line;
    next();  // is
    bool negated = SkipName("not");
    ASSIGN_OR_RETURN(std::string name, ParseDottedName());
    if (!HasTest(name)) return Fail("No test named '" + name + "'.");
    auto t = MakeExpr(ExprKind::kTest, line);
    t->name = name;
    t->negated = negated;
    t->args.push_back(std::move(node));
    if (IsOp("(")) {
      RETURN_IF_ERROR(ParseCallArgs(t.get()));
    } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString || cur().type == TokenType::kInt ||
                cur().type == TokenType::kFloat || IsOp("(") || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Fail("You cannot chain multiple tests with is");
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      t->args.push_back(std::move(arg));
    }
    return t;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Expected<Body> ParseTemplate(const std::string& source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).ParseAll();
}

}  // namespace substrate::jinja
