// HttpServer: the OpenAI-compatible HTTP front end (Boost.Beast over Asio). It owns a pool of I/O
// threads, parses and validates requests (openai_request.h), renders prompts through the engine's
// chat template and tokenizer, submits GenerationRequests to an engine::Engine and relays their
// events, as one JSON body or as Server-Sent Events flushed event by event.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (text or message
// input, text output; streamed as response.* events without [DONE]), GET /v1/models, GET
// /v1/models/{id}, GET /health (503 until the engine is ready), GET /metrics (Prometheus text).
// Token level (generate_endpoint.h): POST /v1/generate (token ids in, ids out, streamed or
// whole) and POST /v1/abort (cancels a /v1/generate request by its request_id).
// With an API key, /v1/* needs "Authorization: Bearer <key>" (401 otherwise); /health, /metrics
// and CORS preflights stay open. Chat prompts go through Engine::tokenize_chat (special-token
// text in messages stays text).
//
// HTTP: every GET route also answers HEAD (the GET headers, no body); OPTIONS answers 204 with
// Allow, and a CORS preflight from an allowed origin (ServerOptions::allowed_origins) gets the
// Access-Control-* headers; a wrong method gets 405 with Allow. Every response carries Date and
// X-Request-Id (the client's own X-Request-Id when it sent a sane one, else a fresh id).
//
// Robustness: headers over kMaxHeaderBytes get 431, bodies over kMaxBodyBytes 413, both then close
// the connection; a request's headers must arrive within header_timeout (also the keep-alive idle
// time) and its body within read_timeout; a client that disconnects while its request runs
// (streaming or not) has its engine request cancelled; at max_connections (by default from the
// descriptor limit) a new connection closes the one that has waited longest for a request, so
// idle or slow clients cannot lock others (or /health) out; when every connection has a request
// in progress, a few more (kProbeConnections) may still ask GET /health or /metrics once, and
// anything else gets 503 and is closed; an engine whose waiting queue is
// full (ResourceExhausted from submit) gives a 429 with Retry-After; out of file descriptors, a
// waiting connection is taken with a spare descriptor kept for this, answered 503 and closed (an
// answer, not a hang), and when accept() keeps failing the acceptor backs off (10 ms doubling to
// 1 s) instead of spinning.
// Chat output: when the request has tools (and tool_choice is not "none"), <tool_call> blocks
// become tool_calls with finish_reason "tool_calls"; with reasoning_parser "qwen3", <think>
// becomes reasoning_content (output_parser.h), streamed as deltas too.
// logprobs: each token's entry rides with the chunk of its choice that follows it
// (openai_response.h has the shapes). n > 1: n engine requests ("<id>-<i>"), the later ones sharing
// the first's prompt pages (engine_api.h: share_prompt_with); the body has n choices, a stream
// carries each choice's chunks with its index and ends after the last choice; usage counts the
// prompt once. tool_choice "required" / named: the engine constrains the output to one call
// (engine/tool_constraint.h), parsed as any other; response_format json_object / json_schema
// (text.format on /v1/responses): the engine constrains the output to the schema.
// Not here: TLS, HTTP/2, rate limiting, parallel constrained calls, guided decoding (regex,
// grammar, choice).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine_api.h"
#include "server/prometheus.h"

namespace oscar::server {

inline constexpr int kMaxConnectionsAuto = -1;

// The connections a process may keep open with `fd_limit` descriptors (RLIMIT_NOFILE's soft
// limit): all but a headroom of max(32, fd_limit / 8) for the listener, the model's files, the
// I/O threads' epoll and eventfds, ZMQ sockets and the 503s sent beyond the cap; at least 1, at
// most 16384 (each connection holds buffers). 128 -> 96, 1024 -> 896.
int max_connections_for_fd_limit(uint64_t fd_limit);

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;            // 0: the OS picks a free port; see HttpServer::port()
  int n_threads = 2;               // I/O threads (parsing and JSON; the engine has its own)
  std::string api_key;             // non-empty: /v1/* requires "Authorization: Bearer <api_key>"
  std::string served_model_name;   // what clients put in "model"; "" = engine info().model_name
  // Time for a request's line and headers to arrive: from the connection's opening, and on
  // keep-alive from the previous response (uvicorn, behind vLLM, closes idle keep-alive
  // connections after 5 s). Short, so that idle and slow clients let go of their connections.
  std::chrono::milliseconds header_timeout{10'000};
  // The same for a probe connection (one taken beyond max_connections for /health or /metrics).
  std::chrono::milliseconds probe_header_timeout{2'000};
  // Time for the body to arrive once the headers are in.
  std::chrono::milliseconds read_timeout{30'000};
  // Time for one write to the client to complete (a stalled reader is disconnected).
  std::chrono::milliseconds write_timeout{30'000};
  // stop() lets running requests finish for this long, then cancels them: an open stream gets an
  // error event and [DONE], a waiting non-streaming request a 503.
  std::chrono::milliseconds shutdown_grace{5'000};
  // Open connections at most. At the cap a new connection closes the one that has waited longest
  // for (or is still reading) a request; when every connection has a request in progress, the new
  // one may ask GET /health or /metrics once (8 such at a time), anything else is answered 503
  // (Retry-After) and closed. 0: no cap. kMaxConnectionsAuto: from the
  // process's descriptor limit (max_connections_for_fd_limit of RLIMIT_NOFILE's soft limit).
  int max_connections = kMaxConnectionsAuto;
  // Origins allowed to call from a browser (CORS): exact origins such as
  // "http://localhost:3000", or "*" for any. Empty: no CORS headers (browsers refuse).
  std::vector<std::string> allowed_origins;
  // "qwen3": a leading <think>…</think> of a chat answer becomes reasoning_content. "": off.
  std::string reasoning_parser;
  // max_tokens of a request that leaves it out: min(default_max_tokens, context - prompt).
  // 0: all the room the context leaves (context - prompt, as vLLM).
  int default_max_tokens = 0;
};

class HttpServer {
 public:
  // engine must outlive the server and must follow the threading contract of engine_api.h.
  HttpServer(engine::Engine* engine, ServerOptions options);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. Fails (does not abort) on a bad host or a busy port.
  Status start();
  // The bound port (the real one when options.port was 0). Valid after start().
  uint16_t port() const;
  // Graceful: stops accepting, closes idle connections, waits up to shutdown_grace for running
  // requests, cancels the rest, joins the threads. Idempotent; safe from any non-I/O thread.
  void stop();

  ServerCounters counters() const;
  // options.max_connections as resolved by start() (kMaxConnectionsAuto replaced).
  int max_connections() const;

  struct State;  // shared with the connections; defined in server_state.h

 private:
  std::shared_ptr<State> state_;
};

// Starts a server and blocks until SIGINT or SIGTERM, then stops it gracefully. For `oscar serve`.
Status serve_until_signal(engine::Engine* engine, const ServerOptions& options);

}  // namespace oscar::server
