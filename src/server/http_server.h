// HttpServer: the OpenAI-compatible HTTP front end (Boost.Beast over Asio). It owns a pool of I/O
// threads, parses and validates requests (openai_request.h), renders prompts through the engine's
// chat template and tokenizer, submits GenerationRequests to an engine::Engine and relays their
// events, as one JSON body or as Server-Sent Events flushed event by event.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health (503
// until the engine is ready), GET /metrics (Prometheus text). With an API key, /v1/* needs
// "Authorization: Bearer <key>" (401 otherwise); /health and /metrics stay open.
//
// Robustness: headers over kMaxHeaderBytes get 431, bodies over kMaxBodyBytes 413, both then close
// the connection; a request must arrive within read_timeout; keep-alive between requests; a client
// that disconnects while its request runs (streaming or not) has its engine request cancelled.
// Not here: TLS, HTTP/2, CORS, rate limiting, n > 1, logprobs, tool-call parsing of the output.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/engine_api.h"
#include "server/prometheus.h"

namespace oscar::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;            // 0: the OS picks a free port; see HttpServer::port()
  int n_threads = 2;               // I/O threads (parsing and JSON; the engine has its own)
  std::string api_key;             // non-empty: /v1/* requires "Authorization: Bearer <api_key>"
  std::string served_model_name;   // what clients put in "model"; "" = engine info().model_name
  // Time for a whole request (headers and body) to arrive, and for an idle keep-alive connection
  // to send its next one.
  std::chrono::milliseconds read_timeout{30'000};
  // Time for one write to the client to complete (a stalled reader is disconnected).
  std::chrono::milliseconds write_timeout{30'000};
  // stop() lets running requests finish for this long, then cancels them.
  std::chrono::milliseconds shutdown_grace{5'000};
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

  struct State;  // shared with the connections; defined in http_server.cpp

 private:
  std::shared_ptr<State> state_;
};

// Starts a server and blocks until SIGINT or SIGTERM, then stops it gracefully. For `oscar serve`.
Status serve_until_signal(engine::Engine* engine, const ServerOptions& options);

}  // namespace oscar::server
