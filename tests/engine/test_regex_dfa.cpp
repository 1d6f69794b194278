// engine/regex_dfa.h: the automaton agrees with std::wregex (ECMAScript, regex_search: unanchored
// unless ^ / $ say otherwise) on hand-picked and random strings, for hand-written patterns and
// ones that Pydantic, zod and OpenAPI generators emit; refuses the unsupported features naming
// them; stays within its state cap; marks universal states and pending UTF-8 bytes.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <regex>
#include <string>

#include "engine/regex_dfa.h"
#include "schema_validator.h"

namespace oscar::engine {
namespace {

using test::code_point_string;  // UTF-8 to code points (wchar_t is 32-bit here)

// std::wregex in the C locale leaves the non-ASCII white space out of \s (ECMA-262 has it): the
// reference is asked only about strings without those.
bool reference_knows(const std::string& text) {
  for (wchar_t c : code_point_string(text))
    if (c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
        c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF)
      return false;
  return true;
}

// nullopt where std::regex lacks the syntax (\u{..}, named groups, a literal '{').
std::optional<bool> reference(const std::string& pattern, const std::string& text) {
  // libstdc++ reads \uD83D\uDE00 as two characters and \cJ as 'J'.
  if (pattern.find("\\uD83D") != std::string::npos || pattern.find("\\c") != std::string::npos)
    return std::nullopt;
  try {
    const std::wregex re(code_point_string(pattern), std::regex::ECMAScript);
    return std::regex_search(code_point_string(text), re);
  } catch (const std::regex_error&) {
    return std::nullopt;
  }
}

RegexDfa must_compile(const std::string& pattern) {
  auto r = RegexDfa::compile({pattern});
  EXPECT_TRUE(r.ok()) << pattern << ": " << r.status().to_string();
  return r.ok() ? r.value() : RegexDfa();
}

struct Case {
  const char* pattern;
  std::vector<const char*> match;
  std::vector<const char*> no_match;
};

TEST(RegexDfa, HandWrittenCases) {
  const Case cases[] = {
      {"^abc$", {"abc"}, {"", "ab", "abcd", "xabc"}},
      {"abc", {"abc", "xxabcxx", "abcabc"}, {"", "ab", "acb"}},
      {"^ab", {"ab", "abzz"}, {"zab", "a"}},
      {"ab$", {"ab", "zzab"}, {"abz", "b"}},
      {"", {"", "anything"}, {}},
      {"^$", {""}, {"a"}},
      {"^\\d{3}-\\d{4}$", {"555-1234"}, {"5551234", "55-1234", "555-12345", "abc-defg"}},
      {"^[A-Z][a-z]+$", {"Ann", "Zo"}, {"ann", "A", "AnN"}},
      {"^[^aeiou]*$", {"", "xyz", "\xc3\xa9"}, {"a", "xa"}},
      {"^(?:ab|cd)+$", {"ab", "abcd", "cdab"}, {"", "abc", "ac"}},
      {"^(ab|cd){2,3}$", {"abab", "abcdab"}, {"ab", "abababab"}},
      {"^a{2,}$", {"aa", "aaaaa"}, {"a", ""}},
      {"^a{0}b$", {"b"}, {"ab"}},
      {"^a+?b*?c??$", {"a", "abbc", "aac"}, {"b", "c"}},
      {"^.$", {"a", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}, {"", "\n", "\r", "ab"}},
      {"^\\w+$", {"a_1Z"}, {"a-b", "\xc3\xa9"}},
      {"^\\W$", {"-", "\xc3\xa9"}, {"a"}},
      {"^\\s\\S$", {" a", "\ta", "\n\xc3\xa9"}, {"ab", "  "}},
      {"^\\D$", {"a"}, {"1"}},
      {"^[\\d.-]+$", {"1.5-2"}, {"1,5"}},
      {"^[a\\-z]$", {"-", "a", "z"}, {"b"}},
      {"^[\\w-]+$", {"a-b_c"}, {"a b"}},
      {"^\\.\\\\\\/\\-\\$\\^\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|$", {".\\/-$^*+?()[]{}|"}, {"x"}},
      {"^\\x41\\u0042\\u{43}\\t$", {"ABC\t"}, {"ABC "}},
      {"^\\u00e9$", {"\xc3\xa9"}, {"e"}},
      {"^\\uD83D\\uDE00$", {"\xf0\x9f\x98\x80"}, {"\xef\xbf\xbd"}},
      {"^[\\u0400-\\u04FF]+$", {"\xd0\x96\xd0\xb8"}, {"a"}},
      {"^[^]$", {"a", "\n"}, {""}},
      {"^[]$", {}, {"", "a"}},
      {"^a|b$", {"ab", "a", "xb"}, {"ba", "x"}},
      {"^(a|)$", {"a", ""}, {"b"}},
      {"^x{2}{$", {"xx{"}, {"xx"}},  // '{' that is no quantifier is itself (Annex B)
      {"^a}$", {"a}"}, {"a"}},
      {"^[\\b]$", {"\b"}, {"b"}},
      {"^\\cJ$", {"\n"}, {"J"}},
      {"^(?<year>\\d{4})-(?<month>\\d{2})$", {"2024-05"}, {"2024-5"}},
      {"^(?!\\.)(?!.*\\.\\.)[a-z.]+$", {"a.b", "a.", "ab"}, {".a", "a..b", ""}},
      {"^(?=.*\\d)(?=.*[a-z])[a-z0-9]{4,}$", {"ab12", "1abc"}, {"abcd", "1234", "a1"}},
  };
  for (const Case& c : cases) {
    const RegexDfa d = must_compile(c.pattern);
    for (const char* s : c.match) {
      EXPECT_TRUE(d.matches(s)) << c.pattern << " should match '" << s << "'";
      if (reference_knows(s)) {
        EXPECT_NE(reference(c.pattern, s), false) << "the test is wrong: " << c.pattern << " " << s;
      }
    }
    for (const char* s : c.no_match) {
      EXPECT_FALSE(d.matches(s)) << c.pattern << " should not match '" << s << "'";
      if (reference_knows(s)) {
        EXPECT_NE(reference(c.pattern, s), true) << "the test is wrong: " << c.pattern << " " << s;
      }
    }
  }
}

// Patterns that client libraries send: Pydantic constr(pattern=...) and Field(pattern=...)
// (copied verbatim), zod 4's z.email() / z.uuid() / z.iso.datetime() / z.iso.date() /
// z.ipv4() patterns, and common OpenAPI examples.
const char* const kPublicPatterns[] = {
    R"(^\d{3}-\d{3}-\d{4}$)",                                        // phone (Pydantic docs)
    R"(^[A-Z]{2}\d{6}$)",                                            // passport number
    R"(^\+?[1-9]\d{1,14}$)",                                         // E.164
    R"(^[a-z0-9]+(?:-[a-z0-9]+)*$)",                                 // slug
    R"(^#?([a-fA-F0-9]{6}|[a-fA-F0-9]{3})$)",                        // hex colour
    R"(^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[\da-z-]+)?$)",  // semver-ish
    R"(^[\w.+-]+@[\w-]+\.[\w.-]+$)",                                 // simple email
    R"(^(?!\.)(?!.*\.\.)([A-Za-z0-9_'+\-\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\-]*\.)+[A-Za-z]{2,}$)",
    R"(^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$)",
    R"(^(?:(?:\d\d[2468][048]|\d\d[13579][26]|\d\d0[48]|[02468][048]00|[13579][26]00)-02-29|\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|(?:02)-(?:0[1-9]|1\d|2[0-8])))T(?:(?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:\.\d+)?)?(?:Z))$)",
    R"(^(?:(?:\d\d[2468][048]|\d\d[13579][26]|\d\d0[48]|[02468][048]00|[13579][26]00)-02-29|\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|(?:02)-(?:0[1-9]|1\d|2[0-8])))$)",
    R"(^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])$)",
    R"(^[a-zA-Z0-9_-]{21}$)",                    // zod nanoid
    R"(^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$)",  // zod ulid
    R"(^[cC][^\s-]{8,}$)",                       // zod cuid
    R"(ab+c)",                                   // unanchored
    R"(\.(jpg|png)$)",                           // suffix only
    R"(^https?://)",                             // prefix only
};

// Bytes to an accepting state from each state (INT32_MAX: none), by relaxation.
std::vector<int32_t> distances(const RegexDfa& d) {
  std::vector<int32_t> dist(d.n_states(), INT32_MAX);
  for (size_t s = 0; s < d.n_states(); ++s)
    if (d.accepting(static_cast<int32_t>(s))) dist[s] = 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < d.n_states(); ++s)
      for (int b = 0; b < 256; ++b) {
        const int32_t t = d.next(static_cast<int32_t>(s), static_cast<unsigned char>(b));
        if (dist[static_cast<size_t>(t)] != INT32_MAX &&
            dist[static_cast<size_t>(t)] + 1 < dist[s]) {
          dist[s] = dist[static_cast<size_t>(t)] + 1;
          changed = true;
        }
      }
  }
  return dist;
}

// Random strings over the pattern's own characters plus a few others; half of them then walk to
// an accepting state by random bytes that shorten the distance, so that long matches occur. The
// automaton and std::wregex agree on each.
TEST(RegexDfa, AgreesWithStdRegexOnRandomStrings) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> extra = {"a", "Z", "0",  "9",        "5",
                                          "-", ".", "@",  ":",        "T",
                                          "Z", " ", "\n", "\xc3\xa9", "\xf0\x9f\x98\x80",
                                          "2", "1"};
  for (const char* pattern : kPublicPatterns) {
    SCOPED_TRACE(pattern);
    const RegexDfa d = must_compile(pattern);
    const std::vector<int32_t> dist = distances(d);
    std::vector<std::string> alphabet = extra;
    for (const char* p = pattern; *p; ++p)
      if (static_cast<unsigned char>(*p) < 0x80) alphabet.push_back(std::string(1, *p));
    const std::wregex re(code_point_string(pattern), std::regex::ECMAScript);
    int matched = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const size_t len = rng() % 30;
      int32_t state = d.start();
      for (size_t k = 0; k < len; ++k) {
        const std::string& piece = alphabet[rng() % alphabet.size()];
        int32_t t = state;
        for (char c : piece) t = d.next(t, static_cast<unsigned char>(c));
        if (i % 2 == 0 && dist[static_cast<size_t>(t)] == INT32_MAX) continue;  // stay live
        s += piece;
        state = t;
      }
      while (i % 2 == 0 && dist[static_cast<size_t>(state)] > 0 &&
             dist[static_cast<size_t>(state)] != INT32_MAX) {
        std::vector<int> closer;
        for (int b = 0; b < 256; ++b)
          if (dist[static_cast<size_t>(d.next(state, static_cast<unsigned char>(b)))] <
              dist[static_cast<size_t>(state)])
            closer.push_back(b);
        const int b = closer[rng() % closer.size()];
        s += static_cast<char>(b);
        state = d.next(state, static_cast<unsigned char>(b));
      }
      if (!reference_knows(s)) continue;
      const bool mine = d.matches(s);
      matched += mine;
      if (i % 2 == 0) {
        EXPECT_TRUE(mine) << "the walk ended outside: '" << s << "'";
      }
      EXPECT_EQ(mine, std::regex_search(code_point_string(s), re)) << "'" << s << "'";
    }
    EXPECT_GT(matched, 500);
  }
}

TEST(RegexDfa, RefusesUnsupportedFeaturesNamingThem) {
  const std::pair<const char*, const char*> bad[] = {
      {"(a)\\1", "backreference '\\1' is not supported (offset 3)"},
      {"(?<n>a)\\k<n>", "named backreference"},
      {"(?<=a)b", "lookbehind '(?<=' is not supported (offset 0)"},
      {"(?<!a)b", "lookbehind '(?<!'"},
      {"a(?=b)", "lookahead is supported only right after the leading '^'"},
      {"(?=b)a", "lookahead is supported only right after the leading '^'"},
      {"^(?=b)a|c", "lookahead beside a top-level '|'"},
      {"\\bword\\b", "word boundary '\\b'"},
      {"\\Bx", "word boundary '\\B'"},
      {"\\p{L}+", "unicode property class '\\p'"},
      {"\\P{Lu}", "unicode property class '\\P'"},
      {"\\Aabc\\Z", "the escape '\\A' is not ECMAScript"},
      {"a^b", "'^' is supported only at the start"},
      {"(^a)", "'^' is supported only at the start"},
      {"a$b", "'$' is supported only at the end"},
      {"(a$)", "'$' is supported only at the end"},
      {"(?i)abc", "the group '(?i' is not supported"},
      {"(abc", "unterminated group"},
      {"abc)", "unmatched ')'"},
      {"[abc", "unterminated character class"},
      {"[z-a]", "class range out of order"},
      {"*a", "nothing to repeat"},
      {"a**", "nothing to repeat"},
      {"a{3,2}", "out of order"},
      {"a{1001}", "a count above 1000"},
      {"\\x4", "two hex digits"},
      {"\\uD800", "lone surrogate"},
      {"abc\\", "trailing"},
      {"\\01", "octal"},
  };
  for (const auto& [pattern, want] : bad) {
    auto r = RegexDfa::compile({pattern});
    ASSERT_FALSE(r.ok()) << pattern;
    EXPECT_NE(r.status().message().find(want), std::string::npos)
        << pattern << ": " << r.status().message() << " (want " << want << ")";
  }
  auto two = RegexDfa::compile({"a", "(?<=b)"});
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("pattern 1: lookbehind"), std::string::npos)
      << two.status().message();
}

TEST(RegexDfa, StateCapIsEnforced) {
  // "an a 14 characters before the end": 2^15 subsets.
  auto r = RegexDfa::compile({"a[ab]{14}$"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 4096 automaton states"), std::string::npos)
      << r.status().message();
  EXPECT_TRUE(RegexDfa::compile({"a[ab]{8}$"}).ok());
  auto big = RegexDfa::compile({"(((a{1000}){1000}){1000})"});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("too large"), std::string::npos) << big.status().message();
}

TEST(RegexDfa, IntersectionOfPatterns) {
  auto r = RegexDfa::compile({"^[a-z]+$", "q", "^.{3,5}$"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->matches("aqz"));
  EXPECT_TRUE(r->matches("qqqqq"));
  EXPECT_FALSE(r->matches("abc"));
  EXPECT_FALSE(r->matches("aq"));
  EXPECT_FALSE(r->matches("aqzzzz"));
  EXPECT_FALSE(r->matches("aQz"));
  auto every = RegexDfa::compile({});
  ASSERT_TRUE(every.ok());
  EXPECT_TRUE(every->matches(""));
  EXPECT_TRUE(every->universal(every->start()));
}

TEST(RegexDfa, UniversalAndPendingStates) {
  const RegexDfa d = must_compile("ab");
  int32_t s = d.start();
  EXPECT_FALSE(d.universal(s));
  s = d.next(s, 'a');
  s = d.next(s, 'b');
  ASSERT_TRUE(d.universal(s));
  // Every whole character leads back to it; a multi-byte one through pending states.
  EXPECT_EQ(d.next(s, 'x'), s);
  const int32_t mid = d.next(s, 0xE2);
  EXPECT_EQ(d.pending(mid), 2);
  EXPECT_EQ(d.pending(d.next(mid, 0x82)), 1);
  EXPECT_EQ(d.next(d.next(mid, 0x82), 0xAC), s);
  // Invalid UTF-8 is dead.
  EXPECT_EQ(d.next(s, 0xC0), RegexDfa::kDead);
  EXPECT_EQ(d.next(s, 0x80), RegexDfa::kDead);
  EXPECT_EQ(d.next(d.next(s, 0xED), 0xA0), RegexDfa::kDead);  // a surrogate
  EXPECT_FALSE(must_compile("^ab$").universal(d.start()));
}

}  // namespace
}  // namespace oscar::engine
