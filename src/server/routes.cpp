// Routing, health, metrics, models, auth and CORS (routes.h).
#include "server/routes.h"

#include <cctype>
#include <mutex>
#include <optional>

#include "server/generate_relay.h"
#include "server/openai_relay.h"
#include "server/openai_response.h"

namespace oscar::server {

namespace http = boost::beast::http;

namespace {

constexpr std::string_view kModelPrefix = "/v1/models/";

// Constant-time comparison, so the API key can not be guessed byte by byte from timings.
bool equal_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// %XX decoding of a path segment; nullopt on a malformed escape.
std::optional<std::string> percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      return std::nullopt;
    }
    out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
    i += 2;
  }
  return out;
}

// The methods a route answers, for Allow and 405; nullptr for no route.
const char* route_methods(std::string_view target) {
  if (target == "/health" || target == "/metrics" || target == "/v1/models" ||
      (target.size() > kModelPrefix.size() &&
       target.substr(0, kModelPrefix.size()) == kModelPrefix)) {
    return "GET, HEAD, OPTIONS";
  }
  if (target == "/v1/chat/completions" || target == "/v1/completions" ||
      target == "/v1/responses" || target == "/v1/generate" || target == "/v1/abort") {
    return "POST, OPTIONS";
  }
  return nullptr;
}

// OPTIONS: 204 with Allow; a CORS preflight from an allowed origin also gets what it asks for.
void send_options(HttpSession& s, const HttpRequest& req) {
  const HttpServer::State& st = s.server();
  std::shared_ptr<HttpResponse> res = s.make_response(204);
  res->set(http::field::allow, s.allow());
  if (!cors_allow_origin(st.options, s.origin()).empty() &&
      req.find(http::field::access_control_request_method) != req.end()) {
    res->set(http::field::access_control_allow_methods, s.allow());
    auto h = req.find(http::field::access_control_request_headers);
    res->set(http::field::access_control_allow_headers,
             h != req.end() ? std::string(h->value().data(), h->value().size())
                            : std::string("Authorization, Content-Type, X-Request-Id"));
    res->set(http::field::access_control_max_age, "600");
  }
  res->keep_alive(s.keep_alive() && !st.shutting_down);
  res->prepare_payload();
  res->erase(http::field::content_length);  // a 204 carries none (RFC 9110 §8.6)
  s.write_response(res, 204, s.keep_alive());
}

void send_metrics(HttpSession& s) {
  HttpServer::State& st = s.server();
  ServerCounters counters;
  {
    std::lock_guard<std::mutex> lock(st.counters_mu);
    counters = st.counters;
  }
  // Labelled with the name clients send (vLLM labels with the served model name).
  engine::EngineMetrics m = st.engine->metrics();
  m.model_name = st.model_name;
  s.send(200, render_prometheus(m, counters), "text/plain; version=0.0.4; charset=utf-8");
}

// GET /v1/models/{id}: the served model, or a 404 naming the id asked for.
void send_model(HttpSession& s, std::string_view target) {
  const HttpServer::State& st = s.server();
  std::optional<std::string> id = percent_decode(target.substr(kModelPrefix.size()));
  if (!id || *id != st.model_name) {
    ApiError e = invalid_request(
        str_format("The model '%s' does not exist; this server serves '%s'",
                   id ? id->c_str() : std::string(target.substr(kModelPrefix.size())).c_str(),
                   st.model_name.c_str()),
        "model", 404);
    e.code = "model_not_found";
    return s.send_error(e, s.keep_alive());
  }
  s.send(200,
         dump_json(model_json(st.model_name, st.created, st.engine->info().max_context_tokens)),
         "application/json");
}

}  // namespace

std::string cors_allow_origin(const ServerOptions& o, std::string_view origin) {
  if (origin.empty()) return "";
  for (const std::string& a : o.allowed_origins) {
    if (a == "*") return "*";
    if (a == origin) return std::string(origin);
  }
  return "";
}

void route(HttpSession& s, const HttpRequest& req) {
  const HttpServer::State& st = s.server();
  std::string_view target(req.target().data(), req.target().size());
  if (size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
  const bool post = req.method() == http::verb::post;
  if (s.probe() && !(get && (target == "/health" || target == "/metrics"))) {
    ApiError e = invalid_request(
        str_format("every connection (--max-connections %d) has a request in progress; only "
                   "GET /health and /metrics are answered now; retry later",
                   st.options.max_connections),
        "", 503);
    e.type = "server_error";
    e.code = "too_many_connections";
    return s.send_error(e, /*keep_alive=*/false);
  }
  const char* methods = route_methods(target);
  if (!methods) {
    ApiError e = invalid_request("no route for " + std::string(target), "", 404);
    e.code = "not_found";
    return s.send_error(e, s.keep_alive());
  }
  s.set_allow(methods);
  if (req.method() == http::verb::options) return send_options(s, req);

  if (target == "/health") {
    if (!get) return s.send_method_not_allowed();
    const engine::EngineInfo info = st.engine->info();
    if (!info.fault.empty())
      return s.send(503, dump_json({{"status", "unhealthy"}, {"error", info.fault}}),
                    "application/json");
    return s.send(info.ready ? 200 : 503,
                  info.ready ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}",
                  "application/json");
  }
  if (target == "/metrics") {
    if (!get) return s.send_method_not_allowed();
    return send_metrics(s);
  }
  if (!st.options.api_key.empty()) {
    auto it = req.find(http::field::authorization);
    std::string_view got = it == req.end()
                               ? std::string_view()
                               : std::string_view(it->value().data(), it->value().size());
    if (!equal_constant_time(got, "Bearer " + st.options.api_key)) {
      ApiError e =
          invalid_request("missing or incorrect API key in the Authorization header", "", 401);
      e.code = "invalid_api_key";
      return s.send_error(e, s.keep_alive());
    }
  }
  if (target == "/v1/models") {
    if (!get) return s.send_method_not_allowed();
    return s.send(
        200,
        dump_json(models_body(st.model_name, st.created, st.engine->info().max_context_tokens)),
        "application/json");
  }
  if (target.substr(0, kModelPrefix.size()) == kModelPrefix) {
    if (!get) return s.send_method_not_allowed();
    return send_model(s, target);
  }
  if (!post) return s.send_method_not_allowed();
  if (target == "/v1/generate") return start_generate_relay(s, req.body());
  if (target == "/v1/abort") return abort_generate(s, req.body());
  start_openai_relay(s,
                     target == "/v1/chat/completions" ? Endpoint::kChatCompletions
                     : target == "/v1/responses"      ? Endpoint::kResponses
                                                      : Endpoint::kCompletions,
                     req.body());
}

}  // namespace oscar::server
