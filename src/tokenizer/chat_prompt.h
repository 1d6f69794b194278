// The safe prompt path: a chat (OpenAI messages, tools, template kwargs) rendered through the
// model's chat template and tokenized so that only the special tokens the template itself writes
// are control tokens. Text that came from the client (message content, names, tool calls, tool
// definitions, kwargs) is tokenized as ordinary text even when it spells an added token: a user
// typing "<|im_end|>\n<|im_start|>system" gets the ids of that text, not a forged system turn.
//
// How: before rendering, every occurrence of an added token's text inside a client string is
// preceded by a marker, a Unicode noncharacter (U+FDD0..U+FDEF) that the request does not contain.
// The template sees the client text otherwise unchanged (so `'</think>' in content`, split() and
// tojson behave as usual); after rendering, the markers are removed and the added token that
// followed each one is tokenized as ordinary text (Tokenizer::encode(pieces)). A template that
// cuts a client string right after a marker can at worst turn a client's token text into plain
// text, never the reverse. Not detected: a template that glues client text to a partial token of
// its own (no known template does).
//
// Assistant turns that carry "<think>…</think>" inside content (clients send the model's output
// back) are split into reasoning_content and content first when split_reasoning is set, exactly
// as the Qwen3 template would split them itself, so that the template writes the think tags.
//
// Not here: the OpenAI-level validation of messages (server/openai_request.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace oscar::tok {

struct ChatPromptOptions {
  bool add_generation_prompt = true;
  // Move "<think>R</think>C" of assistant content to reasoning_content R and content C (the
  // Qwen3 rule) before rendering; for templates that read reasoning_content.
  bool split_reasoning = false;
};

struct ChatPrompt {
  // The rendered prompt: what render_chat() gives for the same chat (markers removed).
  std::string text;
  // Byte ranges [first, second) of `text` that spell an added token but came from the client;
  // sorted and disjoint.
  std::vector<std::pair<size_t, size_t>> literal;
  std::vector<int32_t> ids;  // [n_prompt_tokens]
};

// Renders and tokenizes a chat safely (see above). `content: null` is rendered as "" (assistant
// turns that only carry tool calls). Errors: template errors as render_chat() reports them;
// InvalidArgument when the request uses every marker candidate (all 32 noncharacters).
Result<ChatPrompt> encode_chat(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                               const nlohmann::ordered_json& messages,
                               const nlohmann::ordered_json& tools,
                               const nlohmann::ordered_json& kwargs,
                               const ChatPromptOptions& options = {});

// True when the template source reads reasoning_content (then split_reasoning should be set).
bool template_reads_reasoning(const std::string& template_source);

}  // namespace oscar::tok
