// engine/tool_constraint.h: the JSON prefix automaton accepts exactly the prefixes of JSON objects
// that nlohmann::json parses (valid and invalid cases, every prefix of the valid ones), and the
// constraint, driven by random choices among the allowed tokens of the real Qwen3 tokenizer and
// of the embedded model's, always ends in a call that output_parser-style parsing accepts, with
// one of the allowed names.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "engine/tool_constraint.h"
#include "schema_validator.h"

namespace oscar::engine {
namespace {

// Feeds s; returns the number of bytes accepted (s.size() when all were).
size_t accepted(const std::string& s, JsonObjectPrefix* j) {
  for (size_t i = 0; i < s.size(); ++i)
    if (!j->feed(static_cast<unsigned char>(s[i]))) return i;
  return s.size();
}

TEST(JsonObjectPrefix, AcceptsObjectsAndEveryPrefix) {
  const char* valid[] = {
      "{}",
      " {\"a\": 1}",
      "{\"a\":[1,2.5,-0.25e+3,true,false,null,{\"b\":[]}],\"c\":\"x\\n\\u00e9\\\"\"}",
      "{\"k\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}",
      "{ \"n\" : 0 , \"m\" : -0 , \"e\" : 1E5 }",
      "{\"deep\":[[[[{\"x\":[]}]]]]}",
  };
  for (const char* v : valid) {
    const std::string s = v;
    ASSERT_TRUE(nlohmann::json::accept(s)) << s;
    JsonObjectPrefix j;
    EXPECT_EQ(accepted(s, &j), s.size()) << s;
    EXPECT_TRUE(j.complete()) << s;
    EXPECT_FALSE(j.feed(' ')) << "nothing after the object: " << s;
    for (size_t n = 0; n + 1 < s.size(); ++n) {  // every proper prefix is accepted, incomplete
      JsonObjectPrefix p;
      EXPECT_EQ(accepted(s.substr(0, n), &p), n) << s.substr(0, n);
      EXPECT_FALSE(p.complete()) << s.substr(0, n);
    }
  }
  const char* invalid[] = {
      "[1]",
      "\"a\"",
      "1",
      "{a:1}",
      "{\"a\" 1}",
      "{\"a\":01}",
      "{\"a\":1.}",
      "{\"a\":-}",
      "{\"a\":1,}",
      "{\"a\":tru}",
      "{\"a\":\"\\x\"}",
      "{\"a\":\"\x01\"}",
      "{\"a\":\"\xc0\xaf\"}",
      "{\"a\":\"\xed\xa0\x80\"}",
      "{\"a\":\"\\ud800\"}",
      "{\"a\":[1}",
      "{\"a\":{]}",
      "{,}",
  };
  for (const char* v : invalid) {
    const std::string s = v;
    const bool parses = nlohmann::json::accept(s);
    JsonObjectPrefix j;
    const bool all = accepted(s, &j) == s.size() && j.complete();
    EXPECT_FALSE(all) << s;
    if (s[0] == '{') {
      EXPECT_FALSE(parses) << s;  // the refusals agree with the parser
    }
  }
  // closing(): from every prefix of the valid texts (and of bytes the automaton accepts), the
  // shortest completion gives an object the parser accepts.
  for (const char* v : valid) {
    const std::string str = v;
    for (size_t n = 0; n <= str.size(); ++n) {
      JsonObjectPrefix p;
      ASSERT_EQ(accepted(str.substr(0, n), &p), n);
      const std::string close = p.closing();
      EXPECT_EQ(p.closing_size(), static_cast<int64_t>(close.size())) << str.substr(0, n);
      for (size_t k = 0; k < close.size(); ++k) {  // a prefix of it leaves the rest
        JsonObjectPrefix q = p;
        ASSERT_EQ(accepted(close.substr(0, k), &q), k);
        EXPECT_EQ(q.closing(), close.substr(k)) << str.substr(0, n) << " + " << close;
      }
      EXPECT_EQ(accepted(close, &p), close.size()) << str.substr(0, n) << " + " << close;
      EXPECT_TRUE(p.complete()) << str.substr(0, n) << " + " << close;
      EXPECT_TRUE(nlohmann::json::accept(str.substr(0, n) + close)) << str.substr(0, n) + close;
    }
  }
  for (const char* partial : {"{\"a\":\"\\u0", "{\"a\":\"\\ud", "{\"a\":\"\\", "{\"k", "{\"a\":-",
                              "{\"a\":1.", "{\"a\":1e+", "{\"a\":[tr", "{\"a\":\"\xe0",
                              "{\"a\":\"\xf4\x8f", "{\"a\":{\"b\":[[", "{\"a\":1,", "{\"a\":[1,"}) {
    JsonObjectPrefix p;
    ASSERT_EQ(accepted(partial, &p), std::string(partial).size()) << partial;
    EXPECT_EQ(p.closing_size(), static_cast<int64_t>(p.closing().size())) << partial;
    const std::string text = std::string(partial) + p.closing();
    JsonObjectPrefix q;
    EXPECT_EQ(accepted(text, &q), text.size()) << text;
    EXPECT_TRUE(q.complete()) << text;
    EXPECT_TRUE(nlohmann::json::accept(text)) << text;
  }
  // Limits: nesting and whitespace runs.
  JsonObjectPrefix deep;
  std::string open = "{\"a\":";
  for (int i = 1; i < JsonObjectPrefix::kMaxDepth; ++i) open += "[";
  EXPECT_EQ(accepted(open, &deep), open.size());
  EXPECT_FALSE(deep.feed('['));
  JsonObjectPrefix ws;
  EXPECT_EQ(accepted("{" + std::string(JsonObjectPrefix::kMaxWhitespace, ' '), &ws),
            JsonObjectPrefix::kMaxWhitespace + 1u);
  EXPECT_FALSE(ws.feed(' '));
}

// Draws random allowed tokens until done; returns the decoded text.
std::string random_call(const tok::Tokenizer& t, const std::vector<std::string>& names,
                        uint64_t seed, int* steps) {
  auto c = ToolCallConstraint::create(t, names);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> allowed;
  std::vector<int32_t> ids;
  std::vector<int32_t> choices;
  *steps = 0;
  const int budget = 120;  // tokens: the call must close within them
  while (!c.value()->done() && *steps < budget) {
    c.value()->allowed_tokens(&allowed, budget - *steps);
    choices.clear();
    for (int32_t i = 0; i < static_cast<int32_t>(allowed.size()); ++i)
      if (allowed[i]) choices.push_back(i);
    EXPECT_FALSE(choices.empty());
    if (choices.empty()) break;
    // Prefer closing tokens now and then, so that objects end within the step budget.
    int32_t tok = choices[rng() % choices.size()];
    if (*steps > 40) {
      for (int32_t ch : choices)
        if (t.token_bytes(ch).find_first_of("}]\"") != std::string_view::npos && rng() % 2) {
          tok = ch;
          break;
        }
    }
    EXPECT_NE(tok, t.eos_token_id().value_or(-1));
    EXPECT_TRUE(c.value()->advance(tok));
    ids.push_back(tok);
    ++*steps;
  }
  EXPECT_TRUE(c.value()->done()) << t.decode(ids);
  return t.decode(ids);
}

void check_calls(const tok::Tokenizer& t, uint64_t n_seeds) {
  const std::vector<std::string> names = {"get_weather", "get_time", "search"};
  for (uint64_t seed = 0; seed < n_seeds; ++seed) {
    int steps = 0;
    const std::vector<std::string> allowed =
        seed % 3 == 0 ? std::vector<std::string>{"get_time"} : names;
    const std::string text = random_call(t, allowed, seed, &steps);
    const std::string open = "<tool_call>\n", close = "\n</tool_call>";
    ASSERT_EQ(text.rfind(open, 0), 0u) << text;
    ASSERT_GE(text.size(), open.size() + close.size());
    ASSERT_EQ(text.substr(text.size() - close.size()), close) << text;
    const std::string body = text.substr(open.size(), text.size() - open.size() - close.size());
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(body)) << body;
    ASSERT_TRUE(j["name"].is_string());
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), j["name"].get<std::string>()),
              allowed.end())
        << body;
    EXPECT_TRUE(j["arguments"].is_object()) << body;
  }
}

TEST(ToolCallConstraint, RandomDrawsGiveValidCallsQwen3Tokenizer) {
  auto t = tok::Tokenizer::load(OSCAR_QWEN3_TOKENIZER_DIR);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // The real tokenizer has <tool_call> as one (added, non-special) token: it is forced as such.
  auto c = ToolCallConstraint::create(t.value(), {"f"});
  ASSERT_TRUE(c.ok());
  std::vector<uint8_t> allowed;
  c.value()->allowed_tokens(&allowed, 100);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 1);
  EXPECT_EQ(allowed[t.value().token_to_id("<tool_call>").value()], 1);
  check_calls(t.value(), 6);
}

TEST(ToolCallConstraint, RandomDrawsGiveValidCallsTinyModel) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  check_calls(t.value(), 24);
}

// Every budget, from none to past the shortest call: each step allows at least one token (a mask
// of zeros once made the scheduler draw token 0 and fail the request with a 500: max_tokens 21..26
// for get_weather with the tiny model's tokenizer, enough for the name but not for `{}` and the
// end), and a budget that fits the shortest call gets a whole one.
TEST(ToolCallConstraint, EveryBudgetAllowsATokenAndFitsTheShortestCall) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  int shortest = -1;  // the smallest budget that ends in a whole call
  for (int budget = 1; budget <= 40; ++budget) {
    auto c = ToolCallConstraint::create(t.value(), {"get_weather"});
    ASSERT_TRUE(c.ok());
    std::vector<uint8_t> allowed;
    std::vector<int32_t> ids;
    for (int step = 0; step < budget && !c.value()->done(); ++step) {
      c.value()->allowed_tokens(&allowed, budget - step);
      // The longest allowed token: the draw that gets furthest, as a model may.
      int32_t tok = -1;
      for (int32_t i = 0; i < static_cast<int32_t>(allowed.size()); ++i)
        if (allowed[i] &&
            (tok < 0 || t.value().token_bytes(i).size() > t.value().token_bytes(tok).size()))
          tok = i;
      ASSERT_GE(tok, 0) << "budget " << budget << ", step " << step << ": no token allowed after "
                        << t.value().decode(ids);
      ASSERT_TRUE(c.value()->advance(tok));
      ids.push_back(tok);
    }
    if (c.value()->done() && shortest < 0) shortest = budget;
    if (shortest > 0) {
      EXPECT_TRUE(c.value()->done()) << "budget " << budget << ": " << t.value().decode(ids);
    }
  }
  ASSERT_GT(shortest, 0);
  // Below it, the text is a prefix of that shortest call (cut by the budget, not malformed).
  auto c = ToolCallConstraint::create(t.value(), {"get_weather"});
  ASSERT_TRUE(c.ok());
  std::vector<uint8_t> allowed;
  std::vector<int32_t> ids;
  for (int step = 0; step < shortest - 1; ++step) {
    c.value()->allowed_tokens(&allowed, shortest - 1 - step);
    const auto it = std::find(allowed.begin(), allowed.end(), 1);
    ASSERT_NE(it, allowed.end());
    const int32_t tok = static_cast<int32_t>(it - allowed.begin());
    ASSERT_TRUE(c.value()->advance(tok));
    ids.push_back(tok);
  }
  EXPECT_FALSE(c.value()->done());
  const std::string whole =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
  EXPECT_EQ(whole.rfind(t.value().decode(ids), 0), 0u) << t.value().decode(ids);
}

// JSON mode: random allowed draws make one JSON object, closed within every budget that fits
// `{}`, and every step allows a token.
TEST(ToolCallConstraint, JsonModeGivesOneObjectWithinEveryBudget) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::mt19937_64 rng(11);
  for (int budget : {2, 3, 5, 8, 20, 60}) {
    for (int rep = 0; rep < 4; ++rep) {
      auto c = ToolCallConstraint::create_json_object(t.value());
      std::vector<uint8_t> allowed;
      std::vector<int32_t> ids;
      for (int step = 0; step < budget && !c->done(); ++step) {
        c->allowed_tokens(&allowed, budget - step);
        std::vector<int32_t> choices;
        for (int32_t i = 0; i < static_cast<int32_t>(allowed.size()); ++i)
          if (allowed[i]) choices.push_back(i);
        ASSERT_FALSE(choices.empty()) << "budget " << budget << " step " << step;
        const int32_t tok = choices[rng() % choices.size()];
        ASSERT_TRUE(c->advance(tok));
        ids.push_back(tok);
      }
      const std::string text = t.value().decode(ids);
      ASSERT_TRUE(c->done()) << "budget " << budget << ": " << text;
      nlohmann::json j;
      ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
      EXPECT_TRUE(j.is_object()) << text;
    }
  }
}

TEST(ToolCallConstraint, RefusesNoNames) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(ToolCallConstraint::create(t.value(), {}).ok());
  EXPECT_FALSE(ToolCallConstraint::create(t.value(), {""}).ok());
  // A token that was not allowed is refused and changes nothing.
  auto c = ToolCallConstraint::create(t.value(), {"f"});
  ASSERT_TRUE(c.ok());
  const int32_t x = t.value().encode("x")[0];
  EXPECT_FALSE(c.value()->advance(x));
  std::vector<uint8_t> allowed;
  c.value()->allowed_tokens(&allowed, 100);
  EXPECT_EQ(allowed[x], 0);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 1);
}

// ---- structured outputs (json_schema) and strict tool calls ----

using ojson = nlohmann::ordered_json;

// Schemas for the token-level draws: OpenAI's math reasoning and UI examples, and small ones with
// every kind of value.
const char* kTokenSchemas[] = {
    R"({"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},"required":["explanation","output"],"additionalProperties":false}},"final_answer":{"type":"string"}},"required":["steps","final_answer"],"additionalProperties":false})",
    R"({"type":"object","properties":{"type":{"type":"string","enum":["div","button","header","section","field","form"]},"label":{"type":"string"},"children":{"type":"array","items":{"$ref":"#"}},"attributes":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"value":{"type":"string"}},"required":["name","value"],"additionalProperties":false}}},"required":["type","label","children","attributes"],"additionalProperties":false})",
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":20},"age":{"type":"integer","minimum":0,"maximum":120},"score":{"type":"number","minimum":-1,"maximum":1},"ok":{"type":"boolean"},"tags":{"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":3},"note":{"type":["string","null"]}},"required":["name","age","ok","tags"]})",
    R"({"anyOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number","exclusiveMinimum":0}},"required":["kind","r"]},{"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"integer","minimum":1}},"required":["kind","side"]}]})",
    R"({"type":"integer","minimum":10,"maximum":99})",
    R"({"type":"array","items":{"type":"string","minLength":1,"maxLength":4},"minItems":2,"maxItems":2})",
    // Patterns and formats: anchored, unanchored (free once matched), with lengths.
    R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"day":{"type":"string","format":"date"},"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},"mail":{"type":"string","format":"email","maxLength":40},"note":{"type":"string","pattern":"ok"}},"required":["id","day","code","mail","note"]})",
};
constexpr size_t kPatternSchema = 6;

std::shared_ptr<const JsonSchema> compile_or_die(const char* text) {
  auto r = JsonSchema::compile(ojson::parse(text));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : nullptr;
}

// Random allowed tokens (steered to closing characters late, as in random_call) until done or the
// budget ends; returns the text, with *eos when the end-of-sequence token ended it.
std::string random_document(const tok::Tokenizer& t, ToolCallConstraint& c, int budget,
                            std::mt19937_64& rng, bool* ended) {
  std::vector<uint8_t> allowed;
  std::vector<int32_t> ids, choices;
  const int32_t eos = t.eos_token_id().value_or(-1);
  *ended = false;
  for (int step = 0; step < budget && !c.done(); ++step) {
    c.allowed_tokens(&allowed, budget - step);
    choices.clear();
    for (int32_t i = 0; i < static_cast<int32_t>(allowed.size()); ++i)
      if (allowed[i]) choices.push_back(i);
    EXPECT_FALSE(choices.empty()) << "step " << step << " after " << t.decode(ids) << " ("
                                  << ids.size() << " tokens, last "
                                  << (ids.empty() ? -1 : ids.back()) << ")";
    if (choices.empty()) break;
    int32_t tok = choices[rng() % choices.size()];
    if (step > budget / 3)
      for (int32_t ch : choices)
        if (t.token_bytes(ch).find_first_of("}]\"") != std::string_view::npos && rng() % 2) {
          tok = ch;
          break;
        }
    EXPECT_TRUE(c.advance(tok));
    if (tok == eos) {
      *ended = true;
      break;
    }
    ids.push_back(tok);
  }
  return t.decode(ids);
}

void check_schema_draws(const tok::Tokenizer& t, int reps, std::shared_ptr<const TokenTrie> vocab) {
  std::mt19937_64 rng(5);
  for (const char* text : kTokenSchemas) {
    // A top-level number ends with end-of-sequence: not with a tokenizer that has none (the
    // Qwen3 test tokenizer ships without its config).
    if (text == kTokenSchemas[4] && !t.eos_token_id()) continue;
    SCOPED_TRACE(text);
    const ojson schema = ojson::parse(text);
    auto compiled = compile_or_die(text);
    ASSERT_TRUE(compiled);
    const int shortest = static_cast<int>(compiled->node(compiled->root()).min_bytes);
    for (int budget : {shortest + 2, std::max(shortest + 2, 40), std::max(shortest + 2, 150)}) {
      for (int rep = 0; rep < reps; ++rep) {
        auto c = ToolCallConstraint::create_json_schema(t, compiled, vocab);
        bool ended = false;
        const std::string doc = random_document(t, *c, budget, rng, &ended);
        ASSERT_TRUE(c->done()) << "budget " << budget << ": " << doc;
        ojson v;
        ASSERT_NO_THROW(v = ojson::parse(doc)) << doc;
        std::string why;
        EXPECT_TRUE(test::validate(v, schema, schema, &why)) << why << "\n" << doc;
      }
    }
  }
}

TEST(ToolCallConstraint, JsonSchemaDrawsValidateTinyModel) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  check_schema_draws(t.value(), 6, TokenTrie::build(t.value()));
}

TEST(ToolCallConstraint, JsonSchemaDrawsValidateQwen3Tokenizer) {
  auto t = tok::Tokenizer::load(OSCAR_QWEN3_TOKENIZER_DIR);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  check_schema_draws(t.value(), 1, TokenTrie::build(t.value()));
}

// The trie walk gives the same mask as probing each token alone (the definition), with and
// without patterns (whose free strings take the plain tokens together).
TEST(ToolCallConstraint, JsonSchemaMaskEqualsPerTokenProbe) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok());
  auto vocab = TokenTrie::build(t.value());
  for (size_t schema : {size_t{2}, kPatternSchema}) {
    SCOPED_TRACE(kTokenSchemas[schema]);
    auto compiled = compile_or_die(kTokenSchemas[schema]);
    ASSERT_TRUE(compiled);
    auto c = ToolCallConstraint::create_json_schema(t.value(), compiled, vocab);
    JsonSchemaPrefix doc(compiled.get());
    std::mt19937_64 rng(3);
    std::vector<uint8_t> allowed;
    for (int step = 0; step < 120 && !c->done(); ++step) {
      const int64_t left = 1000;
      c->allowed_tokens(&allowed, left);
      for (int32_t tok = 0; tok < t.value().vocab_size(); ++tok) {
        const std::string& b = vocab->bytes[static_cast<size_t>(tok)];
        bool ok = !b.empty();
        JsonSchemaPrefix probe = doc;
        for (size_t i = 0; ok && i < b.size(); ++i)
          ok = !probe.complete() && probe.feed(static_cast<unsigned char>(b[i]));
        ok = ok && probe.min_completion() <= left - 1;
        ASSERT_EQ(allowed[static_cast<size_t>(tok)] != 0, ok)
            << "token " << tok << " '" << b << "'";
      }
      std::vector<int32_t> choices;
      for (int32_t i = 0; i < static_cast<int32_t>(allowed.size()); ++i)
        if (allowed[i]) choices.push_back(i);
      ASSERT_FALSE(choices.empty());
      const int32_t tok = choices[rng() % choices.size()];
      ASSERT_TRUE(c->advance(tok));
      for (char ch : vocab->bytes[static_cast<size_t>(tok)])
        ASSERT_TRUE(doc.feed(static_cast<unsigned char>(ch)));
    }
  }
}

// A top-level number ends with the end-of-sequence token, allowed once the number may end.
TEST(ToolCallConstraint, JsonSchemaTopLevelNumberEndsWithEos) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok());
  const int32_t eos = t.value().eos_token_id().value();
  auto c = ToolCallConstraint::create_json_schema(t.value(), compile_or_die(kTokenSchemas[4]));
  std::vector<uint8_t> allowed;
  c->allowed_tokens(&allowed, 10);
  EXPECT_EQ(allowed[static_cast<size_t>(eos)], 0);
  ASSERT_TRUE(c->advance(t.value().encode("4")[0]));
  c->allowed_tokens(&allowed, 10);
  EXPECT_EQ(allowed[static_cast<size_t>(eos)], 0);  // 4 is below the minimum
  ASSERT_TRUE(c->advance(t.value().encode("2")[0]));
  c->allowed_tokens(&allowed, 10);
  EXPECT_EQ(allowed[static_cast<size_t>(eos)], 1);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 1);  // 42: two digits at most
  EXPECT_TRUE(c->advance(eos));
  EXPECT_TRUE(c->done());
}

// The strict tool of the tests below, and the check of one drawn call's text: the tags around
// one JSON object whose arguments follow get_weather's schema, or are any object for get_time.
// True for a get_weather call.
constexpr const char* kWeather =
    R"({"type":"object","properties":{"city":{"type":"string","minLength":1},"unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false})";

bool check_strict_call(const std::string& text) {
  const std::string open = "<tool_call>\n", close = "\n</tool_call>";
  EXPECT_EQ(text.rfind(open, 0), 0u) << text;
  if (text.rfind(open, 0) != 0 || text.size() < open.size() + close.size()) return false;
  const std::string body = text.substr(open.size(), text.size() - open.size() - close.size());
  ojson j;
  EXPECT_NO_THROW(j = ojson::parse(body)) << body;
  if (j["name"] == "get_weather") {
    std::string why;
    const ojson schema = ojson::parse(kWeather);
    EXPECT_TRUE(test::validate(j["arguments"], schema, schema, &why)) << why << "\n" << body;
    return true;
  }
  EXPECT_EQ(j["name"], "get_time") << body;
  EXPECT_TRUE(j["arguments"].is_object()) << body;
  return false;
}

// Strict tool calls: the arguments of each name follow that name's schema.
TEST(ToolCallConstraint, StrictToolArgumentsFollowTheirSchema) {
  auto t = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(t.ok());
  const std::vector<std::string> names = {"get_weather", "get_time"};
  const std::vector<std::shared_ptr<const JsonSchema>> schemas = {compile_or_die(kWeather),
                                                                  nullptr};
  auto vocab = TokenTrie::build(t.value());
  std::mt19937_64 rng(9);
  int weather_calls = 0;
  for (int rep = 0; rep < 16; ++rep) {
    auto c = ToolCallConstraint::create(t.value(), names, schemas, vocab);
    ASSERT_TRUE(c.ok());
    bool ended = false;
    const std::string text = random_document(t.value(), *c.value(), 90, rng, &ended);
    ASSERT_TRUE(c.value()->done()) << text;
    weather_calls += check_strict_call(text);
  }
  EXPECT_GT(weather_calls, 0);
  // A non-object schema is refused for arguments.
  EXPECT_FALSE(
      ToolCallConstraint::create(t.value(), {"f"}, {compile_or_die(R"({"type":"string"})")}).ok());
  EXPECT_FALSE(ToolCallConstraint::create(t.value(), {"f", "g"}, {nullptr}).ok());
}

// tool_choice "auto" with strict tools: free text (every token allowed) until the model draws the
// <tool_call> token, then a call whose arguments follow the named tool's schema.
TEST(ToolCallConstraint, OnCallIsFreeUntilTheCallStarts) {
  auto t = tok::Tokenizer::load(OSCAR_QWEN3_TOKENIZER_DIR);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::vector<std::string> names = {"get_weather", "get_time"};
  const std::vector<std::shared_ptr<const JsonSchema>> schemas = {compile_or_die(kWeather),
                                                                  nullptr};
  auto vocab = TokenTrie::build(t.value());
  const int32_t tag = t.value().token_to_id("<tool_call>").value();
  std::mt19937_64 rng(11);
  int weather_calls = 0;
  for (int rep = 0; rep < 8; ++rep) {
    auto c = ToolCallConstraint::create_on_call(t.value(), names, schemas, vocab);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    std::vector<uint8_t> allowed;
    for (const int32_t id : t.value().encode("Let me look that up <b>now</b>: {\"x\": 1}")) {
      EXPECT_FALSE(c.value()->active());
      c.value()->allowed_tokens(&allowed, 100);
      EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1),
                static_cast<std::ptrdiff_t>(allowed.size()));
      EXPECT_TRUE(c.value()->advance(id));
      EXPECT_FALSE(c.value()->done());
    }
    EXPECT_TRUE(c.value()->advance(tag));
    EXPECT_TRUE(c.value()->active());
    bool ended = false;
    const std::string rest = random_document(t.value(), *c.value(), 90, rng, &ended);
    ASSERT_TRUE(c.value()->done()) << rest;
    weather_calls += check_strict_call("<tool_call>" + rest);
  }
  EXPECT_GT(weather_calls, 0);
  // Without a single token for the tag the call could start at any "<": refused.
  auto tiny = tok::Tokenizer::load("models/tiny-qwen3");
  ASSERT_TRUE(tiny.ok());
  if (!tiny.value().token_to_id("<tool_call>").has_value()) {
    EXPECT_FALSE(ToolCallConstraint::create_on_call(tiny.value(), names, schemas).ok());
  }
}

// The mask's cost per decoded token (printed; not a pass/fail bound): the tiny model's vocabulary
// and Qwen3's, at the start of a document, inside a free string and inside a number.
TEST(ToolCallConstraint, JsonSchemaMaskCost) {
  for (const char* dir : {"models/tiny-qwen3", OSCAR_QWEN3_TOKENIZER_DIR}) {
    auto t = tok::Tokenizer::load(dir);
    ASSERT_TRUE(t.ok());
    const auto t0 = std::chrono::steady_clock::now();
    auto vocab = TokenTrie::build(t.value());
    const double build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto compiled = compile_or_die(kTokenSchemas[0]);
    std::printf(
        "[ mask cost ] %s: vocab %d, trie %zu nodes (%zu plain string tokens) built in "
        "%.1f ms\n",
        dir, t.value().vocab_size(), vocab->all.nodes.size(), vocab->plain.size(), build_ms);
    auto person = compile_or_die(kTokenSchemas[2]);
    auto pattern = compile_or_die(kTokenSchemas[kPatternSchema]);
    for (
        const auto& [label, prefix] : std::vector<std::pair<const char*, std::string>>{
            {"start", ""},
            {"in a string", R"({"steps":[{"explanation":"abc)"},
            {"after a key", R"({"steps":[{"explanation")"},
            {"in a number", R"({"name":"a","age":4)"},
            {"in a uuid", R"({"id":"123e4567-e8)"},
            {"in a pattern string, matched",
             R"({"id":"123e4567-e89b-12d3-a456-426614174000","day":"2024-01-31","code":"AB-123","mail":"a@b.co","note":"it is ok)"}}) {
      auto& schema = prefix.rfind(R"({"name")", 0) == 0 ? person
                     : prefix.rfind(R"({"id")", 0) == 0 ? pattern
                                                        : compiled;
      auto c = ToolCallConstraint::create_json_schema(t.value(), schema, vocab);
      for (int32_t id : t.value().encode(prefix)) ASSERT_TRUE(c->advance(id)) << prefix;
      std::vector<uint8_t> allowed;
      const int reps = 20;
      const auto s0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) c->allowed_tokens(&allowed, 1000);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count() /
          reps;
      std::printf("[ mask cost ] %s, %s: %.3f ms per token, %lld tokens allowed\n", dir, label, ms,
                  static_cast<long long>(std::count(allowed.begin(), allowed.end(), 1)));
    }
    // The JSON-object machine (response_format json_object) for comparison.
    auto j = ToolCallConstraint::create_json_object(t.value(), vocab);
    for (int32_t id : t.value().encode(R"({"steps":[{"explanation":"abc)"))
      ASSERT_TRUE(j->advance(id));
    std::vector<uint8_t> allowed;
    const auto s0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 20; ++r) j->allowed_tokens(&allowed, 1000);
    std::printf(
        "[ mask cost ] %s, json_object in a string: %.3f ms per token\n", dir,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count() /
            20);
  }
}

}  // namespace
}  // namespace oscar::engine
