// JsonSchema (the compiler) and JsonSchemaPrefix (the character machine); see json_schema.h.
#include "engine/json_schema.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <deque>
#include <map>
#include <set>

namespace oscar::engine {

using json = nlohmann::ordered_json;
using Kind = JsonSchema::Kind;
using Node = JsonSchema::Node;

namespace {

constexpr int64_t kInf = JsonSchema::kInfinite;

int64_t add(int64_t a, int64_t b) { return std::min(kInf, a + b); }
int64_t mul(int64_t a, int64_t b) {  // a, b >= 0, saturating at kInf
  if (a == 0 || b == 0) return 0;
  return a >= kInf || b >= kInf || a > kInf / b ? kInf : a * b;
}

int64_t pow10(int k) {
  int64_t p = 1;
  for (int i = 0; i < k; ++i) p *= 10;
  return p;
}

int number_scale(const Node& n) { return n.integer ? 0 : JsonSchema::kNumberFracDigits; }
int number_int_digits(const Node& n) {
  return n.integer ? JsonSchema::kIntegerDigits : JsonSchema::kNumberIntDigits;
}

// ---- numbers: a prefix is its sign, its digits as one integer A (integer and fraction digits),
// how many of each, and whether the dot was written. Values are in units of 10^-scale.
enum NumPhase : uint8_t { kNumStart, kNumMinus, kNumInt, kNumDot, kNumFrac };

// Some D in [d_lo, d_hi] has D * mult in [m_lo, m_hi] (all >= 0 but m_hi, which may be < 0).
bool any_in(int64_t d_lo, int64_t d_hi, int64_t mult, int64_t m_lo, int64_t m_hi) {
  if (m_hi < 0 || d_lo > d_hi) return false;
  const int64_t lo = std::max(d_lo, (m_lo + mult - 1) / mult);
  const int64_t hi = std::min(d_hi, m_hi / mult);
  return lo <= hi;
}

// The fewest characters that finish the number (phase, negative, A, integer digits, fraction
// digits) within the node's bounds; -1 when none does.
int64_t number_rest(const Node& n, uint8_t phase, bool neg, int64_t a, int n_int, int f) {
  const int scale = number_scale(n);
  const int max_int = number_int_digits(n);
  if (phase == kNumStart) {
    const int64_t pos = number_rest(n, kNumMinus, false, 0, 0, 0);
    const int64_t negative = number_rest(n, kNumMinus, true, 0, 0, 0);
    if (negative < 0) return pos;
    if (pos < 0) return negative + 1;
    return std::min(pos, negative + 1);
  }
  // The magnitudes allowed.
  const int64_t m_lo = neg ? std::max<int64_t>(-n.hi, 0) : std::max<int64_t>(n.lo, 0);
  const int64_t m_hi = neg ? -n.lo : n.hi;
  if (phase == kNumDot || phase == kNumFrac) {
    for (int j = f == 0 ? 1 : 0; f + j <= scale; ++j) {
      const int64_t p = pow10(j);
      if (any_in(a * p, a * p + p - 1, pow10(scale - f - j), m_lo, m_hi)) return j;
    }
    return -1;
  }
  int64_t best = -1;
  for (int i = 0; n_int + i <= max_int; ++i) {
    if (n_int == 0 && i == 0) continue;
    if (n_int >= 1 && a == 0 && i > 0) break;  // "0" takes no more integer digits
    if (best >= 0 && i >= best) break;
    const int64_t p = pow10(i);
    const int64_t d_lo = a * p + (n_int == 0 && i >= 2 ? p / 10 : 0);
    const int64_t d_hi = a * p + p - 1;
    if (any_in(d_lo, d_hi, pow10(scale), m_lo, m_hi)) {
      best = i;
      break;
    }
    for (int j = 1; j <= scale; ++j) {
      const int64_t q = pow10(j);
      if (any_in(d_lo * q, d_hi * q + q - 1, pow10(scale - j), m_lo, m_hi)) {
        if (best < 0 || i + 1 + j < best) best = i + 1 + j;
        break;
      }
    }
  }
  return best;
}

// A bound in units of 10^-scale: lower bounds round up, upper ones down (exact within 1e-9).
int64_t scaled_bound(double x, int scale, bool lower, bool exclusive, int64_t limit) {
  const long double y = static_cast<long double>(x) * static_cast<long double>(pow10(scale));
  if (y >= static_cast<long double>(limit)) return lower ? limit + 1 : limit;
  if (y <= -static_cast<long double>(limit)) return lower ? -limit : -limit - 1;
  const long double r = std::round(y);
  int64_t v;
  if (std::fabs(y - r) <= 1e-9L * std::max(1.0L, std::fabs(y))) {
    v = static_cast<int64_t>(r);
    if (exclusive) v += lower ? 1 : -1;
  } else {
    v = static_cast<int64_t>(lower ? std::ceil(y) : std::floor(y));
  }
  return v;
}

bool is_annotation(const std::string& k) {
  static const std::set<std::string> kAnnotations = {
      "title",   "description", "$schema",  "$id",       "$comment", "examples",
      "default", "deprecated",  "readOnly", "writeOnly", "$defs",    "definitions"};
  return kAnnotations.count(k) > 0;
}

bool is_supported(const std::string& k) {
  static const std::set<std::string> kSupported = {"type",
                                                   "properties",
                                                   "required",
                                                   "additionalProperties",
                                                   "items",
                                                   "minItems",
                                                   "maxItems",
                                                   "enum",
                                                   "const",
                                                   "anyOf",
                                                   "$ref",
                                                   "minimum",
                                                   "maximum",
                                                   "exclusiveMinimum",
                                                   "exclusiveMaximum",
                                                   "minLength",
                                                   "maxLength",
                                                   "pattern",
                                                   "format"};
  return kSupported.count(k) > 0;
}

std::string pointer_token(const std::string& key) {  // RFC 6901 escaping
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

bool value_has_type(const json& v, const std::string& type) {
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_number_integer() || v.is_number_unsigned() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return type == type_name(v);
}

// The built-in patterns of the formats (a subset of each format's strings where exactness would
// cost too much: no IPv4-in-IPv6 or zone forms, no hostname total-length limit); nullptr for the
// formats that are only annotations here.
const char* format_pattern(const std::string& format) {
  static const std::map<std::string, std::string> kFormats = [] {
    const std::string date =
        R"((?:\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))|(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29))";
    const std::string time =
        R"((?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
    const std::string label = R"([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
    const std::string h16 = "[0-9A-Fa-f]{1,4}";
    const std::string ipv6 =
        "(?:(?:" + h16 + ":){7}" + h16 + "|(?:" + h16 + ":){1,7}:|(?:" + h16 + ":){1,6}:" + h16 +
        "|(?:" + h16 + ":){1,5}(?::" + h16 + "){1,2}|(?:" + h16 + ":){1,4}(?::" + h16 +
        "){1,3}|(?:" + h16 + ":){1,3}(?::" + h16 + "){1,4}|(?:" + h16 + ":){1,2}(?::" + h16 +
        "){1,5}|" + h16 + ":(?::" + h16 + "){1,6}|:(?:(?::" + h16 + "){1,7}|:))";
    const std::string octet = R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
    return std::map<std::string, std::string>{
        {"date", "^" + date + "$"},
        {"time", "^" + time + "$"},
        {"date-time", "^" + date + "T" + time + "$"},
        {"uuid",
         R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)"},
        {"email", R"(^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@)" +
                      label + R"((?:\.)" + label + ")+$"},
        {"ipv4", "^(?:" + octet + R"(\.){3})" + octet + "$"},
        {"ipv6", "^" + ipv6 + "$"},
        {"hostname", "^" + label + R"((?:\.)" + label + ")*$"},
        {"uri", R"(^[A-Za-z][A-Za-z0-9+.\-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*$)"},
    };
  }();
  auto it = kFormats.find(format);
  return it == kFormats.end() ? nullptr : it->second.c_str();
}

// JSON bytes that write byte b of the string's content at a character boundary: 1, 2 for the
// escapes the machine writes (\" \\ \b \f \n \r \t), 0 for a byte it never writes (the other
// control characters; \u escapes are not written under a pattern).
int write_cost(int b) {
  if (b == '"' || b == '\\' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t')
    return 2;
  return b < 0x20 ? 0 : 1;
}

// The decoded byte of the escape `\c` under a pattern; -1 for none (\u included).
int escaped_byte(unsigned char c) {
  switch (c) {
    case '"':
      return '"';
    case '\\':
      return '\\';
    case '/':
      return '/';
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return -1;
  }
}
constexpr unsigned char kEscapes[] = {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'};

// p.cost by layers: E_k[s], the fewest bytes that finish with exactly k more code points (at
// least k when there is no maxLength), k = 0..L; a character's count goes to its first byte, so
// a state mid-character takes its continuation bytes within the same layer.
void fill_costs(JsonSchema::StringPattern* p) {
  using SP = JsonSchema::StringPattern;
  const RegexDfa& d = *p->dfa;
  const size_t n = d.n_states(), nc = d.n_classes(), cols = static_cast<size_t>(p->columns);
  const bool bounded = p->max_count != INT64_MAX;
  std::vector<int> class_cost(nc, 0);
  for (int b = 0; b < 256; ++b) {
    const int c = write_cost(b), k = d.byte_class(static_cast<unsigned char>(b));
    if (c > 0 &&
        (class_cost[static_cast<size_t>(k)] == 0 || c < class_cost[static_cast<size_t>(k)]))
      class_cost[static_cast<size_t>(k)] = c;
  }
  auto plus = [](int32_t a, int c) { return a == SP::kNone ? SP::kNone : a + c; };
  // One step over state s's characters (pending 0) or continuation bytes, from `from`.
  auto relax = [&](size_t s, const std::vector<int32_t>& from) {
    int32_t best = SP::kNone;
    for (size_t k = 0; k < nc; ++k) {
      const int32_t t = d.next_class(static_cast<int32_t>(s), static_cast<int>(k));
      if (t == RegexDfa::kDead || class_cost[k] == 0) continue;
      best = std::min(best, plus(from[static_cast<size_t>(t)], class_cost[k]));
    }
    return best;
  };
  std::vector<std::vector<int32_t>> layer(cols, std::vector<int32_t>(n, SP::kNone));
  // Layer 0: bounded, finish the character and stop; unbounded, any completion (Dijkstra).
  if (bounded) {
    for (size_t s = 0; s < n; ++s)
      if (d.pending(static_cast<int32_t>(s)) == 0 && d.accepting(static_cast<int32_t>(s)))
        layer[0][s] = 0;
  } else {
    std::vector<std::vector<std::pair<int32_t, int>>> back(n);
    for (size_t s = 0; s < n; ++s)
      for (size_t k = 0; k < nc; ++k) {
        const int32_t t = d.next_class(static_cast<int32_t>(s), static_cast<int>(k));
        if (t != RegexDfa::kDead && class_cost[k] > 0)
          back[static_cast<size_t>(t)].push_back({static_cast<int32_t>(s), class_cost[k]});
      }
    std::vector<int32_t>& dist = layer[0];
    std::set<std::pair<int32_t, int32_t>> queue;
    for (size_t s = 0; s < n; ++s)
      if (d.accepting(static_cast<int32_t>(s))) {
        dist[s] = 0;
        queue.insert({0, static_cast<int32_t>(s)});
      }
    while (!queue.empty()) {
      const auto [ds, t] = *queue.begin();
      queue.erase(queue.begin());
      for (const auto& [s, c] : back[static_cast<size_t>(t)]) {
        if (ds + c >= dist[static_cast<size_t>(s)]) continue;
        queue.erase({dist[static_cast<size_t>(s)], s});
        dist[static_cast<size_t>(s)] = ds + c;
        queue.insert({ds + c, s});
      }
    }
  }
  for (size_t k = 0; k < cols; ++k) {
    if (k > 0)
      for (size_t s = 0; s < n; ++s)
        if (d.pending(static_cast<int32_t>(s)) == 0) layer[k][s] = relax(s, layer[k - 1]);
    if (k > 0 || bounded)
      for (int pending = 1; pending <= 3; ++pending)
        for (size_t s = 0; s < n; ++s)
          if (d.pending(static_cast<int32_t>(s)) == pending) layer[k][s] = relax(s, layer[k]);
  }
  p->cost.assign(n * cols, SP::kNone);
  // Bounded: column r (r = max_count - code points) takes any k in [r - (max - min), r].
  const int64_t spread = bounded ? p->max_count - p->min_count : 0;
  std::deque<size_t> window;  // layers in the window, their costs increasing
  for (size_t s = 0; s < n; ++s) {
    window.clear();
    for (size_t r = 0; r < cols; ++r) {
      if (!bounded) {
        p->cost[s * cols + r] = layer[r][s];
        continue;
      }
      while (!window.empty() && layer[window.back()][s] >= layer[r][s]) window.pop_back();
      window.push_back(r);
      if (static_cast<int64_t>(window.front()) < static_cast<int64_t>(r) - spread)
        window.pop_front();
      p->cost[s * cols + r] = layer[window.front()][s];
    }
  }
}

}  // namespace

// ---- the compiler ----

struct SchemaCompiler {
  const json& root;
  JsonSchema out;
  std::map<std::string, int32_t> by_pointer;  // compiled locations ("#/properties/a")
  std::map<std::string, int32_t> pattern_cache;  // patterns and lengths -> out.patterns_
  size_t pattern_cells = 0;
  int32_t any_node = -1;
  Status error;

  explicit SchemaCompiler(const json& r) : root(r) {}

  int32_t reserve() {
    if (out.nodes_.size() >= JsonSchema::kMaxNodes) {
      fail("the schema has more than %zu nodes", JsonSchema::kMaxNodes);
      return -1;
    }
    out.nodes_.emplace_back();
    return static_cast<int32_t>(out.nodes_.size() - 1);
  }
  void fail(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (!error.ok()) return;
    va_list args;
    va_start(args, fmt);
    error = Status(StatusCode::kInvalidArgument, str_vformat(fmt, args));
    va_end(args);
  }
  int32_t add_node(Node n) {
    const int32_t id = reserve();
    if (id >= 0) out.nodes_[static_cast<size_t>(id)] = std::move(n);
    return id;
  }

  // Any JSON value: anyOf [map of any, array of any, string, number, false/null/true].
  int32_t any() {
    if (any_node >= 0) return any_node;
    any_node = reserve();
    if (any_node < 0) return -1;
    Node map;
    map.kind = Kind::kMap;
    map.items = any_node;
    Node arr;
    arr.kind = Kind::kArray;
    arr.items = any_node;
    Node str;
    str.kind = Kind::kString;
    Node num = number_node(false);
    Node lit;
    lit.kind = Kind::kEnum;
    lit.literals = {"false", "null", "true"};
    Node a;
    a.kind = Kind::kAnyOf;
    a.options = {add_node(std::move(map)), add_node(std::move(arr)), add_node(std::move(str)),
                 add_node(std::move(num)), add_node(std::move(lit))};
    out.nodes_[static_cast<size_t>(any_node)] = std::move(a);
    return any_node;
  }

  static Node number_node(bool integer) {
    Node n;
    n.kind = Kind::kNumber;
    n.integer = integer;
    const int64_t limit = pow10(number_int_digits(n) + number_scale(n)) - 1;
    n.lo = -limit;
    n.hi = limit;
    return n;
  }

  // A non-negative integer keyword (minItems, maxLength, ...).
  bool count_keyword(const json& s, const char* key, const std::string& ptr, int64_t* out_v) {
    auto it = s.find(key);
    if (it == s.end()) return true;
    if (!(it->is_number_integer() || it->is_number_unsigned()) || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > (int64_t{1} << 40)) {
      fail("'%s' (at %s) must be a non-negative integer", key, ptr.c_str());
      return false;
    }
    *out_v = it->get<int64_t>();
    return true;
  }

  int32_t compile(const json& s, const std::string& ptr) {
    if (!error.ok()) return -1;
    if (auto it = by_pointer.find(ptr); it != by_pointer.end()) return it->second;
    if (s.is_boolean()) {
      if (!s.get<bool>()) {
        fail("the schema false (at %s) admits no value", ptr.c_str());
        return -1;
      }
      return by_pointer[ptr] = any();
    }
    if (!s.is_object()) {
      fail("the schema at %s must be an object or a boolean, got %s", ptr.c_str(), type_name(s));
      return -1;
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (!is_supported(it.key()) && !is_annotation(it.key())) {
        fail("'%s' (at %s) is not supported", it.key().c_str(), ptr.c_str());
        return -1;
      }
    }
    const int32_t id = reserve();
    if (id < 0) return -1;
    by_pointer[ptr] = id;
    Node n = build(s, ptr);
    if (!error.ok()) return -1;
    out.nodes_[static_cast<size_t>(id)] = std::move(n);
    return id;
  }

  // 'pattern' and a known 'format' of string node n: its StringPattern (both must match; the
  // other formats are annotations).
  void string_pattern(const json& s, const std::string& ptr, Node* n) {
    std::vector<std::string> patterns;
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) {
        fail("'pattern' (at %s) must be a string", ptr.c_str());
        return;
      }
      patterns.push_back(it->get<std::string>());
      if (auto alone = RegexDfa::compile(patterns); !alone.ok()) {
        fail("'pattern' (at %s): %s", ptr.c_str(), alone.status().message().c_str());
        return;
      }
    }
    std::string format;
    if (auto it = s.find("format"); it != s.end()) {
      if (!it->is_string()) {
        fail("'format' (at %s) must be a string", ptr.c_str());
        return;
      }
      if (const char* f = format_pattern(it->get<std::string>())) {
        patterns.push_back(f);
        format = it->get<std::string>();
      }
    }
    if (patterns.empty()) return;
    const std::string what = format.empty()         ? std::string("'pattern'")
                             : patterns.size() == 1 ? "'format' " + format
                                                    : "'pattern' and 'format' " + format;
    std::string key;
    for (const std::string& p : patterns) key += p + '\0';
    key += std::to_string(n->min_count) + "," + std::to_string(n->max_count);
    if (auto it = pattern_cache.find(key); it != pattern_cache.end()) {
      n->pattern = it->second;
      return;
    }
    auto dfa = RegexDfa::compile(patterns);
    if (!dfa.ok()) {
      fail("%s (at %s): %s", what.c_str(), ptr.c_str(), dfa.status().message().c_str());
      return;
    }
    JsonSchema::StringPattern p;
    p.dfa = std::make_shared<const RegexDfa>(std::move(dfa.value()));
    p.min_count = n->min_count;
    p.max_count = n->max_count;
    const int64_t length = n->max_count != INT64_MAX ? n->max_count : n->min_count;
    const size_t states = p.dfa->n_states(), limit = JsonSchema::kMaxPatternCells;
    const size_t cells = static_cast<size_t>(std::min<int64_t>(length + 1, int64_t{1} << 40));
    if (cells > limit || pattern_cells + states * (cells + p.dfa->n_classes()) > limit) {
      fail(
          "%s (at %s) with 'minLength' %lld / 'maxLength' %s needs %zu automaton states x %zu "
          "lengths; the schema's patterns may use %zu cells",
          what.c_str(), ptr.c_str(), static_cast<long long>(n->min_count),
          n->max_count == INT64_MAX ? "none" : std::to_string(n->max_count).c_str(), states, cells,
          limit - pattern_cells);
      return;
    }
    pattern_cells += states * (cells + p.dfa->n_classes());
    p.columns = static_cast<int64_t>(cells);
    fill_costs(&p);
    if (p.rest(p.dfa->start(), 0) == JsonSchema::StringPattern::kNone) {
      fail("no string (at %s) matches its %s within its 'minLength' / 'maxLength'", ptr.c_str(),
           what.c_str());
      return;
    }
    n->pattern = static_cast<int32_t>(out.patterns_.size());
    pattern_cache[key] = n->pattern;
    out.patterns_.push_back(std::move(p));
  }

  // The constraining keywords of s other than those listed.
  std::string other_keyword(const json& s, std::initializer_list<const char*> allowed) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (is_annotation(it.key())) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || it.key() == a;
      if (!ok) return it.key();
    }
    return "";
  }

  Node alias(int32_t target) {
    Node n;
    n.kind = Kind::kAnyOf;
    n.options = {target};
    return n;
  }

  Node build(const json& s, const std::string& ptr) {
    if (auto r = s.find("$ref"); r != s.end()) {
      if (std::string k = other_keyword(s, {"$ref"}); !k.empty()) {
        fail("'$ref' beside '%s' (at %s) is not supported", k.c_str(), ptr.c_str());
        return {};
      }
      if (!r->is_string() || r->get<std::string>().rfind('#', 0) != 0) {
        fail("'$ref' (at %s) must point into this schema (\"#...\"), got %s", ptr.c_str(),
             r->dump().c_str());
        return {};
      }
      const std::string ref = r->get<std::string>();
      const json* target = nullptr;
      try {
        target = &root.at(json::json_pointer(ref.substr(1)));
      } catch (const json::exception&) {
        fail("'$ref' %s (at %s) points at nothing", ref.c_str(), ptr.c_str());
        return {};
      }
      return alias(compile(*target, ref));
    }
    if (auto a = s.find("anyOf"); a != s.end()) {
      if (std::string k = other_keyword(s, {"anyOf"}); !k.empty()) {
        fail("'anyOf' beside '%s' (at %s) is not supported", k.c_str(), ptr.c_str());
        return {};
      }
      if (!a->is_array() || a->empty()) {
        fail("'anyOf' (at %s) must be a non-empty array", ptr.c_str());
        return {};
      }
      Node n;
      n.kind = Kind::kAnyOf;
      for (size_t i = 0; i < a->size(); ++i)
        n.options.push_back(compile((*a)[i], ptr + "/anyOf/" + std::to_string(i)));
      return n;
    }
    // The types allowed.
    std::vector<std::string> types;
    if (auto t = s.find("type"); t != s.end()) {
      static const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                                   "integer", "boolean", "null"};
      const json list = t->is_array() ? *t : json::array({*t});
      for (const json& v : list) {
        if (!v.is_string() || !kTypes.count(v.get<std::string>())) {
          fail(
              "'type' (at %s) has %s; the types are object, array, string, number, integer, "
              "boolean and null",
              ptr.c_str(), v.dump().c_str());
          return {};
        }
        if (std::find(types.begin(), types.end(), v.get<std::string>()) == types.end())
          types.push_back(v.get<std::string>());
      }
      if (types.empty()) {
        fail("'type' (at %s) is an empty list", ptr.c_str());
        return {};
      }
    }
    if (s.contains("enum") || s.contains("const")) return build_enum(s, ptr, types);
    if (types.empty()) {  // inferred from the keywords (a valid choice: any type is allowed)
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        types = {"object"};
      else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
        types = {"array"};
      else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
               s.contains("format"))
        types = {"string"};
      else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum"))
        types = {"number"};
      else
        return alias(any());
    }
    if (types.size() == 1) return build_typed(s, ptr, types[0]);
    Node n;
    n.kind = Kind::kAnyOf;
    for (const std::string& t : types) n.options.push_back(add_node(build_typed(s, ptr, t)));
    return n;
  }

  Node build_enum(const json& s, const std::string& ptr, const std::vector<std::string>& types) {
    if (std::string k = other_keyword(s, {"enum", "const", "type"}); !k.empty()) {
      fail("'%s' beside 'enum' or 'const' (at %s) is not supported", k.c_str(), ptr.c_str());
      return {};
    }
    json values = json::array();
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) {
        fail("'enum' (at %s) must be a non-empty array", ptr.c_str());
        return {};
      }
      values = *e;
    }
    if (auto c = s.find("const"); c != s.end()) {
      if (s.contains("enum")) {
        json kept = json::array();
        for (const json& v : values)
          if (v == *c) kept.push_back(v);
        values = kept;
      } else {
        values = json::array({*c});
      }
    }
    Node n;
    n.kind = Kind::kEnum;
    for (const json& v : values) {
      bool typed = types.empty();
      for (const std::string& t : types) typed = typed || value_has_type(v, t);
      if (!typed) continue;
      std::string text = v.dump(-1, ' ', false, json::error_handler_t::strict);
      if (std::find(n.literals.begin(), n.literals.end(), text) == n.literals.end())
        n.literals.push_back(std::move(text));
    }
    if (n.literals.empty()) {
      fail("no value of 'enum' / 'const' (at %s) matches its 'type'", ptr.c_str());
      return {};
    }
    std::sort(n.literals.begin(), n.literals.end());
    return n;
  }

  Node build_typed(const json& s, const std::string& ptr, const std::string& type) {
    Node n;
    if (type == "boolean" || type == "null") {
      n.kind = Kind::kEnum;
      n.literals = type == "null" ? std::vector<std::string>{"null"}
                                  : std::vector<std::string>{"false", "true"};
      return n;
    }
    if (type == "string") {
      n.kind = Kind::kString;
      if (!count_keyword(s, "minLength", ptr, &n.min_count)) return n;
      if (!count_keyword(s, "maxLength", ptr, &n.max_count)) return n;
      if (n.min_count > n.max_count)
        fail("'minLength' %lld > 'maxLength' %lld (at %s)", static_cast<long long>(n.min_count),
             static_cast<long long>(n.max_count), ptr.c_str());
      else
        string_pattern(s, ptr, &n);
      return n;
    }
    if (type == "number" || type == "integer") {
      n = number_node(type == "integer");
      const int scale = number_scale(n);
      const int64_t limit = n.hi;
      for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
        auto it = s.find(key);
        if (it == s.end()) continue;
        if (!it->is_number()) {
          fail("'%s' (at %s) must be a number, got %s", key, ptr.c_str(), type_name(*it));
          return n;
        }
        const std::string k = key;
        const bool lower = k == "minimum" || k == "exclusiveMinimum";
        const bool exclusive = k[0] == 'e';
        const int64_t b = scaled_bound(it->get<double>(), scale, lower, exclusive, limit);
        if (lower)
          n.lo = std::max(n.lo, b);
        else
          n.hi = std::min(n.hi, b);
      }
      if (n.lo > n.hi)
        fail("no %s (at %s) satisfies its bounds%s", type.c_str(), ptr.c_str(),
             type == "number" ? " with at most 6 fraction digits" : "");
      return n;
    }
    if (type == "array") {
      n.kind = Kind::kArray;
      if (!count_keyword(s, "minItems", ptr, &n.min_count)) return n;
      if (!count_keyword(s, "maxItems", ptr, &n.max_count)) return n;
      if (n.min_count > n.max_count) {
        fail("'minItems' > 'maxItems' (at %s)", ptr.c_str());
        return n;
      }
      auto it = s.find("items");
      if (it != s.end() && !it->is_object() && !it->is_boolean()) {
        fail("'items' (at %s) must be a schema (tuple 'items' arrays are not supported)",
             ptr.c_str());
        return n;
      }
      if (it != s.end() && it->is_boolean() && !it->get<bool>()) {
        n.max_count = 0;
        n.min_count = std::min<int64_t>(n.min_count, 0);
        n.items = any();
        return n;
      }
      n.items = it == s.end() ? any() : compile(*it, ptr + "/items");
      return n;
    }
    // object
    n.kind = Kind::kObject;
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) {
        fail("'properties' (at %s) must be an object", ptr.c_str());
        return n;
      }
      for (auto it = p->begin(); it != p->end(); ++it) {
        JsonSchema::Prop prop;
        prop.quoted = json(it.key()).dump(-1, ' ', false, json::error_handler_t::strict);
        prop.node = compile(it.value(), ptr + "/properties/" + pointer_token(it.key()));
        n.props.push_back(std::move(prop));
      }
    }
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) {
        fail("'required' (at %s) must be an array of names", ptr.c_str());
        return n;
      }
      for (const json& name : *r) {
        bool found = false;
        if (name.is_string()) {
          const std::string q = json(name).dump(-1, ' ', false, json::error_handler_t::strict);
          for (JsonSchema::Prop& prop : n.props)
            if (prop.quoted == q) found = prop.required = true;
        }
        if (!found) {
          fail("'required' (at %s) names %s, which is not in 'properties'", ptr.c_str(),
               name.dump().c_str());
          return n;
        }
      }
    }
    auto ap = s.find("additionalProperties");
    if (ap != s.end() && !ap->is_boolean() && !ap->is_object()) {
      fail("'additionalProperties' (at %s) must be a boolean or a schema", ptr.c_str());
      return n;
    }
    if (n.props.empty()) {                                                  // a map
      if (ap != s.end() && ap->is_boolean() && !ap->get<bool>()) return n;  // only {}
      n.kind = Kind::kMap;
      n.items =
          ap == s.end() || ap->is_boolean() ? any() : compile(*ap, ptr + "/additionalProperties");
      return n;
    }
    if (ap != s.end() && ap->is_object()) {
      // Checked, not used: objects with properties get no others.
      compile(*ap, ptr + "/additionalProperties");
    }
    return n;
  }

  // min_bytes and min_depth by fixpoint (recursion included), then the object tables.
  void derive() {
    std::vector<Node>& nodes = out.nodes_;
    auto mb = [&](int32_t i) { return nodes[static_cast<size_t>(i)].min_bytes; };
    auto md = [&](int32_t i) { return nodes[static_cast<size_t>(i)].min_depth; };
    for (Node& n : nodes) {
      n.min_bytes = kInf;
      n.min_depth = JsonSchema::kMaxDepth + 1;
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (Node& n : nodes) {
        int64_t bytes = kInf;
        int32_t depth = JsonSchema::kMaxDepth + 1;
        switch (n.kind) {
          case Kind::kObject: {
            bytes = 2;
            depth = 1;
            int64_t n_req = 0;
            for (const JsonSchema::Prop& p : n.props) {
              if (!p.required) continue;
              bytes = add(bytes, add(static_cast<int64_t>(p.quoted.size()) + 1, mb(p.node)));
              depth = std::max(depth, 1 + md(p.node));
              ++n_req;
            }
            if (n_req > 1) bytes = add(bytes, n_req - 1);
            break;
          }
          case Kind::kMap:
            bytes = 2;
            depth = 1;
            break;
          case Kind::kArray:
            bytes =
                n.min_count == 0 ? 2 : add(2 + (n.min_count - 1), mul(mb(n.items), n.min_count));
            depth = n.min_count == 0 ? 1 : 1 + md(n.items);
            break;
          case Kind::kString:
            bytes = add(2, n.pattern < 0 ? n.min_count
                                         : out.pattern(n.pattern).rest(
                                               out.pattern(n.pattern).dfa->start(), 0));
            depth = 1;
            break;
          case Kind::kNumber: {
            const int64_t r = number_rest(n, kNumStart, false, 0, 0, 0);
            bytes = r < 0 ? kInf : r;
            depth = 1;
            break;
          }
          case Kind::kEnum:
            for (const std::string& l : n.literals)
              bytes = std::min(bytes, static_cast<int64_t>(l.size()));
            depth = 1;
            break;
          case Kind::kAnyOf:
            for (int32_t o : n.options) {
              if (mb(o) < bytes || (mb(o) == bytes && md(o) < depth)) {
                bytes = mb(o);
                depth = md(o);
              }
            }
            break;
        }
        depth = std::min(depth, JsonSchema::kMaxDepth + 1);
        if (bytes < n.min_bytes || (bytes == n.min_bytes && depth < n.min_depth)) {
          n.min_bytes = bytes;
          n.min_depth = depth;
          changed = true;
        }
      }
    }
    for (Node& n : nodes) {
      if (n.kind != Kind::kObject) continue;
      const size_t np = n.props.size();
      n.first_required.assign(np + 1, static_cast<int32_t>(np));
      n.n_required.assign(np + 1, 0);
      n.required_bytes.assign(np + 1, 0);
      for (size_t k = np; k-- > 0;) {
        const JsonSchema::Prop& p = n.props[k];
        n.first_required[k] = p.required ? static_cast<int32_t>(k) : n.first_required[k + 1];
        n.n_required[k] = n.n_required[k + 1] + (p.required ? 1 : 0);
        n.required_bytes[k] = p.required
                                  ? add(n.required_bytes[k + 1],
                                        add(static_cast<int64_t>(p.quoted.size()) + 1, mb(p.node)))
                                  : n.required_bytes[k + 1];
      }
    }
  }

  // anyOf / $ref cycles that never reach a value (A = anyOf [B], B = anyOf [A]).
  bool has_empty_cycle() {
    const size_t n = out.nodes_.size();
    std::vector<uint8_t> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<int32_t, size_t>> stack;
    for (size_t start = 0; start < n; ++start) {
      if (state[start]) continue;
      stack.push_back({static_cast<int32_t>(start), 0});
      state[start] = 1;
      while (!stack.empty()) {
        auto& [v, next] = stack.back();
        const Node& node = out.nodes_[static_cast<size_t>(v)];
        if (node.kind == Kind::kAnyOf && next < node.options.size()) {
          const int32_t w = node.options[next++];
          if (state[static_cast<size_t>(w)] == 1) return true;
          if (state[static_cast<size_t>(w)] == 0) {
            state[static_cast<size_t>(w)] = 1;
            stack.push_back({w, 0});
          }
          continue;
        }
        state[static_cast<size_t>(v)] = 2;
        stack.pop_back();
      }
    }
    return false;
  }
};

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(const json& schema) {
  SchemaCompiler c(schema);
  try {
    c.out.root_ = c.compile(schema, "#");
    if (c.error.ok()) {
      Node key;
      key.kind = Kind::kString;
      c.out.key_node_ = c.add_node(std::move(key));
    }
  } catch (const json::exception& ex) {
    c.fail("%s", ex.what());
  }
  if (!c.error.ok()) return c.error;
  if (c.has_empty_cycle())
    return invalid_argument("the schema has a '$ref' / 'anyOf' cycle that never reaches a value");
  c.derive();
  const Node& root = c.out.nodes_[static_cast<size_t>(c.out.root_)];
  if (root.min_bytes >= kInfinite || root.min_depth > kMaxDepth)
    return invalid_argument(
        "the schema admits no document of finite size within %d levels of nesting (a required "
        "property or a minItems that recurses without end?)",
        kMaxDepth);
  return std::make_shared<const JsonSchema>(std::move(c.out));
}

bool JsonSchema::root_is_object() const {
  int32_t r = root_;
  while (nodes_[static_cast<size_t>(r)].kind == Kind::kAnyOf &&
         nodes_[static_cast<size_t>(r)].options.size() == 1)
    r = nodes_[static_cast<size_t>(r)].options[0];
  const Kind k = nodes_[static_cast<size_t>(r)].kind;
  return k == Kind::kObject || k == Kind::kMap;
}

// ---- the machine ----

namespace {

enum FrameKind : uint8_t { kValue, kObj, kMap, kArr, kStr, kNum, kEnumF };
enum ObjPhase : uint8_t { kOpen, kKey, kColon, kAfterColon, kInValue, kAfterValue, kAfterComma };
// kMap uses kOpen, kKey (a key string above), kColon, kAfterColon, kInValue, kAfterValue,
// kAfterComma; kArr uses kOpen, kInValue, kAfterValue, kAfterComma.
enum StrPhase : uint8_t { kChars, kEscape, kHex, kUtf8 };

using Frame = JsonSchemaPrefix::Frame;

bool is_hex(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

struct PrefixStepper {
  const JsonSchema& schema;
  JsonSchemaPrefix* out;

  const Node& node(int32_t i) const { return schema.node(i); }

  // A child value of node `n` may open above a stack of `size` frames.
  bool fits(size_t size, int32_t n) const {
    const Node& c = node(n);
    return c.min_bytes < kInf && static_cast<int64_t>(size) + c.min_depth <= JsonSchema::kMaxDepth;
  }

  // The last property an object may write next from i (the first required one; no skipping it).
  static int32_t last_candidate(const Node& n, int32_t i) {
    return std::min(n.first_required[static_cast<size_t>(i)],
                    static_cast<int32_t>(n.props.size()) - 1);
  }

  // Bytes after property i-1's value: the required ones from i (each after a comma if had) and '}'.
  static int64_t after(const Node& n, int32_t i, bool had) {
    const int64_t req = n.n_required[static_cast<size_t>(i)];
    if (req == 0) return 1;
    return add(n.required_bytes[static_cast<size_t>(i)], (had ? req : req - 1) + 1);
  }

  void emit(const std::vector<Frame>& s) {
    if (out->alt_end_.size() >= JsonSchemaPrefix::kMaxAlternatives) return;
    const size_t begin = out->frames_.size();
    // Skip duplicates of an alternative already there.
    size_t prev = 0;
    for (uint32_t end : out->alt_end_) {
      if (end - prev == s.size() && std::equal(s.begin(), s.end(), out->frames_.begin() + prev))
        return;
      prev = end;
    }
    out->frames_.insert(out->frames_.end(), s.begin(), s.end());
    (void)begin;
    out->alt_end_.push_back(static_cast<uint32_t>(out->frames_.size()));
  }

  // The value on top closed: tell the frame below.
  static void child_done(std::vector<Frame>& s) {
    s.pop_back();
    if (s.empty()) return;
    Frame& p = s.back();
    switch (p.kind) {
      case kObj:
        p.phase = kAfterValue;
        p.a = p.b + 1;
        break;
      case kMap:
        p.phase = p.phase == kKey ? kColon : kAfterValue;
        break;
      case kArr:
        p.phase = kAfterValue;
        p.a += 1;
        break;
      default:
        break;
    }
    p.ws = 0;
  }

  static Frame value_frame(int32_t n) {
    Frame f;
    f.kind = kValue;
    f.node = n;
    return f;
  }

  std::vector<Frame>& scratch(int level) {
    thread_local std::deque<std::vector<Frame>> pool;  // deque: growing keeps the others in place
    if (pool.size() <= static_cast<size_t>(level)) pool.resize(static_cast<size_t>(level) + 1);
    return pool[static_cast<size_t>(level)];
  }

  bool space(Frame& f, unsigned char c) {
    if (c != ' ' || f.ws >= JsonSchema::kMaxWhitespace) return false;
    ++f.ws;
    return true;
  }

  // Feeds c to the stack s (changing it); emits what survives, possibly several alternatives.
  void step(std::vector<Frame>& s, unsigned char c, int level) {
    while (!s.empty()) {
      Frame& f = s.back();
      switch (f.kind) {
        case kValue: {
          const Node& n = node(f.node);
          if (n.kind == Kind::kAnyOf) {
            for (int32_t o : n.options) {
              if (!fits(s.size() - 1, o)) continue;
              std::vector<Frame>& s2 = scratch(level + 1);
              s2 = s;
              s2.back() = value_frame(o);
              step(s2, c, level + 1);
            }
            return;
          }
          if (!fits(s.size() - 1, f.node)) return;
          const int32_t id = f.node;
          f = Frame();
          f.node = id;
          switch (n.kind) {
            case Kind::kObject:
            case Kind::kMap:
              if (c != '{') return;
              f.kind = n.kind == Kind::kObject ? kObj : kMap;
              f.phase = kOpen;
              return emit(s);
            case Kind::kArray:
              if (c != '[') return;
              f.kind = kArr;
              f.phase = kOpen;
              return emit(s);
            case Kind::kString:
              if (c != '"') return;
              f.kind = kStr;
              f.phase = kChars;
              if (n.pattern >= 0) f.a = schema.pattern(n.pattern).dfa->start();
              return emit(s);
            case Kind::kNumber:
              f.kind = kNum;
              f.phase = kNumStart;
              continue;  // c is its first character
            case Kind::kEnum:
              f.kind = kEnumF;
              f.a = 0;
              f.b = static_cast<int32_t>(n.literals.size());
              continue;
            case Kind::kAnyOf:
              return;
          }
          return;
        }
        case kObj: {
          const Node& n = node(f.node);
          const int32_t np = static_cast<int32_t>(n.props.size());
          if (f.phase != kKey && space(f, c)) return emit(s);
          if (f.phase != kKey) f.ws = 0;
          switch (f.phase) {
            case kOpen:
            case kAfterComma:
              if (c == '"') {
                if (f.phase == kOpen) f.a = 0;
                for (int32_t j = f.a; j < np && j <= last_candidate(n, f.a); ++j) {
                  if (!fits(s.size(), n.props[static_cast<size_t>(j)].node)) continue;
                  f.phase = kKey;
                  f.b = j;
                  f.v = 1;
                  return emit(s);
                }
                return;
              }
              if (c == '}' && f.phase == kOpen && n.n_required[0] == 0) {
                child_done(s);
                return emit(s);
              }
              return;
            case kKey: {
              const std::string& q = n.props[static_cast<size_t>(f.b)].quoted;
              const size_t pos = static_cast<size_t>(f.v);
              for (int32_t j = f.b; j < np && j <= last_candidate(n, f.a); ++j) {
                const std::string& qj = n.props[static_cast<size_t>(j)].quoted;
                if (qj.size() <= pos || static_cast<unsigned char>(qj[pos]) != c) continue;
                if (qj.compare(0, pos, q, 0, pos) != 0) continue;
                if (!fits(s.size(), n.props[static_cast<size_t>(j)].node)) continue;
                f.b = j;
                f.v = static_cast<int64_t>(pos + 1);
                if (pos + 1 == qj.size()) f.phase = kColon;
                return emit(s);
              }
              return;
            }
            case kColon:
              if (c != ':') return;
              f.phase = kAfterColon;
              return emit(s);
            case kAfterColon:
              f.phase = kInValue;
              s.push_back(value_frame(n.props[static_cast<size_t>(f.b)].node));
              continue;
            case kAfterValue:
              if (c == ',') {
                for (int32_t j = f.a; j < np && j <= last_candidate(n, f.a); ++j) {
                  if (!fits(s.size(), n.props[static_cast<size_t>(j)].node)) continue;
                  f.phase = kAfterComma;
                  return emit(s);
                }
                return;
              }
              if (c == '}' && n.n_required[static_cast<size_t>(f.a)] == 0) {
                child_done(s);
                return emit(s);
              }
              return;
            default:
              return;
          }
        }
        case kMap: {
          const Node& n = node(f.node);
          if (space(f, c)) return emit(s);
          f.ws = 0;
          switch (f.phase) {
            case kOpen:
            case kAfterComma:
              if (c == '"' && fits(s.size(), n.items)) {
                f.phase = kKey;
                Frame k;
                k.kind = kStr;
                k.node = schema.key_node();
                s.push_back(k);
                return emit(s);
              }
              if (c == '}' && f.phase == kOpen) {
                child_done(s);
                return emit(s);
              }
              return;
            case kColon:
              if (c != ':') return;
              f.phase = kAfterColon;
              return emit(s);
            case kAfterColon:
              f.phase = kInValue;
              s.push_back(value_frame(n.items));
              continue;
            case kAfterValue:
              if (c == ',' && fits(s.size(), n.items)) {
                f.phase = kAfterComma;
                return emit(s);
              }
              if (c == '}') {
                child_done(s);
                return emit(s);
              }
              return;
            default:
              return;
          }
        }
        case kArr: {
          const Node& n = node(f.node);
          if (space(f, c)) return emit(s);
          f.ws = 0;
          switch (f.phase) {
            case kOpen:
              if (c == ']') {
                if (n.min_count > 0) return;
                child_done(s);
                return emit(s);
              }
              if (n.max_count == 0 || !fits(s.size(), n.items)) return;
              f.phase = kInValue;
              s.push_back(value_frame(n.items));
              continue;
            case kAfterValue:
              if (c == ',' && f.a < n.max_count && fits(s.size(), n.items)) {
                f.phase = kAfterComma;
                return emit(s);
              }
              if (c == ']' && f.a >= n.min_count) {
                child_done(s);
                return emit(s);
              }
              return;
            case kAfterComma:
              f.phase = kInValue;
              s.push_back(value_frame(n.items));
              continue;
            default:
              return;
          }
        }
        case kStr: {
          const Node& n = node(f.node);
          if (n.pattern >= 0) return pattern_step(s, c);
          switch (f.phase) {
            case kUtf8: {
              const unsigned lo = static_cast<unsigned>(f.b) & 0xFF;
              const unsigned hi = (static_cast<unsigned>(f.b) >> 8) & 0xFF;
              if (c < lo || c > hi) return;
              f.b = 0x80 | (0xBF << 8);
              if (--f.x == 0) f.phase = kChars;
              return emit(s);
            }
            case kEscape:
              if (c == 'u') {
                f.phase = kHex;
                f.x = 0;
                return emit(s);
              }
              if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                  c == 'r' || c == 't') {
                f.phase = kChars;
                return emit(s);
              }
              return;
            case kHex:
              if (!is_hex(c)) return;
              // \uD800-\uDFFF (surrogates) need a pair; refusing them keeps each escape whole.
              if (f.x == 0) f.b = (c == 'd' || c == 'D') ? 1 : 0;
              if (f.x == 1 && f.b == 1 && !(c >= '0' && c <= '7')) return;
              if (++f.x == 4) f.phase = kChars;
              return emit(s);
            default:
              break;
          }
          if (c == '"') {
            if (f.v < n.min_count) return;
            child_done(s);
            return emit(s);
          }
          if (c < 0x20 || f.v >= n.max_count) return;
          if (c == '\\') {
            ++f.v;
            f.phase = kEscape;
            return emit(s);
          }
          if (c < 0x80) {
            ++f.v;
            return emit(s);
          }
          unsigned lo = 0x80, hi = 0xBF;
          if (c >= 0xC2 && c <= 0xDF) {
            f.x = 1;
          } else if (c >= 0xE0 && c <= 0xEF) {
            f.x = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
          } else if (c >= 0xF0 && c <= 0xF4) {
            f.x = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
          } else {
            return;
          }
          ++f.v;
          f.phase = kUtf8;
          f.b = static_cast<int32_t>(lo | (hi << 8));
          return emit(s);
        }
        case kNum: {
          const Node& n = node(f.node);
          Frame g = f;
          const bool digit = c >= '0' && c <= '9';
          const int d = c - '0';
          bool ok = false;
          switch (f.phase) {
            case kNumStart:
              if (c == '-') {
                g.x = 1;
                g.phase = kNumMinus;
                ok = true;
                break;
              }
              [[fallthrough]];
            case kNumMinus:
              if (digit) {
                g.phase = kNumInt;
                g.v = d;
                g.a = 1;
                ok = true;
              }
              break;
            case kNumInt:
              if (digit && f.v != 0 && f.a < number_int_digits(n)) {
                g.v = f.v * 10 + d;
                ++g.a;
                ok = true;
              } else if (c == '.' && !n.integer) {
                g.phase = kNumDot;
                ok = true;
              }
              break;
            case kNumDot:
            case kNumFrac:
              if (digit && f.b < number_scale(n)) {
                g.phase = kNumFrac;
                g.v = f.v * 10 + d;
                ++g.b;
                ok = true;
              }
              break;
            default:
              break;
          }
          if (ok) {
            if (number_rest(n, g.phase, g.x != 0, g.v, g.a, g.b) < 0) return;
            f = g;
            return emit(s);
          }
          // Not part of the number: it ends here if it may, and c goes to the frame below.
          if (f.phase == kNumStart || number_rest(n, f.phase, f.x != 0, f.v, f.a, f.b) != 0) return;
          child_done(s);
          if (s.empty()) return;  // nothing follows the top-level value
          continue;
        }
        case kEnumF: {
          const Node& n = node(f.node);
          const size_t pos = static_cast<size_t>(f.v);
          int32_t lo = f.a, hi = f.a;
          for (int32_t k = f.a; k < f.b; ++k) {
            const std::string& l = n.literals[static_cast<size_t>(k)];
            const bool match = l.size() > pos && static_cast<unsigned char>(l[pos]) == c;
            if (match && hi == lo) lo = hi = k;
            if (match) hi = k + 1;
          }
          if (lo == hi) {  // c continues no literal: one may have ended here
            if (f.v == 0 || n.literals[static_cast<size_t>(f.a)].size() != pos) return;
            child_done(s);
            if (s.empty()) return;
            continue;
          }
          f.a = lo;
          f.b = hi;
          f.v = static_cast<int64_t>(pos + 1);
          const std::string& first = n.literals[static_cast<size_t>(lo)];
          if (hi - lo == 1 && first.size() == pos + 1 && !(c >= '0' && c <= '9')) child_done(s);
          return emit(s);
        }
        default:
          return;
      }
    }
  }

  // A string under a pattern: the automaton state in f.a, stepped by each decoded byte (raw
  // UTF-8, or the byte of an escape); a byte is taken only where the string can still finish.
  void pattern_step(std::vector<Frame>& s, unsigned char c) {
    Frame& f = s.back();
    const JsonSchema::StringPattern& p = schema.pattern(node(f.node).pattern);
    const RegexDfa& d = *p.dfa;
    auto go = [&](int32_t state, int64_t v) {
      if (p.rest(state, v) == JsonSchema::StringPattern::kNone) return;
      f.a = state;
      f.v = v;
      f.phase = d.pending(state) > 0 ? kUtf8 : kChars;
      emit(s);
    };
    if (f.phase == kUtf8) return go(d.next(f.a, c), f.v);
    if (f.phase == kEscape) {
      const int b = escaped_byte(c);
      if (b >= 0) go(d.next(f.a, static_cast<unsigned char>(b)), f.v);
      return;
    }
    if (c == '"') {
      if (p.rest(f.a, f.v) != 0) return;
      child_done(s);
      return emit(s);
    }
    if (c < 0x20) return;
    if (c == '\\') {
      if (escape_rest(p, f.a, f.v + 1) == JsonSchema::StringPattern::kNone) return;
      f.v += 1;
      f.phase = kEscape;
      return emit(s);
    }
    go(d.next(f.a, c), f.v + 1);
  }

  // After a backslash (the count taken): the fewest bytes from the escaped character on.
  static int64_t escape_rest(const JsonSchema::StringPattern& p, int32_t state, int64_t v) {
    int64_t best = JsonSchema::StringPattern::kNone;
    for (unsigned char e : kEscapes) {
      const int32_t r = p.rest(p.dfa->next(state, static_cast<unsigned char>(escaped_byte(e))), v);
      if (r != JsonSchema::StringPattern::kNone) best = std::min<int64_t>(best, int64_t{r} + 1);
    }
    return best;
  }

  // Bytes that finish frame f, the depth-th of its stack (1-based; a child would open at
  // depth + 1). A frame below the top one counts from where its open child value closes.
  int64_t rest(const Frame& f, size_t depth) const {
    const Node& n = node(f.node);
    switch (f.kind) {
      case kValue:
        return n.min_bytes;
      case kObj: {
        const int32_t np = static_cast<int32_t>(n.props.size());
        auto entry = [&](int32_t j) {
          const JsonSchema::Prop& p = n.props[static_cast<size_t>(j)];
          return add(static_cast<int64_t>(p.quoted.size()) + 1, node(p.node).min_bytes);
        };
        switch (f.phase) {
          case kOpen:
            return np == 0 ? 1 : after(n, 0, false);
          case kKey: {
            const std::string& q = n.props[static_cast<size_t>(f.b)].quoted;
            const size_t pos = static_cast<size_t>(f.v);
            int64_t best = kInf;
            for (int32_t j = f.b; j < np && j <= last_candidate(n, f.a); ++j) {
              const std::string& qj = n.props[static_cast<size_t>(j)].quoted;
              if (qj.size() < pos || qj.compare(0, pos, q, 0, pos) != 0) continue;
              if (!fits(depth, n.props[static_cast<size_t>(j)].node)) continue;
              best =
                  std::min(best, add(entry(j) - static_cast<int64_t>(pos), after(n, j + 1, true)));
            }
            return best;
          }
          case kColon:
            return add(
                entry(f.b) - static_cast<int64_t>(n.props[static_cast<size_t>(f.b)].quoted.size()),
                after(n, f.b + 1, true));
          case kAfterColon:
            return add(node(n.props[static_cast<size_t>(f.b)].node).min_bytes,
                       after(n, f.b + 1, true));
          case kInValue:
            return after(n, f.b + 1, true);
          case kAfterValue:
            return after(n, f.a, true);
          case kAfterComma: {
            int64_t best = kInf;
            for (int32_t j = f.a; j < np && j <= last_candidate(n, f.a); ++j)
              if (fits(depth, n.props[static_cast<size_t>(j)].node))
                best = std::min(best, add(entry(j), after(n, j + 1, true)));
            return best;
          }
          default:
            return kInf;
        }
      }
      case kMap: {
        const int64_t value = node(n.items).min_bytes;
        switch (f.phase) {
          case kOpen:
          case kInValue:
          case kAfterValue:
            return 1;
          case kKey:
          case kColon:
            return add(value, 2);
          case kAfterColon:
            return add(value, 1);
          case kAfterComma:
            return add(value, 4);
          default:
            return kInf;
        }
      }
      case kArr: {
        const int64_t item = node(n.items).min_bytes;
        auto more = [&](int64_t done) {
          const int64_t left = std::max<int64_t>(0, n.min_count - done);
          return mul(left, add(item, 1));
        };
        switch (f.phase) {
          case kOpen:
            return n.min_count == 0 ? 1 : add(more(0), 0);  // ']' replaces the first comma
          case kInValue:
            return add(more(f.a + 1), 1);
          case kAfterValue:
            return add(more(f.a), 1);
          case kAfterComma:
            return add(add(item, more(f.a + 1)), 1);
          default:
            return kInf;
        }
      }
      case kStr: {
        if (n.pattern >= 0) {
          const JsonSchema::StringPattern& p = schema.pattern(n.pattern);
          const int64_t r = f.phase == kEscape ? escape_rest(p, f.a, f.v) : p.rest(f.a, f.v);
          return r >= JsonSchema::StringPattern::kNone ? kInf : r + 1;
        }
        const int64_t chars = std::max<int64_t>(0, n.min_count - f.v) + 1;
        switch (f.phase) {
          case kEscape:
            return chars + 1;
          case kHex:
            return chars + (4 - f.x);
          case kUtf8:
            return chars + f.x;
          default:
            return chars;
        }
      }
      case kNum: {
        const int64_t r = number_rest(n, f.phase, f.x != 0, f.v, f.a, f.b);
        return r < 0 ? kInf : r;
      }
      case kEnumF: {
        int64_t best = kInf;
        for (int32_t k = f.a; k < f.b; ++k)
          best =
              std::min(best, static_cast<int64_t>(n.literals[static_cast<size_t>(k)].size()) - f.v);
        return best;
      }
      default:
        return kInf;
    }
  }
};

JsonSchemaPrefix::JsonSchemaPrefix(const JsonSchema* schema) : schema_(schema) {
  Frame f;
  f.kind = kValue;
  f.node = schema->root();
  frames_.push_back(f);
  alt_end_.push_back(1);
}

bool JsonSchemaPrefix::feed_into(unsigned char c, JsonSchemaPrefix* out) const {
  out->schema_ = schema_;
  out->frames_.clear();
  out->alt_end_.clear();
  PrefixStepper st{*schema_, out};
  uint32_t begin = 0;
  for (uint32_t end : alt_end_) {
    if (end > begin) {  // an empty (finished) alternative takes nothing more
      std::vector<Frame>& s = st.scratch(0);
      s.assign(frames_.begin() + begin, frames_.begin() + end);
      st.step(s, c, 0);
    }
    begin = end;
  }
  return !out->alt_end_.empty();
}

bool JsonSchemaPrefix::feed(unsigned char c) {
  JsonSchemaPrefix next;
  if (!feed_into(c, &next)) return false;
  *this = std::move(next);
  return true;
}

bool JsonSchemaPrefix::complete() const { return !alt_end_.empty() && frames_.empty(); }

bool JsonSchemaPrefix::can_end() const {
  uint32_t begin = 0;
  for (uint32_t end : alt_end_) {
    if (end == begin) return true;
    if (end == begin + 1) {
      const Frame& f = frames_[begin];
      PrefixStepper st{*schema_, nullptr};
      if ((f.kind == kNum || f.kind == kEnumF) && st.rest(f, 1) == 0) return true;
    }
    begin = end;
  }
  return false;
}

bool JsonSchemaPrefix::in_free_string() const {
  if (alt_end_.size() != 1 || frames_.empty()) return false;
  const Frame& f = frames_.back();
  if (f.kind != kStr || f.phase != kChars) return false;
  const Node& n = schema_->node(f.node);
  if (n.pattern >= 0 && !schema_->pattern(n.pattern).dfa->universal(f.a)) return false;
  return n.max_count == INT64_MAX && f.v >= n.min_count;
}

int64_t JsonSchemaPrefix::min_completion() const {
  PrefixStepper st{*schema_, nullptr};
  int64_t best = kInf;
  uint32_t begin = 0;
  for (uint32_t end : alt_end_) {
    int64_t sum = 0;
    for (uint32_t i = begin; i < end; ++i) sum = add(sum, st.rest(frames_[i], i - begin + 1));
    best = std::min(best, sum);
    begin = end;
  }
  return best;
}

}  // namespace oscar::engine
