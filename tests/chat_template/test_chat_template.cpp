// Tests of ChatTemplate: the real Qwen3 template against transformers' renderings
// (models/tiny-qwen3/golden/chat_template_cases.json, exact string match), then each Jinja
// construct, the sandbox caps and the error messages of malformed templates.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace oscar::tok {
namespace {

using json = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// First differing position with some context on both sides, for failure messages.
std::string describe_diff(const std::string& want, const std::string& got) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  size_t from = k > 40 ? k - 40 : 0;
  std::ostringstream os;
  os << "first difference at byte " << k << " (want " << want.size() << " bytes, got "
     << got.size() << ")\n  want: ..." << json(want.substr(from, 80)).dump()
     << "\n  got:  ..." << json(got.substr(from, 80)).dump();
  return os.str();
}

// Renders `src` with `ctx`; the test fails on an error.
std::string render(const std::string& src, const json& ctx = json::object(),
                   const ChatTemplateOptions& opt = {}) {
  auto t = ChatTemplate::parse(src, opt);
  if (!t.ok()) {
    ADD_FAILURE() << "parse failed: " << t.status().to_string() << "\n  template: " << src;
    return "<parse error>";
  }
  auto r = t->render(ctx);
  if (!r.ok()) {
    ADD_FAILURE() << "render failed: " << r.status().to_string() << "\n  template: " << src;
    return "<render error>";
  }
  return r.value();
}

// The Status of parsing or rendering `src`, which is expected to fail.
Status render_error(const std::string& src, const json& ctx = json::object(),
                    const ChatTemplateOptions& opt = {}) {
  auto t = ChatTemplate::parse(src, opt);
  if (!t.ok()) return t.status();
  auto r = t->render(ctx);
  if (r.ok()) return Status();
  return r.status();
}

TEST(ChatTemplateGolden, Qwen3CasesRenderExactly) {
  std::string text = read_file("models/tiny-qwen3/golden/chat_template_cases.json");
  ASSERT_FALSE(text.empty()) << "missing golden file (tests run from the repository root)";
  json golden = json::parse(text);
  auto tmpl = ChatTemplate::parse(golden["template"].get<std::string>());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  ASSERT_EQ(golden["cases"].size(), 10u);
  int index = 0;
  for (const json& c : golden["cases"]) {
    json kwargs = c["kwargs"];
    json tools = kwargs.contains("tools") ? kwargs["tools"] : json();
    json extra = json::object();
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
      if (it.key() != "tools") extra[it.key()] = it.value();
    }
    auto r = render_chat(*tmpl, c["messages"], tools, c["add_generation_prompt"].get<bool>(),
                         extra, "", "<|im_end|>");
    ASSERT_TRUE(r.ok()) << "case " << index << ": " << r.status().to_string();
    std::string want = c["rendered"].get<std::string>();
    EXPECT_EQ(r.value(), want) << "case " << index << ": " << describe_diff(want, r.value());
    ++index;
  }
}

TEST(ChatTemplateGolden, TokenizerConfigTemplateMatchesGoldenTemplate) {
  std::string text = read_file("models/tiny-qwen3/tokenizer_config.json");
  ASSERT_FALSE(text.empty());
  json cfg = json::parse(text);
  json golden = json::parse(read_file("models/tiny-qwen3/golden/chat_template_cases.json"));
  EXPECT_EQ(cfg["chat_template"], golden["template"]);
}

// Every case of a case file written by gen_jinja_cases.py (rendered by Python's Jinja2 as
// transformers configures it) renders to the same string, or fails where Jinja fails.
void expect_cases_match_jinja(const std::string& path) {
  std::string text = read_file(path);
  ASSERT_FALSE(text.empty()) << "missing " << path;
  json doc = json::parse(text);
  int passed = 0, index = 0;
  for (const json& c : doc["cases"]) {
    std::string src = c["template"].get<std::string>();
    auto t = ChatTemplate::parse(src);
    Result<std::string> r = t.ok() ? t->render(c["context"]) : Result<std::string>(t.status());
    if (c.contains("error")) {
      EXPECT_FALSE(r.ok()) << "case " << index << " should fail like Jinja ("
                           << c["error"].get<std::string>() << ")\n  template: " << src
                           << "\n  got: " << (r.ok() ? r.value() : "");
      passed += !r.ok();
    } else if (!r.ok()) {
      ADD_FAILURE() << "case " << index << ": " << r.status().to_string()
                    << "\n  template: " << src;
    } else {
      std::string want = c["expected"].get<std::string>();
      EXPECT_EQ(r.value(), want) << "case " << index << "\n  template: " << src << "\n  "
                                 << describe_diff(want, r.value());
      passed += r.value() == want;
    }
    ++index;
  }
  std::printf("jinja differential cases (%s): %d/%d agree\n", path.c_str(), passed, index);
}

// Hand-written cases: each construct, realistic template fragments, errors.
TEST(ChatTemplateJinja, MatchesPythonJinja2) {
  // OSCAR_JINJA_CASES points at another case file (e.g. gen_jinja_cases.py --random output).
  const char* path = std::getenv("OSCAR_JINJA_CASES");
  expect_cases_match_jinja(path ? path : "tests/chat_template/jinja_cases.json");
}

// 300 random templates (seed 2026): whitespace control, expressions, nested statements.
TEST(ChatTemplateJinja, MatchesPythonJinja2OnRandomTemplates) {
  expect_cases_match_jinja("tests/chat_template/jinja_random_cases.json");
}

TEST(ChatTemplate, RenderChatPassesTransformersVariables) {
  auto t = ChatTemplate::parse(
      "{{ bos_token }}{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}"
      "{{ messages|length }}{{ enable_thinking }}{{ eos_token }}");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto r = render_chat(*t, json::array({{{"role", "user"}, {"content", "x"}}}), json(), true,
                       json{{"enable_thinking", false}}, "<s>", "</s>");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), "<s>TrueTrueTrue1False</s>");
  EXPECT_FALSE(render_chat(*t, json::array(), json(), false, json::array(), "", "").ok());
}

TEST(ChatTemplate, WhitespaceOptionsAreConfigurable) {
  const std::string src = "  {% if true %}\n    x\n  {% endif %}\nend\n";
  EXPECT_EQ(render(src), "    x\nend");
  ChatTemplateOptions plain;
  plain.trim_blocks = false;
  plain.lstrip_blocks = false;
  EXPECT_EQ(render(src, json::object(), plain), "  \n    x\n  \nend");
  plain.keep_trailing_newline = true;
  EXPECT_EQ(render(src, json::object(), plain), "  \n    x\n  \nend\n");
}

TEST(ChatTemplate, GenerationTagRendersItsBody) {
  EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

TEST(ChatTemplate, UndefinedBehavesLikeJinjaDefaultUndefined) {
  EXPECT_EQ(render("[{{ nope }}]{% if nope %}x{% endif %}{{ nope|length }}{{ nope is defined }}"),
            "[]0False");
  EXPECT_EQ(render("{% for x in nope %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{{ d.missing is defined }}{{ d.missing|default('dflt') }}", {{"d", json::object()}}),
            "Falsedflt");
  Status st = render_error("line one\n{{ d.missing.deeper }}", {{"d", json::object()}});
  EXPECT_NE(st.message().find("line 2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'dict object' has no attribute 'missing'"), std::string::npos)
      << st.message();
  st = render_error("{{ nope + 1 }}");
  EXPECT_NE(st.message().find("'nope' is undefined"), std::string::npos) << st.message();
}

TEST(ChatTemplate, RaiseExceptionReturnsItsMessage) {
  Status st = render_error(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
      {{"messages", json::array({{{"role", "tool"}}})}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("Only user and assistant roles are supported!"), std::string::npos)
      << st.message();
}

TEST(ChatTemplate, KeyOrderAndUnicodeSurviveTojson) {
  json ctx = json::parse(R"({"tool": {"z": 1, "a": {"y": "é👋", "b": [1, 2.5, null, true]}}})");
  EXPECT_EQ(render("{{ tool|tojson }}", ctx),
            R"({"z": 1, "a": {"y": "é👋", "b": [1, 2.5, null, true]}})");
}

// Strings count characters as a Python str does, lone surrogates included (kStrDecoding).
TEST(ChatTemplate, StringsCountCodepoints) {
  EXPECT_EQ(render(R"({{ "\ud800"|length }} {{ "é👋"|length }} {{ "\ud800x"[1] }})"), "1 2 x");
}

TEST(ChatTemplateCaps, NestedLoopsHitTheIterationCap) {
  Status st = render_error(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("loop iteration limit"), std::string::npos) << st.message();
}

TEST(ChatTemplateCaps, WorkCapStopsQuadraticStringGrowth) {
  ChatTemplateOptions opt;
  opt.max_loop_iterations = 100'000'000;  // let the work cap decide
  Status st = render_error(
      "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% for j in range(100000) %}"
      "{% set ns.s = ns.s ~ 'x' %}{% endfor %}{% endfor %}",
      json::object(), opt);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
}

TEST(ChatTemplateCaps, OutputAndValueSizeAreCapped) {
  ChatTemplateOptions opt;
  opt.max_output_bytes = 1000;
  EXPECT_EQ(render_error("{% for i in range(2000) %}x{% endfor %}", json::object(), opt).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(render_error("{% set s = 'ab' * 100000000000 %}", json::object(), opt).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(render_error("{{ range(100001)|length }}").code(), StatusCode::kResourceExhausted);
}

TEST(ChatTemplateCaps, DeepNestingIsRefused) {
  std::string deep_parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  Status st = render_error("{{ " + deep_parens + " }}");
  EXPECT_FALSE(st.ok());
  std::string long_chain = "{{ x";
  for (int k = 0; k < 5000; ++k) long_chain += ".a";
  EXPECT_EQ(render_error(long_chain + " }}").code(), StatusCode::kOutOfRange);
  std::string plus_chain = "{{ 1";
  for (int k = 0; k < 5000; ++k) plus_chain += " + 1";
  EXPECT_EQ(render_error(plus_chain + " }}").code(), StatusCode::kOutOfRange);
  std::string nots = "{{ " + std::string(5000 * 4, ' ');
  for (int k = 0; k < 5000; ++k) nots.replace(3 + 4 * static_cast<size_t>(k), 4, "not ");
  EXPECT_EQ(render_error(nots + "1 }}").code(), StatusCode::kOutOfRange);
  std::string ifs;
  for (int k = 0; k < 1000; ++k) ifs += "{% if true %}";
  for (int k = 0; k < 1000; ++k) ifs += "{% endif %}";
  st = render_error(ifs);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  st = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  ChatTemplateOptions small;
  small.max_template_bytes = 10;
  EXPECT_EQ(render_error("{{ 'more than ten bytes' }}", json::object(), small).code(),
            StatusCode::kOutOfRange);
}

TEST(ChatTemplateCaps, DeepValuesAndCyclesAreSafe) {
  // 100000 nested lists would overflow the stack when freed; nesting is capped instead.
  Status st = render_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  // A chain of namespaces and a namespace holding itself are freed after the render.
  EXPECT_EQ(render("{% set h = namespace(n=none) %}{% for i in range(100000) %}"
                   "{% set h.n = namespace(prev=h.n) %}{% endfor %}{{ h.n.prev.prev is defined }}"),
            "True");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.self = ns %}{% set ns.l = [ns] %}"
                   "{{ ns.self.self.l|length }}"),
            "1");
}

// Default caps must not reject a long legitimate conversation: 2001 turns of 4 KiB (8 MiB of
// content) through the real Qwen3 template, compared with a direct concatenation.
TEST(ChatTemplateCaps, LongConversationFitsTheDefaultCaps) {
  json golden = json::parse(read_file("models/tiny-qwen3/golden/chat_template_cases.json"));
  auto tmpl = ChatTemplate::parse(golden["template"].get<std::string>());
  ASSERT_TRUE(tmpl.ok());
  json messages = json::array();
  std::string want;
  for (int k = 0; k < 2001; ++k) {  // ends with a user turn: no <think> block is added
    std::string role = k % 2 == 0 ? "user" : "assistant";
    std::string content(4096, static_cast<char>('a' + k % 26));
    messages.push_back({{"role", role}, {"content", content}});
    want += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
  }
  want += "<|im_start|>assistant\n";
  auto start = std::chrono::steady_clock::now();
  auto r = render_chat(*tmpl, messages, json(), true, json::object(), "", "<|im_end|>");
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), want.size());
  EXPECT_TRUE(r.value() == want) << describe_diff(want, r.value());
  std::printf("2001-turn, 8 MiB conversation rendered in %.1f ms\n", ms);
}

TEST(ChatTemplateErrors, MalformedTemplatesNameTheLine) {
  struct Case {
    const char* src;
    const char* want;  // substring of the message
  };
  const Case cases[] = {
      {"a\n{% if x %}\nno end", "line 2: unclosed '{% if %}'"},
      {"a\n\n{% for x in y %}", "line 3: unclosed '{% for %}'"},
      {"x\n{{ y ", "line 2: unclosed tag '{{'"},
      {"{# never closed", "line 1: unclosed comment"},
      {"\n{{ 'abc }}", "line 2: unterminated string"},
      {"\n\n{{ x|nosuch }}", "line 3: no filter named 'nosuch'"},
      {"{{ x is nosuch }}", "line 1: no test named 'nosuch'"},
      {"{% endfor %}", "unexpected '{% endfor %}'"},
      {"{% frobnicate %}", "unknown tag 'frobnicate'"},
      {"{% include 'other.j2' %}", "not allowed"},
      {"{% break %}", "'break' outside of a loop"},
      {"{{ (1 }}", "expected ')'"},
      {"{{ 1 + }}", "unexpected '}}'"},
      {"{{ a ] }}", "unexpected ']'"},
      {"{{ x @ y }}", "unexpected character '@'"},
      {"{% set x %}", "unclosed '{% set %}'"},
  };
  for (const Case& c : cases) {
    Status st = render_error(c.src);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.src << " -> " << st.to_string();
    EXPECT_NE(st.message().find(c.want), std::string::npos)
        << "template: " << c.src << "\n  message: " << st.message() << "\n  wanted: " << c.want;
  }
}

TEST(ChatTemplate, ContextMustBeAnObject) {
  auto t = ChatTemplate::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(json::array()).ok());
  EXPECT_EQ(t->render(json()).value(), "x");
}

}  // namespace
}  // namespace oscar::tok
