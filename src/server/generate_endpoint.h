// The token-level endpoints that routed and disaggregated deployments call: POST /v1/generate
// (token ids in, token ids out, streamed or whole) and POST /v1/abort (cancel one by request_id).
// Here: request parsing and validation (pure functions from a body to a request or to the
// OpenAI-format error), response bodies and stream events, and GenerateRegistry, the set of live
// /v1/generate request ids that /v1/abort consults. The HTTP plumbing (submitting, relaying
// events, SSE writes) lives in generate_relay.cpp and http_session.cpp.
//
// Wire shape (documented in docs/deploy.md, "Token-level API"):
//   POST /v1/generate {"input_ids": [int, ...], "max_tokens": int, "temperature": num,
//                      "top_p": num, "top_k": int, "seed": int, "stop_token_ids": [int, ...],
//                      "ignore_eos": bool, "stream": bool, "request_id": str}
//     -> {"request_id", "output_ids": [...], "finish_reason", "usage": {prompt_tokens,
//         completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens}}}
//     stream: data: {"request_id", "output_ids": [new ids]} ... then
//             data: {"request_id", "output_ids": [], "finish_reason", "usage"}, data: [DONE]
//   POST /v1/abort {"request_id": str} -> 200 {"request_id", "aborted": true}; 404 (OpenAI error,
//     code "request_not_found") when no live /v1/generate request has that id.
// finish_reason: "stop" (EOS or a stop_token_ids token, which is included in output_ids),
// "length", "cancelled" (aborted, or the client went away). Unknown fields are ignored.
// Not here: text in or out, stop strings, logprobs, n > 1, LoRA, images.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <variant>
#include <vector>

#include "engine/engine_api.h"
#include "server/openai_request.h"

namespace oscar::server {

// Most stop_token_ids a request may list.
inline constexpr size_t kMaxStopTokenIds = 64;
// A client-chosen request_id: 1..kMaxRequestIdBytes visible ASCII characters.
inline constexpr size_t kMaxRequestIdBytes = 128;

struct GenerateRequest {
  std::string request_id;          // the client's, or "" (the server picks "gen-<hex>")
  std::vector<int32_t> input_ids;  // [n_prompt_tokens], non-empty, each in [0, vocab_size)
  std::optional<int> max_tokens;   // > 0 when given; default: the rest of the context
  engine::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // <= kMaxStopTokenIds, each in [0, vocab_size)
  bool ignore_eos = false;
  bool stream = false;
};

// Validates everything but the context fit (the server calls check_context_fit after).
std::variant<GenerateRequest, ApiError> parse_generate_request(std::string_view body,
                                                               const ModelLimits& limits);
// POST /v1/abort: the request_id to cancel.
std::variant<std::string, ApiError> parse_abort_request(std::string_view body);

// A fresh server-chosen id: "gen-" and 24 hex digits. Thread-safe.
std::string make_generate_id();

// Non-streaming answer. usage as usage_json (openai_response.h).
nlohmann::ordered_json generate_body(const std::string& request_id,
                                     const std::vector<int32_t>& output_ids,
                                     const std::string& finish_reason, int prompt_tokens,
                                     int completion_tokens, int cached_tokens);
// One stream event's JSON: new ids; with finish_reason (non-empty) also the usage.
nlohmann::ordered_json generate_chunk(const std::string& request_id,
                                      const std::vector<int32_t>& new_ids,
                                      const std::string& finish_reason, int prompt_tokens,
                                      int completion_tokens, int cached_tokens);

// The ids of live /v1/generate requests (submitted, terminal event not yet seen). Thread-safe:
// the server adds on submit and removes from the engine's callback on the terminal event.
class GenerateRegistry {
 public:
  // False when the id is already live.
  bool add(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_.insert(id).second;
  }
  void remove(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    ids_.erase(id);
  }
  bool contains(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_.count(id) != 0;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<std::string> ids_;
};

}  // namespace oscar::server
