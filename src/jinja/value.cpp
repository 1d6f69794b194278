// Value model of the Jinja2 subset: constructors, Python semantics of ==, str(), repr(), and the
// JSON conversions. See jinja/value.h.
#include "jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace oscar::jinja {

Value Value::undefined(std::string hint) {
  Value v;
  v.kind = Kind::kUndefined;
  if (!hint.empty()) v.str = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.str = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::from_list(List x) {
  Value v;
  v.kind = Kind::kList;
  for (const Value& item : x) v.nest = std::max(v.nest, item.nest);
  v.nest += 1;
  v.list = std::make_shared<const List>(std::move(x));
  return v;
}
Value Value::from_tuple(List x) {
  Value v = from_list(std::move(x));
  v.tuple = true;
  return v;
}
Value Value::from_dict(Dict x) {
  Value v;
  v.kind = Kind::kDict;
  for (const auto& kv : x.items) v.nest = std::max(v.nest, kv.second.nest);
  v.nest += 1;
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}
Value Value::make_namespace(Dict x) {
  Value v;
  v.kind = Kind::kNamespace;
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}
Value Value::callable(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::move(fn);
  return v;
}

std::string Value::undefined_hint() const {
  if (str && !str->empty()) return *str;
  return "value is undefined";
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b;
    case Kind::kInt: return i != 0;
    case Kind::kFloat: return f != 0.0;
    case Kind::kString: return !str->empty();
    case Kind::kList: return !list->empty();
    case Kind::kDict: return !dict->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& kv : items) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::kwarg(std::string_view name) const {
  for (const auto& kv : kw) {
    if (kv.first == name) return &kv.second;
  }
  return nullptr;
}

namespace {

double as_double(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kBool: return v.b ? 1.0 : 0.0;
    case Value::Kind::kInt: return static_cast<double>(v.i);
    default: return v.f;
  }
}

}  // namespace

namespace {
// Containers share structure, so a naive walk of a small value can take exponential time; the
// walk below stops after kMaxEqualSteps items (answering "not equal").
constexpr int64_t kMaxEqualSteps = 10'000'000;
bool equal_impl(const Value& a, const Value& b, int64_t& budget);
}  // namespace

bool values_equal(const Value& a, const Value& b) {
  int64_t budget = kMaxEqualSteps;
  return equal_impl(a, b, budget);
}

namespace {
bool equal_impl(const Value& a, const Value& b, int64_t& budget) {
  using K = Value::Kind;
  if (--budget < 0) return false;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::kFloat && b.kind != K::kFloat) {
      int64_t x = a.kind == K::kBool ? a.b : a.i;
      int64_t y = b.kind == K::kBool ? b.b : b.i;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return *a.str == *b.str;
    case K::kList: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      if (a.list == b.list) return true;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equal_impl((*a.list)[k], (*b.list)[k], budget)) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* other = b.dict->find(kv.first);
        if (!other || !equal_impl(kv.second, *other, budget)) return false;
      }
      return true;
    }
    case K::kNamespace: return a.dict == b.dict;
    case K::kCallable: return a.fn == b.fn;
    default: return false;
  }
}
}  // namespace

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest %.Ne that round-trips, then Python's layout rules for repr().
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s(buf);
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  size_t epos = s.find('e');
  int exp10 = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (size_t k = 0; k < epos; ++k) {
    if (s[k] != '.') digits += s[k];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp10 >= -4 && exp10 < 16) {  // positional notation, as Python's repr
    if (exp10 < 0) {
      out = "0.";
      out.append(static_cast<size_t>(-exp10 - 1), '0');
      out += digits;
    } else {
      size_t int_digits = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_digits) {
        out = digits + std::string(int_digits - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
      }
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ebuf;
  }
  return neg ? "-" + out : out;
}

namespace {

void repr_string(const std::string& s, std::string& out) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  out += quote;
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == static_cast<unsigned char>(quote)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += quote;
}

// repr output stops growing past this size (the caller's output cap then rejects it): shared
// sub-containers can make a small value's repr exponentially long.
constexpr size_t kMaxReprBytes = 32 << 20;

void repr_into(const Value& v, std::string& out, int depth) {
  using K = Value::Kind;
  if (depth > 256 || out.size() > kMaxReprBytes) {
    out += "...";
    return;
  }
  // A namespace can contain itself (Python prints such a cycle as {...}).
  thread_local std::vector<const void*> open_namespaces;
  if (v.kind == K::kNamespace) {
    if (std::find(open_namespaces.begin(), open_namespaces.end(), v.dict.get()) !=
        open_namespaces.end()) {
      out += "<Namespace {...}>";
      return;
    }
    open_namespaces.push_back(v.dict.get());
    std::string inner;
    Value as_dict = v;
    as_dict.kind = K::kDict;
    repr_into(as_dict, inner, depth + 1);
    open_namespaces.pop_back();
    out += "<Namespace " + inner + ">";
    return;
  }
  switch (v.kind) {
    case K::kString: repr_string(*v.str, out); return;
    case K::kList: {
      out += v.tuple ? '(' : '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        repr_into((*v.list)[k], out, depth + 1);
      }
      if (v.tuple && v.list->size() == 1) out += ',';
      out += v.tuple ? ')' : ']';
      return;
    }
    case K::kDict:
    case K::kNamespace: {
      out += '{';
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        repr_string(kv.first, out);
        out += ": ";
        repr_into(kv.second, out, depth + 1);
      }
      out += '}';
      return;
    }
    default: out += to_str(v); return;
  }
}

}  // namespace

std::string to_str(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::kUndefined: return "";
    case K::kNone: return "None";
    case K::kBool: return v.b ? "True" : "False";
    case K::kInt: return std::to_string(v.i);
    case K::kFloat: return py_float_repr(v.f);
    case K::kString: return *v.str;
    case K::kCallable: return "<function " + v.fn->name + ">";
    default: {
      std::string out;
      repr_into(v, out, 0);
      return out;
    }
  }
}

std::string to_repr(const Value& v) {
  std::string out;
  repr_into(v, out, 0);
  return out;
}

namespace {

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

Status json_into(const Value& v, const JsonDumpOptions& opt, int depth, int max_depth,
                 std::string& out) {
  using K = Value::Kind;
  if (depth > max_depth) return out_of_range("tojson: nesting deeper than %d", max_depth);
  if (out.size() > kMaxReprBytes) {
    return out_of_range("tojson: output larger than %zu bytes", kMaxReprBytes);
  }
  auto newline = [&](int level) {
    if (opt.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(opt.indent) * static_cast<size_t>(level), ' ');
  };
  const char* item_sep = opt.indent < 0 ? ", " : ",";
  switch (v.kind) {
    case K::kUndefined:
    case K::kCallable:
      return invalid_argument("tojson: object of type '%s' is not JSON serializable",
                              v.type_name());
    case K::kNone: out += "null"; return Status();
    case K::kBool: out += v.b ? "true" : "false"; return Status();
    case K::kInt: out += std::to_string(v.i); return Status();
    case K::kFloat:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.f);
      return Status();
    case K::kString: json_string(*v.str, out); return Status();
    case K::kList: {
      if (v.list->empty()) {
        out += "[]";
        return Status();
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        OSCAR_RETURN_IF_ERROR(json_into((*v.list)[k], opt, depth + 1, max_depth, out));
      }
      newline(depth);
      out += ']';
      return Status();
    }
    case K::kDict:
    case K::kNamespace: {
      if (v.kind == K::kNamespace) {
        return invalid_argument("tojson: object of type 'Namespace' is not JSON serializable");
      }
      if (v.dict->items.empty()) {
        out += "{}";
        return Status();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_string(items[k]->first, out);
        out += ": ";
        OSCAR_RETURN_IF_ERROR(json_into(items[k]->second, opt, depth + 1, max_depth, out));
      }
      newline(depth);
      out += '}';
      return Status();
    }
  }
  return Status();
}

}  // namespace

Result<std::string> to_json(const Value& v, const JsonDumpOptions& options, int max_depth) {
  std::string out;
  OSCAR_RETURN_IF_ERROR(json_into(v, options, 0, max_depth, out));
  return out;
}

Result<Value> from_json(const nlohmann::ordered_json& j, int max_depth) {
  if (max_depth < 0) return out_of_range("context JSON nested too deeply");
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
    case T::discarded: return Value::none();
    case T::boolean: return Value::boolean(j.get<bool>());
    case T::number_integer: return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value::real(static_cast<double>(u));
      }
      return Value::integer(static_cast<int64_t>(u));
    }
    case T::number_float: return Value::real(j.get<double>());
    case T::string: return Value::string(j.get<std::string>());
    case T::binary: return invalid_argument("context JSON: binary values are not supported");
    case T::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) {
        OSCAR_ASSIGN_OR_RETURN(Value item, from_json(e, max_depth - 1));
        items.push_back(std::move(item));
      }
      return Value::from_list(std::move(items));
    }
    case T::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        OSCAR_ASSIGN_OR_RETURN(Value item, from_json(it.value(), max_depth - 1));
        d.items.emplace_back(it.key(), std::move(item));
      }
      return Value::from_dict(std::move(d));
    }
  }
  return Value::none();
}

}  // namespace oscar::jinja
