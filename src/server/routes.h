// route(): what the server answers to one request. It picks the route (404 for none, 405 with
// Allow for a wrong method, OPTIONS 204 and CORS preflights), answers GET /health, /metrics,
// /v1/models and /v1/models/{id} itself, checks the API key of /v1/*, and hands the generation
// routes to their relays (openai_relay.h, generate_relay.h). A probe session (beyond
// max_connections) is answered /health and /metrics only.
// Not here: reading and writing (http_session.h), request parsing (openai_request.h).
#pragma once

#include <string>
#include <string_view>

#include "server/http_server.h"
#include "server/http_session.h"

namespace oscar::server {

// Answers `req` on `s` (on its strand), now or once its relay is done.
void route(HttpSession& s, const HttpRequest& req);

// CORS: the Access-Control-Allow-Origin value for `origin`, or "" when it is not allowed
// (ServerOptions::allowed_origins).
std::string cors_allow_origin(const ServerOptions& o, std::string_view origin);

}  // namespace oscar::server
