#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <utility>

#include "core/status.h"

namespace oscar::server {

using json = nlohmann::ordered_json;

std::string ApiError::to_json() const {
  json err = json::object();
  err["message"] = message;
  err["type"] = type;
  err["param"] = param.empty() ? json(nullptr) : json(param);
  err["code"] = code.empty() ? json(nullptr) : json(code);
  json body = json::object();
  body["error"] = std::move(err);
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError invalid_request(std::string message, std::string param, int http_status) {
  ApiError e;
  e.http_status = http_status;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

bool json_depth_exceeds(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > max_depth) return true;
        break;
      case ']':
      case '}':
        --depth;  // malformed input is left to the parser
        break;
      default: break;
    }
  }
  return false;
}

namespace {

const char* json_type_name(const json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

ApiError wrong_type(const std::string& field, const char* expected, const json& got) {
  return invalid_request(
      str_format("'%s' must be %s, got %s", field.c_str(), expected, json_type_name(got)), field);
}

// The value of `key`, or nullptr when absent or null (null means "not given").
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> get_bool(const json& obj, const char* key, bool* out) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

// A finite number in [lo, hi].
std::optional<ApiError> get_number(const json& obj, const char* key, double lo, double hi,
                                   std::optional<double>* out) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return wrong_type(key, "a number", *v);
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    return invalid_request(str_format("'%s' must be in [%g, %g], got %g", key, lo, hi, x), key);
  }
  *out = x;
  return std::nullopt;
}

// An integer in [lo, hi].
std::optional<ApiError> get_int(const json& obj, const char* key, int64_t lo, int64_t hi,
                                std::optional<int64_t>* out) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) return wrong_type(key, "an integer", *v);
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
            ? std::numeric_limits<int64_t>::max()
            : static_cast<int64_t>(u);
  } else {
    x = v->get<int64_t>();
  }
  if (x < lo || x > hi) {
    return invalid_request(
        str_format("'%s' must be in [%lld, %lld], got %lld", key, static_cast<long long>(lo),
               static_cast<long long>(hi), static_cast<long long>(x)),
        key);
  }
  *out = x;
  return std::nullopt;
}

std::optional<ApiError> parse_token_ids(const json& arr, const std::string& param, int vocab_size,
                                        std::vector<int32_t>* out) {
  if (arr.empty()) return invalid_request("'" + param + "' must not be empty", param);
  out->reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    if (!t.is_number_integer()) {
      return wrong_type(str_format("%s[%zu]", param.c_str(), i), "an integer token id", t);
    }
    int64_t id = t.is_number_unsigned()
                     ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), INT64_MAX))
                     : t.get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      return invalid_request(str_format("token id %lld at %s[%zu] is out of range [0, %d)",
                                    static_cast<long long>(id), param.c_str(), i, vocab_size),
                             param);
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& body, const ModelLimits& limits,
                                     OpenAIRequest* req) {
  const json* p = field(body, "prompt");
  if (!p) return invalid_request("'prompt' is required", "prompt");
  if (p->is_string()) {
    req->prompt_text = p->get<std::string>();
    if (req->prompt_text.empty()) return invalid_request("'prompt' must not be empty", "prompt");
    return std::nullopt;
  }
  if (!p->is_array()) return wrong_type("prompt", "a string or an array", *p);
  if (p->empty()) return invalid_request("'prompt' must not be empty", "prompt");
  const json& first = (*p)[0];
  if (first.is_number_integer()) {
    req->prompt_is_ids = true;
    return parse_token_ids(*p, "prompt", limits.vocab_size, &req->prompt_ids);
  }
  if (p->size() != 1) {
    return invalid_request(
        str_format("'prompt' holds %zu prompts; only one prompt per request is supported", p->size()),
        "prompt");
  }
  if (first.is_string()) {
    req->prompt_text = first.get<std::string>();
    if (req->prompt_text.empty()) return invalid_request("'prompt' must not be empty", "prompt");
    return std::nullopt;
  }
  if (first.is_array()) {
    req->prompt_is_ids = true;
    return parse_token_ids(first, "prompt[0]", limits.vocab_size, &req->prompt_ids);
  }
  return wrong_type("prompt[0]", "a string, a token id or an array of token ids", first);
}

std::optional<ApiError> parse_messages(const json& body, OpenAIRequest* req) {
  const json* m = field(body, "messages");
  if (!m) return invalid_request("'messages' is required", "messages");
  if (!m->is_array()) return wrong_type("messages", "an array", *m);
  if (m->empty()) return invalid_request("'messages' must not be empty", "messages");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    std::string name = str_format("messages[%zu]", i);
    if (!msg.is_object()) return wrong_type(name, "an object", msg);
    auto role = msg.find("role");
    if (role == msg.end()) return invalid_request("'" + name + ".role' is required", name + ".role");
    if (!role->is_string()) return wrong_type(name + ".role", "a string", *role);
    auto content = msg.find("content");
    if (content != msg.end() && !content->is_string() && !content->is_null() &&
        !content->is_array()) {
      return wrong_type(name + ".content", "a string, an array or null", *content);
    }
  }
  req->messages = *m;
  if (const json* t = field(body, "tools")) {
    if (!t->is_array()) return wrong_type("tools", "an array", *t);
    req->tools = *t;
  }
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) return wrong_type("chat_template_kwargs", "an object", *k);
    req->chat_template_kwargs = *k;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json& body, OpenAIRequest* req) {
  const json* s = field(body, "stop");
  if (!s) return std::nullopt;
  std::vector<std::string> stops;
  if (s->is_string()) {
    stops.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    if (s->size() > kMaxStopStrings) {
      return invalid_request(str_format("'stop' has %zu strings; at most %zu are allowed", s->size(),
                                    kMaxStopStrings),
                             "stop");
    }
    for (size_t i = 0; i < s->size(); ++i) {
      if (!(*s)[i].is_string()) return wrong_type(str_format("stop[%zu]", i), "a string", (*s)[i]);
      stops.push_back((*s)[i].get<std::string>());
    }
  } else {
    return wrong_type("stop", "a string or an array of strings", *s);
  }
  for (const std::string& str : stops) {
    if (str.empty()) return invalid_request("'stop' strings must not be empty", "stop");
    if (str.size() > kMaxStopStringBytes) {
      return invalid_request(str_format("a 'stop' string is %zu bytes; at most %zu are allowed",
                                    str.size(), kMaxStopStringBytes),
                             "stop");
    }
  }
  req->stop = std::move(stops);
  return std::nullopt;
}

std::optional<ApiError> parse_fields(const json& body, const ModelLimits& limits,
                                     OpenAIRequest* req) {
  // model
  const json* model = field(body, "model");
  if (!model) return invalid_request("'model' is required", "model");
  if (!model->is_string()) return wrong_type("model", "a string", *model);
  req->model = model->get<std::string>();
  if (req->model != limits.model_name) {
    ApiError e = invalid_request(str_format("The model '%s' does not exist; this server serves '%s'",
                                        req->model.c_str(), limits.model_name.c_str()),
                                 "model", 404);
    e.code = "model_not_found";
    return e;
  }

  if (req->endpoint == Endpoint::kChatCompletions) {
    if (auto e = parse_messages(body, req)) return e;
  } else {
    if (auto e = parse_prompt(body, limits, req)) return e;
  }

  // n: only one choice per request.
  std::optional<int64_t> n;
  if (auto e = get_int(body, "n", 1, std::numeric_limits<int32_t>::max(), &n)) return e;
  if (n && *n != 1) {
    return invalid_request(
        str_format("'n' = %lld is not supported; this server returns exactly one choice (n = 1)",
               static_cast<long long>(*n)),
        "n");
  }

  // max_completion_tokens (current name) wins over max_tokens (legacy).
  std::optional<int64_t> max_tokens;
  if (auto e = get_int(body, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens)) {
    return e;
  }
  std::optional<int64_t> max_completion_tokens;
  if (auto e = get_int(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(),
                       &max_completion_tokens)) {
    return e;
  }
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  if (max_tokens) req->max_tokens = static_cast<int>(*max_tokens);

  std::optional<double> temperature, top_p;
  if (auto e = get_number(body, "temperature", 0.0, kMaxTemperature, &temperature)) return e;
  if (temperature) req->sampling.temperature = static_cast<float>(*temperature);
  if (auto e = get_number(body, "top_p", 0.0, 1.0, &top_p)) return e;
  if (top_p) {
    if (*top_p <= 0.0) return invalid_request("'top_p' must be in (0, 1], got 0", "top_p");
    req->sampling.top_p = static_cast<float>(*top_p);
  }
  // top_k: 0 or -1 (vLLM's spelling) mean off.
  std::optional<int64_t> top_k;
  if (auto e = get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) return e;
  if (top_k) req->sampling.top_k = *top_k < 0 ? 0 : static_cast<int>(*top_k);
  std::optional<int64_t> seed;
  if (auto e = get_int(body, "seed", std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max(), &seed)) {
    return e;
  }
  if (seed) {
    req->sampling.has_seed = true;
    req->sampling.seed = static_cast<uint64_t>(*seed);
  }

  if (auto e = parse_stop(body, req)) return e;
  if (auto e = get_bool(body, "ignore_eos", &req->ignore_eos)) return e;
  if (auto e = get_bool(body, "stream", &req->stream)) return e;
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    const json* iu = field(*so, "include_usage");
    if (iu) {
      if (!iu->is_boolean()) return wrong_type("stream_options.include_usage", "a boolean", *iu);
      req->include_usage = iu->get<bool>();
    }
  }
  return std::nullopt;
}

}  // namespace

ParseResult parse_openai_request(Endpoint endpoint, std::string_view body,
                                 const ModelLimits& limits) {
  if (body.size() > kMaxBodyBytes) {
    ApiError e = invalid_request(str_format("request body is %zu bytes; at most %zu are allowed",
                                        body.size(), kMaxBodyBytes),
                                 "", 413);
    e.code = "request_too_large";
    return e;
  }
  if (json_depth_exceeds(body, kMaxJsonDepth)) {
    return invalid_request(str_format("request body nests JSON deeper than %d levels", kMaxJsonDepth));
  }
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end());
  } catch (const json::exception& ex) {
    return invalid_request(std::string("request body is not valid JSON: ") + ex.what());
  }
  if (!parsed.is_object()) return invalid_request("request body must be a JSON object");

  OpenAIRequest req;
  req.endpoint = endpoint;
  try {
    if (auto e = parse_fields(parsed, limits, &req)) return std::move(*e);
  } catch (const json::exception& ex) {  // defensive: a get<> the checks above did not foresee
    return invalid_request(std::string("invalid request: ") + ex.what());
  }
  return req;
}

std::variant<int, ApiError> check_context_fit(int prompt_tokens, std::optional<int> max_tokens,
                                              int max_context_tokens) {
  if (prompt_tokens <= 0) return invalid_request("the prompt is empty after tokenization");
  if (prompt_tokens >= max_context_tokens) {
    ApiError e = invalid_request(
        str_format("This model's maximum context length is %d tokens, but the prompt has %d tokens "
               "(no room left for the completion). Please shorten the prompt.",
               max_context_tokens, prompt_tokens));
    e.code = "context_length_exceeded";
    return e;
  }
  if (!max_tokens) return max_context_tokens - prompt_tokens;
  if (static_cast<int64_t>(prompt_tokens) + *max_tokens > max_context_tokens) {
    ApiError e = invalid_request(
        str_format("This model's maximum context length is %d tokens. However, you requested %lld "
               "tokens (%d in the prompt, %d in the completion). Please reduce the prompt or "
               "max_tokens.",
               max_context_tokens, static_cast<long long>(prompt_tokens) + *max_tokens,
               prompt_tokens, *max_tokens),
        "max_tokens");
    e.code = "context_length_exceeded";
    return e;
  }
  return *max_tokens;
}

}  // namespace oscar::server
