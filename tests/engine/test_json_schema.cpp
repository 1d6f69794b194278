// engine/json_schema.h: the compiler accepts the supported keywords and refuses the others naming
// them; the machine accepts hand-written valid documents (and every prefix of them) and refuses
// invalid ones; random walks over the bytes the machine allows end in documents that an
// independent validator (below, written from the JSON Schema spec, not from the machine) accepts,
// for hand-written schemas and for schemas from public docs (OpenAI's structured outputs guide).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "engine/json_schema.h"
#include "schema_validator.h"

namespace oscar::engine {
namespace {

using json = nlohmann::ordered_json;
using test::validate;

std::shared_ptr<const JsonSchema> must_compile(const json& s) {
  auto r = JsonSchema::compile(s);
  EXPECT_TRUE(r.ok()) << r.status().to_string() << "\n" << s.dump();
  return r.ok() ? r.value() : nullptr;
}

// Feeds the text; returns the bytes accepted.
size_t accepted(const JsonSchema& schema, const std::string& text, JsonSchemaPrefix* m) {
  *m = JsonSchemaPrefix(&schema);
  for (size_t i = 0; i < text.size(); ++i)
    if (!m->feed(static_cast<unsigned char>(text[i]))) return i;
  return text.size();
}

bool machine_accepts(const JsonSchema& schema, const std::string& text) {
  JsonSchemaPrefix m;
  return accepted(schema, text, &m) == text.size() && m.can_end();
}

// Random walk: random allowed bytes, steering to the shortest completion after `wander` bytes.
// Checks on every step that some byte shortens the completion by exactly one.
std::string random_document(const JsonSchema& schema, std::mt19937_64& rng, int wander) {
  JsonSchemaPrefix m(&schema);
  std::string text;
  JsonSchemaPrefix next;
  for (int step = 0; step < 20000 && !m.complete(); ++step) {
    const int64_t need = m.min_completion();
    if (m.can_end() && (step > wander || rng() % 8 == 0)) break;
    std::vector<std::pair<unsigned char, int64_t>> options;
    for (int c = 0; c < 256; ++c)
      if (m.feed_into(static_cast<unsigned char>(c), &next))
        options.push_back({static_cast<unsigned char>(c), next.min_completion()});
    if (options.empty() && m.can_end()) break;  // a top-level number at its last digit
    EXPECT_FALSE(options.empty()) << "stuck after " << text;
    if (options.empty()) break;
    bool shorter = false;
    for (auto& o : options) shorter = shorter || o.second == need - 1;
    EXPECT_TRUE(shorter || need == 0)
        << "no byte shortens the completion " << need << " after " << text;
    std::vector<unsigned char> pick;
    for (auto& o : options)
      if (step < wander || o.second == need - 1) pick.push_back(o.first);
    // Within the wander budget, prefer printable ASCII so the documents stay readable.
    std::vector<unsigned char> ascii;
    for (unsigned char c : pick)
      if (c >= 0x20 && c < 0x7F) ascii.push_back(c);
    const std::vector<unsigned char>& from = !ascii.empty() && rng() % 16 ? ascii : pick;
    const unsigned char c = from[rng() % from.size()];
    EXPECT_TRUE(m.feed(c));
    text += static_cast<char>(c);
  }
  EXPECT_TRUE(m.can_end()) << text;
  return text;
}

void check_random_documents(const json& schema, int n, uint64_t seed) {
  auto compiled = must_compile(schema);
  ASSERT_TRUE(compiled);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n; ++i) {
    const std::string text = random_document(*compiled, rng, static_cast<int>(rng() % 200));
    if (std::getenv("OSCAR_SHOW_DOCS")) std::printf("%s\n", text.c_str());  // to eyeball them
    json v;
    ASSERT_NO_THROW(v = json::parse(text)) << text;
    std::string why;
    EXPECT_TRUE(validate(v, schema, schema, &why)) << why << "\n" << text;
  }
}

// ---- the compiler ----

TEST(JsonSchema, CompilesEverySupportedKeyword) {
  const char* ok[] = {
      R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false})",
      R"({"type":"object","additionalProperties":{"type":"integer"}})",
      R"({"type":"object"})",
      R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3})",
      R"({"type":"string","minLength":2,"maxLength":5,"description":"d","title":"t"})",
      R"({"type":"number","minimum":-1.5,"maximum":2.25})",
      R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})",
      R"({"type":"boolean"})",
      R"({"type":"null"})",
      R"({"type":["string","null"]})",
      R"({"enum":["a","b",1,null,{"x":[1]}]})",
      R"({"type":"string","enum":["a","b"]})",
      R"({"const":"fixed"})",
      R"({"anyOf":[{"type":"string"},{"type":"integer"}]})",
      R"({"$defs":{"n":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},"required":["next"]}},"$ref":"#/$defs/n"})",
      R"({"definitions":{"s":{"type":"string"}},"type":"object","properties":{"a":{"$ref":"#/definitions/s"}}})",
      R"({"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#"}}},"required":["kids"]})",
      R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","$comment":"c","examples":[],"default":1,"deprecated":false,"readOnly":true,"writeOnly":false})",
      R"({"type":"string","pattern":"^[a-z]+$","minLength":2,"maxLength":8})",
      R"({"type":"string","pattern":"\\d"})",
      R"({"pattern":"^x"})",
      R"({"type":["string","null"],"format":"date-time"})",
      R"({"type":"string","format":"email","pattern":"^(?!\\.)(?!.*\\.\\.)[a-z.]+@[a-z]+\\.com$"})",
      R"({"type":"string","format":"int32-or-anything-unknown"})",
      R"({"type":"integer","format":"int64"})",
      R"(true)",
      R"({})",
  };
  for (const char* f : {"date", "time", "date-time", "uuid", "email", "ipv4", "ipv6", "hostname",
                        "uri", "duration", "binary"}) {
    auto r = JsonSchema::compile(json{{"type", "string"}, {"format", f}});
    EXPECT_TRUE(r.ok()) << f << ": " << r.status().to_string();
  }
  for (const char* s : ok) {
    auto r = JsonSchema::compile(json::parse(s));
    EXPECT_TRUE(r.ok()) << s << ": " << r.status().to_string();
  }
}

TEST(JsonSchema, RefusesUnsupportedKeywordsNamingThem) {
  const std::pair<const char*, const char*> bad[] = {
      {R"({"type":"string","pattern":"(a)\\1"})",
       "'pattern' (at #): the backreference '\\1' is not supported (offset 3)"},
      {R"({"type":"string","pattern":"(?<=a)b"})", "lookbehind '(?<=' is not supported"},
      {R"j({"type":"string","pattern":"a(?!b)"})j", "lookahead is supported only right after"},
      {R"({"type":"string","pattern":"\\bcat\\b"})", "the word boundary '\\b'"},
      {R"({"type":"string","pattern":"^\\p{Lu}"})", "unicode property class '\\p'"},
      {R"({"type":"string","pattern":"(?<y>a)\\k<y>"})", "named backreference"},
      {R"({"type":"string","pattern":"\\Aabc\\Z"})", "'\\A' is not ECMAScript"},
      {R"({"type":"string","pattern":"a[ab]{14}$"})", "more than 4096 automaton states"},
      {R"({"type":"string","pattern":"(ab"})", "unterminated group"},
      {R"({"type":"string","pattern":3})", "'pattern' (at #) must be a string"},
      {R"({"type":"string","format":7})", "'format' (at #) must be a string"},
      {R"({"type":"string","pattern":"^\\u0001$"})", "no string (at #) matches its 'pattern'"},
      {R"({"type":"string","pattern":"^abc$","maxLength":2})", "within its 'minLength'"},
      {R"({"type":"string","pattern":"^(ab|abcdef)$","minLength":3,"maxLength":5})",
       "no string (at #)"},
      {R"({"type":"string","format":"date","pattern":"^x"})", "'pattern' and 'format' date"},
      {R"({"type":"string","pattern":"^a+$","maxLength":2000000})", "cells"},
      {R"({"oneOf":[{"type":"string"}]})", "'oneOf'"},
      {R"({"allOf":[{"type":"string"}]})", "'allOf'"},
      {R"({"not":{"type":"string"}})", "'not'"},
      {R"({"type":"number","multipleOf":2})", "'multipleOf'"},
      {R"({"type":"array","prefixItems":[]})", "'prefixItems'"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"object","minProperties":1})", "'minProperties'"},
      {R"j({"type":"object","properties":{"a":{"type":"string","pattern":"x(?<!y)"}}})j",
       "'pattern' (at #/properties/a): lookbehind '(?<!' is not supported (offset 1)"},
      {R"({"type":"object","patternProperties":{}})", "'patternProperties'"},
      {R"({"type":"strin"})", "'type'"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "\"b\", which is not in"},
      {R"({"$ref":"http://example.com/s"})", "must point into this schema"},
      {R"({"$ref":"#/$defs/missing"})", "points at nothing"},
      {R"({"$ref":"#/$defs/a","type":"string"})", "'$ref' beside 'type'"},
      {R"({"anyOf":[],"type":"string"})", "'anyOf' beside 'type'"},
      {R"({"anyOf":[]})", "non-empty"},
      {R"({"type":"string","enum":[1,2]})", "matches its 'type'"},
      {R"({"enum":["a"],"minLength":3})", "beside 'enum'"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "satisfies its bounds"},
      {R"({"type":"number","minimum":0.0000001,"maximum":0.0000009})", "satisfies its bounds"},
      {R"({"type":"string","minLength":5,"maxLength":4})", "'minLength' 5 > 'maxLength' 4"},
      {R"({"type":"array","minItems":-1})", "'minItems'"},
      {R"({"type":"array","items":[{"type":"string"}]})", "tuple"},
      {R"({"type":"number","minimum":"1"})", "'minimum' (at #) must be a number"},
      {R"(false)", "admits no value"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
       "cycle"},
      {R"({"type":"object","properties":{"self":{"$ref":"#"}},"required":["self"]})",
       "finite size"},
      {R"({"$defs":{"l":{"type":"array","items":{"$ref":"#/$defs/l"},"minItems":1}},"$ref":"#/$defs/l"})",
       "finite size"},
      {R"(3)", "must be an object or a boolean"},
  };
  for (const auto& [s, want] : bad) {
    auto r = JsonSchema::compile(json::parse(s));
    ASSERT_FALSE(r.ok()) << s;
    EXPECT_NE(r.status().message().find(want), std::string::npos)
        << s << ": " << r.status().message() << " (want " << want << ")";
  }
}

// ---- the machine against hand-written documents ----

struct Case {
  const char* schema;
  std::vector<const char*> valid;
  std::vector<const char*> invalid;
};

TEST(JsonSchemaPrefix, HandWrittenDocuments) {
  const Case cases[] = {
      {R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false})",
       {R"({"name":"Ann","age":31})", R"({"name": "Ann", "age": 31})",
        R"({ "name" : "" , "age" : -0 })", R"({"name":"\u00e9\n\"","age":0})",
        "{\"name\":\"\xc3\xa9\xe2\x82\xac\",\"age\":7}"},
       {R"({"age":31,"name":"Ann"})", R"({"name":"Ann"})", R"({"name":"Ann","age":31,"x":1})",
        R"({"name":"Ann","age":3.5})", R"({"name":"Ann","age":01})", R"({"name":"Ann","age":1e3})",
        R"({"name":"Ann",  "age":1})", "{\n\"name\":\"a\",\"age\":1}", R"( {"name":"a","age":1})",
        R"({"name":"Ann","age":31} )", R"({"name":"\ud800","age":1})",
        "{\"name\":\"\xc3\",\"age\":1}", R"({"name":"Ann","age":1234567890123456})"}},
      {R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"number"}},"required":["b"]})",
       {R"({"b":null})", R"({"a":true,"b":null})", R"({"b":null,"c":1.5})",
        R"({"a":false,"b":null,"c":-0.000001})"},
       {R"({})", R"({"a":true})", R"({"b":null,"a":true})", R"({"b":null,"c":0.0000001})",
        R"({"b":nul})", R"({"b":null,"c":1.})", R"({"b":null,"c":.5})",
        R"({"b":null,"c":1234567890123})"}},
      {R"({"type":"array","items":{"type":"integer","minimum":10,"maximum":20},"minItems":2,"maxItems":3})",
       {"[10,20]", "[15, 11, 19]", "[ 10 , 20 ]"},
       {"[10]", "[10,20,15,12]", "[9,10]", "[10,21]", "[]", "[10,2]", "[10,-15]"}},
      {R"({"type":"number","exclusiveMinimum":0,"maximum":1})",
       {"1", "0.5", "0.000001", "1.0", "1.000000"},
       {"0", "0.0", "-0.5", "1.000001", "2", "0.0000001"}},
      {R"({"enum":["red","green",1,12,null,{"k":[true]}]})",
       {R"("red")", R"("green")", "1", "12", "null", R"({"k":[true]})"},
       {R"("blue")", "2", "123", R"({"k": [true]})", R"("Red")"}},
      {R"({"type":["string","null"],"maxLength":3})",
       {R"("abc")", "null", "\"\xc3\xa9\xc3\xa9\xc3\xa9\""},
       {R"("abcd")", "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"", "1"}},
      {R"({"type":"string","minLength":2})", {R"("ab")", R"("\n\t")"}, {R"("a")", R"("")"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{}", R"({"a":1,"b":2})", R"({"":0})"},
       {R"({"a":"x"})", R"({"a":1,})"}},
      {R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"a":1})"}},
      {R"({"anyOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind","x"]},{"type":"object","properties":{"kind":{"const":"b"},"y":{"type":"string"}},"required":["kind","y"]}]})",
       {R"({"kind":"a","x":1})", R"({"kind":"b","y":"s"})"},
       {R"({"kind":"a","y":"s"})", R"({"kind":"b","x":1})", R"({"kind":"c","x":1})"}},
      {R"({"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["v","kids"],"additionalProperties":false}},"$ref":"#/$defs/t"})",
       {R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]})"},
       {R"({"v":1})", R"({"v":1,"kids":[{"v":2}]})"}},
      {R"({})",
       {R"({"a":[1,{"b":null}],"c":"x"})", "[]", "true", "-1.25", R"("s")"},
       {"{]", "tru"}},
      // Patterns see the decoded string: an escape is one character; \u escapes are not taken.
      {R"({"type":"string","pattern":"^\\d{3}-\\d{4}$"})",
       {R"("555-1234")"},
       {R"("5551234")", R"("555-12345")", R"("55a-1234")", R"("\u0035\u0035\u0035-1234")"}},
      {R"({"type":"string","pattern":"x\"y"})",
       {R"("x\"y")", R"("ax\"yb")"},
       {R"("xy")", R"("x\\y")"}},
      {R"({"type":"string","pattern":"^[^\\n]*\\n\\t?$"})",
       {R"("ab\n")", R"("\n\t")", R"("a\/\\\n")"},
       {R"("ab")", R"("a\nb\n")"}},
      {R"({"type":"string","pattern":"^[a-z]+$","minLength":2,"maxLength":4})",
       {R"("ab")", R"("abcd")"},
       {R"("a")", R"("abcde")", R"("aB")", R"("")"}},
      {R"({"type":"string","pattern":"^(ab|abcdef)$","minLength":3})",
       {R"("abcdef")"},
       {R"("ab")", R"("abc")"}},
      {R"({"type":"string","pattern":"^\u00e9+$"})",
       {"\"\xc3\xa9\xc3\xa9\""},
       {R"("\u00e9")", R"("e")", R"("")"}},
      {R"({"type":"string","pattern":"ok","maxLength":3})",
       {R"("ok")", R"("ok!")", R"("!ok")"},
       {R"("o")", R"("okay")", R"("abc")"}},
      {R"({"type":"string","format":"date"})",
       {R"("2024-02-29")", R"("2000-02-29")", R"("1999-12-31")"},
       {R"("2023-02-29")", R"("1900-02-29")", R"("2024-13-01")", R"("2024-04-31")",
        R"("24-01-01")"}},
      {R"({"type":"string","format":"date-time"})",
       {R"("2024-05-01T12:30:00Z")", R"("2024-05-01T23:59:60.5+05:30")"},
       {R"("2024-05-01T12:30Z")", R"("2024-05-01 12:30:00Z")", R"("2024-05-01T24:00:00Z")"}},
      {R"({"type":"string","format":"uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"}},
      {R"({"type":"string","format":"ipv4"})",
       {R"("192.168.0.1")", R"("0.0.0.0")", R"("255.255.255.255")"},
       {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.1.1")"}},
      {R"({"type":"string","format":"ipv6"})",
       {R"("::1")", R"("2001:db8::8a2e:370:7334")", R"("::")", R"("1:2:3:4:5:6:7:8")"},
       {R"("1:2:3:4:5:6:7:8:9")", R"("1::2::3")", R"(":1")"}},
      {R"({"type":"string","format":"email"})",
       {R"("ann.lee+tag@mail.example.com")"},
       {R"("ann@")", R"("@example.com")", R"("ann@@example.com")", R"("ann@example")"}},
      {R"({"type":"string","format":"hostname"})",
       {R"("example.com")", R"("a")", R"("a-b.c")"},
       {R"("-a.com")", R"("a..b")", R"("")"}},
      {R"({"type":"string","format":"uri"})",
       {R"("https://example.com/a?b=c#d")", R"("mailto:ann@example.com")"},
       {R"("example.com")", R"("http://a b")"}},
      {R"({"type":"string","format":"no-such-format","maxLength":2})",
       {R"("ab")", R"("\u00e9")"},
       {R"("abc")"}},
  };
  for (const Case& c : cases) {
    const json schema = json::parse(c.schema);
    auto compiled = must_compile(schema);
    ASSERT_TRUE(compiled);
    for (const char* doc : c.valid) {
      EXPECT_TRUE(machine_accepts(*compiled, doc)) << c.schema << "\nrefused: " << doc;
      std::string why;
      EXPECT_TRUE(validate(json::parse(doc), schema, schema, &why)) << why;  // the test's own check
      // Every prefix is live: its shortest completion is finite.
      JsonSchemaPrefix m(compiled.get());
      for (const char* p = doc; *p; ++p) {
        ASSERT_TRUE(m.feed(static_cast<unsigned char>(*p)));
        EXPECT_LT(m.min_completion(), JsonSchema::kInfinite) << doc;
      }
      EXPECT_EQ(m.min_completion(), 0) << doc;
    }
    for (const char* doc : c.invalid)
      EXPECT_FALSE(machine_accepts(*compiled, doc)) << c.schema << "\naccepted: " << doc;
  }
}

TEST(JsonSchemaPrefix, CompleteAfterTheTopLevelValue) {
  auto s = must_compile(json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}}})"));
  JsonSchemaPrefix m;
  EXPECT_EQ(accepted(*s, "{\"a\":1}", &m), 7u);
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.feed(' '));
  EXPECT_FALSE(m.feed('\n'));
  // A top-level number may go on: it can end, but is not complete.
  auto n = must_compile(json::parse(R"({"type":"integer"})"));
  EXPECT_EQ(accepted(*n, "12", &m), 2u);
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.feed('3'));
}

TEST(JsonSchemaPrefix, MinCompletionCountsRequiredParts) {
  auto s = must_compile(json::parse(
      R"({"type":"object","properties":{"a":{"type":"string","minLength":3},"b":{"type":"array","items":{"type":"integer","minimum":100},"minItems":2},"c":{"type":"boolean"}},"required":["a","b"]})"));
  JsonSchemaPrefix m(s.get());
  // {"a":"aaa","b":[100,100]}
  EXPECT_EQ(m.min_completion(), 25);
  EXPECT_EQ(s->node(s->root()).min_bytes, 25);
  ASSERT_EQ(accepted(*s, "{\"a\":\"x", &m), 7u);
  EXPECT_EQ(m.min_completion(), 18);  // xaa","b":[100,100]}
}

TEST(JsonSchemaPrefix, DepthIsBounded) {
  auto s = must_compile(json::parse(R"({"type":"array","items":{"$ref":"#"}})"));
  JsonSchemaPrefix m(s.get());
  std::string open;
  while (m.feed('[')) open += '[';
  EXPECT_EQ(static_cast<int>(open.size()), JsonSchema::kMaxDepth);
  EXPECT_EQ(m.min_completion(), JsonSchema::kMaxDepth);
}

TEST(JsonSchemaPrefix, PatternCompletionAndFreeString) {
  // "ab" anywhere, at least 3 characters: `"` needs "ab" and one more.
  auto s = must_compile(json::parse(R"({"type":"string","pattern":"ab","minLength":3})"));
  JsonSchemaPrefix m(s.get());
  EXPECT_EQ(m.min_completion(), 5);  // "ab?" with one more: 1 + 3 + 1
  EXPECT_EQ(s->node(s->root()).min_bytes, 5);
  ASSERT_EQ(accepted(*s, "\"xa", &m), 3u);
  EXPECT_EQ(m.min_completion(), 2);  // b"
  EXPECT_FALSE(m.in_free_string());
  ASSERT_EQ(accepted(*s, "\"xab", &m), 4u);
  EXPECT_TRUE(m.in_free_string());  // matched and long enough: any plain character keeps it
  EXPECT_EQ(m.min_completion(), 1);
  ASSERT_TRUE(m.feed(0xC3));
  EXPECT_FALSE(m.in_free_string());  // mid-character
  // An escape costs two bytes: the shortest "\"" is `\"\""`, and feeding `\` leaves 2.
  auto q = must_compile(json::parse(R"({"type":"string","pattern":"^\"$"})"));
  ASSERT_EQ(accepted(*q, "\"", &m), 1u);
  EXPECT_EQ(m.min_completion(), 3);
  ASSERT_TRUE(m.feed('\\'));
  EXPECT_EQ(m.min_completion(), 2);
  EXPECT_FALSE(m.in_free_string());
  // Only an unanchored end is free (the automaton is not minimized: [^]*$ is not recognized).
  auto a = must_compile(json::parse(R"({"type":"string","pattern":"^a[^]*$"})"));
  ASSERT_EQ(accepted(*a, "\"a", &m), 2u);
  EXPECT_FALSE(m.in_free_string());
  auto d = must_compile(json::parse(R"({"type":"string","pattern":"^a.*$"})"));
  ASSERT_EQ(accepted(*d, "\"a", &m), 2u);
  EXPECT_FALSE(m.in_free_string());  // '.' leaves out \n: not every character
  EXPECT_TRUE(m.feed('b'));
  EXPECT_FALSE(m.feed('\\') && m.feed('n'));
}

// ---- random documents ----

TEST(JsonSchemaPrefix, RandomDocumentsValidateHandWritten) {
  const char* schemas[] = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":130},"email":{"type":["string","null"]},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":4}},"required":["name","age"]})",
      R"({"type":"object","properties":{"x":{"type":"number","minimum":-2.5,"exclusiveMaximum":3}},"required":["x"],"additionalProperties":false})",
      R"({"type":"object","properties":{"p":{"type":"number","exclusiveMinimum":999.5,"maximum":1000}},"required":["p"]})",
      R"({"type":"object","additionalProperties":{"type":"array","items":{"type":"integer","minimum":-5,"maximum":-3}}})",
      R"({"anyOf":[{"type":"integer","minimum":7,"maximum":7},{"type":"string","minLength":1,"maxLength":1},{"type":"array","items":{"type":"null"},"minItems":1}]})",
      R"({})",
      R"({"type":"array","items":{"type":"object","properties":{"k":{"const":{"a":[1,2.5,"x"]}},"v":{"type":"boolean"}},"required":["k"]},"minItems":1,"maxItems":2})",
  };
  for (size_t i = 0; i < std::size(schemas); ++i) {
    SCOPED_TRACE(schemas[i]);
    check_random_documents(json::parse(schemas[i]), 40, i);
  }
}

TEST(JsonSchemaPrefix, RandomDocumentsValidatePatterns) {
  const char* schemas[] = {
      R"({"type":"string","pattern":"^\\d{3}-\\d{3}-\\d{4}$"})",
      R"({"type":"string","pattern":"ab+c"})",
      R"({"type":"string","pattern":"^[^\"\\\\]*\"\\\\$","maxLength":6})",
      R"({"type":"string","pattern":"^(\\w+\\s?)+$","minLength":5,"maxLength":9})",
      R"({"type":"string","pattern":"\\.(jpg|png)$","minLength":8})",
      R"({"type":"string","pattern":"^[\u00e0-\u00ff\u4e00-\u4e10]{2,4}$"})",
      R"({"type":"string","pattern":"^(?!.*--)[a-z-]{3,}$","maxLength":12})",
      R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","pattern":"^#[a-z]{1,5}$"},"maxItems":3},"v":{"anyOf":[{"type":"string","pattern":"^v\\d+$"},{"type":"string","format":"ipv4"}]}},"required":["tags","v"]})",
      R"({"type":"object","additionalProperties":{"type":"string","format":"time"}})",
  };
  for (size_t i = 0; i < std::size(schemas); ++i) {
    SCOPED_TRACE(schemas[i]);
    check_random_documents(json::parse(schemas[i]), 60, 200 + i);
  }
}

// What client libraries send for string constraints, written out as they generate it:
// Pydantic v2's model_json_schema() (constr(pattern=...), EmailStr, UUID, datetime, date,
// HttpUrl | None, IPv4Address, IPv6Address, Field(pattern=...)); zod 4's z.toJSONSchema()
// (z.email(), z.uuid(), z.iso.datetime(), z.iso.date(), .regex(), both 'format' and 'pattern'
// given); zod 3 with zod-to-json-schema (formats only, with lengths).
TEST(JsonSchemaPrefix, RandomDocumentsValidateClientSchemas) {
  const char*
      schemas
          [] =
              {
                  // Pydantic.
                  R"({"properties":{"username":{"maxLength":16,"minLength":3,"pattern":"^[a-z0-9_]+$","title":"Username","type":"string"},"email":{"format":"email","title":"Email","type":"string"},"id":{"format":"uuid","title":"Id","type":"string"},"created":{"format":"date-time","title":"Created","type":"string"},"birthday":{"format":"date","title":"Birthday","type":"string"},"website":{"anyOf":[{"format":"uri","maxLength":2083,"minLength":1,"type":"string"},{"type":"null"}],"default":null,"title":"Website"},"ip":{"format":"ipv4","title":"Ip","type":"string"},"ip6":{"format":"ipv6","title":"Ip6","type":"string"},"phone":{"pattern":"^\\+?[1-9]\\d{1,14}$","title":"Phone","type":"string"}},"required":["username","email","id","created","birthday","ip","ip6","phone"],"title":"User","type":"object"})",
                  // zod 4.
                  R"({"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"email":{"type":"string","format":"email","pattern":"^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"},"id":{"type":"string","format":"uuid","pattern":"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"},"at":{"type":"string","format":"date-time","pattern":"^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))T(?:(?:[01]\\d|2[0-3]):[0-5]\\d(?::[0-5]\\d(?:\\.\\d+)?)?(?:Z))$"},"day":{"type":"string","format":"date","pattern":"^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$"},"code":{"type":"string","pattern":"^[A-Z]{3}$"}},"required":["email","id","at","day","code"],"additionalProperties":false})",
                  // zod 3 + zod-to-json-schema.
                  R"({"type":"object","properties":{"email":{"type":"string","format":"email"},"id":{"type":"string","format":"uuid"},"when":{"type":"string","format":"date-time"},"site":{"type":"string","format":"uri"},"sku":{"type":"string","pattern":"^[A-Z]{2}-\\d+$","minLength":4,"maxLength":10}},"required":["email","id","when","site","sku"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"})",
              };
  for (size_t i = 0; i < std::size(schemas); ++i) {
    SCOPED_TRACE(schemas[i]);
    check_random_documents(json::parse(schemas[i]), 40, 300 + i);
  }
}

// Schemas from OpenAI's structured outputs guide (platform.openai.com/docs/guides/structured-
// outputs): chain-of-thought math, the recursive UI generation schema ("$ref": "#"), research
// paper extraction, and the $defs linked-list example; plus a moderation-style schema with
// nullable fields.
TEST(JsonSchemaPrefix, RandomDocumentsValidatePublicSchemas) {
  const char* schemas[] = {
      // Math reasoning.
      R"({"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},"required":["explanation","output"],"additionalProperties":false}},"final_answer":{"type":"string"}},"required":["steps","final_answer"],"additionalProperties":false})",
      // UI generation (recursive).
      R"({"type":"object","properties":{"type":{"type":"string","description":"The type of the UI component","enum":["div","button","header","section","field","form"]},"label":{"type":"string","description":"The label of the UI component, used for buttons or form fields"},"children":{"type":"array","description":"Nested UI components","items":{"$ref":"#"}},"attributes":{"type":"array","description":"Arbitrary attributes for the UI component, suitable for any element","items":{"type":"object","properties":{"name":{"type":"string","description":"The name of the attribute, for example onClick or className"},"value":{"type":"string","description":"The value of the attribute"}},"required":["name","value"],"additionalProperties":false}}},"required":["type","label","children","attributes"],"additionalProperties":false})",
      // Research paper extraction.
      R"({"type":"object","properties":{"title":{"type":"string"},"authors":{"type":"array","items":{"type":"string"}},"abstract":{"type":"string"},"keywords":{"type":"array","items":{"type":"string"}}},"required":["title","authors","abstract","keywords"],"additionalProperties":false})",
      // Definitions and a recursive linked list.
      R"({"type":"object","properties":{"linked_list":{"$ref":"#/$defs/linked_list_node"}},"$defs":{"linked_list_node":{"type":"object","properties":{"value":{"type":"number"},"next":{"anyOf":[{"$ref":"#/$defs/linked_list_node"},{"type":"null"}]}},"additionalProperties":false,"required":["next","value"]}},"additionalProperties":false,"required":["linked_list"]})",
      // Moderation.
      R"({"type":"object","properties":{"is_violating":{"type":"boolean"},"category":{"type":["string","null"],"enum":["violence","sexual","self_harm",null]},"explanation_if_violating":{"type":["string","null"]}},"required":["is_violating","category","explanation_if_violating"],"additionalProperties":false})",
      // The guide's "definitions" example: steps with $defs.
      R"({"type":"object","properties":{"steps":{"type":"array","items":{"$ref":"#/$defs/step"}},"final_answer":{"type":"string"}},"$defs":{"step":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},"required":["explanation","output"],"additionalProperties":false}},"required":["steps","final_answer"],"additionalProperties":false})",
  };
  for (size_t i = 0; i < std::size(schemas); ++i) {
    SCOPED_TRACE(schemas[i]);
    check_random_documents(json::parse(schemas[i]), 40, 100 + i);
  }
}

}  // namespace
}  // namespace oscar::engine
