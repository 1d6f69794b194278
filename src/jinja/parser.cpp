// Parser of the Jinja2 subset; follows the grammar of jinja2/parser.py (see jinja/parser.h).
#include "jinja/parser.h"

#include <algorithm>
#include <initializer_list>

namespace oscar::jinja {
namespace {

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokKind::kText: return "text";
    case TokKind::kVarBegin: return "'{{'";
    case TokKind::kVarEnd: return "'}}'";
    case TokKind::kBlockBegin: return "'{%'";
    case TokKind::kBlockEnd: return "'%}'";
    case TokKind::kString: return "string";
    case TokKind::kInt:
    case TokKind::kFloat: return "number " + t.text;
    case TokKind::kEof: return "end of template";
    default: return "'" + t.text + "'";
  }
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseLimits& limits)
      : toks_(std::move(tokens)), limits_(limits) {}

  Result<Body> run() {
    std::string end;
    OSCAR_ASSIGN_OR_RETURN(Body body, parse_body({}, "", 0, &end));
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().kind == TokKind::kOp && cur().text == op; }
  bool is_name(const char* name) const {
    return cur().kind == TokKind::kName && cur().text == name;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  Status error(const std::string& msg) const {
    return invalid_argument("chat template: line %d: %s", cur().line, msg.c_str());
  }
  Status expect_op(const char* op) {
    if (skip_op(op)) return Status();
    return error(std::string("expected '") + op + "', got " + describe(cur()));
  }
  Status expect_block_end() {
    if (cur().kind == TokKind::kBlockEnd) {
      next();
      return Status();
    }
    return error("expected end of statement '%}', got " + describe(cur()));
  }
  Result<std::string> expect_name() {
    if (cur().kind != TokKind::kName) return error("expected a name, got " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }

  // ---- tree helpers ----
  Result<ExprPtr> make(Expr::Kind kind, int line, std::vector<ExprPtr> args) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    int d = 0;
    for (const auto& a : args) {
      if (a) d = std::max(d, a->depth);
    }
    e->depth = d + 1;
    e->args = std::move(args);
    if (e->depth > limits_.max_expr_depth) {
      return out_of_range("chat template: line %d: expression nested deeper than %d", line,
                          limits_.max_expr_depth);
    }
    return e;
  }
  static std::vector<ExprPtr> list_of(ExprPtr a, ExprPtr b = nullptr) {
    std::vector<ExprPtr> v;
    v.push_back(std::move(a));
    if (b) v.push_back(std::move(b));
    return v;
  }

  struct DepthGuard {
    explicit DepthGuard(int& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
    int& depth;
  };
  Status check_recursion() {
    if (recursion_ > limits_.max_expr_depth) {
      return out_of_range("chat template: line %d: expression nested deeper than %d",
                          cur().line, limits_.max_expr_depth);
    }
    return Status();
  }

  // ---- template structure ----
  // Parses nodes until a block tag whose name is in `end_tags` (left unconsumed, its name put
  // in *end) or the end of the template (an error if end_tags is not empty).
  Result<Body> parse_body(std::initializer_list<const char*> end_tags, const std::string& opener,
                          int opener_line, std::string* end) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokKind::kEof) {
        if (end_tags.size() == 0) return body;
        std::string expected;
        for (const char* e : end_tags) expected += (expected.empty() ? "'" : " or '") +
                                                   std::string(e) + "'";
        return invalid_argument(
            "chat template: line %d: unclosed '{%% %s %%}' (end of template reached, expected "
            "%s)",
            opener_line, opener.c_str(), expected.c_str());
      }
      if (t.kind == TokKind::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = t.line;
        n->text = t.text;
        body.push_back(std::move(n));
        next();
      } else if (t.kind == TokKind::kVarBegin) {
        int line = t.line;
        next();
        OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(true, {}));
        if (cur().kind != TokKind::kVarEnd) {
          return error("expected end of print statement '}}', got " + describe(cur()));
        }
        next();
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = line;
        n->expr = std::move(e);
        body.push_back(std::move(n));
      } else if (t.kind == TokKind::kBlockBegin) {
        const Token& name = peek();
        if (name.kind == TokKind::kName) {
          for (const char* e : end_tags) {
            if (name.text == e) {
              *end = name.text;
              next();  // {%
              next();  // tag name
              return body;
            }
          }
        }
        next();
        OSCAR_ASSIGN_OR_RETURN(NodePtr n, parse_statement());
        body.push_back(std::move(n));
      } else {
        return error("unexpected " + describe(t));
      }
    }
  }

  Result<NodePtr> parse_statement() {
    if (cur().kind != TokKind::kName) return error("expected a tag name, got " + describe(cur()));
    if (block_depth_ >= limits_.max_block_depth) {
      return out_of_range("chat template: line %d: blocks nested deeper than %d", cur().line,
                          limits_.max_block_depth);
    }
    DepthGuard guard(block_depth_);
    std::string tag = cur().text;
    int line = cur().line;
    next();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "filter") return parse_filter_block(line);
    if (tag == "with") return parse_with(line);
    if (tag == "generation") {
      auto n = std::make_unique<Node>();
      n->kind = Node::Kind::kScope;
      n->line = line;
      OSCAR_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      OSCAR_ASSIGN_OR_RETURN(Body b, parse_body({"endgeneration"}, tag, line, &end));
      n->bodies.push_back(std::move(b));
      OSCAR_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) {
        return invalid_argument("chat template: line %d: '%s' outside of a loop", line,
                                tag.c_str());
      }
      auto n = std::make_unique<Node>();
      n->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      n->line = line;
      OSCAR_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
        tag == "block") {
      return invalid_argument("chat template: line %d: tag '%s' is not allowed (no file access)",
                              line, tag.c_str());
    }
    if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else") {
      return invalid_argument("chat template: line %d: unexpected '{%% %s %%}'", line,
                              tag.c_str());
    }
    return invalid_argument("chat template: line %d: unknown tag '%s'", line, tag.c_str());
  }

  Result<NodePtr> parse_if(int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kIf;
    n->line = line;
    while (true) {
      OSCAR_ASSIGN_OR_RETURN(ExprPtr c, parse_tuple(false, {}));
      OSCAR_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      OSCAR_ASSIGN_OR_RETURN(Body b, parse_body({"elif", "else", "endif"}, "if", line, &end));
      n->conds.push_back(std::move(c));
      n->bodies.push_back(std::move(b));
      if (end == "elif") continue;
      if (end == "else") {
        OSCAR_RETURN_IF_ERROR(expect_block_end());
        OSCAR_ASSIGN_OR_RETURN(n->else_body, parse_body({"endif"}, "if", line, &end));
      }
      OSCAR_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
  }

  // Names for `for a, b in` / `set a, b =` (optionally parenthesised).
  Status parse_targets(std::vector<std::string>& out) {
    bool paren = skip_op("(");
    while (true) {
      OSCAR_ASSIGN_OR_RETURN(std::string n, expect_name());
      out.push_back(n);
      if (!skip_op(",")) break;
      if (cur().kind != TokKind::kName) break;
    }
    if (paren) OSCAR_RETURN_IF_ERROR(expect_op(")"));
    return Status();
  }

  Result<NodePtr> parse_for(int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kFor;
    n->line = line;
    OSCAR_RETURN_IF_ERROR(parse_targets(n->targets));
    if (!skip_name("in")) return error("expected 'in' in for loop, got " + describe(cur()));
    OSCAR_ASSIGN_OR_RETURN(n->expr, parse_tuple(false, {"recursive"}));
    if (skip_name("if")) {
      OSCAR_ASSIGN_OR_RETURN(n->cond, parse_expression(true));
    }
    if (is_name("recursive")) return error("recursive for loops are not supported");
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    {
      DepthGuard loops(loop_depth_);
      OSCAR_ASSIGN_OR_RETURN(Body b, parse_body({"else", "endfor"}, "for", line, &end));
      n->bodies.push_back(std::move(b));
    }
    if (end == "else") {
      OSCAR_RETURN_IF_ERROR(expect_block_end());
      OSCAR_ASSIGN_OR_RETURN(n->else_body, parse_body({"endfor"}, "for", line, &end));
    }
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  Result<NodePtr> parse_set(int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kSet;
    n->line = line;
    if (cur().kind == TokKind::kName && peek().kind == TokKind::kOp && peek().text == "." &&
        peek(2).kind == TokKind::kName) {
      n->targets.push_back(cur().text);
      n->attr = peek(2).text;
      next();
      next();
      next();
    } else {
      OSCAR_RETURN_IF_ERROR(parse_targets(n->targets));
    }
    if (skip_op("=")) {
      OSCAR_ASSIGN_OR_RETURN(n->expr, parse_tuple(true, {}));
      OSCAR_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (!n->attr.empty() || n->targets.size() != 1) {
      return error("expected '=' in set, got " + describe(cur()));
    }
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    n->kind = Node::Kind::kSetBlock;
    std::string end;
    OSCAR_ASSIGN_OR_RETURN(Body b, parse_body({"endset"}, "set", line, &end));
    n->bodies.push_back(std::move(b));
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  Result<NodePtr> parse_macro(int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kMacro;
    n->line = line;
    OSCAR_ASSIGN_OR_RETURN(n->name, expect_name());
    OSCAR_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!n->targets.empty()) OSCAR_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      OSCAR_ASSIGN_OR_RETURN(std::string p, expect_name());
      n->targets.push_back(p);
      ExprPtr def;
      if (skip_op("=")) {
        OSCAR_ASSIGN_OR_RETURN(def, parse_expression(true));
      }
      n->defaults.push_back(std::move(def));
    }
    next();
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    OSCAR_ASSIGN_OR_RETURN(Body b, parse_body({"endmacro"}, "macro", line, &end));
    n->bodies.push_back(std::move(b));
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  Result<NodePtr> parse_filter_block(int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kFilterBlock;
    n->line = line;
    ExprPtr chain;
    do {
      OSCAR_ASSIGN_OR_RETURN(chain, parse_filter(std::move(chain)));
    } while (skip_op("|"));
    n->expr = std::move(chain);
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    OSCAR_ASSIGN_OR_RETURN(Body b, parse_body({"endfilter"}, "filter", line, &end));
    n->bodies.push_back(std::move(b));
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  Result<NodePtr> parse_with(int line) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kWith;
    n->line = line;
    while (cur().kind != TokKind::kBlockEnd) {
      if (!n->targets.empty()) OSCAR_RETURN_IF_ERROR(expect_op(","));
      OSCAR_ASSIGN_OR_RETURN(std::string t, expect_name());
      OSCAR_RETURN_IF_ERROR(expect_op("="));
      OSCAR_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
      n->targets.push_back(t);
      n->defaults.push_back(std::move(v));
    }
    next();
    std::string end;
    OSCAR_ASSIGN_OR_RETURN(Body b, parse_body({"endwith"}, "with", line, &end));
    n->bodies.push_back(std::move(b));
    OSCAR_RETURN_IF_ERROR(expect_block_end());
    return n;
  }

  // ---- expressions ----
  bool is_tuple_end(std::initializer_list<const char*> extra_end) const {
    const Token& t = cur();
    if (t.kind == TokKind::kVarEnd || t.kind == TokKind::kBlockEnd || t.kind == TokKind::kEof)
      return true;
    if (t.kind == TokKind::kOp && t.text == ")") return true;
    if (t.kind == TokKind::kName) {
      for (const char* e : extra_end) {
        if (t.text == e) return true;
      }
    }
    return false;
  }

  // Comma-separated expressions; a tuple if there is a comma, otherwise the single expression.
  Result<ExprPtr> parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra_end,
                              bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
      }
      if (is_tuple_end(extra_end)) break;
      OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_expression(with_condexpr));
      items.push_back(std::move(e));
    }
    if (!is_tuple) {
      if (items.empty()) {
        if (explicit_parens) return make(Expr::Kind::kTuple, line, {});
        return error("expected an expression, got " + describe(cur()));
      }
      return std::move(items[0]);
    }
    return make(Expr::Kind::kTuple, line, std::move(items));
  }

  Result<ExprPtr> parse_expression(bool with_condexpr) {
    DepthGuard guard(recursion_);
    OSCAR_RETURN_IF_ERROR(check_recursion());
    if (!with_condexpr) return parse_or();
    int line = cur().line;
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_or());
    while (skip_name("if")) {
      OSCAR_ASSIGN_OR_RETURN(ExprPtr cond, parse_or());
      ExprPtr other;
      if (skip_name("else")) {
        OSCAR_ASSIGN_OR_RETURN(other, parse_expression(true));
      }
      std::vector<ExprPtr> args;
      args.push_back(std::move(e));
      args.push_back(std::move(cond));
      args.push_back(std::move(other));
      OSCAR_ASSIGN_OR_RETURN(e, make(Expr::Kind::kCondExpr, line, std::move(args)));
    }
    return e;
  }

  Result<ExprPtr> parse_or() {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_and());
    while (is_name("or")) {
      int line = cur().line;
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr r, parse_and());
      OSCAR_ASSIGN_OR_RETURN(e, make(Expr::Kind::kOr, line, list_of(std::move(e), std::move(r))));
    }
    return e;
  }

  Result<ExprPtr> parse_and() {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_not());
    while (is_name("and")) {
      int line = cur().line;
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr r, parse_not());
      OSCAR_ASSIGN_OR_RETURN(e, make(Expr::Kind::kAnd, line, list_of(std::move(e), std::move(r))));
    }
    return e;
  }

  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      DepthGuard guard(recursion_);
      OSCAR_RETURN_IF_ERROR(check_recursion());
      int line = cur().line;
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_not());
      return make(Expr::Kind::kNot, line, list_of(std::move(e)));
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    int line = cur().line;
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_math1());
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    while (true) {
      std::string op;
      if (cur().kind == TokKind::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().kind == TokKind::kName && peek().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      OSCAR_ASSIGN_OR_RETURN(ExprPtr r, parse_math1());
      if (operands.empty()) operands.push_back(std::move(e));
      operands.push_back(std::move(r));
      ops.push_back(op);
    }
    if (ops.empty()) return e;
    OSCAR_ASSIGN_OR_RETURN(ExprPtr c, make(Expr::Kind::kCompare, line, std::move(operands)));
    c->ops = std::move(ops);
    return c;
  }

  Result<ExprPtr> binary(const std::string& op, int line, ExprPtr l, ExprPtr r) {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, make(Expr::Kind::kBinary, line,
                                           list_of(std::move(l), std::move(r))));
    e->name = op;
    return e;
  }

  Result<ExprPtr> parse_math1() {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_concat());
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr r, parse_concat());
      OSCAR_ASSIGN_OR_RETURN(e, binary(op, line, std::move(e), std::move(r)));
    }
    return e;
  }

  Result<ExprPtr> parse_concat() {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_math2());
    while (is_op("~")) {
      int line = cur().line;
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr r, parse_math2());
      OSCAR_ASSIGN_OR_RETURN(e, binary("~", line, std::move(e), std::move(r)));
    }
    return e;
  }

  Result<ExprPtr> parse_math2() {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_pow());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr r, parse_pow());
      OSCAR_ASSIGN_OR_RETURN(e, binary(op, line, std::move(e), std::move(r)));
    }
    return e;
  }

  Result<ExprPtr> parse_pow() {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_unary(true));
    while (is_op("**")) {
      int line = cur().line;
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr r, parse_unary(true));
      OSCAR_ASSIGN_OR_RETURN(e, binary("**", line, std::move(e), std::move(r)));
    }
    return e;
  }

  Result<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard guard(recursion_);
    OSCAR_RETURN_IF_ERROR(check_recursion());
    int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      bool neg = is_op("-");
      next();
      OSCAR_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
      OSCAR_ASSIGN_OR_RETURN(
          e, make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line, list_of(std::move(operand))));
    } else {
      OSCAR_ASSIGN_OR_RETURN(e, parse_primary());
    }
    OSCAR_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (with_filter) {
      OSCAR_ASSIGN_OR_RETURN(e, parse_filter_expr(std::move(e)));
    }
    return e;
  }

  Result<ExprPtr> literal(Value v, int line) {
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, make(Expr::Kind::kLiteral, line, {}));
    e->literal = std::move(v);
    return e;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = cur();
    int line = t.line;
    switch (t.kind) {
      case TokKind::kName: {
        std::string n = t.text;
        next();
        if (n == "true" || n == "True") return literal(Value::boolean(true), line);
        if (n == "false" || n == "False") return literal(Value::boolean(false), line);
        if (n == "none" || n == "None") return literal(Value::none(), line);
        OSCAR_ASSIGN_OR_RETURN(ExprPtr e, make(Expr::Kind::kName, line, {}));
        e->name = n;
        return e;
      }
      case TokKind::kString: {
        std::string s = t.text;
        next();
        while (cur().kind == TokKind::kString) {
          s += cur().text;
          next();
        }
        return literal(Value::string(std::move(s)), line);
      }
      case TokKind::kInt: {
        int64_t v = t.int_value;
        next();
        return literal(Value::integer(v), line);
      }
      case TokKind::kFloat: {
        double v = t.float_value;
        next();
        return literal(Value::real(v), line);
      }
      case TokKind::kOp: {
        if (t.text == "(") {
          next();
          OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(true, {}, true));
          OSCAR_RETURN_IF_ERROR(expect_op(")"));
          return e;
        }
        if (t.text == "[") {
          next();
          std::vector<ExprPtr> items;
          while (!is_op("]")) {
            if (!items.empty()) OSCAR_RETURN_IF_ERROR(expect_op(","));
            if (is_op("]")) break;
            OSCAR_ASSIGN_OR_RETURN(ExprPtr e, parse_expression(true));
            items.push_back(std::move(e));
          }
          next();
          return make(Expr::Kind::kList, line, std::move(items));
        }
        if (t.text == "{") {
          next();
          std::vector<ExprPtr> items;
          while (!is_op("}")) {
            if (!items.empty()) OSCAR_RETURN_IF_ERROR(expect_op(","));
            if (is_op("}")) break;
            OSCAR_ASSIGN_OR_RETURN(ExprPtr k, parse_expression(true));
            OSCAR_RETURN_IF_ERROR(expect_op(":"));
            OSCAR_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
            items.push_back(std::move(k));
            items.push_back(std::move(v));
          }
          next();
          return make(Expr::Kind::kDict, line, std::move(items));
        }
        break;
      }
      default: break;
    }
    return error("unexpected " + describe(t));
  }

  Result<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (is_op(".")) {
        next();
        if (cur().kind == TokKind::kName) {
          OSCAR_ASSIGN_OR_RETURN(e, make(Expr::Kind::kGetAttr, line, list_of(std::move(e))));
          e->name = cur().text;
          next();
        } else if (cur().kind == TokKind::kInt) {
          OSCAR_ASSIGN_OR_RETURN(ExprPtr idx, literal(Value::integer(cur().int_value), line));
          next();
          OSCAR_ASSIGN_OR_RETURN(
              e, make(Expr::Kind::kGetItem, line, list_of(std::move(e), std::move(idx))));
        } else {
          return error("expected an attribute name after '.', got " + describe(cur()));
        }
      } else if (is_op("[")) {
        next();
        OSCAR_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e), line));
      } else if (is_op("(")) {
        OSCAR_ASSIGN_OR_RETURN(e, parse_call(std::move(e), Expr::Kind::kCall, line));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr obj, int line) {
    std::vector<ExprPtr> parts;  // start, stop, step
    ExprPtr first;
    if (!is_op(":")) {
      OSCAR_ASSIGN_OR_RETURN(first, parse_expression(true));
      if (is_op(",")) {  // x[a, b]: a tuple key
        std::vector<ExprPtr> items;
        items.push_back(std::move(first));
        while (skip_op(",") && !is_op("]")) {
          OSCAR_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
          items.push_back(std::move(item));
        }
        OSCAR_ASSIGN_OR_RETURN(first, make(Expr::Kind::kTuple, line, std::move(items)));
      }
      if (skip_op("]")) {
        return make(Expr::Kind::kGetItem, line, list_of(std::move(obj), std::move(first)));
      }
    }
    OSCAR_RETURN_IF_ERROR(expect_op(":"));
    std::vector<ExprPtr> args;
    args.push_back(std::move(obj));
    args.push_back(std::move(first));
    for (int part = 0; part < 2; ++part) {
      ExprPtr bound;
      if (!is_op("]") && !is_op(":")) {
        OSCAR_ASSIGN_OR_RETURN(bound, parse_expression(true));
      }
      args.push_back(std::move(bound));
      if (part == 0 && !skip_op(":")) {
        args.push_back(nullptr);
        break;
      }
    }
    OSCAR_RETURN_IF_ERROR(expect_op("]"));
    return make(Expr::Kind::kSlice, line, std::move(args));
  }

  // Parses `(args)` into a node of `kind` whose args[0] is `callee`.
  Result<ExprPtr> parse_call(ExprPtr callee, Expr::Kind kind, int line) {
    OSCAR_RETURN_IF_ERROR(expect_op("("));
    std::vector<ExprPtr> args;
    args.push_back(std::move(callee));
    std::vector<std::string> kw;
    bool first = true;
    while (!is_op(")")) {
      if (!first) OSCAR_RETURN_IF_ERROR(expect_op(","));
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) return error("*args and **kwargs are not supported");
      if (cur().kind == TokKind::kName && peek().kind == TokKind::kOp && peek().text == "=") {
        kw.push_back(cur().text);
        next();
        next();
      } else if (!kw.empty()) {
        return error("positional argument after keyword argument");
      }
      OSCAR_ASSIGN_OR_RETURN(ExprPtr a, parse_expression(true));
      args.push_back(std::move(a));
    }
    next();
    OSCAR_ASSIGN_OR_RETURN(ExprPtr e, make(kind, line, std::move(args)));
    e->kw_names = std::move(kw);
    return e;
  }

  Result<ExprPtr> parse_filter(ExprPtr operand) {
    int line = cur().line;
    OSCAR_ASSIGN_OR_RETURN(std::string name, expect_name());
    ExprPtr e;
    if (is_op("(")) {
      OSCAR_ASSIGN_OR_RETURN(e, parse_call(std::move(operand), Expr::Kind::kFilter, line));
    } else {
      OSCAR_ASSIGN_OR_RETURN(e, make(Expr::Kind::kFilter, line, list_of(std::move(operand))));
      if (!e->args[0]) e->args[0] = nullptr;
    }
    e->name = name;
    return e;
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (is_op("|")) {
        next();
        OSCAR_ASSIGN_OR_RETURN(e, parse_filter(std::move(e)));
      } else if (is_name("is")) {
        next();
        bool negated = skip_name("not");
        OSCAR_ASSIGN_OR_RETURN(std::string name, expect_name());
        if (is_op("(")) {
          OSCAR_ASSIGN_OR_RETURN(e, parse_call(std::move(e), Expr::Kind::kTest, line));
        } else if ((cur().kind == TokKind::kName || cur().kind == TokKind::kString ||
                    cur().kind == TokKind::kInt || cur().kind == TokKind::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) return error("you cannot chain multiple tests with 'is'");
          OSCAR_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
          OSCAR_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
          OSCAR_ASSIGN_OR_RETURN(e, make(Expr::Kind::kTest, line,
                                         list_of(std::move(e), std::move(arg))));
        } else {
          OSCAR_ASSIGN_OR_RETURN(e, make(Expr::Kind::kTest, line, list_of(std::move(e))));
        }
        e->name = name;
        e->negated = negated;
      } else if (is_op("(")) {
        OSCAR_ASSIGN_OR_RETURN(e, parse_call(std::move(e), Expr::Kind::kCall, line));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  ParseLimits limits_;
  size_t pos_ = 0;
  int recursion_ = 0;
  int block_depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<Body> parse_template(std::string_view source, const LexerOptions& lexer_options,
                            const ParseLimits& limits) {
  OSCAR_ASSIGN_OR_RETURN(std::vector<Token> tokens, lex_template(source, lexer_options));
  return Parser(std::move(tokens), limits).run();
}

}  // namespace oscar::jinja
