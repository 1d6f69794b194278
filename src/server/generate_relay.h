// The token-level routes on a session: POST /v1/generate (token ids in, ids out, streamed or
// whole) and POST /v1/abort. Parsing and bodies are generate_endpoint.h's; here the request is
// submitted, registered for /v1/abort, and its events relayed.
#pragma once

#include <string>

#include "server/http_session.h"

namespace oscar::server {

// POST /v1/generate: validates `body`, submits it, and answers on `s` when its events come.
void start_generate_relay(HttpSession& s, const std::string& body);
// POST /v1/abort: cancels a live /v1/generate request (its own stream or answer then ends with
// finish_reason "cancelled"); an id that is not live is a 404.
void abort_generate(HttpSession& s, const std::string& body);

}  // namespace oscar::server
