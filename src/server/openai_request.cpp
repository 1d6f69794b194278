#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "core/status.h"
#include "server/json_fields.h"

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

namespace {

int http_status_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return 400;
    case StatusCode::kNotFound: return 404;
    // The engine's waiting queue is full (a request that can never fit is InvalidArgument):
    // retryable, with Retry-After.
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnimplemented: return 501;
    case StatusCode::kUnavailable: return 503;  // the device failed: a router sends elsewhere
    default: return 500;
  }
}

}  // namespace

ApiError error_from_status(const Status& s, const char* context) {
  ApiError e = invalid_request(std::string(context) + ": " + s.message(), "", http_status_for(s));
  if (e.http_status >= 500) e.type = "server_error";
  if (e.http_status == 429) {
    e.type = "server_error";
    e.code = "queue_full";
  }
  return e;
}

ApiError model_loading_error() {
  ApiError e = invalid_request("the model is still loading", "", 503);
  e.type = "server_error";
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

using json_fields::field;
using json_fields::int_in;
using json_fields::wrong_type;

// x in the fewest significant digits that read back as x ("1e-39", "0.0099999999999999985").
std::string shortest(double x) {
  std::string out;
  for (int digits = 6; digits <= 17; ++digits) {
    out = str_format("%.*g", digits, x);
    if (std::strtod(out.c_str(), nullptr) == x) break;
  }
  return out;
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
  int64_t x = 0;
  if (auto e = int_in(*v, key, lo, hi, &x)) return e;
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

// Content as the chat template wants it: a string. OpenAI content parts of type "text" are
// joined with "\n" (as vLLM does); media parts are refused, naming what this model takes.
std::optional<ApiError> content_text(const json& content, const std::string& name,
                                     std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  // An array (the caller checked the type).
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string pname = str_format("%s.content[%zu]", name.c_str(), j);
    if (!part.is_object()) return wrong_type(pname, "an object (a content part)", part);
    const json* type = field(part, "type");
    if (!type) return invalid_request("'" + pname + ".type' is required", pname + ".type");
    if (!type->is_string()) return wrong_type(pname + ".type", "a string", *type);
    const std::string t = type->get<std::string>();
    if (t == "text" || t == "input_text" || t == "output_text" || t == "refusal") {
      const char* key = t == "refusal" ? "refusal" : "text";
      const json* v = field(part, key);
      if (!v) {
        return invalid_request(str_format("'%s.%s' is required", pname.c_str(), key),
                               pname + "." + key);
      }
      if (!v->is_string()) return wrong_type(pname + "." + key, "a string", *v);
      if (j > 0) text += "\n";
      text += v->get<std::string>();
      continue;
    }
    const bool media = t == "image_url" || t == "input_image" || t == "image" ||
                       t == "input_audio" || t == "audio_url" || t == "audio" ||
                       t == "video_url" || t == "video" || t == "file" || t == "input_file";
    return invalid_request(
        str_format("%s is a content part of type '%s'; %sthis model accepts text only (content "
                   "parts of type 'text')",
                   pname.c_str(), t.c_str(), media ? "" : "that type is unknown; "),
        pname + ".type");
  }
  *out = std::move(text);
  return std::nullopt;
}

// OpenAI's rule for function names: ^[a-zA-Z0-9_-]{1,64}$.
bool valid_tool_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// tool_calls of an assistant message: [{"id"?, "type"?: "function", "function": {"name": string,
// "arguments": string or object}}], as the template reads them.
std::optional<ApiError> check_tool_calls(const json& calls, const std::string& name) {
  const std::string p = name + ".tool_calls";
  if (!calls.is_array()) return wrong_type(p, "an array", calls);
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string cp = str_format("%s[%zu]", p.c_str(), k);
    if (!c.is_object()) return wrong_type(cp, "an object", c);
    if (const json* type = field(c, "type"); type && *type != "function") {
      return invalid_request(
          str_format("'%s.type' must be \"function\", got %s", cp.c_str(), type->dump().c_str()),
          cp + ".type");
    }
    const json* fn = field(c, "function");
    if (!fn) return invalid_request("'" + cp + ".function' is required", cp + ".function");
    if (!fn->is_object()) return wrong_type(cp + ".function", "an object", *fn);
    const json* fname = field(*fn, "name");
    if (!fname) {
      return invalid_request("'" + cp + ".function.name' is required", cp + ".function.name");
    }
    if (!fname->is_string()) return wrong_type(cp + ".function.name", "a string", *fname);
    const json* args = field(*fn, "arguments");
    if (args && !args->is_string() && !args->is_object()) {
      return wrong_type(cp + ".function.arguments", "a string (JSON) or an object", *args);
    }
  }
  return std::nullopt;
}

// tool_choice: "auto" / "none"; "required" (a call to one of the tools) or
// {"type": "function", "function": {"name": f}} (a call to f), both constrained in the engine.
std::optional<ApiError> parse_tool_choice(const json& body, OpenAIRequest* req) {
  const json* tc = field(body, "tool_choice");
  if (!tc) return std::nullopt;
  const bool has_tools = req->tools.is_array() && !req->tools.empty();
  auto tool_names = [&] {
    std::vector<std::string> names;
    if (has_tools)
      for (const json& t : req->tools)
        names.push_back(t.at("function").at("name").get<std::string>());
    return names;
  };
  if (tc->is_string()) {
    const std::string v = tc->get<std::string>();
    if (v == "auto" || v == "none") {
      req->tool_choice = v;
      return std::nullopt;
    }
    if (v != "required") {
      return invalid_request(
          str_format("'tool_choice' = \"%s\" is not one of \"none\", \"auto\", \"required\" or "
                     "an object naming a function",
                     v.c_str()),
          "tool_choice");
    }
    if (!has_tools) {
      return invalid_request("'tool_choice' = \"required\" needs a non-empty 'tools' array",
                             "tool_choice");
    }
    req->tool_choice = "required";
    req->tool_call_names = tool_names();
    return std::nullopt;
  }
  if (!tc->is_object()) return wrong_type("tool_choice", "a string or an object", *tc);
  if (const json* type = field(*tc, "type"); !type || *type != "function") {
    return invalid_request("'tool_choice.type' must be \"function\"", "tool_choice.type");
  }
  const json* fn = field(*tc, "function");
  if (!fn) return invalid_request("'tool_choice.function' is required", "tool_choice.function");
  if (!fn->is_object()) return wrong_type("tool_choice.function", "an object", *fn);
  const json* name = field(*fn, "name");
  if (!name) {
    return invalid_request("'tool_choice.function.name' is required", "tool_choice.function.name");
  }
  if (!name->is_string()) return wrong_type("tool_choice.function.name", "a string", *name);
  const std::string f = name->get<std::string>();
  const std::vector<std::string> names = tool_names();
  if (std::find(names.begin(), names.end(), f) == names.end()) {
    return invalid_request(
        str_format("'tool_choice' names the function '%s', which is not in 'tools'", f.c_str()),
        "tool_choice.function.name");
  }
  req->tool_choice = "named";
  req->tool_call_names = {f};
  return std::nullopt;
}

// The roles the chat template is given. "developer" (OpenAI's newer name) becomes "system".
constexpr const char* kRoles = "system, developer, user, assistant, tool";

// A strict tool's parameters (or a response_format schema), compiled; errors name `param`.
std::optional<ApiError> compile_schema(const json& schema, const std::string& param,
                                       std::shared_ptr<const engine::JsonSchema>* out) {
  Result<std::shared_ptr<const engine::JsonSchema>> r = engine::JsonSchema::compile(schema);
  if (!r.ok()) {
    return invalid_request(str_format("'%s': %s (structured outputs support OpenAI's strict "
                                      "subset: see the server's README)",
                                      param.c_str(), r.status().message().c_str()),
                           param);
  }
  *out = std::move(r).value();
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const json& body, OpenAIRequest* req) {
  const json* m = field(body, "messages");
  if (!m) return invalid_request("'messages' is required", "messages");
  if (!m->is_array()) return wrong_type("messages", "an array", *m);
  if (m->empty()) return invalid_request("'messages' must not be empty", "messages");
  json out = json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    std::string name = str_format("messages[%zu]", i);
    if (!msg.is_object()) return wrong_type(name, "an object", msg);
    auto role_it = msg.find("role");
    if (role_it == msg.end()) {
      return invalid_request("'" + name + ".role' is required", name + ".role");
    }
    if (!role_it->is_string()) return wrong_type(name + ".role", "a string", *role_it);
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return invalid_request(str_format("%s has role '%s'; supported roles: %s", name.c_str(),
                                        role_it->get<std::string>().c_str(), kRoles),
                             name + ".role");
    }
    json norm = msg;
    norm["role"] = role;
    const json* content = field(msg, "content");
    if (content && !content->is_string() && !content->is_array()) {
      return wrong_type(name + ".content", "a string, an array of content parts or null",
                        *content);
    }
    const json* calls = field(msg, "tool_calls");
    if (calls && role != "assistant") {
      return invalid_request(str_format("%s has tool_calls, but only assistant messages may",
                                        name.c_str()),
                             name + ".tool_calls");
    }
    if (calls) {
      if (auto e = check_tool_calls(*calls, name)) return e;
      if (calls->empty()) norm.erase("tool_calls");
    }
    if (content) {
      std::string text;
      if (auto e = content_text(*content, name, &text)) return e;
      norm["content"] = std::move(text);
    } else if (role == "assistant" && calls && !calls->empty()) {
      norm["content"] = nullptr;  // a turn that only calls tools
    } else {
      return invalid_request(
          str_format("%s (role '%s') has no content%s", name.c_str(), role.c_str(),
                     role == "assistant" ? " and no tool_calls" : ""),
          name + ".content");
    }
    if (const json* rc = field(msg, "reasoning_content"); rc && !rc->is_string()) {
      return wrong_type(name + ".reasoning_content", "a string", *rc);
    }
    if (const json* n = field(msg, "name"); n && !n->is_string()) {
      return wrong_type(name + ".name", "a string", *n);
    }
    if (const json* id = field(msg, "tool_call_id"); id && !id->is_string()) {
      return wrong_type(name + ".tool_call_id", "a string", *id);
    }
    out.push_back(std::move(norm));
  }
  req->messages = std::move(out);
  std::map<std::string, std::shared_ptr<const engine::JsonSchema>> strict_schemas;  // by name
  if (const json* t = field(body, "tools")) {
    if (!t->is_array()) return wrong_type("tools", "an array", *t);
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const std::string tp = str_format("tools[%zu]", i);
      if (!tool.is_object()) return wrong_type(tp, "an object", tool);
      if (const json* type = field(tool, "type"); type && *type != "function") {
        return invalid_request(str_format("'%s.type' must be \"function\", got %s", tp.c_str(),
                                          type->dump().c_str()),
                               tp + ".type");
      }
      const json* fn = field(tool, "function");
      if (!fn) return invalid_request("'" + tp + ".function' is required", tp + ".function");
      if (!fn->is_object()) return wrong_type(tp + ".function", "an object", *fn);
      const json* fname = field(*fn, "name");
      if (!fname) {
        return invalid_request("'" + tp + ".function.name' is required", tp + ".function.name");
      }
      if (!fname->is_string()) return wrong_type(tp + ".function.name", "a string", *fname);
      if (const std::string f = fname->get<std::string>(); !valid_tool_name(f)) {
        return invalid_request(
            str_format("'%s.function.name' = %s must be 1 to 64 characters of a-z, A-Z, 0-9, "
                       "underscore and dash",
                       tp.c_str(),
                       fname->dump(-1, ' ', false, json::error_handler_t::replace).c_str()),
            tp + ".function.name");
      }
      const json* strict = field(*fn, "strict");
      if (strict && !strict->is_boolean())
        return wrong_type(tp + ".function.strict", "a boolean", *strict);
      if (strict && strict->get<bool>()) {
        const json* params = field(*fn, "parameters");
        const json schema =
            params ? *params : json{{"type", "object"}, {"properties", json::object()}};
        std::shared_ptr<const engine::JsonSchema> compiled;
        if (auto e = compile_schema(schema, tp + ".function.parameters", &compiled)) return e;
        if (!compiled->root_is_object()) {
          return invalid_request("'" + tp + ".function.parameters' must be an object schema",
                                 tp + ".function.parameters");
        }
        strict_schemas[fname->get<std::string>()] = std::move(compiled);
      }
    }
    if (!t->empty()) req->tools = *t;
  }
  if (auto e = parse_tool_choice(body, req)) return e;
  if (!strict_schemas.empty() && req->tool_call_names.empty() &&
      (req->tool_choice.empty() || req->tool_choice == "auto") && !req->json_object &&
      !req->json_schema) {
    for (const json& t : req->tools) req->tool_call_names.push_back(t["function"]["name"]);
    req->tool_call_on_start = true;
  }
  if (!strict_schemas.empty()) {
    for (const std::string& name : req->tool_call_names) {
      auto it = strict_schemas.find(name);
      req->tool_call_schemas.push_back(it == strict_schemas.end() ? nullptr : it->second);
    }
  }
  if ((req->json_object || req->json_schema) && !req->tool_call_names.empty()) {
    return invalid_request(
        str_format("'response_format' %s cannot be combined with a 'tool_choice' that forces a "
                   "call",
                   req->json_object ? "json_object" : "json_schema"),
        "response_format");
  }
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) return wrong_type("chat_template_kwargs", "an object", *k);
    req->chat_template_kwargs = *k;
  }
  return std::nullopt;
}

// /v1/responses input -> the messages of a chat body ({"messages": [...]}, for parse_messages).
std::optional<ApiError> responses_input(const json& body, json* chat) {
  json messages = json::array();
  if (const json* ins = field(body, "instructions")) {
    if (!ins->is_string()) return wrong_type("instructions", "a string", *ins);
    messages.push_back(json{{"role", "system"}, {"content", *ins}});
  }
  const json* input = field(body, "input");
  if (!input) return invalid_request("'input' is required", "input");
  if (input->is_string()) {
    messages.push_back(json{{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    if (input->empty()) return invalid_request("'input' must not be empty", "input");
    for (size_t i = 0; i < input->size(); ++i) {
      const json& item = (*input)[i];
      const std::string name = str_format("input[%zu]", i);
      if (!item.is_object()) return wrong_type(name, "an object", item);
      const json* type = field(item, "type");
      if (type && *type != "message") {
        return invalid_request(
            str_format("%s is an item of type %s; this server takes message items only",
                       name.c_str(), type->dump().c_str()),
            name + ".type");
      }
      json m = json::object();
      if (const json* role = field(item, "role")) m["role"] = *role;
      if (const json* content = field(item, "content")) m["content"] = *content;
      messages.push_back(std::move(m));
    }
  } else {
    return wrong_type("input", "a string or an array of message items", *input);
  }
  (*chat)["messages"] = std::move(messages);
  return std::nullopt;
}

// Parameters OpenAI clients send that this server does not implement: refused with a 400 naming
// them when set to anything but their no-op value, never silently ignored.
std::optional<ApiError> refuse_unsupported(const json& body, Endpoint endpoint) {
  auto refuse = [](const std::string& key, const json& v, const char* why) {
    const std::string value = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return invalid_request(str_format("'%s' = %s is not supported by this server%s%s", key.c_str(),
                                      value.c_str(), *why ? ": " : "", why),
                           key);
  };
  auto number_is = [](const json& v, double x) { return v.is_number() && v.get<double>() == x; };
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (v.is_null()) continue;
    if (endpoint == Endpoint::kResponses && (k == "logprobs" || k == "top_logprobs") &&
        v != false && !number_is(v, 0)) {
      return refuse(k, v, "use /v1/chat/completions or /v1/completions for log probabilities");
    }
    if (k == "min_p" && !number_is(v, 0)) return refuse(k, v, "");
    if (k == "logit_bias" && !(v.is_object() && v.empty())) return refuse(k, v, "");
    if (k == "best_of" && !number_is(v, 1)) return refuse(k, v, "use 'n' for several choices");
    if (k == "echo" && v != false) return refuse(k, v, "");
    if (k == "suffix" && !(v.is_string() && v.get<std::string>().empty())) {
      return refuse(k, v, "");
    }
    if (k == "use_beam_search" && v != false) return refuse(k, v, "");
    if (k == "stop_token_ids" && !(v.is_array() && v.empty())) {
      return refuse(k, v, "use 'stop' strings");
    }
    if (k == "response_format" && endpoint == Endpoint::kResponses &&
        !(v.is_object() && v.contains("type") && v["type"] == "text")) {
      return refuse(k, v, "use 'text.format' on /v1/responses");
    }
    if (k == "response_format" &&
        !(v.is_object() && v.contains("type") &&
          (v["type"] == "text" || v["type"] == "json_object" || v["type"] == "json_schema"))) {
      return refuse(k, v,
                    "structured output is {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                    "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}");
    }
    if (k == "functions" || k == "function_call") {
      return refuse(k, v, "use 'tools' (the legacy function-calling fields are not supported)");
    }
    if (k == "tool_choice" && endpoint != Endpoint::kChatCompletions && v != "auto" &&
        v != "none") {
      return refuse(k, v, "tool calls are a /v1/chat/completions feature");
    }
    if (k == "modalities" && !(v.is_array() && v.size() == 1 && v[0] == "text")) {
      return refuse(k, v, "text output only");
    }
    if (endpoint == Endpoint::kResponses) {
      if (k == "tools" && !(v.is_array() && v.empty())) {
        return refuse(k, v, "use /v1/chat/completions for tools");
      }
      if (k == "previous_response_id" || k == "conversation") {
        return refuse(k, v, "responses are not stored; send the whole conversation as input");
      }
      if (k == "background" && v != false) return refuse(k, v, "");
      if (k == "text" && v.is_object() && v.contains("format") && !v["format"].is_null() &&
          !(v["format"].is_object() && (v["format"].value("type", "") == "text" ||
                                        v["format"].value("type", "") == "json_object" ||
                                        v["format"].value("type", "") == "json_schema"))) {
        return refuse(k, v,
                      "text.format is {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                      "{\"type\": \"json_schema\", \"schema\": ...}");
      }
    }
    if (k == "audio" || k == "prediction" || k == "guided_json" || k == "guided_regex" ||
        k == "guided_choice" || k == "guided_grammar" || k == "structured_outputs") {
      return refuse(k, v, "");
    }
  }
  return std::nullopt;
}

// response_format (chat, completions) or text.format (/v1/responses): json_object or json_schema.
// refuse_unsupported() has checked the type.
std::optional<ApiError> parse_response_format(const json& body, OpenAIRequest* req) {
  const bool responses = req->endpoint == Endpoint::kResponses;
  req->text_format = json{{"type", "text"}};
  const json* fmt = nullptr;
  if (!responses) {
    fmt = field(body, "response_format");
  } else if (const json* t = field(body, "text")) {
    if (!t->is_object()) return wrong_type("text", "an object", *t);
    fmt = field(*t, "format");
  }
  const std::string where = responses ? "text.format" : "response_format";
  if (!fmt) return std::nullopt;
  if (!fmt->is_object()) return wrong_type(where, "an object", *fmt);
  const json* type = field(*fmt, "type");
  if (!type || !type->is_string())
    return wrong_type(where + ".type", "a string", type ? *type : json());
  if (responses) req->text_format = *fmt;
  if (*type == "json_object") req->json_object = true;
  if (*type != "json_schema") return std::nullopt;
  // Chat / completions: {"type": "json_schema", "json_schema": {...}}; responses: flat.
  const std::string js_name = responses ? where : where + ".json_schema";
  const json* js = responses ? fmt : field(*fmt, "json_schema");
  if (!js) return invalid_request("'" + js_name + "' is required", js_name);
  if (!js->is_object()) return wrong_type(js_name, "an object", *js);
  if (const json* n = field(*js, "name"); n && !n->is_string())
    return wrong_type(js_name + ".name", "a string", *n);
  if (const json* st = field(*js, "strict"); st && !st->is_boolean())
    return wrong_type(js_name + ".strict", "a boolean", *st);
  const json* schema = field(*js, "schema");
  if (!schema) return invalid_request("'" + js_name + ".schema' is required", js_name + ".schema");
  return compile_schema(*schema, js_name + ".schema", &req->json_schema);
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

  if (auto e = refuse_unsupported(body, req->endpoint)) return e;
  if (auto e = parse_response_format(body, req)) return e;  // checked against forced calls below
  if (req->endpoint == Endpoint::kChatCompletions) {
    if (auto e = parse_messages(body, req)) return e;
  } else if (req->endpoint == Endpoint::kResponses) {
    json chat = json::object();
    if (auto e = responses_input(body, &chat)) return e;
    if (auto e = parse_messages(chat, req)) {
      // Name the field as the client sent it: input[i] (after instructions, if any).
      const bool ins = field(body, "instructions") != nullptr;
      for (std::string* s : {&e->param, &e->message}) {
        size_t p = s->find("messages[");
        while (p != std::string::npos) {
          const size_t close = s->find(']', p);
          const int idx = std::atoi(s->c_str() + p + 9) - (ins ? 1 : 0);
          s->replace(p, close + 1 - p, str_format("input[%d]", idx < 0 ? 0 : idx));
          p = s->find("messages[", p);
        }
      }
      return e;
    }
    std::optional<int64_t> mot;
    if (auto e = get_int(body, "max_output_tokens", 1, std::numeric_limits<int32_t>::max(), &mot)) {
      return e;
    }
    if (mot) req->max_tokens = static_cast<int>(*mot);
  } else {
    if (auto e = parse_prompt(body, limits, req)) return e;
  }

  // n: choices per request (chat and completions).
  std::optional<int64_t> n;
  if (auto e = get_int(body, "n", 1, kMaxChoices, &n)) return e;
  if (n && *n != 1 && req->endpoint == Endpoint::kResponses) {
    return invalid_request(
        str_format("'n' = %lld is not supported by /v1/responses (one output per response)",
                   static_cast<long long>(*n)),
        "n");
  }
  if (n && limits.max_live_requests > 0 && *n > limits.max_live_requests) {
    // Its choices run as n requests: more than the engine holds at once could never all run
    // (a 429 would invite retries that can not succeed).
    return invalid_request(
        str_format("'n' = %lld exceeds the %d requests this server can hold at once "
                   "(--max-running + --max-queue)",
                   static_cast<long long>(*n), limits.max_live_requests),
        "n");
  }
  if (n) req->n = static_cast<int>(*n);

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
  if (temperature) req->sampling.config.temperature = static_cast<float>(*temperature);
  if (auto e = get_number(body, "top_p", 0.0, 1.0, &top_p)) return e;
  if (top_p) {
    // The sampler works in 32-bit floats: a value that rounds to 0 there would keep no token.
    if (*top_p <= 0.0 || static_cast<float>(*top_p) <= 0.0f) {
      return invalid_request(
          str_format("'top_p' must be in (0, 1], got %.17g%s", *top_p,
                     *top_p > 0.0 ? ", which rounds to 0 in the sampler's 32-bit floats" : ""),
          "top_p");
    }
    req->sampling.config.top_p = static_cast<float>(*top_p);
  }
  // Penalties: OpenAI's presence/frequency in [-2, 2], vLLM's repetition_penalty > 0.
  std::optional<double> presence, frequency, repetition;
  if (auto e = get_number(body, "presence_penalty", -2.0, 2.0, &presence)) return e;
  if (auto e = get_number(body, "frequency_penalty", -2.0, 2.0, &frequency)) return e;
  if (const json* rp = field(body, "repetition_penalty")) {
    if (!rp->is_number()) return wrong_type("repetition_penalty", "a number", *rp);
    const double x = rp->get<double>();
    // The engine's range (engine_api.h says why it is bounded): a tiny or huge factor would
    // overflow the logits to infinity.
    if (!(x >= engine::kMinRepetitionPenalty) || !(x <= engine::kMaxRepetitionPenalty)) {
      return invalid_request(
          str_format("'repetition_penalty' must be in [%g, %g], got %s",
                     static_cast<double>(engine::kMinRepetitionPenalty),
                     static_cast<double>(engine::kMaxRepetitionPenalty), shortest(x).c_str()),
          "repetition_penalty");
    }
    repetition = x;
  }
  if (presence) req->sampling.presence_penalty = static_cast<float>(*presence);
  if (frequency) req->sampling.frequency_penalty = static_cast<float>(*frequency);
  if (repetition) req->sampling.repetition_penalty = static_cast<float>(*repetition);
  // top_k: 0 or -1 (vLLM's spelling) mean off.
  std::optional<int64_t> top_k;
  if (auto e = get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) return e;
  if (top_k) req->sampling.config.top_k = *top_k < 0 ? 0 : static_cast<int>(*top_k);
  std::optional<int64_t> seed;
  if (auto e = get_int(body, "seed", std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max(), &seed)) {
    return e;
  }
  if (seed) {
    req->sampling.has_seed = true;
    req->sampling.config.seed = static_cast<uint64_t>(*seed);
  }

  // logprobs. Chat: logprobs (boolean) and top_logprobs (0..20, needs logprobs); completions:
  // logprobs (0..20 alternatives; 0 = the chosen token's only).
  if (req->endpoint == Endpoint::kChatCompletions) {
    bool logprobs = false;
    if (auto e = get_bool(body, "logprobs", &logprobs)) return e;
    std::optional<int64_t> top;
    if (auto e = get_int(body, "top_logprobs", 0, engine::kMaxLogprobs, &top)) return e;
    if (top && *top > 0 && !logprobs) {
      return invalid_request(str_format("'top_logprobs' = %lld needs 'logprobs' set to true",
                                        static_cast<long long>(*top)),
                             "top_logprobs");
    }
    if (logprobs) req->logprobs = top ? static_cast<int>(*top) : 0;
  } else if (req->endpoint == Endpoint::kCompletions) {
    std::optional<int64_t> lp;
    if (auto e = get_int(body, "logprobs", 0, engine::kMaxLogprobs, &lp)) return e;
    if (lp) req->logprobs = static_cast<int>(*lp);
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
                                              int max_context_tokens, int default_max_tokens) {
  if (prompt_tokens <= 0) return invalid_request("the prompt is empty after tokenization");
  if (prompt_tokens >= max_context_tokens) {
    ApiError e = invalid_request(
        str_format("This model's maximum context length is %d tokens, but the prompt has %d tokens "
               "(no room left for the completion). Please shorten the prompt.",
               max_context_tokens, prompt_tokens));
    e.code = "context_length_exceeded";
    return e;
  }
  if (!max_tokens) {
    const int room = max_context_tokens - prompt_tokens;
    return default_max_tokens > 0 ? std::min(room, default_max_tokens) : room;
  }
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
