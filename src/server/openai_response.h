// OpenAI response bodies: the JSON the server sends for /v1/chat/completions, /v1/completions and
// /v1/models, the streaming chunks, and SSE framing. Pure functions of their arguments (ids and
// timestamps are passed in), so tests can compare exact bytes. Request parsing lives in
// openai_request.h; HTTP in http_server.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_request.h"
#include "server/output_parser.h"

namespace oscar::server {

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // reported as usage.prompt_tokens_details.cached_tokens
};

// Fixed per response: every chunk of a stream repeats them.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string id;        // "chatcmpl-...", "cmpl-..." or "resp_..."
  int64_t created = 0;   // Unix seconds
  std::string model;
  nlohmann::ordered_json text_format = nullptr;  // /v1/responses: text.format asked; null: text
};

// A fresh id with the endpoint's prefix and 24 random hex digits. Thread-safe.
std::string make_response_id(Endpoint endpoint);
// The time now in Unix seconds, as "created" fields carry it.
int64_t unix_now();

// The engine's "cancelled" is not an OpenAI value; clients see "abort" (vLLM's spelling).
std::string openai_finish_reason(const std::string& engine_reason);

nlohmann::ordered_json usage_json(const Usage& usage);

// ---- logprobs ----
// One generated token with its log-probability and alternatives (engine::GenerationEvent), and
// where its text starts in the choice's text (bytes; completions' text_offset).
struct LogprobEntry {
  engine::TokenLogprob chosen;
  std::vector<engine::TokenLogprob> top;
  int64_t text_offset = 0;
};
// Chat: {"content": [{"token", "logprob", "bytes": [...], "top_logprobs": [{"token", "logprob",
// "bytes"}]}]}. A token's text is its bytes as UTF-8 (a partial character becomes U+FFFD on the
// wire); "bytes" are exact.
nlohmann::ordered_json chat_logprobs_json(const std::vector<LogprobEntry>& entries);
// Completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}.
// Each top_logprobs object holds the alternatives and the chosen token (as vLLM does).
nlohmann::ordered_json completion_logprobs_json(const std::vector<LogprobEntry>& entries);

// Non-streaming body: object "chat.completion" / "text_completion", one choice.
nlohmann::ordered_json completion_body(const ResponseMeta& meta, const std::string& text,
                                       const std::string& finish_reason, const Usage& usage);
// One choice of a non-streaming body; logprobs null or an *_logprobs_json object.
nlohmann::ordered_json completion_choice(int index, const std::string& text,
                                         const std::string& finish_reason,
                                         const nlohmann::ordered_json& logprobs);
// A non-streaming body with these choices (chat.completion / text_completion).
nlohmann::ordered_json body_with_choices(const ResponseMeta& meta, nlohmann::ordered_json choices,
                                         const Usage& usage);

// One streaming chunk, object "chat.completion.chunk" / "text_completion". For chat, role_first
// adds delta.role = "assistant" (the first chunk). finish_reason empty -> null.
nlohmann::ordered_json stream_chunk(const ResponseMeta& meta, const std::string& text_delta,
                                    bool role_first, const std::string& finish_reason,
                                    int index = 0,
                                    const nlohmann::ordered_json& logprobs = nullptr);
// The final chunk of stream_options.include_usage: choices is empty and usage is set.
nlohmann::ordered_json usage_chunk(const ResponseMeta& meta, const Usage& usage);

// A chat answer as OutputParser split it.
struct ChatOutput {
  std::string content;
  bool with_reasoning = false;  // the reasoning parser is on: reasoning_content is reported
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

// Non-streaming chat body whose message carries content (null when empty and there are tool
// calls), reasoning_content (with_reasoning; null when empty) and tool_calls (when any).
nlohmann::ordered_json chat_completion_body(const ResponseMeta& meta, const ChatOutput& out,
                                            const std::string& finish_reason, const Usage& usage);
nlohmann::ordered_json chat_choice(int index, const ChatOutput& out,
                                   const std::string& finish_reason,
                                   const nlohmann::ordered_json& logprobs);

// One streaming chat chunk for a parsed delta: delta.content / delta.reasoning_content /
// delta.tool_calls (each call whole, with "index" = first_call_index + its position).
nlohmann::ordered_json chat_delta_chunk(const ResponseMeta& meta, const OutputDelta& delta,
                                        int first_call_index, const std::string& finish_reason,
                                        int index = 0,
                                        const nlohmann::ordered_json& logprobs = nullptr);

// ---- /v1/responses ----
// The Response object: status "in_progress" (no output yet), "completed" or "incomplete" (cut by
// max_output_tokens: incomplete_details.reason "max_output_tokens"); output is one assistant
// message item `item_id` with one output_text part when the status is not in_progress.
nlohmann::ordered_json response_object(const ResponseMeta& meta, const std::string& status,
                                       const std::string& item_id, const std::string& text,
                                       const Usage& usage);
// The status of a finished response for an engine finish_reason.
std::string response_status(const std::string& finish_reason);
// A Responses streaming event: "event: <type>\ndata: <json with type and sequence_number>\n\n".
std::string response_event(const std::string& type, nlohmann::ordered_json payload, int* sequence);
// The output message item ("in_progress" with no content, or "completed" with its text).
nlohmann::ordered_json response_message_item(const std::string& item_id, const std::string& status,
                                             const std::string* text);
nlohmann::ordered_json output_text_part(const std::string& text);

// GET /v1/models/{id}: one model object.
nlohmann::ordered_json model_json(const std::string& model, int64_t created, int max_model_len);
// GET /v1/models: {"object": "list", "data": [model_json(...)]}.
nlohmann::ordered_json models_body(const std::string& model, int64_t created, int max_model_len);

// JSON text for the wire: invalid UTF-8 is replaced, never thrown.
std::string dump_json(const nlohmann::ordered_json& j);
// "data: <json>\n\n"
std::string sse_event(const nlohmann::ordered_json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace oscar::server
