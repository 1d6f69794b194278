// encode_chat: mark client strings, render, unmark, tokenize with literal pieces (chat_prompt.h).
#include "tokenizer/chat_prompt.h"

#include <algorithm>
#include <string_view>

namespace oscar::tok {

namespace {

using json = nlohmann::ordered_json;

// Marker candidates: the 32 noncharacters U+FDD0..U+FDEF (UTF-8 EF B7 90 .. EF B7 AF). Never
// assigned to characters, so real text does not contain them.
std::string marker_candidate(int i) {
  std::string m = "\xEF\xB7";
  m += static_cast<char>(0x90 + i);
  return m;
}

// Every string of a JSON value, keys included.
bool contains_text(const json& j, const std::string& needle) {
  if (j.is_string()) return j.get_ref<const std::string&>().find(needle) != std::string::npos;
  if (j.is_array()) {
    for (const json& x : j)
      if (contains_text(x, needle)) return true;
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key().find(needle) != std::string::npos || contains_text(it.value(), needle)) {
        return true;
      }
    }
  }
  return false;
}

class Marker {
 public:
  Marker(const std::vector<std::string>& added, std::string mark)
      : added_(added), mark_(std::move(mark)) {
    for (const std::string& t : added_)
      if (!t.empty()) first_byte_[static_cast<uint8_t>(t[0])] = true;
  }

  // `s` with the marker before each position where an added token's text starts.
  std::string mark_string(const std::string& s) const {
    std::string out;
    out.reserve(s.size());
    for (size_t pos = 0; pos < s.size(); ++pos) {
      if (first_byte_[static_cast<uint8_t>(s[pos])] && starts_token(s, pos)) out += mark_;
      out += s[pos];
    }
    return out;
  }

  json mark(const json& j) const {
    if (j.is_string()) return mark_string(j.get_ref<const std::string&>());
    if (j.is_array()) {
      json out = json::array();
      for (const json& x : j) out.push_back(mark(x));
      return out;
    }
    if (j.is_object()) {
      json out = json::object();
      for (auto it = j.begin(); it != j.end(); ++it) out[mark_string(it.key())] = mark(it.value());
      return out;
    }
    return j;
  }

  // The length of the longest added token whose text starts at s[pos]; 0 if none.
  size_t longest_token_at(std::string_view s, size_t pos) const {
    size_t best = 0;
    for (const std::string& t : added_) {
      if (t.size() > best && s.size() - pos >= t.size() && s.compare(pos, t.size(), t) == 0) {
        best = t.size();
      }
    }
    return best;
  }

 private:
  bool starts_token(const std::string& s, size_t pos) const {
    return longest_token_at(s, pos) > 0;
  }

  const std::vector<std::string>& added_;
  std::string mark_;
  bool first_byte_[256] = {};
};

// The Qwen3 template's own rule: content.split('</think>')[-1].lstrip('\n') stays content, and
// content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') is the reasoning.
void split_reasoning(json& msg) {
  if (!msg.is_object()) return;
  auto role = msg.find("role");
  if (role == msg.end() || !role->is_string() || *role != "assistant") return;
  auto rc = msg.find("reasoning_content");
  if (rc != msg.end() && !rc->is_null()) return;
  auto content = msg.find("content");
  if (content == msg.end() || !content->is_string()) return;
  const std::string c = content->get<std::string>();
  static constexpr std::string_view kEnd = "</think>", kBegin = "<think>";
  const size_t first_end = c.find(kEnd);
  if (first_end == std::string::npos) return;
  const size_t last_end = c.rfind(kEnd);
  auto lstrip_newlines = [](std::string s) {
    const size_t first = s.find_first_not_of('\n');
    return first == std::string::npos ? std::string() : s.substr(first);
  };
  const std::string after = lstrip_newlines(c.substr(last_end + kEnd.size()));
  std::string before = c.substr(0, first_end);
  while (!before.empty() && before.back() == '\n') before.pop_back();
  if (size_t b = before.rfind(kBegin); b != std::string::npos) {
    before = before.substr(b + kBegin.size());
  }
  before = lstrip_newlines(std::move(before));
  msg["content"] = after;
  msg["reasoning_content"] = before;
}

}  // namespace

bool template_reads_reasoning(const std::string& template_source) {
  return template_source.find("reasoning_content") != std::string::npos;
}

Result<ChatPrompt> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                               const json& messages, const json& tools, const json& kwargs,
                               const ChatPromptOptions& options) {
  if (!kwargs.is_null() && !kwargs.is_object()) {
    return invalid_argument("chat template kwargs must be a JSON object, got %s",
                            kwargs.type_name());
  }
  std::string mark;
  for (int i = 0; i < 32 && mark.empty(); ++i) {
    std::string m = marker_candidate(i);
    if (!contains_text(messages, m) && !contains_text(tools, m) && !contains_text(kwargs, m)) {
      mark = std::move(m);
    }
  }
  if (mark.empty()) {
    return invalid_argument(
        "the request contains every Unicode noncharacter U+FDD0..U+FDEF; remove them");
  }
  const std::vector<std::string> added = tokenizer.added_tokens();
  Marker marker(added, mark);

  json msgs = messages;
  for (json& m : msgs) {
    if (!m.is_object()) continue;
    if (m.contains("content") && m["content"].is_null()) m["content"] = "";
    if (options.split_reasoning) split_reasoning(m);
  }
  OSCAR_ASSIGN_OR_RETURN(
      std::string rendered,
      render_chat(tmpl, marker.mark(msgs), marker.mark(tools), options.add_generation_prompt,
                  kwargs.is_null() ? json::object() : marker.mark(kwargs), tokenizer.bos_token(),
                  tokenizer.eos_token()));

  ChatPrompt out;
  out.text.reserve(rendered.size());
  std::vector<size_t> marks;  // offsets in out.text
  for (size_t pos = 0; pos < rendered.size();) {
    if (rendered.compare(pos, mark.size(), mark) == 0) {
      marks.push_back(out.text.size());
      pos += mark.size();
    } else {
      out.text += rendered[pos++];
    }
  }
  for (size_t p : marks) {
    const size_t n = marker.longest_token_at(out.text, p);
    if (n == 0) continue;  // the template moved the marker away from the token: nothing to guard
    if (!out.literal.empty() && p <= out.literal.back().second) {
      out.literal.back().second = std::max(out.literal.back().second, p + n);
    } else {
      out.literal.emplace_back(p, p + n);
    }
  }
  std::vector<Tokenizer::TextPiece> pieces;
  const std::string_view text(out.text);
  size_t at = 0;
  for (const auto& [a, b] : out.literal) {
    if (a > at) pieces.push_back({text.substr(at, a - at), false});
    pieces.push_back({text.substr(a, b - a), true});
    at = b;
  }
  if (at < text.size()) pieces.push_back({text.substr(at), false});
  out.ids = tokenizer.encode(pieces);
  return out;
}

}  // namespace oscar::tok
