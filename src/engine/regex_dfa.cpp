// RegexDfa: a parser from ECMA-262 pattern text to a small syntax tree, Thompson's construction of
// an NFA over UTF-8 bytes (code-point classes split into byte-range sequences), and the subset
// construction over byte classes; see regex_dfa.h.
#include "engine/regex_dfa.h"

#include <algorithm>
#include <map>

#include "core/check.h"

namespace oscar::engine {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kInfiniteRepeat = -1;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.push_back({lo, hi});
  }
  return out;
}

Ranges negated(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

const Ranges& digit_ranges() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word_ranges() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& space_ranges() {  // ECMA-262 WhiteSpace and LineTerminator
  static const Ranges r = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                           {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return r;
}
const Ranges& dot_ranges() {  // all but the line terminators
  static const Ranges r = negated({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
  return r;
}
const Ranges& all_ranges() {
  static const Ranges r = {{0, kMaxCodePoint}};
  return r;
}

// ---- the syntax tree ----

struct Re {
  enum Kind : uint8_t { kSet, kCat, kAlt, kRepeat } kind = kCat;
  Ranges set;                 // kSet
  std::vector<int32_t> kids;  // kCat (none: the empty string), kAlt, kRepeat (one)
  int min = 0, max = 0;       // kRepeat; max kInfiniteRepeat for no bound
};

struct TopAlternative {
  bool anchored_start = false, anchored_end = false;
  int32_t body = -1;
};
struct Lookahead {
  bool negated = false;
  int32_t body = -1;
};
struct ParsedPattern {
  std::vector<TopAlternative> alternatives;
  std::vector<Lookahead> lookaheads;  // only with one alternative anchored at its start
};

std::vector<uint32_t> decode_utf8(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    uint32_t cp = n == 1 ? c : c & (0x3F >> (n - 1));
    for (int k = 1; k < n; ++k)
      cp = (cp << 6) | (i + k < s.size() ? static_cast<unsigned char>(s[i + k]) & 0x3F : 0);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

struct Parser {
  std::vector<uint32_t> cp;
  size_t pos = 0;
  std::vector<Re> nodes;
  ParsedPattern out;
  std::string error;

  bool at_end() const { return pos >= cp.size(); }
  uint32_t peek(size_t ahead = 0) const {
    return pos + ahead < cp.size() ? cp[pos + ahead] : 0xFFFFFFFF;
  }
  bool fail(const std::string& what, size_t at) {
    if (error.empty()) error = what + " (offset " + std::to_string(at) + ")";
    return false;
  }
  int32_t add(Re r) {
    nodes.push_back(std::move(r));
    return static_cast<int32_t>(nodes.size() - 1);
  }
  int32_t set_node(Ranges r) {
    Re n;
    n.kind = Re::kSet;
    n.set = normalized(std::move(r));
    return add(std::move(n));
  }

  void parse() {
    parse_alternation(0);
    if (!error.empty()) return;
    if (!at_end()) fail("unmatched ')'", pos);
    if (!out.lookaheads.empty() && out.alternatives.size() > 1)
      fail("lookahead beside a top-level '|' is not supported", 0);
  }

  // depth 0: the top level, whose alternatives go to `out` (anchors allowed at their ends).
  int32_t parse_alternation(int depth) {
    Re alt;
    alt.kind = Re::kAlt;
    for (;;) {
      TopAlternative top;
      const int32_t body = parse_sequence(depth, &top);
      if (!error.empty()) return -1;
      if (depth == 0) {
        top.body = body;
        out.alternatives.push_back(top);
      }
      alt.kids.push_back(body);
      if (peek() != '|') break;
      ++pos;
    }
    return alt.kids.size() == 1 ? alt.kids[0] : add(std::move(alt));
  }

  int32_t parse_sequence(int depth, TopAlternative* top) {
    Re cat;
    cat.kind = Re::kCat;
    const size_t begin = pos;
    for (;;) {
      if (at_end() || peek() == '|' || peek() == ')') break;
      const size_t at = pos;
      const uint32_t c = peek();
      if (c == '^') {
        ++pos;
        if (depth != 0 || at != begin)
          return fail("'^' is supported only at the start of the pattern or of a top-level '|'",
                      at);
        top->anchored_start = true;
        continue;
      }
      if (c == '$') {
        ++pos;
        if (depth != 0 || !(at_end() || peek() == '|'))
          return fail("'$' is supported only at the end of the pattern or of a top-level '|'", at);
        top->anchored_end = true;
        continue;
      }
      if (c == '(' && peek(1) == '?' && (peek(2) == '=' || peek(2) == '!')) {
        if (depth != 0 || !top->anchored_start || !cat.kids.empty())
          return fail("lookahead is supported only right after the leading '^'", at);
        pos += 3;
        Lookahead la;
        la.negated = cp[at + 2] == '!';
        la.body = parse_alternation(depth + 1);
        if (!error.empty()) return -1;
        if (peek() != ')') return fail("unterminated group", at);
        ++pos;
        if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')
          return fail("a quantifier on a lookahead is not supported", pos);
        out.lookaheads.push_back(la);
        continue;
      }
      int32_t atom = parse_atom(depth);
      if (!error.empty()) return -1;
      atom = parse_quantifiers(atom);
      if (!error.empty()) return -1;
      cat.kids.push_back(atom);
    }
    return cat.kids.size() == 1 ? cat.kids[0] : add(std::move(cat));
  }

  // {n}, {n,}, {n,m} at pos: true and the bounds, or false (then '{' is a literal, as in Annex B).
  bool braces(size_t* end, int* lo, int* hi) const {
    size_t p = pos + 1;
    auto number = [&](int* v) {
      const size_t start = p;
      long long x = 0;
      while (p < cp.size() && cp[p] >= '0' && cp[p] <= '9') {
        x = std::min<long long>(x * 10 + (cp[p] - '0'), 1LL << 40);
        ++p;
      }
      *v = static_cast<int>(std::min<long long>(x, 1 << 30));
      return p > start;
    };
    if (!number(lo)) return false;
    *hi = *lo;
    if (p < cp.size() && cp[p] == ',') {
      ++p;
      if (!number(hi)) *hi = kInfiniteRepeat;
    }
    if (p >= cp.size() || cp[p] != '}') return false;
    *end = p + 1;
    return true;
  }

  int32_t parse_quantifiers(int32_t atom) {
    bool quantified = false;
    for (;;) {
      const size_t at = pos;
      const uint32_t c = peek();
      int lo = 0, hi = 0;
      size_t end = pos + 1;
      if (c == '*') {
        hi = kInfiniteRepeat;
      } else if (c == '+') {
        lo = 1;
        hi = kInfiniteRepeat;
      } else if (c == '?') {
        hi = 1;
      } else if (c != '{' || !braces(&end, &lo, &hi)) {
        return atom;
      }
      if (quantified) return fail("nothing to repeat", at);
      if (lo > RegexDfa::kMaxRepeat || hi > RegexDfa::kMaxRepeat)
        return fail("a count above " + std::to_string(RegexDfa::kMaxRepeat) + " is not supported",
                    at);
      if (hi != kInfiniteRepeat && hi < lo) return fail("numbers out of order in {n,m}", at);
      pos = end;
      if (peek() == '?') ++pos;  // lazy: the same language
      Re r;
      r.kind = Re::kRepeat;
      r.kids = {atom};
      r.min = lo;
      r.max = hi;
      atom = add(std::move(r));
      quantified = true;
    }
  }

  int32_t parse_atom(int depth) {
    const size_t at = pos;
    const uint32_t c = cp[pos++];
    switch (c) {
      case '(': {
        if (peek() == '?') {
          if (peek(1) == ':') {
            pos += 2;
          } else if (peek(1) == '<' && (peek(2) == '=' || peek(2) == '!')) {
            return fail("lookbehind '(?<" + std::string(1, static_cast<char>(peek(2))) +
                            "' is not supported",
                        at);
          } else if (peek(1) == '<') {  // a named group: plain grouping
            size_t p = pos + 2;
            while (p < cp.size() && cp[p] != '>') ++p;
            if (p >= cp.size()) return fail("unterminated group name", at);
            pos = p + 1;
          } else if (peek(1) == '=' || peek(1) == '!') {
            return fail("lookahead is supported only right after the leading '^'", at);
          } else {
            return fail(
                "the group '(?" + std::string(1, static_cast<char>(peek(1))) + "' is not supported",
                at);
          }
        }
        const int32_t inner = parse_alternation(depth + 1);
        if (!error.empty()) return -1;
        if (peek() != ')') return fail("unterminated group", at);
        ++pos;
        return inner;
      }
      case '[':
        return parse_class(at);
      case '.':
        return set_node(dot_ranges());
      case '\\': {
        Ranges r;
        if (!parse_escape(false, at, &r)) return -1;
        return set_node(std::move(r));
      }
      case '*':
      case '+':
      case '?':
        return fail("nothing to repeat", at);
      default:
        return set_node({{c, c}});
    }
  }

  static uint32_t hex_value(uint32_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return 16;
  }
  bool hex_digits(int n, uint32_t* v) {
    uint32_t x = 0;
    for (int i = 0; i < n; ++i) {
      const uint32_t h = hex_value(peek());
      if (h > 15) return false;
      x = x * 16 + h;
      ++pos;
    }
    *v = x;
    return true;
  }

  // After a backslash (at `at`); *out gets the characters it stands for.
  bool parse_escape(bool in_class, size_t at, Ranges* out) {
    if (at_end()) return fail("a trailing '\\'", at);
    const uint32_t c = cp[pos++];
    auto one = [&](uint32_t v) {
      *out = {{v, v}};
      return true;
    };
    const std::string text = c < 0x80 ? std::string("'\\") + static_cast<char>(c) + "'" : "";
    switch (c) {
      case 'd':
        *out = digit_ranges();
        return true;
      case 'D':
        *out = negated(digit_ranges());
        return true;
      case 'w':
        *out = word_ranges();
        return true;
      case 'W':
        *out = negated(word_ranges());
        return true;
      case 's':
        *out = space_ranges();
        return true;
      case 'S':
        *out = negated(space_ranges());
        return true;
      case 't':
        return one('\t');
      case 'n':
        return one('\n');
      case 'v':
        return one('\v');
      case 'f':
        return one('\f');
      case 'r':
        return one('\r');
      case 'b':
        if (in_class) return one('\b');
        return fail("the word boundary '\\b' is not supported", at);
      case 'B':
        return fail("the word boundary '\\B' is not supported", at);
      case '0':
        if (!(peek() >= '0' && peek() <= '9')) return one(0);
        return fail("the octal escape " + text + " is not supported", at);
      case 'x': {
        uint32_t v;
        if (!hex_digits(2, &v)) return fail("'\\x' needs two hex digits", at);
        return one(v);
      }
      case 'u': {
        uint32_t v = 0;
        if (peek() == '{') {
          ++pos;
          int n = 0;
          while (hex_value(peek()) <= 15 && v <= kMaxCodePoint) {
            v = v * 16 + hex_value(peek());
            ++pos;
            ++n;
          }
          if (n == 0 || peek() != '}' || v > kMaxCodePoint) return fail("a bad '\\u{...}'", at);
          ++pos;
          return one(v);
        }
        if (!hex_digits(4, &v)) return fail("'\\u' needs four hex digits", at);
        if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
          const size_t back = pos;
          pos += 2;
          uint32_t low;
          if (hex_digits(4, &low) && low >= 0xDC00 && low <= 0xDFFF)
            return one(0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00));
          pos = back;
        }
        if (v >= 0xD800 && v <= 0xDFFF) return fail("a lone surrogate '\\u' is not supported", at);
        return one(v);
      }
      case 'c': {
        const uint32_t l = peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')))
          return fail("'\\c' needs a letter", at);
        ++pos;
        return one(l % 32);
      }
      case 'p':
      case 'P':
        return fail("the unicode property class " + text + "{...} is not supported", at);
      case 'k':
        return fail("the named backreference '\\k<...>' is not supported", at);
      default:
        break;
    }
    if (c >= '1' && c <= '9') return fail("the backreference " + text + " is not supported", at);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      return fail("the escape " + text + " is not ECMAScript", at);
    return one(c);  // \. \\ \/ \- \$ and any other punctuation: itself
  }

  int32_t parse_class(size_t at) {
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos;
    }
    Ranges r;
    // One class atom: a single code point (*single), or a set from an escape.
    auto atom = [&](Ranges* set, bool* single) {
      const size_t a = pos;
      const uint32_t c = cp[pos++];
      if (c != '\\') {
        *set = {{c, c}};
        *single = true;
        return true;
      }
      if (!parse_escape(true, a, set)) return false;
      *single = set->size() == 1 && (*set)[0].first == (*set)[0].second;
      if (*single) {  // \d, \w, \s, ... are sets even when they hold one character
        const uint32_t e = cp[a + 1];
        *single = !(e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 's' || e == 'S');
      }
      return true;
    };
    for (;;) {
      if (at_end()) return fail("unterminated character class", at);
      if (peek() == ']') {
        ++pos;
        break;
      }
      Ranges left;
      bool left_single = false;
      if (!atom(&left, &left_single)) return -1;
      if (peek() == '-' && peek(1) != ']' && pos + 1 < cp.size()) {
        const size_t dash = pos;
        ++pos;
        Ranges right;
        bool right_single = false;
        if (!atom(&right, &right_single)) return -1;
        if (left_single && right_single) {
          if (left[0].first > right[0].first) return fail("a class range out of order", dash);
          r.push_back({left[0].first, right[0].first});
          continue;
        }
        r.insert(r.end(), left.begin(), left.end());  // [\d-z]: the '-' is itself (Annex B)
        r.push_back({'-', '-'});
        r.insert(r.end(), right.begin(), right.end());
        continue;
      }
      r.insert(r.end(), left.begin(), left.end());
    }
    return set_node(negate ? negated(r) : r);
  }
};

// ---- the NFA over bytes ----

struct Edge {
  uint8_t lo, hi;
  int32_t to;
};
struct NfaState {
  std::vector<int32_t> eps;
  std::vector<Edge> edges;
};

int utf8_encode(uint32_t cp, uint8_t* b) {
  if (cp < 0x80) {
    b[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    b[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    b[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    b[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    b[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    b[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  b[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  b[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  b[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  b[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// The code points [lo, hi] (no surrogates) as sequences of byte ranges, each sequence a product
// of its ranges (the split of Go's regexp/syntax and Rust's utf8-ranges).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>* out) {
  static const uint32_t kLast[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t last : kLast) {
    if (lo <= last && hi > last) {
      utf8_sequences(lo, last, out);
      utf8_sequences(last + 1, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  const int n = utf8_encode(lo, a);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      utf8_sequences(lo, lo | m, out);
      utf8_sequences((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      utf8_sequences(lo, (hi & ~m) - 1, out);
      utf8_sequences(hi & ~m, hi, out);
      return;
    }
  }
  utf8_encode(hi, b);
  ByteSeq seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

// A pattern's piece of the product automaton: its NFA states [lo, hi), the accepting one, and the
// universal one (a [^]* loop into `accept`: once there, every string is accepted).
struct Component {
  int32_t lo = 0, hi = 0, start = -1, accept = -1, universal = -1;
  bool negated = false;
  std::vector<int32_t> universal_closure;
};

}  // namespace

struct DfaBuilder {
  std::vector<NfaState> nfa;
  std::vector<Component> comps;
  std::string error;

  int32_t new_state() {
    if (nfa.size() >= RegexDfa::kMaxNfaStates) {
      if (error.empty())
        error = "the pattern is too large (over " + std::to_string(RegexDfa::kMaxNfaStates) +
                " automaton states before determinization)";
      return 0;
    }
    nfa.emplace_back();
    return static_cast<int32_t>(nfa.size() - 1);
  }
  void eps(int32_t from, int32_t to) { nfa[static_cast<size_t>(from)].eps.push_back(to); }

  // The characters `set` from `from`; returns the state after one of them.
  int32_t emit_set(const Ranges& set, int32_t from) {
    const int32_t end = new_state();
    std::vector<ByteSeq> seqs;
    for (auto [lo, hi] : set) {  // without the surrogates
      if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, &seqs);
        if (hi > 0xDFFF) utf8_sequences(0xE000, hi, &seqs);
      } else {
        utf8_sequences(lo, hi, &seqs);
      }
    }
    for (const ByteSeq& seq : seqs) {
      int32_t cur = from;
      for (size_t i = 0; i < seq.size() && error.empty(); ++i) {
        const int32_t to = i + 1 == seq.size() ? end : new_state();
        nfa[static_cast<size_t>(cur)].edges.push_back({seq[i].first, seq[i].second, to});
        cur = to;
      }
    }
    return end;
  }

  // Thompson's construction: node i of `re` from `from`; returns its end. An end may be a loop
  // head, so edges only leave it; whatever must reach "after the body" gets a fresh state.
  int32_t emit(const std::vector<Re>& re, int32_t i, int32_t from) {
    if (!error.empty()) return from;
    const Re& r = re[static_cast<size_t>(i)];
    switch (r.kind) {
      case Re::kSet:
        return emit_set(r.set, from);
      case Re::kCat: {
        int32_t cur = from;
        for (int32_t k : r.kids) cur = emit(re, k, cur);
        return cur;
      }
      case Re::kAlt: {
        const int32_t end = new_state();
        for (int32_t k : r.kids) {
          const int32_t head = new_state();
          eps(from, head);
          eps(emit(re, k, head), end);
        }
        return end;
      }
      case Re::kRepeat: {
        int32_t cur = from;
        for (int k = 0; k < r.min && error.empty(); ++k) cur = emit(re, r.kids[0], cur);
        if (r.max == kInfiniteRepeat) {
          const int32_t loop = new_state();
          eps(cur, loop);
          eps(emit(re, r.kids[0], loop), loop);
          return loop;
        }
        for (int k = r.min; k < r.max && error.empty(); ++k) {
          const int32_t head = new_state(), end = new_state();
          eps(cur, head);
          eps(emit(re, r.kids[0], head), end);
          eps(head, end);  // into a fresh state: the body's end may be a loop head
          cur = end;
        }
        return cur;
      }
    }
    return from;
  }

  // A component: the alternatives (each with [^]* before it unless anchored at its start, and
  // after it unless anchored at its end).
  void add_component(const std::vector<Re>& re, const std::vector<TopAlternative>& alts,
                     bool negated) {
    Component c;
    c.negated = negated;
    c.lo = static_cast<int32_t>(nfa.size());
    c.start = new_state();
    c.accept = new_state();
    c.universal = new_state();
    eps(emit_set(all_ranges(), c.universal), c.universal);
    eps(c.universal, c.accept);
    int32_t prefix = -1;
    for (const TopAlternative& a : alts) {
      int32_t from = c.start;
      if (!a.anchored_start) {
        if (prefix < 0) {
          prefix = new_state();
          eps(c.start, prefix);
          eps(emit_set(all_ranges(), prefix), prefix);
        }
        from = new_state();
        eps(prefix, from);
      }
      const int32_t end = emit(re, a.body, from);
      eps(end, a.anchored_end ? c.accept : c.universal);
    }
    c.hi = static_cast<int32_t>(nfa.size());
    c.universal_closure = closure({c.universal});
    comps.push_back(std::move(c));
  }

  std::vector<int32_t> closure(std::vector<int32_t> set) {
    std::vector<uint8_t> seen(nfa.size(), 0);
    std::vector<int32_t> stack;
    for (int32_t s : set) {
      if (!seen[static_cast<size_t>(s)]) stack.push_back(s);
      seen[static_cast<size_t>(s)] = 1;
    }
    std::vector<int32_t> out;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      out.push_back(s);
      for (int32_t t : nfa[static_cast<size_t>(s)].eps) {
        if (seen[static_cast<size_t>(t)]) continue;
        seen[static_cast<size_t>(t)] = 1;
        stack.push_back(t);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // A component that reached its universal state keeps only that (its language from there is
  // everything). Empty: dead (a positive component failed, or a negated one matched).
  std::vector<int32_t> canonical(const std::vector<int32_t>& set) const {
    std::vector<int32_t> out;
    for (const Component& c : comps) {
      auto lo = std::lower_bound(set.begin(), set.end(), c.lo);
      auto hi = std::lower_bound(set.begin(), set.end(), c.hi);
      const bool universal = std::binary_search(lo, hi, c.universal);
      if (c.negated) {
        if (universal) return {};
        out.insert(out.end(), lo, hi);
      } else {
        if (lo == hi) return {};
        if (universal)
          out.insert(out.end(), c.universal_closure.begin(), c.universal_closure.end());
        else
          out.insert(out.end(), lo, hi);
      }
    }
    return out;
  }

  uint8_t flags(const std::vector<int32_t>& set) const {
    bool accepting = !set.empty(), universal = !set.empty();
    for (const Component& c : comps) {
      auto lo = std::lower_bound(set.begin(), set.end(), c.lo);
      auto hi = std::lower_bound(set.begin(), set.end(), c.hi);
      accepting = accepting && std::binary_search(lo, hi, c.accept) != c.negated;
      universal = universal && (c.negated ? lo == hi : std::binary_search(lo, hi, c.universal));
    }
    return static_cast<uint8_t>((accepting ? RegexDfa::kAccepting : 0) |
                                (universal ? RegexDfa::kUniversal : 0));
  }

  Status determinize(RegexDfa* dfa, size_t max_states) {
    // Byte classes: the bytes between consecutive range boundaries step alike.
    std::array<bool, 257> boundary{};
    boundary[0] = true;
    for (const NfaState& s : nfa)
      for (const Edge& e : s.edges) boundary[e.lo] = boundary[static_cast<size_t>(e.hi) + 1] = true;
    std::vector<int> representative;
    int cls = -1;
    for (int b = 0; b < 256; ++b) {
      if (boundary[static_cast<size_t>(b)]) {
        ++cls;
        representative.push_back(b);
      }
      dfa->byte_class_[static_cast<size_t>(b)] = static_cast<uint8_t>(cls);
    }
    const size_t n_classes = representative.size();
    dfa->n_classes_ = n_classes;

    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> sets;
    auto intern = [&](std::vector<int32_t> set, int pending) -> int32_t {
      auto it = ids.find(set);
      if (it != ids.end()) {
        OSCAR_CHECK(it->second == RegexDfa::kDead ||
                        dfa->pending_[static_cast<size_t>(it->second)] == pending,
                    "regex_dfa: a state reached mid-character and at a boundary");
        return it->second;
      }
      const int32_t id = static_cast<int32_t>(sets.size());
      ids.emplace(set, id);
      dfa->flags_.push_back(flags(set));
      dfa->pending_.push_back(static_cast<uint8_t>(pending));
      sets.push_back(std::move(set));
      return id;
    };
    intern({}, 0);  // kDead
    std::vector<int32_t> starts;
    for (const Component& c : comps) starts.push_back(c.start);
    dfa->start_ = intern(canonical(closure(starts)), 0);
    for (size_t s = 1; s < sets.size(); ++s) {
      if (sets.size() > max_states)
        return invalid_argument("the pattern needs more than %zu automaton states", max_states);
      dfa->next_.resize(sets.size() * n_classes, RegexDfa::kDead);
      const int pending = dfa->pending_[s];
      for (size_t k = 0; k < n_classes; ++k) {
        const int b = representative[k];
        std::vector<int32_t> moved;
        for (int32_t q : sets[s])
          for (const Edge& e : nfa[static_cast<size_t>(q)].edges)
            if (e.lo <= b && b <= e.hi) moved.push_back(e.to);
        if (moved.empty()) continue;
        std::vector<int32_t> next = canonical(closure(std::move(moved)));
        if (next.empty()) continue;
        const int after = pending > 0 ? pending - 1
                          : b < 0x80  ? 0
                          : b >= 0xF0 ? 3
                          : b >= 0xE0 ? 2
                                      : 1;
        const int32_t id = intern(std::move(next), after);
        dfa->next_[s * n_classes + k] = id;
      }
    }
    dfa->next_.resize(sets.size() * n_classes, RegexDfa::kDead);
    return Status();
  }
};

Result<RegexDfa> RegexDfa::compile(const std::vector<std::string>& patterns, size_t max_states) {
  DfaBuilder b;
  const std::vector<std::string> all = patterns.empty() ? std::vector<std::string>{""} : patterns;
  for (size_t i = 0; i < all.size(); ++i) {
    Parser p;
    p.cp = decode_utf8(all[i]);
    p.parse();
    const std::string which = all.size() > 1 ? "pattern " + std::to_string(i) + ": " : "";
    if (!p.error.empty()) return invalid_argument("%s%s", which.c_str(), p.error.c_str());
    b.add_component(p.nodes, p.out.alternatives, false);
    for (const Lookahead& la : p.out.lookaheads) {
      TopAlternative body;
      body.anchored_start = true;
      body.body = la.body;
      b.add_component(p.nodes, {body}, la.negated);
    }
    if (!b.error.empty()) return invalid_argument("%s%s", which.c_str(), b.error.c_str());
  }
  RegexDfa dfa;
  Status st = b.determinize(&dfa, max_states);
  if (!st.ok()) return st;
  return dfa;
}

bool RegexDfa::matches(const std::string& text) const {
  int32_t s = start_;
  for (char c : text) {
    s = next(s, static_cast<unsigned char>(c));
    if (s == kDead) return false;
  }
  return accepting(s);
}

}  // namespace oscar::engine
