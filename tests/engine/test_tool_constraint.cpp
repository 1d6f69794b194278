// engine/tool_constraint.h: the JSON prefix automaton accepts exactly the prefixes of JSON objects
// that nlohmann::json parses (valid and invalid cases, every prefix of the valid ones), and the
// constraint, driven by random choices among the allowed tokens of the real Qwen3 tokenizer and
// of the embedded model's, always ends in a call that output_parser-style parsing accepts, with
// one of the allowed names.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "engine/tool_constraint.h"

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
  auto t = tok::Tokenizer::load("tests/data/qwen3_tokenizer");
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

}  // namespace
}  // namespace oscar::engine
