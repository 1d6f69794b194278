// HttpSession: one client connection of HttpServer, and its transport. It reads a request (header
// and body limits, 100-continue, header and body timeouts), hands it to route() (routes.h), writes
// what comes back, then reads the next request (keep-alive) or closes with a lingering close. What
// comes back is a whole response (send, send_error) or, while a Relay is generating, a
// Server-Sent Events stream (open_event_stream, queue_event, flush, end_stream). While a request
// runs it watches the socket for the client going away, and then cancels the relay's engine
// requests. It also takes its part in the connection cap (evictable, probe sessions) and in
// HttpServer::stop() (on_shutdown, force_close).
// Not here: which route answers what (routes.cpp), how engine events become OpenAI or token-level
// bodies (openai_relay.cpp, generate_relay.cpp), the accept loop (http_server.cpp).
//
// Threading: every method runs on the session's strand, except evictable and mark_evicting
// (do_accept, with State::sessions_mu held). Lifetimes: http_server.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "engine/engine_api.h"
#include "server/openai_request.h"
#include "server/server_state.h"

namespace oscar::server {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpResponse = boost::beast::http::response<boost::beast::http::string_body>;

// RFC 9110 IMF-fixdate: "Tue, 01 Dec 2026 09:35:27 GMT".
std::string http_date();

// A generation in progress on a session: turns the engine's events into the response. Owned by
// the session (begin_relay), called on its strand.
class Relay {
 public:
  virtual ~Relay() = default;
  // One event of the engine request of choice `choice` (0 when there is one).
  virtual void on_event(int choice, const engine::GenerationEvent& ev) = 0;
  // Cancels the engine requests still live; their terminal events still come.
  virtual void cancel() = 0;
  // Ends the response with `e`: an error event in an open stream, else an error body.
  virtual void fail(const ApiError& e, bool keep_alive) = 0;
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  // probe: a connection beyond max_connections while every other one has a request in progress
  // (do_accept): it answers one GET /health or /metrics, anything else 503, then closes.
  HttpSession(boost::asio::ip::tcp::socket socket, std::shared_ptr<HttpServer::State> st,
              bool probe = false);
  ~HttpSession();

  void start();

  // ---- for the listener: the connection cap and stop() ----

  boost::asio::any_io_executor executor() { return stream_.get_executor(); }
  // stop(), phase 1: close idle connections; busy ones close after their response.
  void on_shutdown();
  // stop(), phase 2: cancel whatever still runs. An open stream ends with an error event (and
  // [DONE]), a request waiting for its whole answer gets a 503; then the connection closes.
  void force_close();
  // stop(), after the I/O threads have been joined: break the self-reference.
  void release_after_join() { self_hold_.reset(); }
  // At max_connections (do_accept), with sessions_mu held: whether this connection waits for, or
  // is still reading, a request (no request in progress) and is not yet asked to close; *since:
  // when it started waiting.
  bool evictable(std::chrono::steady_clock::time_point* since) const;
  // With sessions_mu held: chosen to close for a new connection (counted until it is gone).
  void mark_evicting();
  // On the strand, after mark_evicting: closes the connection unless a request arrived in between
  // (then it stays, and counts as open again).
  void evict();

  // ---- for route() and the relays: the request being answered ----

  HttpServer::State& server() const { return *st_; }
  bool keep_alive() const { return keep_alive_; }
  bool probe() const { return probe_; }
  const std::string& origin() const { return origin_; }  // its Origin header, "" when none
  // The methods of the route, for Allow (OPTIONS, 405).
  void set_allow(const char* methods) { allow_ = methods; }
  const char* allow() const { return allow_; }

  // A response carrying the headers every response carries (Server, Date, X-Request-Id, CORS).
  std::shared_ptr<HttpResponse> make_response(int status) const;
  // Writes it (to a HEAD request its headers only), then reads the next request or closes.
  void write_response(std::shared_ptr<HttpResponse> res, int status, bool keep_alive);
  void send(int status, std::string body, const char* content_type);
  void send_error(const ApiError& e, bool keep_alive);
  void send_method_not_allowed();

  // ---- for the relays: generation ----

  // Makes `relay` the response in progress; events of earlier responses are dropped from now on.
  void begin_relay(std::unique_ptr<Relay> relay);
  // The engine callback for choice `choice` of the response begun last: it posts each event onto
  // the strand, to the relay, while the server's EventGate is open.
  std::function<void(const engine::GenerationEvent&)> event_callback(int choice);
  // The engine requests are in: the session keeps itself alive and watches for the client going
  // away until generation_ended(). request_id names the request in the log.
  void generation_started(std::string request_id);
  void generation_ended();
  bool client_gone() const { return client_gone_; }
  // Before a whole response: the disconnect watch ends.
  void stop_watching();

  // ---- for the relays: Server-Sent Events ----

  // The 200 head of an event stream (chunked on HTTP/1.1; HTTP/1.0 closes after it).
  void open_event_stream();
  // One event, framed as a chunk when chunked; written by flush().
  void queue_event(const std::string& data);
  void flush();
  // The stream's last chunk; once written, the next request is read (or the connection closed).
  void end_stream();

 private:
  void do_read();
  void on_header(boost::beast::error_code ec);
  void read_body();
  void on_read(boost::beast::error_code ec);
  void deliver(uint64_t gen, int choice, const engine::GenerationEvent& ev);
  void watch_for_disconnect();
  void on_client_gone();
  void on_stream_write(boost::beast::error_code ec);
  void finish_request(bool keep_alive);
  void lingering_close();
  void drain();
  void close();
  void set_busy(bool busy);

  std::shared_ptr<HttpServer::State> st_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::vector<char> drain_buf_;

  // The request being answered.
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;                         // a HEAD request: headers only
  std::string origin_;                        // its Origin header ("" when none)
  std::string req_id_;                        // X-Request-Id of the answer
  const char* allow_ = "GET, HEAD, OPTIONS";  // methods of the route, for Allow
  bool busy_ = false;  // from a request read to its response written (guarded by sessions_mu)
  const bool probe_;   // beyond max_connections: /health and /metrics only, then close
  // Guarded by sessions_mu: when the connection last started waiting for a request, and whether
  // do_accept chose it to close for a new connection.
  std::chrono::steady_clock::time_point waiting_since_ = std::chrono::steady_clock::now();
  bool evicting_ = false;
  bool closed_ = false;
  bool client_gone_ = false;

  // Generation (strand only).
  std::unique_ptr<Relay> relay_;            // the response begun last
  std::shared_ptr<HttpSession> self_hold_;  // set while its engine requests are live
  std::string request_id_;                  // theirs, for the log
  bool generating_ = false;    // engine requests submitted, terminal event not yet seen
  uint64_t response_gen_ = 0;  // counts the responses begun; events carry theirs
  uint64_t watch_gen_ = 0;

  // Streaming output: bytes queued, bytes being written.
  bool chunked_ = true;
  std::string pending_;
  std::string inflight_;
  bool writing_ = false;
  bool end_after_flush_ = false;
};

}  // namespace oscar::server
