// Evaluator of the Jinja2 subset: statements, expressions, scoping and caps (see jinja/eval.h).
#include "jinja/eval.h"

#include <algorithm>

namespace oscar::jinja {
namespace {

struct DepthGuard {
  explicit DepthGuard(int& d) : depth(d) { ++depth; }
  ~DepthGuard() { --depth; }
  int& depth;
};

// The `loop` object of iteration k over `items`.
Value make_loop_object(const List& items, int64_t k) {
  const int64_t n = static_cast<int64_t>(items.size());
  Dict loop;
  loop.items.reserve(12);
  loop.items.emplace_back("index", Value::integer(k + 1));
  loop.items.emplace_back("index0", Value::integer(k));
  loop.items.emplace_back("revindex", Value::integer(n - k));
  loop.items.emplace_back("revindex0", Value::integer(n - k - 1));
  loop.items.emplace_back("first", Value::boolean(k == 0));
  loop.items.emplace_back("last", Value::boolean(k == n - 1));
  loop.items.emplace_back("length", Value::integer(n));
  loop.items.emplace_back("depth", Value::integer(1));
  loop.items.emplace_back("depth0", Value::integer(0));
  loop.items.emplace_back("previtem", k > 0 ? items[static_cast<size_t>(k - 1)]
                                             : Value::undefined("there is no previous item"));
  loop.items.emplace_back("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)]
                                                : Value::undefined("there is no next item"));
  auto cycle = std::make_shared<Callable>();
  cycle->name = "cycle";
  cycle->fn = [k](Evaluator& ev, const CallArgs& args) -> Result<Value> {
    if (args.pos.empty()) return ev.fail("loop.cycle() needs at least one argument");
    return args.pos[static_cast<size_t>(k) % args.pos.size()];
  };
  loop.items.emplace_back("cycle", Value::callable(std::move(cycle)));
  return Value::from_dict(std::move(loop));
}

}  // namespace

Evaluator::~Evaluator() {
  for (auto& closure : macro_closures_) closure->reset();
  // Moving the items out first: their destruction may release other namespaces, which stay
  // alive in namespaces_ until the end, so no destructor recurses through a chain of them.
  std::vector<Dict> released;
  released.reserve(namespaces_.size());
  for (auto& ns : namespaces_) released.push_back(std::move(*ns));
  released.clear();
}

Value Evaluator::make_namespace(Dict items) {
  Value v = Value::make_namespace(std::move(items));
  namespaces_.push_back(v.dict);
  return v;
}

Status Evaluator::fail(StatusCode code, const std::string& msg) const {
  return Status(code, str_format("chat template: line %d: %s", line_, msg.c_str()));
}

Status Evaluator::charge(int64_t units) {
  work_ += units;
  if (work_ > limits_.max_work_units) {
    return fail(StatusCode::kResourceExhausted,
                str_format("work limit of %lld units exceeded", (long long)limits_.max_work_units));
  }
  return Status();
}

Status Evaluator::check_size(int64_t n) const {
  if (n > limits_.max_output_bytes) {
    return fail(StatusCode::kResourceExhausted,
                str_format("value of size %lld exceeds the limit of %lld", (long long)n,
                       (long long)limits_.max_output_bytes));
  }
  return Status();
}

Result<std::string> Evaluator::render(const Body& body, const Value& context) {
  context_ = context;
  scope_ = std::make_shared<Scope>();
  flow_ = Flow::kNormal;
  std::string out;
  OSCAR_RETURN_IF_ERROR(exec_body(body, out));
  return out;
}

Status Evaluator::append(std::string& out, const std::string& text) {
  if (static_cast<int64_t>(out.size() + text.size()) > limits_.max_output_bytes) {
    return fail(StatusCode::kResourceExhausted,
                str_format("output exceeds the limit of %lld bytes",
                       (long long)limits_.max_output_bytes));
  }
  OSCAR_RETURN_IF_ERROR(charge(static_cast<int64_t>(text.size() / 32)));
  out += text;
  return Status();
}

Status Evaluator::exec_body(const Body& body, std::string& out) {
  for (const auto& node : body) {
    OSCAR_RETURN_IF_ERROR(exec(*node, out));
    if (flow_ != Flow::kNormal) return Status();
  }
  return Status();
}

Status Evaluator::assign(const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    scope_->vars.set(targets[0], v);
    return Status();
  }
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(*this, v));
  if (items.size() != targets.size()) {
    return fail(str_format("cannot unpack %zu values into %zu names", items.size(), targets.size()));
  }
  for (size_t k = 0; k < targets.size(); ++k) scope_->vars.set(targets[k], items[k]);
  return Status();
}

Status Evaluator::exec(const Node& node, std::string& out) {
  line_ = node.line;
  DepthGuard guard(depth_);
  if (depth_ > limits_.max_depth) {
    return fail(StatusCode::kOutOfRange, str_format("nesting deeper than %d", limits_.max_depth));
  }
  OSCAR_RETURN_IF_ERROR(charge(1));
  switch (node.kind) {
    case Node::Kind::kText: return append(out, node.text);
    case Node::Kind::kOutput: {
      OSCAR_ASSIGN_OR_RETURN(Value v, eval(*node.expr));
      return append(out, to_str(v));
    }
    case Node::Kind::kIf: {
      for (size_t k = 0; k < node.conds.size(); ++k) {
        OSCAR_ASSIGN_OR_RETURN(Value c, eval(*node.conds[k]));
        if (c.truthy()) return exec_body(node.bodies[k], out);
      }
      return exec_body(node.else_body, out);
    }
    case Node::Kind::kFor: return exec_for(node, out);
    case Node::Kind::kSet: return exec_set(node);
    case Node::Kind::kSetBlock: {
      std::string captured;
      OSCAR_RETURN_IF_ERROR(exec_body(node.bodies[0], captured));
      scope_->vars.set(node.targets[0], Value::string(std::move(captured)));
      return Status();
    }
    case Node::Kind::kMacro: {
      auto fn = std::make_shared<Callable>();
      fn->name = node.name;
      const Node* macro = &node;
      auto closure = std::make_shared<std::shared_ptr<Scope>>(scope_);
      macro_closures_.push_back(closure);
      fn->fn = [macro, closure](Evaluator& ev, const CallArgs& args) {
        return ev.call_macro(*macro, *closure, args);
      };
      scope_->vars.set(node.name, Value::callable(std::move(fn)));
      return Status();
    }
    case Node::Kind::kFilterBlock: {
      std::string captured;
      OSCAR_RETURN_IF_ERROR(exec_body(node.bodies[0], captured));
      Value operand = Value::string(std::move(captured));
      line_ = node.line;
      OSCAR_ASSIGN_OR_RETURN(Value v, eval_filter(*node.expr, &operand));
      return append(out, to_str(v));
    }
    case Node::Kind::kWith: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope_;
      for (size_t k = 0; k < node.targets.size(); ++k) {
        OSCAR_ASSIGN_OR_RETURN(Value v, eval(*node.defaults[k]));
        inner->vars.set(node.targets[k], std::move(v));
      }
      std::shared_ptr<Scope> saved = scope_;
      scope_ = inner;
      Status st = exec_body(node.bodies[0], out);
      scope_ = saved;
      return st;
    }
    case Node::Kind::kScope: return exec_body(node.bodies[0], out);
    case Node::Kind::kBreak: flow_ = Flow::kBreak; return Status();
    case Node::Kind::kContinue: flow_ = Flow::kContinue; return Status();
  }
  return Status();
}

Status Evaluator::exec_set(const Node& node) {
  OSCAR_ASSIGN_OR_RETURN(Value v, eval(*node.expr));
  if (node.attr.empty()) return assign(node.targets, v);
  OSCAR_ASSIGN_OR_RETURN(Value ns, lookup(node.targets[0]));
  if (ns.kind != Value::Kind::kNamespace) {
    return fail(str_format("cannot assign attribute '%s' on '%s', which is not a namespace",
                       node.attr.c_str(), node.targets[0].c_str()));
  }
  ns.dict->set(node.attr, std::move(v));
  return Status();
}

Status Evaluator::exec_for(const Node& node, std::string& out) {
  OSCAR_ASSIGN_OR_RETURN(Value seq, eval(*node.expr));
  std::shared_ptr<const List> items;
  if (seq.is_list()) {
    OSCAR_RETURN_IF_ERROR(charge(static_cast<int64_t>(seq.list->size() / 8)));
    items = seq.list;  // shared, not copied
  } else {
    OSCAR_ASSIGN_OR_RETURN(List copy, iterate(*this, seq));
    items = std::make_shared<const List>(std::move(copy));
  }
  std::shared_ptr<Scope> outer = scope_;
  if (node.cond) {  // the loop filter sees the targets but not `loop`
    List kept;
    for (const Value& item : *items) {
      scope_ = std::make_shared<Scope>();
      scope_->parent = outer;
      Status st = assign(node.targets, item);
      Result<Value> c = st.ok() ? eval(*node.cond) : Result<Value>(st);
      scope_ = outer;
      if (!c.ok()) return c.status();
      if (c->truthy()) kept.push_back(item);
    }
    items = std::make_shared<const List>(std::move(kept));
  }
  const int64_t n = static_cast<int64_t>(items->size());
  // Jinja runs the else block unless some iteration reached the end of the body (a break or
  // continue before the end does not count).
  bool completed_one = false;
  Status st;
  for (int64_t k = 0; k < n; ++k) {
    if (++iterations_ > limits_.max_loop_iterations) {
      st = fail(StatusCode::kResourceExhausted,
                str_format("loop iteration limit of %lld exceeded",
                       (long long)limits_.max_loop_iterations));
      break;
    }
    scope_ = std::make_shared<Scope>();
    scope_->parent = outer;
    st = assign(node.targets, (*items)[static_cast<size_t>(k)]);
    if (!st.ok()) break;
    scope_->loop_items = items;
    scope_->loop_index = k;
    st = exec_body(node.bodies[0], out);
    if (!st.ok()) break;
    if (flow_ == Flow::kNormal) completed_one = true;
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  scope_ = outer;
  OSCAR_RETURN_IF_ERROR(st);
  if (completed_one || node.else_body.empty()) return Status();
  scope_ = std::make_shared<Scope>();  // the else block's assignments stay inside it
  scope_->parent = outer;
  st = exec_body(node.else_body, out);
  scope_ = outer;
  return st;
}

Result<Value> Evaluator::call_macro(const Node& macro, const std::shared_ptr<Scope>& closure,
                                    const CallArgs& args) {
  if (macro_depth_ >= limits_.max_macro_depth) {
    return fail(StatusCode::kOutOfRange,
                str_format("macro calls nested deeper than %d", limits_.max_macro_depth));
  }
  DepthGuard guard(macro_depth_);
  auto inner = std::make_shared<Scope>();
  inner->parent = closure;
  std::shared_ptr<Scope> saved = scope_;
  int saved_line = line_;
  scope_ = inner;
  Status st;
  List varargs;
  Dict kwargs;
  for (size_t k = 0; k < args.pos.size(); ++k) {
    if (k < macro.targets.size()) inner->vars.set(macro.targets[k], args.pos[k]);
    else varargs.push_back(args.pos[k]);
  }
  for (const auto& kv : args.kw) {
    if (std::find(macro.targets.begin(), macro.targets.end(), kv.first) == macro.targets.end()) {
      kwargs.set(kv.first, kv.second);
    } else {
      inner->vars.set(kv.first, kv.second);
    }
  }
  for (size_t k = 0; k < macro.targets.size() && st.ok(); ++k) {
    if (inner->vars.find(macro.targets[k])) continue;
    if (macro.defaults[k]) {
      Result<Value> d = eval(*macro.defaults[k]);
      if (!d.ok()) st = d.status();
      else inner->vars.set(macro.targets[k], std::move(d).value());
    } else {
      inner->vars.set(macro.targets[k],
                      Value::undefined(str_format("parameter '%s' was not provided",
                                              macro.targets[k].c_str())));
    }
  }
  inner->vars.set("varargs", Value::from_tuple(std::move(varargs)));
  inner->vars.set("kwargs", Value::from_dict(std::move(kwargs)));
  std::string out;
  Flow saved_flow = flow_;
  flow_ = Flow::kNormal;
  if (st.ok()) st = exec_body(macro.bodies[0], out);
  flow_ = saved_flow;
  scope_ = saved;
  line_ = saved_line;
  OSCAR_RETURN_IF_ERROR(st);
  return Value::string(std::move(out));
}

Result<Value> Evaluator::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s; s = s->parent.get()) {
    if (const Value* v = s->vars.find(name)) return *v;
    if (s->loop_items && name == "loop") {
      if (s->loop_value.is_undefined()) {
        s->loop_value = make_loop_object(*s->loop_items, s->loop_index);
      }
      return s->loop_value;
    }
  }
  if (context_.is_dict()) {
    if (const Value* v = context_.dict->find(name)) return *v;
  }
  Value g = global_function(name);
  if (!g.is_undefined()) return g;
  return Value::undefined(str_format("'%s' is undefined", name.c_str()));
}

Result<Value> Evaluator::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) return undefined_error(callee);
  if (callee.kind != Value::Kind::kCallable) {
    return fail(str_format("'%s' object is not callable", callee.type_name()));
  }
  return callee.fn->fn(*this, args);
}

Result<CallArgs> Evaluator::eval_args(const Expr& e, size_t first) {
  CallArgs args;
  size_t n_kw = e.kw_names.size();
  size_t n_pos = e.args.size() - first - n_kw;
  for (size_t k = 0; k < n_pos; ++k) {
    OSCAR_ASSIGN_OR_RETURN(Value v, eval(*e.args[first + k]));
    args.pos.push_back(std::move(v));
  }
  for (size_t k = 0; k < n_kw; ++k) {
    OSCAR_ASSIGN_OR_RETURN(Value v, eval(*e.args[first + n_pos + k]));
    args.kw.emplace_back(e.kw_names[k], std::move(v));
  }
  return args;
}

Result<Value> Evaluator::eval_filter(const Expr& e, const Value* block_operand) {
  Value operand;
  if (e.args[0]) {
    if (e.args[0]->kind == Expr::Kind::kFilter && block_operand) {
      OSCAR_ASSIGN_OR_RETURN(operand, eval_filter(*e.args[0], block_operand));
    } else {
      OSCAR_ASSIGN_OR_RETURN(operand, eval(*e.args[0]));
    }
  } else if (block_operand) {
    operand = *block_operand;
  }
  OSCAR_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1));
  line_ = e.line;
  return apply_filter(*this, e.name, operand, args);
}

Result<Value> Evaluator::eval(const Expr& e) {
  DepthGuard guard(depth_);
  if (depth_ > limits_.max_depth) {
    return fail(StatusCode::kOutOfRange, str_format("nesting deeper than %d", limits_.max_depth));
  }
  OSCAR_RETURN_IF_ERROR(charge(1));
  line_ = e.line;
  Result<Value> v = eval_inner(e);
  if (v.ok() && v->nest > limits_.max_value_nesting) {
    line_ = e.line;
    return fail(StatusCode::kOutOfRange,
                str_format("lists/dicts nested deeper than %d", limits_.max_value_nesting));
  }
  return v;
}

Result<Value> Evaluator::eval_inner(const Expr& e) {
  using K = Expr::Kind;
  switch (e.kind) {
    case K::kLiteral: return e.literal;
    case K::kName: return lookup(e.name);
    case K::kList:
    case K::kTuple: {
      List items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) {
        OSCAR_ASSIGN_OR_RETURN(Value v, eval(*a));
        items.push_back(std::move(v));
      }
      if (e.kind == K::kTuple) return Value::from_tuple(std::move(items));
      return Value::from_list(std::move(items));
    }
    case K::kDict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        OSCAR_ASSIGN_OR_RETURN(Value key, eval(*e.args[k]));
        OSCAR_ASSIGN_OR_RETURN(Value v, eval(*e.args[k + 1]));
        if (!key.is_string()) {
          line_ = e.line;
          return fail(str_format("dict keys must be strings, got '%s'", key.type_name()));
        }
        d.set(key.s(), std::move(v));
      }
      return Value::from_dict(std::move(d));
    }
    case K::kGetAttr: {
      OSCAR_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
      line_ = e.line;
      return get_attr(*this, obj, e.name);
    }
    case K::kGetItem: {
      OSCAR_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
      OSCAR_ASSIGN_OR_RETURN(Value key, eval(*e.args[1]));
      line_ = e.line;
      return get_item(*this, obj, key);
    }
    case K::kSlice: {
      OSCAR_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
      int64_t bounds[3] = {0, 0, 1};
      bool given[3] = {false, false, false};
      for (int k = 0; k < 3; ++k) {
        if (!e.args[static_cast<size_t>(k) + 1]) continue;
        OSCAR_ASSIGN_OR_RETURN(Value b, eval(*e.args[static_cast<size_t>(k) + 1]));
        if (b.is_none()) continue;
        if (b.kind != Value::Kind::kInt && b.kind != Value::Kind::kBool) {
          line_ = e.line;
          return fail("slice indices must be integers or None");
        }
        bounds[k] = b.kind == Value::Kind::kBool ? b.b : b.i;
        given[k] = true;
      }
      line_ = e.line;
      if (obj.is_undefined()) return undefined_error(obj);
      int64_t step = given[2] ? bounds[2] : 1;
      if (step == 0) return fail("slice step cannot be zero");
      bool is_str = obj.is_string();
      if (!is_str && !obj.is_list()) {
        return fail(str_format("'%s' object is not subscriptable", obj.type_name()));
      }
      std::u32string chars;
      if (is_str) chars = utf8::decode(obj.s(), kStrDecoding);
      int64_t len = is_str ? static_cast<int64_t>(chars.size())
                           : static_cast<int64_t>(obj.list->size());
      OSCAR_RETURN_IF_ERROR(charge(len / 32));
      // Python's slice.indices().
      auto adjust = [&](int64_t v, bool has, int64_t def_pos, int64_t def_neg) {
        if (!has) return step > 0 ? def_pos : def_neg;
        if (v < 0) {
          v += len;
          if (v < 0) v = step > 0 ? 0 : -1;
        } else if (v >= len) {
          v = step > 0 ? len : len - 1;
        }
        return v;
      };
      int64_t start = adjust(bounds[0], given[0], 0, len - 1);
      int64_t stop = adjust(bounds[1], given[1], len, -1);
      std::u32string sub;
      List items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (is_str) sub += chars[static_cast<size_t>(k)];
        else items.push_back((*obj.list)[static_cast<size_t>(k)]);
      }
      if (is_str) return Value::string(utf8::encode(sub));
      return obj.tuple ? Value::from_tuple(std::move(items)) : Value::from_list(std::move(items));
    }
    case K::kCall: {
      OSCAR_ASSIGN_OR_RETURN(Value callee, eval(*e.args[0]));
      OSCAR_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1));
      line_ = e.line;
      return call(callee, args);
    }
    case K::kFilter: return eval_filter(e, nullptr);
    case K::kTest: {
      OSCAR_ASSIGN_OR_RETURN(Value operand, eval(*e.args[0]));
      OSCAR_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1));
      line_ = e.line;
      OSCAR_ASSIGN_OR_RETURN(bool r, apply_test(*this, e.name, operand, args));
      return Value::boolean(r != e.negated);
    }
    case K::kNeg:
    case K::kPos: {
      OSCAR_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
      line_ = e.line;
      if (v.is_undefined()) return undefined_error(v);
      if (!v.is_number()) {
        return fail(str_format("bad operand type for unary %s: '%s'", e.kind == K::kNeg ? "-" : "+",
                           v.type_name()));
      }
      if (e.kind == K::kPos) return v.kind == Value::Kind::kBool ? Value::integer(v.b) : v;
      if (v.kind == Value::Kind::kFloat) return Value::real(-v.f);
      int64_t x = v.kind == Value::Kind::kBool ? v.b : v.i;
      if (x == INT64_MIN) return fail("integer overflow");
      return Value::integer(-x);
    }
    case K::kNot: {
      OSCAR_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
      return Value::boolean(!v.truthy());
    }
    case K::kAnd: {  // Python returns the deciding operand
      OSCAR_ASSIGN_OR_RETURN(Value l, eval(*e.args[0]));
      if (!l.truthy()) return l;
      return eval(*e.args[1]);
    }
    case K::kOr: {
      OSCAR_ASSIGN_OR_RETURN(Value l, eval(*e.args[0]));
      if (l.truthy()) return l;
      return eval(*e.args[1]);
    }
    case K::kBinary: {
      OSCAR_ASSIGN_OR_RETURN(Value l, eval(*e.args[0]));
      OSCAR_ASSIGN_OR_RETURN(Value r, eval(*e.args[1]));
      line_ = e.line;
      return binary_op(*this, e.name, l, r);
    }
    case K::kCompare: {
      OSCAR_ASSIGN_OR_RETURN(Value l, eval(*e.args[0]));
      for (size_t k = 0; k < e.ops.size(); ++k) {
        OSCAR_ASSIGN_OR_RETURN(Value r, eval(*e.args[k + 1]));
        line_ = e.line;
        OSCAR_ASSIGN_OR_RETURN(bool ok, compare_op(*this, e.ops[k], l, r));
        if (!ok) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case K::kCondExpr: {
      OSCAR_ASSIGN_OR_RETURN(Value c, eval(*e.args[1]));
      if (c.truthy()) return eval(*e.args[0]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value::undefined("the inline if-expression evaluated to false and had no else");
    }
  }
  return Value::undefined();
}

}  // namespace oscar::jinja
