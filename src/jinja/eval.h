// Evaluator of the Jinja2 subset: walks a parsed template (jinja/ast.h) against a context and
// appends the rendered text to a string, with Jinja's scoping (a for-loop iteration and a macro
// call get their own scope; if/set do not), Jinja's default Undefined, and the caps that keep a
// hostile template from hanging or exhausting memory (loop iterations, work units, recursion
// depth, output size). Filters, tests, methods and globals live in jinja/builtins.cpp.
// An Evaluator is single-use and not thread-safe; the tree it walks must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace oscar::jinja {

struct EvalLimits {
  int64_t max_loop_iterations = 1'000'000;  // summed over all loops of one render
  int64_t max_work_units = 50'000'000;      // ~1 per expression node, + bytes/32 copied
  int64_t max_output_bytes = 16 << 20;      // also caps any single string or list built
  int max_depth = 400;                      // nested evaluation (expressions, blocks, macros)
  int max_macro_depth = 32;
  int max_value_nesting = 256;              // lists/dicts inside lists/dicts
};

struct Scope {
  Dict vars;
  std::shared_ptr<Scope> parent;
  // A for-loop iteration's scope: `loop` is built from these on first use (most iterations of a
  // long loop never read it). loop_items: [length] the items visited, shared with the loop.
  std::shared_ptr<const List> loop_items;
  int64_t loop_index = 0;
  mutable Value loop_value;
};

class Evaluator {
 public:
  explicit Evaluator(const EvalLimits& limits) : limits_(limits) {}
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Renders `body` with the variables of `context` (a dict value) visible at the top level.
  Result<std::string> render(const Body& body, const Value& context);

  // ---- for builtins ----
  const EvalLimits& limits() const { return limits_; }
  int line() const { return line_; }
  // "chat template: line N: <msg>" with the given code.
  Status fail(StatusCode code, const std::string& msg) const;
  Status fail(const std::string& msg) const { return fail(StatusCode::kInvalidArgument, msg); }
  Status undefined_error(const Value& v) const { return fail(v.undefined_hint()); }
  // Counts work; fails once the budget is spent.
  Status charge(int64_t units);
  // Fails if a string or list of `n` bytes/items would exceed the size cap.
  Status check_size(int64_t n) const;
  Result<Value> call(const Value& callee, const CallArgs& args);
  // A namespace owned by this render: emptied when the evaluator ends, which breaks reference
  // cycles such as `{% set ns.self = ns %}`.
  Value make_namespace(Dict items);
  Result<Value> call_macro(const Node& macro, const std::shared_ptr<Scope>& closure,
                           const CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Status exec_body(const Body& body, std::string& out);
  Status exec(const Node& node, std::string& out);
  Status exec_for(const Node& node, std::string& out);
  Status exec_set(const Node& node);
  Status append(std::string& out, const std::string& text);
  Status assign(const std::vector<std::string>& targets, const Value& v);

  Result<Value> eval(const Expr& e);
  Result<Value> eval_inner(const Expr& e);
  Result<Value> eval_filter(const Expr& e, const Value* block_operand);
  Result<CallArgs> eval_args(const Expr& e, size_t first);
  Result<Value> lookup(const std::string& name) const;

  EvalLimits limits_;
  std::shared_ptr<Scope> scope_;
  // Scopes captured by macros defined during this render. A macro's scope holds the macro
  // itself (a reference cycle), so the destructor drops these captures to free them.
  std::vector<std::shared_ptr<std::shared_ptr<Scope>>> macro_closures_;
  std::vector<std::shared_ptr<Dict>> namespaces_;
  Value context_;
  Flow flow_ = Flow::kNormal;
  int line_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
  int64_t iterations_ = 0;
  int64_t work_ = 0;
};

// ---- builtins (jinja/builtins.cpp) ----
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Result<Value> apply_filter(Evaluator& ev, const std::string& name, const Value& operand,
                           const CallArgs& args);
Result<bool> apply_test(Evaluator& ev, const std::string& name, const Value& operand,
                        const CallArgs& args);
// obj.name: methods of str and dict, dict items, namespace attributes; Undefined when absent.
Result<Value> get_attr(Evaluator& ev, const Value& obj, const std::string& name);
// obj[key]: dict items, list/str indexing; falls back to get_attr for string keys.
Result<Value> get_item(Evaluator& ev, const Value& obj, const Value& key);
// A global function (range, namespace, dict, raise_exception, strftime_now) or Undefined.
Value global_function(const std::string& name);
// The items a for loop visits: list items, dict keys, string characters; nothing for Undefined.
Result<List> iterate(Evaluator& ev, const Value& v);
// Python operators.
Result<Value> binary_op(Evaluator& ev, const std::string& op, const Value& a, const Value& b);
Result<bool> compare_op(Evaluator& ev, const std::string& op, const Value& a, const Value& b);

}  // namespace oscar::jinja
