// OutputParser: turns the text a chat model generates into what OpenAI clients expect, the way
// vLLM and SGLang do for Qwen3 (hermes-style tool calls, qwen3 reasoning parser):
//   - `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` becomes a tool call (id, type
//     "function", function name, arguments as a JSON string); several calls may follow each
//     other; text before the first call stays content, whitespace between calls is dropped;
//   - with reasoning on, a leading `<think>…</think>` becomes reasoning_content (the newlines
//     right after `</think>` are dropped from content).
// It works incrementally for streaming: push() returns the part of the output that can be sent now,
// holding back text that may still be the start of a tag; finish() flushes the rest. The
// concatenation of every returned delta is the non-streaming result. A call whose JSON does not
// parse (or lacks a string "name") is left in content as the model wrote it, tags included.
// Pure and single-threaded (one per response); no HTTP, no engine.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace oscar::server {

struct ToolCall {
  std::string id;         // "call_<24 hex>"
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  OutputParser(bool parse_tool_calls, bool parse_reasoning);

  OutputDelta push(std::string_view text);
  OutputDelta finish();
  int tool_calls_seen() const { return n_calls_; }

 private:
  enum class Mode { kStart, kReasoning, kContent, kCall };
  void run(OutputDelta& out, bool final);
  void emit_content(OutputDelta& out, std::string text);

  bool tools_;
  Mode mode_;
  std::string buf_;          // received, not yet classified
  std::string call_;         // kCall: the text after <tool_call> so far
  std::string ws_;           // content held back after a tool call while it is only whitespace
  bool after_think_ = false; // drop newlines that follow </think>
  int n_calls_ = 0;
};

// A fresh tool-call id. Thread-safe.
std::string make_tool_call_id();

}  // namespace oscar::server
