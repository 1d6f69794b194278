// OutputParser (server/output_parser.h): tool calls and reasoning out of generated text, whole and
// streamed in every split (one byte at a time, and at each single cut), which must agree.
#include "server/output_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace oscar::server {
namespace {

struct Parsed {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

void add(Parsed& p, OutputDelta d) {
  p.content += d.content;
  p.reasoning += d.reasoning;
  for (auto& c : d.tool_calls) p.calls.push_back(std::move(c));
}

Parsed parse_chunks(const std::vector<std::string>& chunks, bool tools, bool reasoning) {
  OutputParser parser(tools, reasoning);
  Parsed p;
  for (const std::string& c : chunks) add(p, parser.push(c));
  add(p, parser.finish());
  return p;
}

// Whole, byte by byte, and cut once at every position: the same result.
Parsed parse(const std::string& text, bool tools = true, bool reasoning = false) {
  Parsed whole = parse_chunks({text}, tools, reasoning);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  std::vector<std::vector<std::string>> splits = {bytes};
  for (size_t i = 1; i < text.size(); ++i) splits.push_back({text.substr(0, i), text.substr(i)});
  for (const auto& chunks : splits) {
    Parsed p = parse_chunks(chunks, tools, reasoning);
    EXPECT_EQ(p.content, whole.content) << text;
    EXPECT_EQ(p.reasoning, whole.reasoning) << text;
    EXPECT_EQ(p.calls.size(), whole.calls.size()) << text;
    for (size_t k = 0; k < std::min(p.calls.size(), whole.calls.size()); ++k) {
      EXPECT_EQ(p.calls[k].name, whole.calls[k].name);
      EXPECT_EQ(p.calls[k].arguments, whole.calls[k].arguments);
    }
  }
  return whole;
}

TEST(OutputParser, PlainTextIsContent) {
  Parsed p = parse("Hello <b>world</b> a < b <tool");
  EXPECT_EQ(p.content, "Hello <b>world</b> a < b <tool");
  EXPECT_TRUE(p.calls.empty());
}

TEST(OutputParser, Qwen3ToolCall) {
  Parsed p = parse(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 2}}\n</tool_call>");
  EXPECT_EQ(p.content, "Let me check.\n");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Paris\",\"days\":2}");  // key order kept
  EXPECT_EQ(p.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(p.calls[0].id.size(), 29u);
}

TEST(OutputParser, SeveralCallsAndWhitespaceBetween) {
  Parsed p = parse(
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>\n");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[0].arguments, "{}");
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, "{\"x\": 1}");  // a string is passed through
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
}

TEST(OutputParser, BrokenCallsStayContent) {
  Parsed bad = parse("x<tool_call>{not json}</tool_call>y");
  EXPECT_EQ(bad.content, "x<tool_call>{not json}</tool_call>y");
  EXPECT_TRUE(bad.calls.empty());
  Parsed noname = parse("<tool_call>{\"arguments\": {}}</tool_call>");
  EXPECT_EQ(noname.content, "<tool_call>{\"arguments\": {}}</tool_call>");
  // Cut off by max_tokens: a complete JSON body still counts, a partial one is content.
  Parsed cut_ok = parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}}\n");
  ASSERT_EQ(cut_ok.calls.size(), 1u);
  Parsed cut_bad = parse("<tool_call>\n{\"name\": \"f\", \"argu");
  EXPECT_EQ(cut_bad.content, "<tool_call>\n{\"name\": \"f\", \"argu");
}

TEST(OutputParser, ToolsOffLeavesTagsInContent) {
  const std::string text = "<tool_call>{\"name\": \"f\"}</tool_call>";
  Parsed p = parse(text, /*tools=*/false);
  EXPECT_EQ(p.content, text);
  EXPECT_TRUE(p.calls.empty());
}

TEST(OutputParser, Qwen3Reasoning) {
  Parsed p = parse("<think>\nThe user wants X.\n</think>\n\nHere is X.", false, true);
  EXPECT_EQ(p.reasoning, "\nThe user wants X.\n");
  EXPECT_EQ(p.content, "Here is X.");
  // Off: all content.
  EXPECT_EQ(parse("<think>a</think>b", false, false).content, "<think>a</think>b");
  // No think block: all content; an unterminated one is all reasoning.
  EXPECT_EQ(parse("plain", false, true).content, "plain");
  EXPECT_EQ(parse("<thin", false, true).content, "<thin");
  Parsed open = parse("<think>still thinking", false, true);
  EXPECT_EQ(open.reasoning, "still thinking");
  EXPECT_EQ(open.content, "");
  // Reasoning then a tool call.
  Parsed both = parse(
      "<think>\nneed weather\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n"
      "</tool_call>",
      true, true);
  EXPECT_EQ(both.reasoning, "\nneed weather\n");
  EXPECT_EQ(both.content, "");
  ASSERT_EQ(both.calls.size(), 1u);
  EXPECT_EQ(both.calls[0].name, "w");
}

}  // namespace
}  // namespace oscar::server
