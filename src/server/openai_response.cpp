#include "server/openai_response.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>

namespace oscar::server {

using json = nlohmann::ordered_json;

std::string make_response_id(Endpoint endpoint) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lock(mu);
    a = rng();
    b = rng();
  }
  char hex[25];
  std::snprintf(hex, sizeof(hex), "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffULL));
  const char* prefix = endpoint == Endpoint::kChatCompletions ? "chatcmpl-"
                       : endpoint == Endpoint::kResponses     ? "resp_"
                                                              : "cmpl-";
  return std::string(prefix) + hex;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string openai_finish_reason(const std::string& engine_reason) {
  if (engine_reason == "cancelled") return "abort";
  return engine_reason;
}

json usage_json(const Usage& usage) {
  json u = json::object();
  u["prompt_tokens"] = usage.prompt_tokens;
  u["completion_tokens"] = usage.completion_tokens;
  u["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  u["prompt_tokens_details"] = json{{"cached_tokens", usage.cached_tokens}};
  return u;
}

namespace {

json header(const ResponseMeta& meta, const char* chat_object) {
  json j = json::object();
  j["id"] = meta.id;
  j["object"] = meta.endpoint == Endpoint::kChatCompletions ? chat_object : "text_completion";
  j["created"] = meta.created;
  j["model"] = meta.model;
  return j;
}

json finish_json(const std::string& reason) {
  return reason.empty() ? json(nullptr) : json(openai_finish_reason(reason));
}

}  // namespace

json completion_choice(int index, const std::string& text, const std::string& finish_reason,
                       const json& logprobs) {
  json choice = json::object();
  choice["index"] = index;
  choice["text"] = text;
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_json(finish_reason);
  return choice;
}

json body_with_choices(const ResponseMeta& meta, json choices, const Usage& usage) {
  json j = header(meta, "chat.completion");
  j["choices"] = std::move(choices);
  j["usage"] = usage_json(usage);
  return j;
}

json completion_body(const ResponseMeta& meta, const std::string& text,
                     const std::string& finish_reason, const Usage& usage) {
  if (meta.endpoint == Endpoint::kChatCompletions) {
    ChatOutput out;
    out.content = text;
    return chat_completion_body(meta, out, finish_reason, usage);
  }
  return body_with_choices(meta, json::array({completion_choice(0, text, finish_reason, nullptr)}),
                           usage);
}

namespace {

json token_json(const engine::TokenLogprob& t, bool with_top,
                const std::vector<engine::TokenLogprob>* top) {
  json j = json::object();
  j["token"] = t.bytes;
  j["logprob"] = t.logprob;
  json bytes = json::array();
  for (unsigned char c : t.bytes) bytes.push_back(static_cast<int>(c));
  j["bytes"] = std::move(bytes);
  if (with_top) {
    json alts = json::array();
    for (const engine::TokenLogprob& a : *top) alts.push_back(token_json(a, false, nullptr));
    j["top_logprobs"] = std::move(alts);
  }
  return j;
}

}  // namespace

json chat_logprobs_json(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const LogprobEntry& e : entries) content.push_back(token_json(e.chosen, true, &e.top));
  return json{{"content", std::move(content)}};
}

json completion_logprobs_json(const std::vector<LogprobEntry>& entries) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.chosen.bytes);
    token_logprobs.push_back(e.chosen.logprob);
    json alts = json::object();
    for (const engine::TokenLogprob& a : e.top) alts[a.bytes] = a.logprob;
    alts[e.chosen.bytes] = e.chosen.logprob;
    top.push_back(std::move(alts));
    offsets.push_back(e.text_offset);
  }
  json j = json::object();
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(token_logprobs);
  j["top_logprobs"] = std::move(top);
  j["text_offset"] = std::move(offsets);
  return j;
}

namespace {

json tool_call_json(const ToolCall& c) {
  return json{{"id", c.id},
              {"type", "function"},
              {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

}  // namespace

json chat_choice(int index, const ChatOutput& out, const std::string& finish_reason,
                 const json& logprobs) {
  json msg = json::object();
  msg["role"] = "assistant";
  msg["content"] = out.content.empty() && !out.tool_calls.empty() ? json(nullptr)
                                                                  : json(out.content);
  if (out.with_reasoning) {
    msg["reasoning_content"] = out.reasoning.empty() ? json(nullptr) : json(out.reasoning);
  }
  if (!out.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCall& c : out.tool_calls) calls.push_back(tool_call_json(c));
    msg["tool_calls"] = std::move(calls);
  }
  json choice = json::object();
  choice["index"] = index;
  choice["message"] = std::move(msg);
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_json(finish_reason);
  return choice;
}

json chat_completion_body(const ResponseMeta& meta, const ChatOutput& out,
                          const std::string& finish_reason, const Usage& usage) {
  return body_with_choices(meta, json::array({chat_choice(0, out, finish_reason, nullptr)}), usage);
}

json chat_delta_chunk(const ResponseMeta& meta, const OutputDelta& d, int first_call_index,
                      const std::string& finish_reason, int index, const json& logprobs) {
  json j = header(meta, "chat.completion.chunk");
  json delta = json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    json calls = json::array();
    for (size_t i = 0; i < d.tool_calls.size(); ++i) {
      json c = json::object();
      c["index"] = first_call_index + static_cast<int>(i);
      const ToolCall& t = d.tool_calls[i];
      c["id"] = t.id;
      c["type"] = "function";
      c["function"] = json{{"name", t.name}, {"arguments", t.arguments}};
      calls.push_back(std::move(c));
    }
    delta["tool_calls"] = std::move(calls);
  }
  json choice = json::object();
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_json(finish_reason);
  j["choices"] = json::array({choice});
  return j;
}

json stream_chunk(const ResponseMeta& meta, const std::string& text_delta, bool role_first,
                  const std::string& finish_reason, int index, const json& logprobs) {
  json j = header(meta, "chat.completion.chunk");
  json choice = json::object();
  choice["index"] = index;
  if (meta.endpoint == Endpoint::kChatCompletions) {
    json delta = json::object();
    if (role_first) delta["role"] = "assistant";
    if (!text_delta.empty() || role_first) delta["content"] = text_delta;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text_delta;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_json(finish_reason);
  j["choices"] = json::array({choice});
  return j;
}

json usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json j = header(meta, "chat.completion.chunk");
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j;
}

json models_body(const std::string& model, int64_t created, int max_model_len) {
  return json{{"object", "list"},
              {"data", json::array({model_json(model, created, max_model_len)})}};
}

json output_text_part(const std::string& text) {
  return json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
}

json response_message_item(const std::string& item_id, const std::string& status,
                           const std::string* text) {
  json item = json::object();
  item["id"] = item_id;
  item["type"] = "message";
  item["status"] = status;
  item["role"] = "assistant";
  item["content"] = text ? json::array({output_text_part(*text)}) : json::array();
  return item;
}

std::string response_status(const std::string& finish_reason) {
  return finish_reason == "length" || finish_reason == "cancelled" ? "incomplete" : "completed";
}

json response_object(const ResponseMeta& meta, const std::string& status,
                     const std::string& item_id, const std::string& text, const Usage& usage) {
  json r = json::object();
  r["id"] = meta.id;
  r["object"] = "response";
  r["created_at"] = meta.created;
  r["status"] = status;
  r["error"] = nullptr;
  r["incomplete_details"] =
      status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  r["model"] = meta.model;
  r["output"] = status == "in_progress"
                    ? json::array()
                    : json::array({response_message_item(item_id, "completed", &text)});
  r["parallel_tool_calls"] = false;
  r["tool_choice"] = "none";
  r["tools"] = json::array();
  r["text"] =
      json{{"format", meta.text_format.is_object() ? meta.text_format : json{{"type", "text"}}}};
  json u = json::object();
  u["input_tokens"] = usage.prompt_tokens;
  u["input_tokens_details"] = json{{"cached_tokens", usage.cached_tokens}};
  u["output_tokens"] = usage.completion_tokens;
  u["output_tokens_details"] = json{{"reasoning_tokens", 0}};
  u["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  r["usage"] = status == "in_progress" ? json(nullptr) : std::move(u);
  return r;
}

std::string response_event(const std::string& type, json payload, int* sequence) {
  json j = json::object();
  j["type"] = type;
  j["sequence_number"] = (*sequence)++;
  for (auto it = payload.begin(); it != payload.end(); ++it) j[it.key()] = it.value();
  return "event: " + type + "\ndata: " + dump_json(j) + "\n\n";
}

json model_json(const std::string& model, int64_t created, int max_model_len) {
  json m = json::object();
  m["id"] = model;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "oscar";
  m["max_model_len"] = max_model_len;
  return m;
}

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace oscar::server
