// HttpSession: reading, writing, keep-alive, the disconnect watch and SSE framing of one
// connection (http_session.h).
#include "server/http_session.h"

#include <algorithm>
#include <ctime>
#include <string_view>

#include "core/log.h"
#include "server/openai_response.h"
#include "server/routes.h"

namespace oscar::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// A client's X-Request-Id is echoed when it is 1..128 visible ASCII characters; else a fresh id.
std::string request_id_for(std::string_view client_id) {
  bool sane = !client_id.empty() && client_id.size() <= 128;
  for (char c : client_id) sane = sane && c > 0x20 && c < 0x7f;
  if (sane) return std::string(client_id);
  std::string id = make_response_id(Endpoint::kCompletions);  // "cmpl-<24 hex>"
  return "req-" + id.substr(5);
}

}  // namespace

std::string http_date() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  static const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                  "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  return str_format("%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday], tm.tm_mday,
                    kMonths[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

HttpSession::HttpSession(tcp::socket socket, std::shared_ptr<HttpServer::State> st, bool probe)
    : st_(std::move(st)), stream_(std::move(socket)), probe_(probe) {}

HttpSession::~HttpSession() {
  std::lock_guard<std::mutex> lock(st_->sessions_mu);
  st_->sessions.erase(this);
  if (busy_) --st_->busy_sessions;
  if (evicting_) --st_->evicting_sessions;
  if (probe_) --st_->probe_sessions;
  st_->sessions_cv.notify_all();
}

void HttpSession::start() {
  {
    std::lock_guard<std::mutex> lock(st_->sessions_mu);
    st_->sessions[this] = weak_from_this();
  }
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
}

// ---- the listener's calls ----

void HttpSession::on_shutdown() {
  if (!busy_) close();
}

void HttpSession::force_close() {
  if (generating_) {
    relay_->cancel();
    generating_ = false;
    self_hold_.reset();  // the pending write keeps the session alive until it is done
    if (!client_gone_ && !closed_) {
      ApiError e =
          invalid_request("the server is shutting down; the request was cancelled", "", 503);
      e.type = "server_error";
      e.code = "server_shutting_down";
      return relay_->fail(e, /*keep_alive=*/false);
    }
  }
  close();
  self_hold_.reset();
}

bool HttpSession::evictable(std::chrono::steady_clock::time_point* since) const {
  *since = waiting_since_;
  return !busy_ && !evicting_ && !probe_;
}

void HttpSession::mark_evicting() {
  evicting_ = true;
  ++st_->evicting_sessions;
}

void HttpSession::evict() {
  if (busy_) {
    std::lock_guard<std::mutex> lock(st_->sessions_mu);
    evicting_ = false;
    --st_->evicting_sessions;
    return;
  }
  close();
}

// ---- reading ----

void HttpSession::do_read() {
  if (st_->shutting_down) return close();
  {
    std::lock_guard<std::mutex> lock(st_->sessions_mu);
    waiting_since_ = std::chrono::steady_clock::now();
  }
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(kMaxHeaderBytes));
  parser_->body_limit(kMaxBodyBytes);
  stream_.expires_after(probe_ ? std::min(st_->options.header_timeout,
                                          st_->options.probe_header_timeout)
                               : st_->options.header_timeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

// Headers are in (and within limits, including a Content-Length within kMaxBodyBytes). Clients
// such as curl send "Expect: 100-continue" before a large body and wait for our go-ahead.
void HttpSession::on_header(beast::error_code ec) {
  if (ec || parser_->is_done()) return on_read(ec);
  stream_.expires_after(st_->options.read_timeout);  // the body's time
  auto expect = parser_->get().find(http::field::expect);
  if (expect != parser_->get().end() && beast::iequals(expect->value(), "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    return net::async_write(stream_, net::buffer(kContinue.data(), kContinue.size()),
                            [self = shared_from_this()](beast::error_code wec, size_t) {
                              if (wec) return self->close();
                              self->read_body();
                            });
  }
  read_body();
}

void HttpSession::read_body() {
  http::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void HttpSession::on_read(beast::error_code ec) {
  head_ = false;
  origin_.clear();
  req_id_ = request_id_for("");
  if (ec == http::error::end_of_stream || ec == net::error::operation_aborted ||
      ec == beast::error::timeout || ec == net::error::connection_reset || ec == net::error::eof) {
    return close();
  }
  set_busy(true);
  if (ec == http::error::header_limit) {
    ApiError e =
        invalid_request(str_format("request headers exceed %zu bytes", kMaxHeaderBytes), "", 431);
    e.code = "request_header_fields_too_large";
    return send_error(e, /*keep_alive=*/false);
  }
  if (ec == http::error::body_limit) {
    ApiError e =
        invalid_request(str_format("request body exceeds %zu bytes", kMaxBodyBytes), "", 413);
    e.code = "request_too_large";
    return send_error(e, /*keep_alive=*/false);
  }
  if (ec) {
    return send_error(invalid_request("malformed HTTP request: " + ec.message()),
                      /*keep_alive=*/false);
  }
  HttpRequest req = parser_->release();
  version_ = req.version();
  keep_alive_ = req.keep_alive() && !probe_;
  head_ = req.method() == http::verb::head;
  if (auto o = req.find(http::field::origin); o != req.end()) {
    origin_ = std::string(o->value().data(), o->value().size());
  }
  if (auto id = req.find("X-Request-Id"); id != req.end()) {
    req_id_ = request_id_for(std::string_view(id->value().data(), id->value().size()));
  }
  route(*this, req);
}

// ---- whole responses ----

std::shared_ptr<HttpResponse> HttpSession::make_response(int status) const {
  auto res = std::make_shared<HttpResponse>(static_cast<http::status>(status), version_);
  res->set(http::field::server, "oscar");
  res->set(http::field::date, http_date());
  res->set("X-Request-Id", req_id_);
  if (std::string acao = cors_allow_origin(st_->options, origin_); !acao.empty()) {
    res->set(http::field::access_control_allow_origin, acao);
    res->set(http::field::access_control_expose_headers, "X-Request-Id");
    res->set(http::field::vary, "Origin");
  }
  return res;
}

void HttpSession::send(int status, std::string body, const char* content_type) {
  std::shared_ptr<HttpResponse> res = make_response(status);
  res->set(http::field::content_type, content_type);
  res->keep_alive(keep_alive_ && !st_->shutting_down);
  res->body() = std::move(body);
  res->prepare_payload();
  write_response(res, status, keep_alive_);
}

void HttpSession::send_error(const ApiError& e, bool keep_alive) {
  std::shared_ptr<HttpResponse> res = make_response(e.http_status);
  res->set(http::field::content_type, "application/json");
  if (e.http_status == 401) res->set(http::field::www_authenticate, "Bearer");
  if (e.http_status == 405) res->set(http::field::allow, allow_);
  if (e.http_status == 429 || e.code == "too_many_connections") {
    res->set(http::field::retry_after, "1");
  }
  if (e.http_status >= 500 && e.code != "too_many_connections") {  // do_accept logs those
    OSCAR_LOG_WARN("server: status=%d request_id=%s message=%s", e.http_status, req_id_.c_str(),
                   e.message.c_str());
  }
  res->keep_alive(keep_alive && !st_->shutting_down);
  res->body() = e.to_json();
  res->prepare_payload();
  write_response(res, e.http_status, keep_alive);
}

void HttpSession::send_method_not_allowed() {
  ApiError e =
      invalid_request(str_format("method not allowed; this route answers %s", allow_), "", 405);
  e.code = "method_not_allowed";
  send_error(e, keep_alive_);
}

void HttpSession::write_response(std::shared_ptr<HttpResponse> res, int status, bool keep_alive) {
  st_->count_response(status);
  if (head_) {  // HEAD: the headers of the answer (its Content-Length too), never a body
    res->content_length(res->body().size());
    res->body().clear();
  }
  writing_ = true;
  stream_.expires_after(st_->options.write_timeout);
  http::async_write(stream_, *res,
                    [self = shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
                      self->writing_ = false;
                      if (ec) return self->close();
                      self->finish_request(keep_alive);
                    });
}

// ---- generation ----

void HttpSession::begin_relay(std::unique_ptr<Relay> relay) {
  ++response_gen_;
  relay_ = std::move(relay);
}

std::function<void(const engine::GenerationEvent&)> HttpSession::event_callback(int choice) {
  std::weak_ptr<HttpSession> weak = weak_from_this();
  std::shared_ptr<EventGate> gate = st_->gate;
  auto executor = stream_.get_executor();
  const uint64_t gen = response_gen_;
  return [weak, gate, executor, gen, choice](const engine::GenerationEvent& ev) {
    std::lock_guard<std::mutex> lock(gate->mu);
    if (!gate->open) return;
    if (std::shared_ptr<HttpSession> s = weak.lock()) {
      net::post(executor, [s, ev, gen, choice] { s->deliver(gen, choice, ev); });
    }
  };
}

// A late event of an earlier response on this connection (a choice cancelled after another
// failed), or one after the response has ended: nothing is left to send for it.
void HttpSession::deliver(uint64_t gen, int choice, const engine::GenerationEvent& ev) {
  if (gen != response_gen_ || !generating_) return;
  relay_->on_event(choice, ev);
}

void HttpSession::generation_started(std::string request_id) {
  request_id_ = std::move(request_id);
  generating_ = true;
  self_hold_ = shared_from_this();
  watch_for_disconnect();
}

void HttpSession::generation_ended() {
  generating_ = false;
  self_hold_.reset();
}

// A readable socket while we are answering means the client closed it (or pipelined the next
// request, which we then leave for after the response).
void HttpSession::watch_for_disconnect() {
  const uint64_t gen = ++watch_gen_;
  stream_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
        if (gen != self->watch_gen_ || ec == net::error::operation_aborted) return;
        if (!self->generating_ && !self->writing_) return;
        if (!ec) {
          // Non-blocking peek: the reactor may report readiness spuriously, and a blocking
          // receive would then stall this strand.
          char c;
          beast::error_code peek_ec;
          self->stream_.socket().non_blocking(true, peek_ec);
          size_t n = self->stream_.socket().receive(net::buffer(&c, 1), tcp::socket::message_peek,
                                                    peek_ec);
          if (peek_ec == net::error::would_block || peek_ec == net::error::try_again) {
            return self->watch_for_disconnect();  // nothing there after all: keep watching
          }
          if (n > 0 && !peek_ec) return;  // pipelined data: not a disconnect
        }
        self->on_client_gone();
      });
}

void HttpSession::stop_watching() {
  ++watch_gen_;
  beast::error_code ec;
  stream_.socket().cancel(ec);
}

void HttpSession::on_client_gone() {
  if (client_gone_) return;
  client_gone_ = true;
  if (generating_) {
    st_->count_disconnect();
    relay_->cancel();
    OSCAR_LOG_INFO("server: client disconnected, cancelled request_id=%s", request_id_.c_str());
  }
  close();
}

// ---- Server-Sent Events ----

void HttpSession::open_event_stream() {
  chunked_ = version_ >= 11;
  if (!chunked_) keep_alive_ = false;
  std::string head =
      "HTTP/1.1 200 OK\r\nServer: oscar\r\nContent-Type: text/event-stream\r\n"
      "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
  head += "Date: " + http_date() + "\r\nX-Request-Id: " + req_id_ + "\r\n";
  if (std::string acao = cors_allow_origin(st_->options, origin_); !acao.empty()) {
    head += "Access-Control-Allow-Origin: " + acao +
            "\r\nAccess-Control-Expose-Headers: X-Request-Id\r\nVary: Origin\r\n";
  }
  head += chunked_ ? "Transfer-Encoding: chunked\r\n" : "";
  head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  pending_ += head;
  st_->count_response(200);
}

void HttpSession::queue_event(const std::string& data) {
  if (chunked_) {
    pending_ += str_format("%zx\r\n", data.size());
    pending_ += data;
    pending_ += "\r\n";
  } else {
    pending_ += data;
  }
}

void HttpSession::end_stream() {
  if (chunked_) pending_ += "0\r\n\r\n";
  end_after_flush_ = true;
  flush();
}

void HttpSession::flush() {
  if (writing_ || pending_.empty() || client_gone_) return;
  writing_ = true;
  inflight_.swap(pending_);
  pending_.clear();
  stream_.expires_after(st_->options.write_timeout);
  net::async_write(
      stream_, net::buffer(inflight_),
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_stream_write(ec); });
}

void HttpSession::on_stream_write(beast::error_code ec) {
  writing_ = false;
  inflight_.clear();
  if (ec) return on_client_gone();
  if (!pending_.empty()) return flush();
  if (end_after_flush_) {
    end_after_flush_ = false;
    stop_watching();
    finish_request(keep_alive_);
  }
}

// ---- the end of a request ----

void HttpSession::finish_request(bool keep_alive) {
  set_busy(false);
  if (keep_alive && !st_->shutting_down && !client_gone_) return do_read();
  lingering_close();
}

// Half-close, then drain what the client still sends for a moment, so that it reads our answer
// (e.g. a 413) instead of a connection reset caused by unread data.
void HttpSession::lingering_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return close();
  stream_.expires_after(st_->shutting_down ? std::chrono::milliseconds(200)
                                           : std::chrono::milliseconds(1000));
  drain_buf_.resize(16 * 1024);
  drain();
}

void HttpSession::drain() {
  stream_.async_read_some(net::buffer(drain_buf_),
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) return self->close();
                            self->drain();
                          });
}

void HttpSession::close() {
  if (closed_) return;
  closed_ = true;
  set_busy(false);
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
}

void HttpSession::set_busy(bool busy) {
  if (busy == busy_) return;
  std::lock_guard<std::mutex> lock(st_->sessions_mu);
  busy_ = busy;
  st_->busy_sessions += busy ? 1 : -1;
  st_->sessions_cv.notify_all();
}

}  // namespace oscar::server
