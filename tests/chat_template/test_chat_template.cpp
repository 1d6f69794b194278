// Tests of ChatTemplate: the real Qwen3 template against transformers' renderings
// (models/tiny-qwen3/golden/chat_template_cases.json, exact string match), then each Jinja
// construct, the sandbox caps and the error messages of malformed templates.
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

// Every case of jinja_cases.json (rendered by Python's Jinja2 as transformers configures it; see
// gen_jinja_cases.py) renders to the same string, or fails where Jinja fails.
TEST(ChatTemplateJinja, MatchesPythonJinja2) {
  std::string text = read_file("tests/chat_template/jinja_cases.json");
  ASSERT_FALSE(text.empty());
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
  std::printf("jinja differential cases: %d/%d agree\n", passed, index);
}

}  // namespace
}  // namespace oscar::tok
