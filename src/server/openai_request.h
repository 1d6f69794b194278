// OpenAI request parsing and validation: pure functions from a request body to a validated
// OpenAIRequest, or to the OpenAI-format error (HTTP status, message naming the field) that the
// server sends back. No sockets, no engine calls: prompt templating and tokenization happen in the
// server, which then calls check_context_fit() with the prompt length. Response bodies live in
// openai_response.h.
//
// Accepted (both endpoints unless noted): model, messages (chat), prompt (completions: string,
// list of token ids, or a list of exactly one string / one id list), max_tokens,
// max_completion_tokens, temperature, top_p, top_k (extension), seed, stop (string or list), n
// (1..kMaxChoices and at most ModelLimits::max_live_requests; not /v1/responses), stream,
// stream_options.include_usage, tools and chat_template_kwargs (chat, extensions passed to the
// template), ignore_eos (extension), logprobs (chat: boolean with top_logprobs 0..20;
// completions: 0..20), presence_penalty and frequency_penalty (OpenAI, [-2, 2]),
// repetition_penalty (vLLM, [0.01, 100]: engine::kMinRepetitionPenalty), tool_choice (chat:
// "auto", "none", "required" with tools, or {"type": "function", "function": {"name"}} naming one
// of the tools). A null value means "not given". Unknown fields are ignored, as OpenAI clients
// expect; known ones this server does not implement (min_p, logit_bias, best_of, echo, suffix, beam
// search, stop_token_ids, functions, tool_choice outside chat, audio output, guided decoding) get a
// 400 naming them unless set to their no-op value.
// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {"schema": {...}, "name", "strict", "description"}} (chat and completions):
// constrained decoding; the schema is compiled here (engine/json_schema.h lists the keywords),
// and a keyword outside the supported subset is a 400 naming it and where it is
// (param "response_format.json_schema.schema"). strict true or false constrains the same way.
// A tool with function.strict true has its parameters compiled the same way: a forced call to it
// (tool_choice "required" or naming it) has arguments valid under them; with tool_choice "auto"
// (and no response_format) the text is free until the model starts a call, which then follows
// the schema of the tool it names.
//
// /v1/responses: input (a string, or message items {role, content} whose content is a string or
// input_text/output_text parts), instructions (a system message first), max_output_tokens,
// temperature, top_p, stream, text.format (text, json_object, or json_schema with its fields
// flat: {"type": "json_schema", "name", "schema", "strict"}); tools, previous_response_id,
// background, conversation, n > 1, logprobs / top_logprobs and response_format (use text.format)
// get a 400.
//
// Chat messages are normalized for the chat template (the validator accepts exactly what the
// template is given): roles system, developer (sent as system), user, assistant, tool, anything
// else a 400 naming it; content a string or an array of content parts, whose text parts are
// joined with "\n" and whose image/audio/file parts get a 400 saying the model takes text only;
// a message without content is refused, except an assistant turn with tool_calls (content null);
// tool_calls and tools are checked for the fields the template reads (function.name); a tool's
// name must match OpenAI's ^[a-zA-Z0-9_-]{1,64}$ (it is written into the prompt and into the
// constrained tool call, so markup in a name could break either).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/engine_api.h"
#include "engine/json_schema.h"

namespace oscar::server {

// ---- Limits, declared once. The HTTP layer enforces the first two while reading. ----
// Request line plus all header fields; beyond it the server answers 431 and closes.
inline constexpr size_t kMaxHeaderBytes = 16 * 1024;
// Request body; 8 MiB holds a ~1M-token context as text. Beyond it: 413 and close.
inline constexpr size_t kMaxBodyBytes = 8 * 1024 * 1024;
// Nesting of JSON arrays/objects, checked by a pre-scan before parsing so that a hostile body can
// not exhaust the stack of the recursive parser or of the code that walks the tree.
inline constexpr int kMaxJsonDepth = 64;
// OpenAI's own limits on stop sequences.
inline constexpr size_t kMaxStopStrings = 4;
inline constexpr size_t kMaxStopStringBytes = 256;
// Choices per request (n) at most.
inline constexpr int kMaxChoices = 16;
// OpenAI's temperature range.
inline constexpr double kMaxTemperature = 2.0;

// An error as OpenAI reports it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" -> null
  std::string code;   // e.g. "model_not_found", "" -> null
  std::string to_json() const;
};

ApiError invalid_request(std::string message, std::string param = "", int http_status = 400);
// A failed engine, tokenizer or template call as the client sees it, the message prefixed with
// `context`: InvalidArgument and OutOfRange 400, NotFound 404, ResourceExhausted (the engine's
// waiting queue is full) 429 with code "queue_full", Unimplemented 501, anything else 500; 429 and
// 5xx have type "server_error".
ApiError error_from_status(const Status& s, const char* context);
// 503 while the engine is not ready (EngineInfo::ready false).
ApiError model_loading_error();

// kResponses: POST /v1/responses (text or message input, text output), parsed into the same
// chat messages as kChatCompletions.
enum class Endpoint { kChatCompletions, kCompletions, kResponses };

// What the parser needs to know about the served model (from engine::EngineInfo).
struct ModelLimits {
  std::string model_name;
  int max_context_tokens = 0;
  int vocab_size = 0;
  int max_live_requests = 0;  // the most choices (n) the engine can ever hold; 0: no cap
};

struct OpenAIRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;

  // /v1/chat/completions
  // Normalized: every message has role system/user/assistant/tool and content a string (null only
  // for an assistant turn with tool_calls).
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;                 // array or null
  nlohmann::ordered_json chat_template_kwargs;  // object or null
  // "auto", "none", "required", "named" or "" (not given: auto). required / named: the output is
  // constrained to one call to one of tool_call_names (engine/tool_constraint.h).
  std::string tool_choice;
  std::vector<std::string> tool_call_names;
  // Empty, or one per tool_call_names: the compiled parameters of the tools with
  // function.strict true (null for the others).
  std::vector<std::shared_ptr<const engine::JsonSchema>> tool_call_schemas;
  // tool_choice auto (or not given) with a strict tool and no response_format: tool_call_names
  // holds every tool, and a call the model starts follows its tool's schema.
  bool tool_call_on_start = false;
  // response_format {"type": "json_object"} (chat and completions; /v1/responses: text.format):
  // the output is constrained to one JSON object (engine/tool_constraint.h).
  bool json_object = false;
  // response_format {"type": "json_schema", "json_schema": {"schema", "name", "strict"}} (chat
  // and completions; /v1/responses: text.format {"type": "json_schema", "schema", ...}): the
  // output is constrained to one document valid under it (engine/json_schema.h).
  std::shared_ptr<const engine::JsonSchema> json_schema;
  // /v1/responses: the text.format given ({"type": "text"} when none), echoed in the response.
  nlohmann::ordered_json text_format;

  // /v1/completions: either text or ids.
  bool prompt_is_ids = false;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;  // [n_prompt_tokens], each in [0, vocab_size)

  std::optional<int> max_tokens;  // > 0 when given; default: the rest of the context
  engine::SamplingParams sampling;
  std::vector<std::string> stop;  // <= kMaxStopStrings, each 1..kMaxStopStringBytes bytes
  bool ignore_eos = false;
  // -1: none. Else the alternatives per token (chat: top_logprobs with logprobs true;
  // completions: logprobs), in [0, engine::kMaxLogprobs].
  int logprobs = -1;
  // Choices: n engine requests sharing the prompt (the seed of choice i is seed + i, as vLLM).
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

using ParseResult = std::variant<OpenAIRequest, ApiError>;

// Validates everything that can be checked without the tokenizer. body_bytes beyond
// kMaxBodyBytes is 413 (the server normally stops reading before that).
ParseResult parse_openai_request(Endpoint endpoint, std::string_view body,
                                 const ModelLimits& limits);

// True when arrays/objects nest deeper than max_depth (brackets inside strings do not count).
bool json_depth_exceeds(std::string_view text, int max_depth);

// After tokenization: the prompt must be non-empty and prompt + max_tokens must fit the context.
// Returns the max_tokens to use (the requested one, or all the room left), or a 400 whose
// message gives the numbers.
// default_max_tokens > 0 caps the room used when max_tokens is absent.
std::variant<int, ApiError> check_context_fit(int prompt_tokens, std::optional<int> max_tokens,
                                              int max_context_tokens, int default_max_tokens = 0);

}  // namespace oscar::server
