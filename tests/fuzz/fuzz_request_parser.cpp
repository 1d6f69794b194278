// libFuzzer target: parse_openai_request on arbitrary bodies (first byte picks the endpoint).
// Must return a validated request or an ApiError, never crash or hang; an accepted request must
// satisfy every documented limit, and every error must serialise to valid JSON.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oscar::server;
  if (size == 0) return 0;
  const Endpoint endpoint = (data[0] & 1) ? Endpoint::kCompletions : Endpoint::kChatCompletions;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const ModelLimits limits{"m", /*max_context_tokens=*/4096, /*vocab_size=*/1000};

  ParseResult r = parse_openai_request(endpoint, body, limits);
  if (const ApiError* e = std::get_if<ApiError>(&r)) {
    OSCAR_CHECK(e->http_status >= 400 && e->http_status < 600, "status %d", e->http_status);
    OSCAR_CHECK(nlohmann::json::accept(e->to_json()), "error JSON does not parse");
    return 0;
  }
  const OpenAIRequest& q = std::get<OpenAIRequest>(r);
  OSCAR_CHECK(q.model == "m");
  OSCAR_CHECK(q.stop.size() <= kMaxStopStrings);
  for (const std::string& s : q.stop) OSCAR_CHECK(!s.empty() && s.size() <= kMaxStopStringBytes);
  OSCAR_CHECK(!q.max_tokens || *q.max_tokens > 0);
  OSCAR_CHECK(q.sampling.config.temperature >= 0.0f &&
              q.sampling.config.temperature <= kMaxTemperature);
  OSCAR_CHECK(q.sampling.config.top_p > 0.0f && q.sampling.config.top_p <= 1.0f);
  OSCAR_CHECK(q.sampling.config.top_k >= 0);
  int n_prompt = 0;
  if (endpoint == Endpoint::kChatCompletions) {
    OSCAR_CHECK(q.messages.is_array() && !q.messages.empty());
    n_prompt = static_cast<int>(q.messages.size());
  } else if (q.prompt_is_ids) {
    OSCAR_CHECK(!q.prompt_ids.empty());
    for (int32_t id : q.prompt_ids) OSCAR_CHECK(id >= 0 && id < limits.vocab_size, "id %d", id);
    n_prompt = static_cast<int>(q.prompt_ids.size());
  } else {
    OSCAR_CHECK(!q.prompt_text.empty());
    n_prompt = static_cast<int>(q.prompt_text.size());
  }
  auto fit = check_context_fit(n_prompt, q.max_tokens, limits.max_context_tokens);
  if (const int* max_tokens = std::get_if<int>(&fit)) {
    OSCAR_CHECK(*max_tokens > 0 && n_prompt + *max_tokens <= limits.max_context_tokens);
  }
  // Responses carrying user text (possibly invalid UTF-8) must serialise without throwing.
  ResponseMeta meta{endpoint, "id", 0, q.model};
  std::string out = sse_event(stream_chunk(meta, q.prompt_text, true, ""));
  OSCAR_CHECK(out.size() >= 8);
  return 0;
}
