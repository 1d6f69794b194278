// Syntax tree of the Jinja2 subset, produced by jinja/parser.h and walked by jinja/eval.h.
// Expressions and statements are single tagged structs (one kind field, children owned by
// unique_ptr) rather than class hierarchies: the tree is small, built once per template, and
// read-only afterwards. Every expression records its subtree depth, which the parser caps so
// that evaluation and destruction recurse a bounded number of times.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "jinja/value.h"

namespace oscar::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items (evaluates to a list)
    kDict,      // args: key0, value0, key1, value1, ...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], each bound may be null
    kCall,      // args[0](args[1..]); the last kw_names.size() args are keyword arguments
    kFilter,    // args[0] | name(args[1..]); args[0] is null inside {% filter %}
    kTest,      // args[0] is [not] name(args[1..])
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kNot,       // not args[0]
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kBinary,    // args[0] <name> args[1], name in + - * / // % ** ~
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ... (Python chained comparison)
    kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  int depth = 1;  // height of this subtree
  Value literal;
  std::string name;
  std::vector<std::string> ops;
  std::vector<ExprPtr> args;
  std::vector<std::string> kw_names;
  bool negated = false;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i], else_body
    kFor,          // for targets in expr [if cond] : bodies[0], else_body
    kSet,          // set targets = expr, or set targets[0].attr = expr (namespace)
    kSetBlock,     // set targets[0] %} bodies[0] {% endset
    kMacro,        // macro name(params = defaults) : bodies[0]
    kFilterBlock,  // filter expr(chain with null operand) : bodies[0]
    kWith,         // with targets = defaults : bodies[0]
    kScope,        // bodies[0] rendered as is ({% generation %})
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;  // kFor loop filter
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body else_body;
  std::vector<std::string> targets;  // assignment / loop targets, macro params
  std::string attr;                  // kSet on a namespace attribute
  std::string name;                  // kMacro
  std::vector<ExprPtr> defaults;     // kMacro param defaults (null if none), kWith values
};

}  // namespace oscar::jinja
