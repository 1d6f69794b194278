// The value model of the Jinja2-subset interpreter behind ChatTemplate (chat_template.h): a
// Python-like dynamic value (Undefined, None, bool, int, float, str, list, dict, namespace,
// callable) with Python's truthiness, equality, str() and repr(), plus the conversions from and
// to JSON (json.dumps style, key order preserved). Strings, lists and dicts are immutable and
// shared by pointer, so copying a Value is cheap; only a namespace is mutable (by `set ns.x`).
// Nothing here parses or evaluates templates: see jinja/lexer.h, jinja/parser.h, jinja/eval.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/utf8.h"

namespace oscar::jinja {

struct Value;
struct Dict;
struct Callable;
using List = std::vector<Value>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace,
                    kCallable };

  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  // kString: the UTF-8 text. kUndefined: the hint used in error messages ("'x' is undefined").
  std::shared_ptr<const std::string> str;
  std::shared_ptr<const List> list;  // kList
  bool tuple = false;                // kList that is a Python tuple: repr uses parentheses
  // kList/kDict: 1 + the deepest nesting of the items (namespaces count as 0: they are freed by
  // the evaluator that made them). Bounded by the evaluator so that recursive walks and
  // destruction stay shallow.
  int nest = 0;
  std::shared_ptr<Dict> dict;        // kDict (never mutated once built) and kNamespace (mutable)
  std::shared_ptr<const Callable> fn;  // kCallable

  static Value undefined(std::string hint = "");
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value from_list(List v);
  static Value from_tuple(List v);
  static Value from_dict(Dict v);
  static Value make_namespace(Dict v);
  static Value callable(std::shared_ptr<const Callable> fn);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_number() const {  // bool counts, as in Python
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  const std::string& s() const { return *str; }  // precondition: is_string()
  std::string undefined_hint() const;

  // Python's bool(x).
  bool truthy() const;
  // Python type name as Jinja prints it in errors: "dict", "list", "str", "NoneType", ...
  const char* type_name() const;
};

// An insertion-ordered string-keyed map (Python dicts keep insertion order; lookups are linear,
// which suits the small dicts of chat messages).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const;
};

class Evaluator;
// A builtin function, a bound method (the receiver captured in `fn`) or a macro.
struct Callable {
  std::string name;
  std::function<Result<Value>(Evaluator&, const CallArgs&)> fn;
};

// Python ==.
bool values_equal(const Value& a, const Value& b);
// Python str(x) (Undefined -> ""). Nested containers use repr of their items.
std::string to_str(const Value& v);
// Python repr(x).
std::string to_repr(const Value& v);
// Python repr of a float: shortest round-trip digits, "1.0", "1e+16", "1.5e-05".
std::string py_float_repr(double v);

struct JsonDumpOptions {
  int indent = -1;  // < 0: single line with ", " and ": "; >= 0: newline + indent spaces
  bool sort_keys = false;
};
// json.dumps(x, ensure_ascii=False, ...) as transformers' tojson filter calls it. Fails on
// Undefined and callables (not JSON serializable), and on nesting deeper than max_depth.
Result<std::string> to_json(const Value& v, const JsonDumpOptions& options, int max_depth);

// Context JSON to values: integers stay int, floats float, objects keep their key order.
Result<Value> from_json(const nlohmann::ordered_json& j, int max_depth);

// Strings are UTF-8 bytes. Where they count as characters (len, slicing, most string filters),
// they are decoded loosely, so that a lone surrogate written by "\ud800" is one character, as in
// a Python str; each invalid byte becomes U+FFFD.
inline constexpr utf8::Decoding kStrDecoding = utf8::Decoding::kLoose;

}  // namespace oscar::jinja
