// OutputParser: a small state machine over the generated text (see output_parser.h).
#include "server/output_parser.h"

#include <nlohmann/json.hpp>

#include "server/openai_response.h"

namespace oscar::server {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

// The length of the longest suffix of `s` that is a proper prefix of `tag` (text that may still
// become the tag once more arrives).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  const size_t max = std::min(s.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

bool all_space(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return false;
  return true;
}

// {"name": "f", "arguments": {...}} (hermes/Qwen3); "parameters" is accepted for "arguments".
bool parse_call(std::string_view body, ToolCall* call) {
  using json = nlohmann::ordered_json;
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception&) {
    return false;
  }
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  call->name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) {
    call->arguments = "{}";
  } else if (args->is_string()) {
    call->arguments = args->get<std::string>();
  } else {
    call->arguments = dump_json(*args);
  }
  call->id = make_tool_call_id();
  return true;
}

}  // namespace

std::string make_tool_call_id() {
  return "call_" + make_response_id(Endpoint::kCompletions).substr(5);  // "cmpl-" + 24 hex
}

OutputParser::OutputParser(bool parse_tool_calls, bool parse_reasoning)
    : tools_(parse_tool_calls), mode_(parse_reasoning ? Mode::kStart : Mode::kContent) {}

OutputDelta OutputParser::push(std::string_view text) {
  OutputDelta out;
  buf_.append(text);
  run(out, /*final=*/false);
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  run(out, /*final=*/true);
  ws_.clear();  // whitespace after the last tool call is not content
  return out;
}

void OutputParser::emit_content(OutputDelta& out, std::string text) {
  if (text.empty()) return;
  if (n_calls_ == 0) {
    out.content += text;
    return;
  }
  ws_ += text;
  if (!all_space(ws_)) {
    out.content += ws_;
    ws_.clear();
  }
}

void OutputParser::run(OutputDelta& out, bool final) {
  for (;;) {
    switch (mode_) {
      case Mode::kStart: {
        if (buf_.compare(0, kThinkOpen.size(), kThinkOpen) == 0) {
          buf_.erase(0, kThinkOpen.size());
          mode_ = Mode::kReasoning;
          continue;
        }
        if (!final && buf_.size() < kThinkOpen.size() &&
            kThinkOpen.substr(0, buf_.size()) == buf_) {
          return;  // may still become <think>
        }
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kReasoning: {
        const size_t pos = buf_.find(kThinkClose);
        if (pos != std::string::npos) {
          out.reasoning += buf_.substr(0, pos);
          buf_.erase(0, pos + kThinkClose.size());
          mode_ = Mode::kContent;
          after_think_ = true;
          continue;
        }
        const size_t hold = final ? 0 : partial_tag_suffix(buf_, kThinkClose);
        out.reasoning += buf_.substr(0, buf_.size() - hold);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case Mode::kContent: {
        if (after_think_) {
          const size_t first = buf_.find_first_not_of('\n');
          buf_.erase(0, first == std::string::npos ? buf_.size() : first);
          if (buf_.empty()) return;
          after_think_ = false;
        }
        if (!tools_) {
          emit_content(out, std::move(buf_));
          buf_.clear();
          return;
        }
        const size_t pos = buf_.find(kCallOpen);
        if (pos != std::string::npos) {
          emit_content(out, buf_.substr(0, pos));
          buf_.erase(0, pos + kCallOpen.size());
          call_.clear();
          mode_ = Mode::kCall;
          continue;
        }
        const size_t hold = final ? 0 : partial_tag_suffix(buf_, kCallOpen);
        emit_content(out, buf_.substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case Mode::kCall: {
        call_ += buf_;
        buf_.clear();
        const size_t pos = call_.find(kCallClose);
        if (pos == std::string::npos && !final) return;
        const std::string body = pos == std::string::npos ? call_ : call_.substr(0, pos);
        ToolCall call;
        if (parse_call(body, &call)) {
          out.tool_calls.push_back(std::move(call));
          ++n_calls_;
        } else {
          emit_content(out,
                       std::string(kCallOpen) + body +
                           (pos == std::string::npos ? "" : std::string(kCallClose)));
        }
        if (pos != std::string::npos) buf_ = call_.substr(pos + kCallClose.size());
        call_.clear();
        mode_ = Mode::kContent;
        if (buf_.empty()) return;
        continue;
      }
    }
  }
}

}  // namespace oscar::server
