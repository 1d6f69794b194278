// The OpenAI generation routes on a session: POST /v1/chat/completions, /v1/completions and
// /v1/responses. Here the parsed request (openai_request.h) becomes a prompt (the chat template or
// the tokenizer) and n engine requests, whose events are relayed as one JSON body or as
// Server-Sent Events (openai_response.h has the shapes): chat deltas through the output parser
// (tool calls, reasoning), log-probabilities with the chunk that follows them, usage counting the
// prompt once, the response.* events of /v1/responses.
#pragma once

#include <string>

#include "server/http_session.h"
#include "server/openai_request.h"

namespace oscar::server {

// Validates `body` for `endpoint`, submits its choices, and answers on `s` as their events come.
void start_openai_relay(HttpSession& s, Endpoint endpoint, const std::string& body);

}  // namespace oscar::server
