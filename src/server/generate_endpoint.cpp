// /v1/generate and /v1/abort: parsing, validation and bodies (generate_endpoint.h).
#include "server/generate_endpoint.h"

#include <cmath>
#include <limits>

#include "core/status.h"
#include "server/json_fields.h"
#include "server/openai_response.h"

namespace oscar::server {

namespace {

using json = nlohmann::ordered_json;

using json_fields::field;
using json_fields::int_in;
using json_fields::type_name;
using json_fields::wrong_type;

std::optional<ApiError> number_in(const json& obj, const char* key, double lo, double hi,
                                  double* out) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return wrong_type(key, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    return invalid_request(str_format("'%s' must be in [%g, %g], got %g", key, lo, hi, x), key);
  }
  *out = x;
  return std::nullopt;
}

// An array of token ids, each in [0, vocab_size); the message names the first bad index.
std::optional<ApiError> token_ids(const json& v, const char* key, int vocab_size,
                                  std::vector<int32_t>* out) {
  if (!v.is_array()) return wrong_type(key, "an array of token ids", v);
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer()) {
      return invalid_request(
          str_format("'%s[%zu]' must be an integer token id, got %s", key, i, type_name(t)), key);
    }
    const bool neg = t.is_number_integer() && !t.is_number_unsigned() && t.get<int64_t>() < 0;
    const uint64_t u = neg ? 0 : t.get<uint64_t>();
    if (neg || u >= static_cast<uint64_t>(vocab_size)) {
      return invalid_request(
          str_format("'%s[%zu]' = %s is not a token id of this model (vocabulary size %d)", key, i,
                     t.dump().c_str(), vocab_size),
          key);
    }
    out->push_back(static_cast<int32_t>(u));
  }
  return std::nullopt;
}

std::optional<ApiError> request_id(const json& obj, std::string* out) {
  const json* v = field(obj, "request_id");
  if (!v) return std::nullopt;
  if (!v->is_string()) return wrong_type("request_id", "a string", *v);
  const std::string s = v->get<std::string>();
  bool sane = !s.empty() && s.size() <= kMaxRequestIdBytes;
  for (char c : s) sane = sane && c > 0x20 && c < 0x7f;
  if (!sane) {
    return invalid_request(
        str_format("'request_id' must be 1..%zu visible ASCII characters", kMaxRequestIdBytes),
        "request_id");
  }
  *out = s;
  return std::nullopt;
}

// The body as a JSON object, or the 400.
std::variant<json, ApiError> parse_object(std::string_view body) {
  if (json_depth_exceeds(body, kMaxJsonDepth)) {
    return invalid_request(str_format("request body nests deeper than %d levels", kMaxJsonDepth));
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_request("request body is not valid JSON");
  if (!j.is_object()) return invalid_request("request body must be a JSON object");
  return j;
}

}  // namespace

std::variant<GenerateRequest, ApiError> parse_generate_request(std::string_view body,
                                                               const ModelLimits& limits) {
  auto parsed = parse_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  GenerateRequest r;

  const json* ids = field(j, "input_ids");
  if (!ids) return invalid_request("'input_ids' is required", "input_ids");
  if (auto e = token_ids(*ids, "input_ids", limits.vocab_size, &r.input_ids)) return *e;
  if (r.input_ids.empty()) return invalid_request("'input_ids' must not be empty", "input_ids");
  if (r.input_ids.size() >= static_cast<size_t>(limits.max_context_tokens)) {
    return invalid_request(
        str_format("'input_ids' has %zu tokens; this model's context is %d tokens, prompt and "
                   "output together",
                   r.input_ids.size(), limits.max_context_tokens),
        "input_ids");
  }
  if (const json* v = field(j, "max_tokens")) {
    int64_t x = 0;
    if (auto e = int_in(*v, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &x)) return *e;
    r.max_tokens = static_cast<int>(x);
  }
  double temperature = r.sampling.config.temperature, top_p = r.sampling.config.top_p;
  if (auto e = number_in(j, "temperature", 0.0, kMaxTemperature, &temperature)) return *e;
  if (auto e = number_in(j, "top_p", 0.0, 1.0, &top_p)) return *e;
  if (top_p <= 0.0) return invalid_request("'top_p' must be in (0, 1], got 0", "top_p");
  r.sampling.config.temperature = static_cast<float>(temperature);
  r.sampling.config.top_p = static_cast<float>(top_p);
  if (const json* v = field(j, "top_k")) {
    int64_t x = 0;
    // -1 is vLLM's and SGLang's "off", as 0 is here.
    if (auto e = int_in(*v, "top_k", -1, std::numeric_limits<int32_t>::max(), &x)) return *e;
    r.sampling.config.top_k = x < 0 ? 0 : static_cast<int>(x);
  }
  if (const json* v = field(j, "seed")) {
    int64_t x = 0;
    if (auto e = int_in(*v, "seed", std::numeric_limits<int64_t>::min(),
                        std::numeric_limits<int64_t>::max(), &x)) {
      return *e;
    }
    r.sampling.has_seed = true;
    r.sampling.config.seed = static_cast<uint64_t>(x);
  }
  if (const json* v = field(j, "stop_token_ids")) {
    if (auto e = token_ids(*v, "stop_token_ids", limits.vocab_size, &r.stop_token_ids)) return *e;
    if (r.stop_token_ids.size() > kMaxStopTokenIds) {
      return invalid_request(str_format("'stop_token_ids' lists %zu ids; at most %zu",
                                        r.stop_token_ids.size(), kMaxStopTokenIds),
                             "stop_token_ids");
    }
  }
  for (const char* key : {"ignore_eos", "stream"}) {
    const json* v = field(j, key);
    if (!v) continue;
    if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
    (key[0] == 'i' ? r.ignore_eos : r.stream) = v->get<bool>();
  }
  if (auto e = request_id(j, &r.request_id)) return *e;
  return r;
}

std::variant<std::string, ApiError> parse_abort_request(std::string_view body) {
  auto parsed = parse_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  std::string id;
  if (auto e = request_id(std::get<json>(parsed), &id)) return *e;
  if (id.empty()) return invalid_request("'request_id' is required", "request_id");
  return id;
}

std::string make_generate_id() {
  return "gen-" + make_response_id(Endpoint::kCompletions).substr(5);  // "cmpl-<24 hex>"
}

json generate_body(const std::string& request_id, const std::vector<int32_t>& output_ids,
                   const std::string& finish_reason, int prompt_tokens, int completion_tokens,
                   int cached_tokens) {
  json j = json::object();
  j["request_id"] = request_id;
  j["output_ids"] = output_ids;
  j["finish_reason"] = finish_reason;
  j["usage"] = usage_json(Usage{prompt_tokens, completion_tokens, cached_tokens});
  return j;
}

json generate_chunk(const std::string& request_id, const std::vector<int32_t>& new_ids,
                    const std::string& finish_reason, int prompt_tokens, int completion_tokens,
                    int cached_tokens) {
  json j = json::object();
  j["request_id"] = request_id;
  j["output_ids"] = new_ids;
  if (!finish_reason.empty()) {
    j["finish_reason"] = finish_reason;
    j["usage"] = usage_json(Usage{prompt_tokens, completion_tokens, cached_tokens});
  }
  return j;
}

}  // namespace oscar::server
