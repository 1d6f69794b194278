// Builtins of the Jinja2 subset: Python operators, filters, tests, the methods of str and dict
// reachable from templates, and the globals that transformers' chat templates use (range,
// namespace, dict, raise_exception, strftime_now). Declared in jinja/eval.h. Mutating methods
// (list.append, dict.update, ...) are absent on purpose, as in Jinja's ImmutableSandbox.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>

#include <utf8proc.h>

#include "jinja/eval.h"

namespace oscar::jinja {
namespace {

using K = Value::Kind;

// The sandbox's cap on range() (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

bool get_int(const Value& v, int64_t* out) {
  if (v.kind == K::kInt) {
    *out = v.i;
    return true;
  }
  if (v.kind == K::kBool) {
    *out = v.b;
    return true;
  }
  return false;
}

double num(const Value& v) {
  if (v.kind == K::kInt) return static_cast<double>(v.i);
  if (v.kind == K::kBool) return v.b ? 1.0 : 0.0;
  return v.f;
}

bool is_int_like(const Value& v) { return v.kind == K::kInt || v.kind == K::kBool; }

// The argument at `index` or named `name`, or null.
const Value* arg(const CallArgs& a, size_t index, const char* name) {
  if (index < a.pos.size()) return &a.pos[index];
  return a.kwarg(name);
}

bool arg_bool(const CallArgs& a, size_t index, const char* name, bool def) {
  const Value* v = arg(a, index, name);
  return v ? v->truthy() : def;
}

// ---- UTF-8 code point helpers ----
char32_t cp_at(const std::string& s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (i + n > s.size()) n = 1;
  std::u32string d =
      n == 1 ? std::u32string(1, c) : utf8::decode(std::string_view(s).substr(i, n), kStrDecoding);
  *len = n;
  return d.empty() ? U'\uFFFD' : d[0];
}

size_t prev_cp_start(const std::string& s, size_t end) {
  size_t p = end - 1;
  size_t back = 0;
  while (p > 0 && back < 3 && (static_cast<unsigned char>(s[p]) & 0xc0) == 0x80) {
    --p;
    ++back;
  }
  return p;
}

bool py_isspace(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
         c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string map_case(const std::string& s, bool upper) {
  std::u32string d = utf8::decode(s, kStrDecoding);
  for (char32_t& c : d) {
    c = static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                    : utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  }
  return utf8::encode(d);
}

bool is_cased_letter(char32_t c) {
  return utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c) ||
         utf8proc_tolower(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c);
}

bool is_alpha(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool is_digit_cp(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}

// Python str.strip/lstrip/rstrip; chars null means whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string set;
  bool ws = !chars || chars->is_none() || !chars->is_string();
  if (!ws) set = utf8::decode(chars->s(), kStrDecoding);
  auto strip_it = [&](char32_t c) {
    return ws ? py_isspace(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t len;
      char32_t c = cp_at(s, b, &len);
      if (!strip_it(c)) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      size_t p = prev_cp_start(s, e);
      size_t len;
      char32_t c = cp_at(s, p, &len);
      if (!strip_it(c)) break;
      e = p;
    }
  }
  return s.substr(b, e - b);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

size_t cp_index(const std::string& s, size_t byte_pos) {
  return utf8::length(std::string_view(s).substr(0, byte_pos), kStrDecoding);
}

Result<std::string> py_replace(Evaluator& ev, const std::string& s, const std::string& from,
                               const std::string& to, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {
    std::u32string d = utf8::decode(s, kStrDecoding);
    for (size_t k = 0; k <= d.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < d.size()) utf8::append(out, d[k]);
      OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
    }
    return out;
  }
  size_t p = 0;
  while (true) {
    size_t q = (count >= 0 && done >= count) ? std::string::npos : s.find(from, p);
    if (q == std::string::npos) {
      out.append(s, p, std::string::npos);
      break;
    }
    out.append(s, p, q - p);
    out += to;
    ++done;
    p = q + from.size();
    OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
  }
  OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(out.size() / 32)));
  return out;
}

// Python str.split / str.rsplit.
Result<List> py_split(Evaluator& ev, const std::string& s, const Value* sep, int64_t maxsplit,
                      bool from_right) {
  std::vector<std::string> parts;
  if (!sep || sep->is_none()) {
    // Runs of whitespace separate; leading/trailing whitespace is dropped.
    std::vector<std::pair<size_t, size_t>> words;
    size_t k = 0;
    while (k < s.size()) {
      size_t len;
      char32_t c = cp_at(s, k, &len);
      if (py_isspace(c)) {
        k += len;
        continue;
      }
      size_t b = k;
      while (k < s.size()) {
        c = cp_at(s, k, &len);
        if (py_isspace(c)) break;
        k += len;
      }
      words.emplace_back(b, k);
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (auto [b, e] : words) parts.push_back(s.substr(b, e - b));
    } else if (!from_right) {
      for (size_t w = 0; w < static_cast<size_t>(maxsplit); ++w) {
        parts.push_back(s.substr(words[w].first, words[w].second - words[w].first));
      }
      parts.push_back(py_strip(s.substr(words[static_cast<size_t>(maxsplit)].first), nullptr,
                               false, true));
    } else {
      size_t keep = words.size() - static_cast<size_t>(maxsplit);
      parts.push_back(py_strip(s.substr(0, words[keep - 1].second), nullptr, true, false));
      for (size_t w = keep; w < words.size(); ++w) {
        parts.push_back(s.substr(words[w].first, words[w].second - words[w].first));
      }
    }
  } else {
    if (!sep->is_string()) return ev.fail("split(): separator must be a string or None");
    const std::string& d = sep->s();
    if (d.empty()) return ev.fail("split(): empty separator");
    if (!from_right) {
      size_t p = 0;
      int64_t n = 0;
      while (true) {
        size_t q = (maxsplit >= 0 && n >= maxsplit) ? std::string::npos : s.find(d, p);
        if (q == std::string::npos) {
          parts.push_back(s.substr(p));
          break;
        }
        parts.push_back(s.substr(p, q - p));
        p = q + d.size();
        ++n;
      }
    } else {
      size_t e = s.size();
      int64_t n = 0;
      std::vector<std::string> rev;
      while (true) {
        size_t q = (maxsplit >= 0 && n >= maxsplit) || e < d.size()
                       ? std::string::npos
                       : s.rfind(d, e - d.size());
        if (q == std::string::npos) {
          rev.push_back(s.substr(0, e));
          break;
        }
        rev.push_back(s.substr(q + d.size(), e - q - d.size()));
        e = q;
        ++n;
      }
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(s.size() / 32 + parts.size())));
  List out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

Result<std::string> py_title(const std::string& s) {
  std::u32string d = utf8::decode(s, kStrDecoding);
  bool prev_cased = false;
  for (char32_t& c : d) {
    bool cased = is_cased_letter(c);
    auto ci = static_cast<utf8proc_int32_t>(c);
    c = static_cast<char32_t>(prev_cased ? utf8proc_tolower(ci) : utf8proc_totitle(ci));
    prev_cased = cased;
  }
  return utf8::encode(d);
}

std::string py_capitalize(const std::string& s) {
  std::u32string d = utf8::decode(s, kStrDecoding);
  for (size_t k = 0; k < d.size(); ++k) {
    auto ci = static_cast<utf8proc_int32_t>(d[k]);
    d[k] = static_cast<char32_t>(k == 0 ? utf8proc_totitle(ci) : utf8proc_tolower(ci));
  }
  return utf8::encode(d);
}

Result<std::string> join_values(Evaluator& ev, const List& items, const std::string& sep) {
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += sep;
    out += to_str(items[k]);
    OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
  }
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(out.size() / 32 + items.size())));
  return out;
}

// Python <, for sort/min/max and the comparison operators.
Result<bool> py_less(Evaluator& ev, const Value& a, const Value& b) {
  if (a.is_undefined()) return ev.undefined_error(a);
  if (b.is_undefined()) return ev.undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (is_int_like(a) && is_int_like(b)) {
      int64_t x, y;
      get_int(a, &x);
      get_int(b, &y);
      return x < y;
    }
    return num(a) < num(b);
  }
  if (a.is_string() && b.is_string()) return a.s() < b.s();
  if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
    if (a.list == b.list) return false;
    OSCAR_RETURN_IF_ERROR(ev.charge(1));
    const List& x = *a.list;
    const List& y = *b.list;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (values_equal(x[k], y[k])) continue;
      return py_less(ev, x[k], y[k]);
    }
    return x.size() < y.size();
  }
  return ev.fail(str_format("'<' not supported between instances of '%s' and '%s'", a.type_name(),
                        b.type_name()));
}

Result<bool> contains(Evaluator& ev, const Value& needle, const Value& hay) {
  switch (hay.kind) {
    case K::kString:
      if (!needle.is_string()) {
        if (needle.is_undefined()) return ev.undefined_error(needle);
        return ev.fail(str_format("'in <string>' requires string as left operand, not %s",
                              needle.type_name()));
      }
      return hay.s().find(needle.s()) != std::string::npos;
    case K::kList:
      for (const Value& v : *hay.list) {
        if (values_equal(v, needle)) return true;
      }
      return false;
    case K::kDict:
      if ((needle.is_list() && !needle.tuple) || needle.is_dict()) {
        return ev.fail(str_format("unhashable type: '%s'", needle.type_name()));
      }
      return needle.is_string() && hay.dict->find(needle.s()) != nullptr;
    case K::kUndefined: return false;
    default:
      return ev.fail(str_format("argument of type '%s' is not iterable", hay.type_name()));
  }
}

// Jinja's make_attrgetter: "a.b.0" walks items/attributes.
Result<Value> attr_path(Evaluator& ev, const Value& v, const std::string& path) {
  Value cur = v;
  size_t p = 0;
  while (true) {
    size_t q = path.find('.', p);
    std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; });
    Value key = digits ? Value::integer(std::atoll(part.c_str())) : Value::string(part);
    OSCAR_ASSIGN_OR_RETURN(cur, get_item(ev, cur, key));
    if (q == std::string::npos) return cur;
    p = q + 1;
  }
}

Result<Value> sort_key(Evaluator& ev, const Value& v, const Value* attribute, bool case_sensitive) {
  Value key = v;
  if (attribute && attribute->is_string()) {
    OSCAR_ASSIGN_OR_RETURN(key, attr_path(ev, v, attribute->s()));
  }
  if (!case_sensitive && key.is_string()) key = Value::string(map_case(key.s(), false));
  return key;
}

Result<Value> make_callable(std::string name,
                            std::function<Result<Value>(Evaluator&, const CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value::callable(std::move(c));
}

// Python's printf-style `fmt % args`: conversions s r d i f F e E g G x X o c and %%, flags
// "-+ 0#", width, precision, and %(name)s with a dict. A tuple supplies several arguments.
Result<std::string> printf_format(Evaluator& ev, const std::string& fmt, const Value& args) {
  List pos = args.is_list() && args.tuple ? *args.list : List{args};
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) return ev.fail("incomplete format");
    if (fmt[k] == '%') {
      out += '%';
      continue;
    }
    const Value* arg_value = nullptr;
    if (fmt[k] == '(') {
      size_t close = fmt.find(')', k);
      if (close == std::string::npos) return ev.fail("incomplete format key");
      std::string key = fmt.substr(k + 1, close - k - 1);
      if (!args.is_dict()) return ev.fail("format requires a mapping");
      arg_value = args.dict->find(key);
      if (!arg_value) return ev.fail(str_format("format key '%s' not found", key.c_str()));
      used_mapping = true;
      k = close + 1;
    }
    std::string spec = "%";
    while (k < fmt.size() && std::strchr("-+ 0#", fmt[k])) spec += fmt[k++];
    std::string width, precision;
    while (k < fmt.size() && fmt[k] >= '0' && fmt[k] <= '9' && width.size() < 3) width += fmt[k++];
    if (k < fmt.size() && fmt[k] == '.') {
      ++k;
      while (k < fmt.size() && fmt[k] >= '0' && fmt[k] <= '9' && precision.size() < 3) {
        precision += fmt[k++];
      }
      precision = "." + (precision.empty() ? std::string("0") : precision);
    }
    if (k >= fmt.size()) return ev.fail("incomplete format");
    char conv = fmt[k];
    if (!arg_value) {
      if (next >= pos.size()) return ev.fail("not enough arguments for format string");
      arg_value = &pos[next++];
    }
    const Value& v = *arg_value;
    char buf[512];
    if (conv == 's' || conv == 'r') {
      std::string text = conv == 's' ? to_str(v) : to_repr(v);
      if (!precision.empty()) {
        std::u32string d = utf8::decode(text, kStrDecoding);
        size_t p = static_cast<size_t>(std::atoi(precision.c_str() + 1));
        if (d.size() > p) text = utf8::encode(d.substr(0, p));
      }
      size_t w = static_cast<size_t>(std::atoi(width.c_str()));
      size_t len = utf8::length(text, kStrDecoding);
      if (len < w) {
        if (spec.find('-') != std::string::npos) text += std::string(w - len, ' ');
        else text = std::string(w - len, ' ') + text;
      }
      out += text;
    } else if (std::strchr("diouxXc", conv)) {
      if (!v.is_number()) {
        return ev.fail(str_format("%%%c format: a number is required, not %s", conv, v.type_name()));
      }
      int64_t x = 0;
      if (!get_int(v, &x)) {
        if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) return ev.fail("format: bad number");
        x = static_cast<int64_t>(v.f);
      }
      if (conv == 'c') {
        if (x < 0 || x > 0x10FFFF) return ev.fail("%c arg not in range(0x110000)");
        utf8::append(out, static_cast<char32_t>(x));
        continue;
      }
      char c = conv == 'i' || conv == 'u' ? 'd' : conv;
      std::string f = spec + width + precision + "ll" + c;
      std::snprintf(buf, sizeof(buf), f.c_str(), static_cast<long long>(x));
      out += buf;
    } else if (std::strchr("fFeEgG", conv)) {
      if (!v.is_number()) {
        return ev.fail(str_format("%%%c format: a number is required, not %s", conv, v.type_name()));
      }
      std::string f = spec + width + precision + conv;
      std::snprintf(buf, sizeof(buf), f.c_str(), num(v));
      out += buf;
    } else {
      return ev.fail(str_format("unsupported format character '%c'", conv));
    }
    OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
  }
  // Python skips this check when the argument is a mapping or any non-tuple sequence.
  bool mapping_like = args.is_dict() || (args.is_list() && !args.tuple) || args.is_undefined();
  if (!used_mapping && !mapping_like && next < pos.size()) {
    return ev.fail("not all arguments converted during string formatting");
  }
  return out;
}

// ---- methods ----
Result<Value> string_method(Evaluator& ev, const std::string& s, const std::string& name,
                            const CallArgs& a) {
  auto str_arg = [&](size_t i, const char* n) -> Result<std::string> {
    const Value* v = arg(a, i, n);
    if (!v || !v->is_string()) return ev.fail(str_format("str.%s() needs a string argument", name.c_str()));
    return v->s();
  };
  if (name == "startswith" || name == "endswith") {
    const Value* p = arg(a, 0, "prefix");
    if (!p) return ev.fail(str_format("str.%s() needs an argument", name.c_str()));
    List candidates = p->is_list() ? *p->list : List{*p};
    for (const Value& c : candidates) {
      if (!c.is_string()) {
        return ev.fail(str_format("str.%s() argument must be str or a tuple of str", name.c_str()));
      }
      const std::string& x = c.s();
      bool hit = name == "startswith"
                     ? s.compare(0, x.size(), x) == 0
                     : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      if (hit) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value::string(py_strip(s, arg(a, 0, "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    int64_t maxsplit = -1;
    if (const Value* m = arg(a, 1, "maxsplit")) get_int(*m, &maxsplit);
    OSCAR_ASSIGN_OR_RETURN(List parts, py_split(ev, s, arg(a, 0, "sep"), maxsplit,
                                                name == "rsplit"));
    return Value::from_list(std::move(parts));
  }
  if (name == "lower") return Value::string(map_case(s, false));
  if (name == "upper") return Value::string(map_case(s, true));
  if (name == "title") {
    OSCAR_ASSIGN_OR_RETURN(std::string t, py_title(s));
    return Value::string(std::move(t));
  }
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace") {
    OSCAR_ASSIGN_OR_RETURN(std::string from, str_arg(0, "old"));
    OSCAR_ASSIGN_OR_RETURN(std::string to, str_arg(1, "new"));
    int64_t count = -1;
    if (const Value* c = arg(a, 2, "count")) get_int(*c, &count);
    OSCAR_ASSIGN_OR_RETURN(std::string r, py_replace(ev, s, from, to, count));
    return Value::string(std::move(r));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    OSCAR_ASSIGN_OR_RETURN(std::string sub, str_arg(0, "sub"));
    size_t p = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") return ev.fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(cp_index(s, p)));
  }
  if (name == "count") {
    OSCAR_ASSIGN_OR_RETURN(std::string sub, str_arg(0, "x"));
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8::length(s, kStrDecoding)) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* it = arg(a, 0, "iterable");
    if (!it) return ev.fail("str.join() needs an argument");
    OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, *it));
    for (size_t k = 0; k < items.size(); ++k) {
      if (!items[k].is_string()) {
        return ev.fail(str_format("sequence item %zu: expected str instance, %s found", k,
                              items[k].type_name()));
      }
    }
    OSCAR_ASSIGN_OR_RETURN(std::string r, join_values(ev, items, s));
    return Value::string(std::move(r));
  }
  if (name == "format") {
    // "{}", "{0}", "{name}" and "{{"/"}}"; format specs and conversions are not supported.
    std::string out;
    size_t auto_index = 0;
    int numbering = 0;  // 1: automatic "{}", 2: manual "{0}"
    for (size_t k = 0; k < s.size(); ++k) {
      char c = s[k];
      if ((c == '{' || c == '}') && k + 1 < s.size() && s[k + 1] == c) {
        out += c;
        ++k;
        continue;
      }
      if (c == '}') return ev.fail("str.format: single '}' encountered in format string");
      if (c != '{') {
        out += c;
        continue;
      }
      size_t close = s.find('}', k);
      if (close == std::string::npos) return ev.fail("str.format: single '{' encountered");
      std::string field = s.substr(k + 1, close - k - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        return ev.fail("str.format: format specs are not supported");
      }
      const Value* v = nullptr;
      bool numeric = !field.empty() && std::all_of(field.begin(), field.end(),
                                                   [](char d) { return d >= '0' && d <= '9'; });
      if (field.empty() || numeric) {
        int mode = field.empty() ? 1 : 2;
        if (numbering != 0 && numbering != mode) {
          return ev.fail("str.format: cannot switch between automatic and manual field numbering");
        }
        numbering = mode;
      }
      if (field.empty()) {
        if (auto_index < a.pos.size()) v = &a.pos[auto_index++];
      } else if (numeric) {
        size_t idx = static_cast<size_t>(std::atoll(field.c_str()));
        if (idx < a.pos.size()) v = &a.pos[idx];
      } else {
        v = a.kwarg(field);
      }
      if (!v) return ev.fail(str_format("str.format: no argument for '{%s}'", field.c_str()));
      out += to_str(*v);
      OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
      k = close;
    }
    return Value::string(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    OSCAR_ASSIGN_OR_RETURN(std::string x, str_arg(0, "prefix"));
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) {
      return Value::string(s.substr(x.size()));
    }
    if (name == "removesuffix" && s.size() >= x.size() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0) {
      return Value::string(s.substr(0, s.size() - x.size()));
    }
    return Value::string(s);
  }
  if (name == "splitlines") {
    List out;
    size_t b = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\n' || s[k] == '\r') {
        out.push_back(Value::string(s.substr(b, k - b)));
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        b = k + 1;
      }
    }
    if (b < s.size()) out.push_back(Value::string(s.substr(b)));
    return Value::from_list(std::move(out));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "islower" || name == "isupper") {
    std::u32string d = utf8::decode(s, kStrDecoding);
    if (d.empty()) return Value::boolean(false);
    if (name == "islower" || name == "isupper") {
      bool any_cased = false;
      for (char32_t c : d) {
        auto ci = static_cast<utf8proc_int32_t>(c);
        bool lower = utf8proc_toupper(ci) != ci;
        bool upper = utf8proc_tolower(ci) != ci;
        if ((name == "islower" && upper) || (name == "isupper" && lower)) {
          return Value::boolean(false);
        }
        any_cased = any_cased || lower || upper;
      }
      return Value::boolean(any_cased);
    }
    for (char32_t c : d) {
      bool ok = name == "isdigit"   ? is_digit_cp(c)
                : name == "isalpha" ? is_alpha(c)
                : name == "isalnum" ? (is_alpha(c) || is_digit_cp(c))
                                    : py_isspace(c);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  return ev.fail(str_format("'str' object has no method '%s'", name.c_str()));
}

bool is_string_method(const std::string& n) {
  static const char* kNames[] = {
      "startswith", "endswith", "strip",      "lstrip",  "rstrip",       "split",
      "rsplit",     "lower",    "upper",      "title",   "capitalize",   "replace",
      "find",       "rfind",    "index",      "rindex",  "count",        "join",
      "removeprefix", "removesuffix", "splitlines", "isdigit", "isalpha", "isalnum",
      "isspace",    "islower",  "isupper", "format"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

Result<Value> dict_method(Evaluator& ev, const Value& d, const std::string& name,
                          const CallArgs& a) {
  if (name == "items" || name == "keys" || name == "values") {
    List out;
    out.reserve(d.dict->items.size());
    for (const auto& kv : d.dict->items) {
      if (name == "items") out.push_back(Value::from_tuple({Value::string(kv.first), kv.second}));
      else if (name == "keys") out.push_back(Value::string(kv.first));
      else out.push_back(kv.second);
    }
    return Value::from_list(std::move(out));
  }
  // get(key, default=None)
  const Value* key = arg(a, 0, "key");
  if (!key) return ev.fail("dict.get() needs a key");
  if (key->is_string()) {
    if (const Value* v = d.dict->find(key->s())) return *v;
  }
  const Value* def = arg(a, 1, "default");
  return def ? *def : Value::none();
}

// ---- filters ----
using FilterFn = Result<Value> (*)(Evaluator&, const Value&, const CallArgs&);

Result<Value> f_length(Evaluator& ev, const Value& v, const CallArgs&) {
  switch (v.kind) {
    case K::kString:
      return Value::integer(static_cast<int64_t>(utf8::length(v.s(), kStrDecoding)));
    case K::kList: return Value::integer(static_cast<int64_t>(v.list->size()));
    case K::kDict: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    case K::kUndefined: return Value::integer(0);
    default: return ev.fail(str_format("object of type '%s' has no len()", v.type_name()));
  }
}

Result<Value> f_tojson(Evaluator& ev, const Value& v, const CallArgs& a) {
  JsonDumpOptions opt;
  if (const Value* ind = arg(a, 0, "indent")) {
    int64_t n = 0;
    if (!ind->is_none()) {
      if (!get_int(*ind, &n) || n < 0 || n > 64) return ev.fail("tojson: bad indent");
      opt.indent = static_cast<int>(n);
    }
  }
  opt.sort_keys = a.kwarg("sort_keys") && a.kwarg("sort_keys")->truthy();
  Result<std::string> s = to_json(v, opt, 256);
  if (!s.ok()) return ev.fail(s.status().message());
  std::string out = std::move(s).value();
  if (a.kwarg("ensure_ascii") && a.kwarg("ensure_ascii")->truthy()) {
    std::u32string d = utf8::decode(out, kStrDecoding);
    out.clear();
    for (char32_t c : d) {
      if (c < 0x80) {
        out += static_cast<char>(c);
        continue;
      }
      auto put = [&](unsigned u) {
        char buf[16];
        std::snprintf(buf, sizeof(buf), "\\u%04x", u);
        out += buf;
      };
      if (c >= 0x10000) {
        put(0xd800 + ((c - 0x10000) >> 10));
        put(0xdc00 + ((c - 0x10000) & 0x3ff));
      } else {
        put(static_cast<unsigned>(c));
      }
    }
  }
  OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(out.size() / 32)));
  return Value::string(std::move(out));
}

Result<Value> f_string(Evaluator& ev, const Value& v, const CallArgs&) {
  std::string s = to_str(v);
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(s.size() / 32)));
  return Value::string(std::move(s));
}

Result<Value> f_trim(Evaluator&, const Value& v, const CallArgs& a) {
  return Value::string(py_strip(to_str(v), arg(a, 0, "chars"), true, true));
}
Result<Value> f_lower(Evaluator&, const Value& v, const CallArgs&) {
  return Value::string(map_case(to_str(v), false));
}
Result<Value> f_upper(Evaluator&, const Value& v, const CallArgs&) {
  return Value::string(map_case(to_str(v), true));
}
Result<Value> f_capitalize(Evaluator&, const Value& v, const CallArgs&) {
  return Value::string(py_capitalize(to_str(v)));
}
Result<Value> f_title(Evaluator&, const Value& v, const CallArgs&) {
  // Jinja splits at runs of [-\s({[<] and title-cases each piece's first character.
  std::u32string d = utf8::decode(to_str(v), kStrDecoding);
  bool at_start = true;
  for (char32_t& c : d) {
    bool delim = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    auto ci = static_cast<utf8proc_int32_t>(c);
    if (!delim) c = static_cast<char32_t>(at_start ? utf8proc_toupper(ci) : utf8proc_tolower(ci));
    at_start = delim;
  }
  return Value::string(utf8::encode(d));
}

Result<Value> f_default(Evaluator&, const Value& v, const CallArgs& a) {
  const Value* def = arg(a, 0, "default_value");
  bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return def ? *def : Value::string("");
  return v;
}

Result<Value> f_safe(Evaluator&, const Value& v, const CallArgs&) { return v; }

Result<Value> f_escape(Evaluator&, const Value& v, const CallArgs&) {
  return Value::string(html_escape(to_str(v)));
}

Result<Value> f_items(Evaluator& ev, const Value& v, const CallArgs& a) {
  if (v.is_undefined()) return Value::from_list({});
  if (!v.is_dict()) return ev.fail("items: can only get item pairs from a mapping");
  return dict_method(ev, v, "items", a);
}

Result<Value> f_join(Evaluator& ev, const Value& v, const CallArgs& a) {
  const Value* sep = arg(a, 0, "d");
  const Value* attribute = arg(a, 1, "attribute");
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  if (attribute && !attribute->is_none()) {
    for (Value& it : items) {
      OSCAR_ASSIGN_OR_RETURN(it, attr_path(ev, it, to_str(*attribute)));
    }
  }
  OSCAR_ASSIGN_OR_RETURN(std::string s, join_values(ev, items, sep ? to_str(*sep) : ""));
  return Value::string(std::move(s));
}

Result<Value> f_first(Evaluator& ev, const Value& v, const CallArgs&) {
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Result<Value> f_last(Evaluator& ev, const Value& v, const CallArgs&) {
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Result<Value> f_reverse(Evaluator& ev, const Value& v, const CallArgs&) {
  if (v.is_string()) {
    std::u32string d = utf8::decode(v.s(), kStrDecoding);
    std::reverse(d.begin(), d.end());
    return Value::string(utf8::encode(d));
  }
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  std::reverse(items.begin(), items.end());
  return Value::from_list(std::move(items));
}

Result<Value> f_list(Evaluator& ev, const Value& v, const CallArgs&) {
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  return Value::from_list(std::move(items));
}

Result<Value> f_replace(Evaluator& ev, const Value& v, const CallArgs& a) {
  const Value* from = arg(a, 0, "old");
  const Value* to = arg(a, 1, "new");
  if (!from || !to) return ev.fail("replace needs two arguments");
  int64_t count = -1;
  if (const Value* c = arg(a, 2, "count")) {
    if (!c->is_none()) get_int(*c, &count);
  }
  OSCAR_ASSIGN_OR_RETURN(std::string r, py_replace(ev, to_str(v), to_str(*from), to_str(*to), count));
  return Value::string(std::move(r));
}

Result<Value> f_int(Evaluator&, const Value& v, const CallArgs& a) {
  const Value* def = arg(a, 0, "default");
  Value fallback = def ? *def : Value::integer(0);
  if (is_int_like(v)) return Value::integer(v.kind == K::kBool ? v.b : v.i);
  if (v.kind == K::kFloat) {
    if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.s(), nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (s.empty()) return fallback;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(s.c_str(), &end, 10);
    if (*end == '\0' && errno == 0) return Value::integer(x);
    bool hex = s.find_first_of("xXpP") != std::string::npos;  // strtod reads C hex floats
    double d = std::strtod(s.c_str(), &end);
    if (!hex && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(d));
    }
  }
  return fallback;
}

Result<Value> f_float(Evaluator&, const Value& v, const CallArgs& a) {
  const Value* def = arg(a, 0, "default");
  Value fallback = def ? *def : Value::real(0.0);
  if (v.is_number()) return Value::real(num(v));
  if (v.is_string()) {
    std::string s = py_strip(v.s(), nullptr, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    bool hex = s.find_first_of("xXpP") != std::string::npos;  // Python's float() has no hex
    if (!s.empty() && !hex && *end == '\0') return Value::real(d);
  }
  return fallback;
}

Result<Value> f_abs(Evaluator& ev, const Value& v, const CallArgs&) {
  if (is_int_like(v)) {
    int64_t x = v.kind == K::kBool ? v.b : v.i;
    if (x == INT64_MIN) return ev.fail("integer overflow");
    return Value::integer(x < 0 ? -x : x);
  }
  if (v.kind == K::kFloat) return Value::real(std::fabs(v.f));
  return ev.fail(str_format("bad operand type for abs(): '%s'", v.type_name()));
}

Result<Value> f_round(Evaluator& ev, const Value& v, const CallArgs& a) {
  if (!v.is_number()) return ev.fail(str_format("round: '%s' is not a number", v.type_name()));
  int64_t precision = 0;
  if (const Value* p = arg(a, 0, "precision")) get_int(*p, &precision);
  precision = std::clamp<int64_t>(precision, -15, 15);
  std::string method = "common";
  if (const Value* m = arg(a, 1, "method")) method = to_str(*m);
  if (is_int_like(v) && method == "common" && precision >= 0) return v;
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = num(v) * scale;
  if (method == "common") x = std::nearbyint(x);
  else if (method == "ceil") x = std::ceil(x);
  else if (method == "floor") x = std::floor(x);
  else return ev.fail("round: method must be 'common', 'ceil' or 'floor'");
  return Value::real(x / scale);
}

Result<Value> f_indent(Evaluator& ev, const Value& v, const CallArgs& a) {
  std::string pad(4, ' ');
  if (const Value* w = arg(a, 0, "width")) {
    int64_t n;
    if (w->is_string()) pad = w->s();
    else if (get_int(*w, &n) && n >= 0 && n <= 1024) pad = std::string(static_cast<size_t>(n), ' ');
  }
  bool first = arg_bool(a, 1, "first", false);
  bool blank = arg_bool(a, 2, "blank", false);
  std::string s = to_str(v);
  std::vector<std::string> lines;
  size_t b = 0;
  for (size_t k = 0; k <= s.size(); ++k) {
    if (k == s.size() || s[k] == '\n') {
      lines.push_back(s.substr(b, k - b));
      b = k + 1;
    }
  }
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += '\n';
    bool indent_it = (k > 0 || first) && (blank || !lines[k].empty());
    if (indent_it) out += pad;
    out += lines[k];
    OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(out.size())));
  }
  return Value::string(std::move(out));
}

Result<Value> f_wordcount(Evaluator&, const Value& v, const CallArgs&) {
  std::u32string d = utf8::decode(to_str(v), kStrDecoding);
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : d) {
    bool w = is_alpha(c) || is_digit_cp(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Result<Value> f_attr(Evaluator& ev, const Value& v, const CallArgs& a) {
  const Value* n = arg(a, 0, "name");
  if (!n || !n->is_string()) return ev.fail("attr needs an attribute name");
  // getattr() only: dict items are not attributes.
  if (v.is_dict() && n->s() != "items" && n->s() != "keys" && n->s() != "values" &&
      n->s() != "get") {
    return Value::undefined(str_format("'dict object' has no attribute '%s'", n->s().c_str()));
  }
  return get_attr(ev, v, n->s());
}

Result<Value> f_pprint(Evaluator&, const Value& v, const CallArgs&) {
  return Value::string(to_repr(v));
}

Result<Value> f_map(Evaluator& ev, const Value& v, const CallArgs& a) {
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  List out;
  out.reserve(items.size());
  if (const Value* attribute = a.kwarg("attribute")) {
    const Value* def = a.kwarg("default");
    for (const Value& it : items) {
      OSCAR_ASSIGN_OR_RETURN(Value x, attr_path(ev, it, to_str(*attribute)));
      if (x.is_undefined() && def) x = *def;
      out.push_back(std::move(x));
    }
    return Value::from_list(std::move(out));
  }
  if (a.pos.empty() || !a.pos[0].is_string()) return ev.fail("map needs a filter name or attribute=");
  std::string filter = a.pos[0].s();
  if (!has_filter(filter)) return ev.fail(str_format("no filter named '%s'", filter.c_str()));
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& it : items) {
    OSCAR_ASSIGN_OR_RETURN(Value x, apply_filter(ev, filter, it, rest));
    out.push_back(std::move(x));
  }
  return Value::from_list(std::move(out));
}

// select/reject/selectattr/rejectattr.
Result<Value> select_impl(Evaluator& ev, const Value& v, const CallArgs& a, bool by_attr,
                          bool keep_if) {
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  size_t next = 0;
  std::string attribute;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_string()) return ev.fail("selectattr needs an attribute");
    attribute = a.pos[0].s();
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (next < a.pos.size()) {
    if (!a.pos[next].is_string()) return ev.fail("select: the test name must be a string");
    test = a.pos[next].s();
    if (!has_test(test)) return ev.fail(str_format("no test named '%s'", test.c_str()));
    test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(next) + 1, a.pos.end());
  }
  List out;
  for (const Value& it : items) {
    Value x = it;
    if (by_attr) {
      OSCAR_ASSIGN_OR_RETURN(x, attr_path(ev, it, attribute));
    }
    bool r;
    if (test.empty()) {
      r = x.truthy();
    } else {
      OSCAR_ASSIGN_OR_RETURN(r, apply_test(ev, test, x, test_args));
    }
    if (r == keep_if) out.push_back(it);
  }
  return Value::from_list(std::move(out));
}
Result<Value> f_select(Evaluator& ev, const Value& v, const CallArgs& a) {
  return select_impl(ev, v, a, false, true);
}
Result<Value> f_reject(Evaluator& ev, const Value& v, const CallArgs& a) {
  return select_impl(ev, v, a, false, false);
}
Result<Value> f_selectattr(Evaluator& ev, const Value& v, const CallArgs& a) {
  return select_impl(ev, v, a, true, true);
}
Result<Value> f_rejectattr(Evaluator& ev, const Value& v, const CallArgs& a) {
  return select_impl(ev, v, a, true, false);
}

// Sorts (key, item) pairs with Python's <; the first comparison error is returned.
Result<List> sorted_by_key(Evaluator& ev, List items, std::vector<Value> keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  Status err;
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(items.size()) * 8));
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!err.ok()) return false;
    Result<bool> r = reverse ? py_less(ev, keys[y], keys[x]) : py_less(ev, keys[x], keys[y]);
    if (!r.ok()) {
      err = r.status();
      return false;
    }
    return *r;
  });
  OSCAR_RETURN_IF_ERROR(err);
  List out;
  out.reserve(items.size());
  for (size_t k : order) out.push_back(items[k]);
  return out;
}

Result<Value> f_sort(Evaluator& ev, const Value& v, const CallArgs& a) {
  bool reverse = arg_bool(a, 0, "reverse", false);
  bool case_sensitive = arg_bool(a, 1, "case_sensitive", false);
  const Value* attribute = arg(a, 2, "attribute");
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  std::vector<Value> keys;
  for (const Value& it : items) {
    OSCAR_ASSIGN_OR_RETURN(Value key, sort_key(ev, it, attribute, case_sensitive));
    keys.push_back(std::move(key));
  }
  OSCAR_ASSIGN_OR_RETURN(List out, sorted_by_key(ev, std::move(items), std::move(keys), reverse));
  return Value::from_list(std::move(out));
}

Result<Value> f_dictsort(Evaluator& ev, const Value& v, const CallArgs& a) {
  if (!v.is_dict()) return ev.fail("dictsort: can only sort a mapping");
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = arg(a, 1, "by");
  bool by_value = by && by->is_string() && by->s() == "value";
  bool reverse = arg_bool(a, 2, "reverse", false);
  List items;
  std::vector<Value> keys;
  for (const auto& kv : v.dict->items) {
    items.push_back(Value::from_tuple({Value::string(kv.first), kv.second}));
    OSCAR_ASSIGN_OR_RETURN(
        Value key, sort_key(ev, by_value ? kv.second : Value::string(kv.first), nullptr,
                            case_sensitive));
    keys.push_back(std::move(key));
  }
  OSCAR_ASSIGN_OR_RETURN(List out, sorted_by_key(ev, std::move(items), std::move(keys), reverse));
  return Value::from_list(std::move(out));
}

Result<Value> f_unique(Evaluator& ev, const Value& v, const CallArgs& a) {
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  List out;
  std::vector<Value> seen;
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(items.size() * items.size() / 16)));
  for (const Value& it : items) {
    OSCAR_ASSIGN_OR_RETURN(Value key, sort_key(ev, it, attribute, case_sensitive));
    bool dup = std::any_of(seen.begin(), seen.end(),
                           [&](const Value& s) { return values_equal(s, key); });
    if (dup) continue;
    seen.push_back(key);
    out.push_back(it);
  }
  return Value::from_list(std::move(out));
}

Result<Value> min_max(Evaluator& ev, const Value& v, const CallArgs& a, bool want_max) {
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  OSCAR_ASSIGN_OR_RETURN(Value best_key, sort_key(ev, items[0], attribute, case_sensitive));
  for (size_t k = 1; k < items.size(); ++k) {
    OSCAR_ASSIGN_OR_RETURN(Value key, sort_key(ev, items[k], attribute, case_sensitive));
    OSCAR_ASSIGN_OR_RETURN(bool better, want_max ? py_less(ev, best_key, key)
                                                 : py_less(ev, key, best_key));
    if (better) {
      best = k;
      best_key = key;
    }
  }
  return items[best];
}
Result<Value> f_min(Evaluator& ev, const Value& v, const CallArgs& a) {
  return min_max(ev, v, a, false);
}
Result<Value> f_max(Evaluator& ev, const Value& v, const CallArgs& a) {
  return min_max(ev, v, a, true);
}

Result<Value> f_batch(Evaluator& ev, const Value& v, const CallArgs& a) {
  int64_t size = 0;
  const Value* n = arg(a, 0, "linecount");
  if (!n || !get_int(*n, &size) || size <= 0) return ev.fail("batch needs a positive size");
  const Value* fill = arg(a, 1, "fill_with");
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  List out;
  for (size_t k = 0; k < items.size(); k += static_cast<size_t>(size)) {
    List row(items.begin() + static_cast<std::ptrdiff_t>(k),
             items.begin() + static_cast<std::ptrdiff_t>(
                                 std::min(items.size(), k + static_cast<size_t>(size))));
    while (fill && !fill->is_none() && row.size() < static_cast<size_t>(size)) row.push_back(*fill);
    out.push_back(Value::from_list(std::move(row)));
  }
  return Value::from_list(std::move(out));
}

Result<Value> f_sum(Evaluator& ev, const Value& v, const CallArgs& a) {
  const Value* attribute = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  OSCAR_ASSIGN_OR_RETURN(List items, iterate(ev, v));
  Value total = start ? *start : Value::integer(0);
  for (const Value& it : items) {
    Value x = it;
    if (attribute && attribute->is_string()) {
      OSCAR_ASSIGN_OR_RETURN(x, attr_path(ev, it, attribute->s()));
    }
    OSCAR_ASSIGN_OR_RETURN(total, binary_op(ev, "+", total, x));
  }
  return total;
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> kFilters = {
      {"abs", f_abs},           {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize}, {"count", f_length},
      {"d", f_default},         {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"indent", f_indent},
      {"int", f_int},           {"items", f_items},
      {"join", f_join},         {"last", f_last},
      {"length", f_length},     {"list", f_list},
      {"lower", f_lower},       {"map", f_map},
      {"max", f_max},           {"min", f_min},
      {"pprint", f_pprint},     {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse},   {"round", f_round},
      {"safe", f_safe},         {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string},     {"sum", f_sum},
      {"title", f_title},       {"tojson", f_tojson},
      {"trim", f_trim},         {"unique", f_unique},
      {"upper", f_upper},       {"wordcount", f_wordcount},
  };
  return kFilters;
}

// ---- tests ----
Result<bool> run_test(Evaluator& ev, const std::string& n, const Value& v, const CallArgs& a) {
  const Value* other = arg(a, 0, "other");
  auto need_other = [&]() -> Status {
    if (!other) return ev.fail(str_format("test '%s' needs an argument", n.c_str()));
    return Status();
  };
  static const char* kUnary[] = {"defined", "undefined", "none", "true", "false", "boolean",
                                 "integer", "float", "number", "string", "mapping", "sequence",
                                 "iterable", "callable", "lower", "upper", "odd", "even"};
  for (const char* u : kUnary) {
    if (n == u && (!a.pos.empty() || !a.kw.empty())) {
      return ev.fail(str_format("test_%s() takes 1 positional argument but %zu were given", u,
                                a.pos.size() + a.kw.size() + 1));
    }
  }
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "true") return v.kind == K::kBool && v.b;
  if (n == "false") return v.kind == K::kBool && !v.b;
  if (n == "boolean") return v.kind == K::kBool;
  if (n == "integer") return v.kind == K::kInt;
  if (n == "float") return v.kind == K::kFloat;
  if (n == "number") return v.is_number();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_dict();
  if (n == "sequence") return v.is_string() || v.is_list() || v.is_dict();
  if (n == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (n == "callable") return v.kind == K::kCallable;
  if (n == "lower" || n == "upper") {
    OSCAR_ASSIGN_OR_RETURN(Value r, string_method(ev, to_str(v), "is" + n, CallArgs{}));
    return r.b;
  }
  if (n == "odd" || n == "even" || n == "divisibleby") {
    int64_t x;
    if (!get_int(v, &x)) return ev.fail(str_format("test '%s' needs an integer", n.c_str()));
    if (n == "odd") return (x % 2) != 0;
    if (n == "even") return (x % 2) == 0;
    OSCAR_RETURN_IF_ERROR(need_other());
    int64_t d;
    if (!get_int(*other, &d) || d == 0) return ev.fail("divisibleby needs a non-zero integer");
    return (x % d) == 0;
  }
  if (n == "eq" || n == "equalto" || n == "==") {
    OSCAR_RETURN_IF_ERROR(need_other());
    return values_equal(v, *other);
  }
  if (n == "ne" || n == "!=") {
    OSCAR_RETURN_IF_ERROR(need_other());
    return !values_equal(v, *other);
  }
  if (n == "lt" || n == "lessthan" || n == "<" || n == "le" || n == "<=" || n == "gt" ||
      n == "greaterthan" || n == ">" || n == "ge" || n == ">=") {
    OSCAR_RETURN_IF_ERROR(need_other());
    std::string op = (n == "lt" || n == "lessthan" || n == "<")      ? "<"
                     : (n == "le" || n == "<=")                      ? "<="
                     : (n == "gt" || n == "greaterthan" || n == ">") ? ">"
                                                                     : ">=";
    return compare_op(ev, op, v, *other);
  }
  if (n == "in") {
    OSCAR_RETURN_IF_ERROR(need_other());
    return contains(ev, v, *other);
  }
  if (n == "sameas") {
    OSCAR_RETURN_IF_ERROR(need_other());
    if (v.kind != other->kind) return false;
    switch (v.kind) {
      case K::kList: return v.list == other->list;
      case K::kDict:
      case K::kNamespace: return v.dict == other->dict;
      case K::kString: return v.str == other->str || v.s() == other->s();
      default: return values_equal(v, *other);
    }
  }
  if (n == "filter") return other && other->is_string() && has_filter(other->s());
  if (n == "test") return other && other->is_string() && has_test(other->s());
  return ev.fail(str_format("no test named '%s'", n.c_str()));
}

const char* const kTests[] = {
    "defined", "undefined", "none", "true", "false", "boolean", "integer", "float", "number",
    "string", "mapping", "sequence", "iterable", "callable", "lower", "upper", "odd", "even",
    "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt",
    "greaterthan", ">", "ge", ">=", "in", "sameas", "filter", "test"};

// ---- globals ----
Result<Value> g_range(Evaluator& ev, const CallArgs& a) {
  int64_t v[3] = {0, 0, 1};
  if (a.pos.empty() || a.pos.size() > 3) return ev.fail("range() takes 1 to 3 arguments");
  for (size_t k = 0; k < a.pos.size(); ++k) {
    if (!get_int(a.pos[k], &v[k])) return ev.fail("range() arguments must be integers");
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = v[0];
  } else {
    start = v[0];
    stop = v[1];
    if (a.pos.size() == 3) step = v[2];
  }
  if (step == 0) return ev.fail("range() arg 3 must not be zero");
  // Length computed in long double so that extreme bounds cannot overflow.
  long double span = static_cast<long double>(stop) - static_cast<long double>(start);
  long double count = std::ceil(span / static_cast<long double>(step));
  if (count > static_cast<long double>(kMaxRange)) {
    return ev.fail(StatusCode::kResourceExhausted,
                   str_format("range too big: the sandbox allows at most %lld items",
                          (long long)kMaxRange));
  }
  List out;
  for (int64_t k = 0; k < static_cast<int64_t>(std::max<long double>(count, 0)); ++k) {
    out.push_back(Value::integer(start + k * step));
  }
  OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(out.size())));
  return Value::from_list(std::move(out));
}

Result<Value> dict_from_args(Evaluator& ev, const CallArgs& a) {
  Dict d;
  for (const Value& p : a.pos) {
    if (!p.is_dict()) return ev.fail("expected a mapping as positional argument");
    for (const auto& kv : p.dict->items) d.set(kv.first, kv.second);
  }
  for (const auto& kv : a.kw) d.set(kv.first, kv.second);
  return Value::from_dict(std::move(d));
}

Result<Value> g_namespace(Evaluator& ev, const CallArgs& a) {
  OSCAR_ASSIGN_OR_RETURN(Value d, dict_from_args(ev, a));
  return ev.make_namespace(std::move(*d.dict));
}

Result<Value> g_raise(Evaluator&, const CallArgs& a) {
  std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
  return invalid_argument("chat template raised an exception: %s", msg.c_str());
}

Result<Value> g_strftime_now(Evaluator& ev, const CallArgs& a) {
  if (a.pos.empty() || !a.pos[0].is_string()) return ev.fail("strftime_now needs a format");
  std::time_t t = std::time(nullptr);
  std::tm tm_local{};
  localtime_r(&t, &tm_local);
  char buf[256];
  size_t n = std::strftime(buf, sizeof(buf), a.pos[0].s().c_str(), &tm_local);
  return Value::string(std::string(buf, n));
}

}  // namespace

// ---- public builtins API ----
bool has_filter(const std::string& name) { return filters().count(name) != 0; }

bool has_test(const std::string& name) {
  for (const char* t : kTests) {
    if (name == t) return true;
  }
  return false;
}

Result<Value> apply_filter(Evaluator& ev, const std::string& name, const Value& operand,
                           const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) return ev.fail(str_format("no filter named '%s'", name.c_str()));
  // Jinja's default Undefined: filters that need a value fail, the rest see "nothing".
  if (operand.is_undefined() && name != "default" && name != "d" && name != "length" &&
      name != "count" && name != "items" && name != "string" && name != "list" &&
      name != "join" && name != "first" && name != "last" && name != "safe" &&
      name != "trim" && name != "lower" && name != "upper" && name != "e" &&
      name != "escape" && name != "select" && name != "reject" && name != "selectattr" &&
      name != "rejectattr" && name != "map" && name != "unique" && name != "reverse" &&
      name != "sort" && name != "pprint" && name != "capitalize" && name != "title" &&
      name != "wordcount" && name != "replace" && name != "indent" && name != "int" &&
      name != "float" && name != "sum" && name != "min" && name != "max") {
    return ev.undefined_error(operand);
  }
  return it->second(ev, operand, args);
}

Result<bool> apply_test(Evaluator& ev, const std::string& name, const Value& operand,
                        const CallArgs& args) {
  return run_test(ev, name, operand, args);
}

Result<Value> get_attr(Evaluator& ev, const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case K::kUndefined: return ev.undefined_error(obj);
    case K::kDict: {
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        Value self = obj;
        return make_callable(name, [self, name](Evaluator& e, const CallArgs& a) {
          return dict_method(e, self, name, a);
        });
      }
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    }
    case K::kNamespace: {
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    }
    case K::kString: {
      if (is_string_method(name)) {
        Value self = obj;
        return make_callable(name, [self, name](Evaluator& e, const CallArgs& a) {
          return string_method(e, self.s(), name, a);
        });
      }
      break;
    }
    default: break;
  }
  return Value::undefined(
      str_format("'%s object' has no attribute '%s'", obj.type_name(), name.c_str()));
}

Result<Value> get_item(Evaluator& ev, const Value& obj, const Value& key) {
  if (obj.is_undefined()) return ev.undefined_error(obj);
  int64_t idx;
  if ((obj.is_list() || obj.is_string()) && get_int(key, &idx)) {
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      int64_t k = idx < 0 ? idx + n : idx;
      if (k >= 0 && k < n) return (*obj.list)[static_cast<size_t>(k)];
    } else {
      const std::string& s = obj.s();
      bool ascii = std::all_of(s.begin(), s.end(),
                               [](char c) { return static_cast<unsigned char>(c) < 0x80; });
      int64_t n = ascii ? static_cast<int64_t>(s.size())
                        : static_cast<int64_t>(utf8::length(s, kStrDecoding));
      int64_t k = idx < 0 ? idx + n : idx;
      if (k >= 0 && k < n) {
        if (ascii) return Value::string(std::string(1, s[static_cast<size_t>(k)]));
        std::u32string d = utf8::decode(s, kStrDecoding);
        return Value::string(utf8::encode(std::u32string(1, d[static_cast<size_t>(k)])));
      }
    }
    return Value::undefined(str_format("'%s object' has no element %lld", obj.type_name(),
                                   (long long)idx));
  }
  if (key.is_string()) {
    if (obj.is_dict()) {
      if (const Value* v = obj.dict->find(key.s())) return *v;
    }
    return get_attr(ev, obj, key.s());
  }
  if (key.is_undefined()) return ev.undefined_error(key);
  return Value::undefined(
      str_format("'%s object' has no element %s", obj.type_name(), to_repr(key).c_str()));
}

Value global_function(const std::string& name) {
  static const std::map<std::string, Value> kGlobals = [] {
    std::map<std::string, Value> g;
    auto add = [&](const char* n, Result<Value> (*fn)(Evaluator&, const CallArgs&)) {
      auto c = std::make_shared<Callable>();
      c->name = n;
      c->fn = fn;
      g[n] = Value::callable(std::move(c));
    };
    add("range", g_range);
    add("namespace", g_namespace);
    add("dict", dict_from_args);
    add("raise_exception", g_raise);
    add("strftime_now", g_strftime_now);
    return g;
  }();
  auto it = kGlobals.find(name);
  return it == kGlobals.end() ? Value::undefined() : it->second;
}

Result<List> iterate(Evaluator& ev, const Value& v) {
  switch (v.kind) {
    case K::kList:
      OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(v.list->size() / 8)));
      return *v.list;
    case K::kDict: {
      List keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case K::kString: {
      std::u32string d = utf8::decode(v.s(), kStrDecoding);
      OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(d.size())));
      List chars;
      chars.reserve(d.size());
      for (char32_t c : d) chars.push_back(Value::string(utf8::encode(std::u32string(1, c))));
      return chars;
    }
    case K::kUndefined: return List{};
    default: return ev.fail(str_format("'%s' object is not iterable", v.type_name()));
  }
}

Result<Value> binary_op(Evaluator& ev, const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a);
    std::string t = to_str(b);
    OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(s.size() + t.size())));
    OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>((s.size() + t.size()) / 32)));
    return Value::string(s + t);
  }
  if (op == "%" && a.is_string()) {  // printf-style; an Undefined argument formats as ""
    OSCAR_ASSIGN_OR_RETURN(std::string r, printf_format(ev, a.s(), b));
    return Value::string(std::move(r));
  }
  if (a.is_undefined()) return ev.undefined_error(a);
  if (b.is_undefined()) return ev.undefined_error(b);
  auto type_error = [&]() {
    return ev.fail(str_format("unsupported operand type(s) for %s: '%s' and '%s'", op.c_str(),
                          a.type_name(), b.type_name()));
  };
  if (a.is_number() && b.is_number()) {
    bool ints = is_int_like(a) && is_int_like(b);
    int64_t x = 0, y = 0, r = 0;
    get_int(a, &x);
    get_int(b, &y);
    double p = num(a), q = num(b);
    if (op == "+" || op == "-" || op == "*") {
      if (!ints) return Value::real(op == "+" ? p + q : op == "-" ? p - q : p * q);
      bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                      : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                  : __builtin_mul_overflow(x, y, &r);
      if (overflow) return ev.fail("integer overflow");
      return Value::integer(r);
    }
    if (op == "/") {
      if (q == 0.0) return ev.fail("division by zero");
      return Value::real(p / q);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) return ev.fail("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return ev.fail("integer overflow");
        int64_t quot = x / y, rem = x % y;
        if (rem != 0 && ((rem < 0) != (y < 0))) {
          --quot;
          rem += y;
        }
        return Value::integer(op == "//" ? quot : rem);
      }
      if (q == 0.0) return ev.fail("float division or modulo by zero");
      if (op == "//") return Value::real(std::floor(p / q));
      double m = std::fmod(p, q);
      if (m != 0.0 && ((m < 0) != (q < 0))) m += q;
      return Value::real(m);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1, base = x, e = y;
        while (e > 0) {
          if (e & 1) {
            if (__builtin_mul_overflow(result, base, &result)) return ev.fail("integer overflow");
          }
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) return ev.fail("integer overflow");
        }
        return Value::integer(result);
      }
      if (p == 0.0 && q < 0) return ev.fail("zero cannot be raised to a negative power");
      return Value::real(std::pow(p, q));
    }
    return type_error();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      OSCAR_RETURN_IF_ERROR(ev.check_size(static_cast<int64_t>(a.s().size() + b.s().size())));
      OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>((a.s().size() + b.s().size()) / 32)));
      return Value::string(a.s() + b.s());
    }
    if (a.is_list() && b.is_list()) {
      if (a.tuple != b.tuple) {
        return ev.fail(str_format("can only concatenate %s (not \"%s\") to %s",
                                  a.tuple ? "tuple" : "list", b.tuple ? "tuple" : "list",
                                  a.tuple ? "tuple" : "list"));
      }
      OSCAR_RETURN_IF_ERROR(
          ev.check_size(static_cast<int64_t>(a.list->size() + b.list->size())));
      OSCAR_RETURN_IF_ERROR(ev.charge(static_cast<int64_t>(a.list->size() + b.list->size())));
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return a.tuple ? Value::from_tuple(std::move(out)) : Value::from_list(std::move(out));
    }
    return type_error();
  }
  if (op == "*") {
    const Value& seq = is_int_like(a) ? b : a;
    const Value& times = is_int_like(a) ? a : b;
    int64_t n;
    if (!get_int(times, &n) || !(seq.is_string() || seq.is_list())) return type_error();
    n = std::max<int64_t>(n, 0);
    int64_t unit = seq.is_string() ? static_cast<int64_t>(seq.s().size())
                                   : static_cast<int64_t>(seq.list->size());
    if (unit > 0 && n > ev.limits().max_output_bytes / unit + 1) {
      return ev.check_size(ev.limits().max_output_bytes + 1);
    }
    OSCAR_RETURN_IF_ERROR(ev.check_size(unit * n));
    OSCAR_RETURN_IF_ERROR(ev.charge(unit * n / 32));
    if (seq.is_string()) {
      std::string out;
      out.reserve(static_cast<size_t>(unit * n));
      for (int64_t k = 0; k < n; ++k) out += seq.s();
      return Value::string(std::move(out));
    }
    List out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
    return seq.tuple ? Value::from_tuple(std::move(out)) : Value::from_list(std::move(out));
  }
  return type_error();
}

Result<bool> compare_op(Evaluator& ev, const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return values_equal(a, b);
  if (op == "!=") return !values_equal(a, b);
  if (op == "in") return contains(ev, a, b);
  if (op == "notin") {
    OSCAR_ASSIGN_OR_RETURN(bool r, contains(ev, a, b));
    return !r;
  }
  if (op == "<") return py_less(ev, a, b);
  if (op == ">") return py_less(ev, b, a);
  if (op == "<=") {
    OSCAR_ASSIGN_OR_RETURN(bool r, py_less(ev, b, a));
    return !r;
  }
  if (op == ">=") {
    OSCAR_ASSIGN_OR_RETURN(bool r, py_less(ev, a, b));
    return !r;
  }
  return ev.fail(str_format("unknown comparison '%s'", op.c_str()));
}

}  // namespace oscar::jinja
