// HttpServer: the listener and the server's life. It binds, runs the I/O threads, accepts
// connections (with the connection cap: an idle connection evicted for a new one, probe sessions
// for /health and /metrics when every connection is busy, a 503 beyond those or when out of
// descriptors, a backoff when accept() keeps failing) and stops gracefully. Each connection is an
// HttpSession (http_session.h) on its own strand; route() (routes.h) and the relays
// (openai_relay.h, generate_relay.h) answer its requests.
//
// Lifetimes: while its engine requests are live a session keeps itself alive (self_hold_),
// released on the terminal event or by stop(). The engine callback reaches the session only
// through the server-wide EventGate, which stop() closes after the I/O threads have been joined,
// so no event can touch a session once the io_context is gone.
#include "server/http_server.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>

#include "core/check.h"
#include "core/log.h"
#include "server/http_session.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/server_state.h"

namespace oscar::server {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

namespace {

// Beyond max_connections, when every connection has a request in progress: this many more may
// connect to ask GET /health or /metrics (one request each, within options.probe_header_timeout).
constexpr int kProbeConnections = 8;

// A connection beyond max_connections: a 503 (Retry-After), then a lingering close so the
// client reads it. Owns only its socket; its handlers keep it alive.
class Rejecter : public std::enable_shared_from_this<Rejecter> {
 public:
  Rejecter(tcp::socket socket, std::string response)
      : stream_(std::move(socket)), response_(std::move(response)) {}
  void run() {
    stream_.expires_after(std::chrono::seconds(2));
    net::async_write(stream_, net::buffer(response_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->close();
                       self->stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
                       self->drain();
                     });
  }

 private:
  void drain() {
    stream_.async_read_some(net::buffer(buf_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain();
                            });
  }
  void close() {
    beast::error_code ec;
    stream_.socket().close(ec);
  }
  beast::tcp_stream stream_;
  std::string response_;
  char buf_[4096];
};

void reject_connection(const std::shared_ptr<HttpServer::State>& st, tcp::socket socket,
                       size_t open) {
  const uint64_t n = st->count_rejected_connection();
  if ((n & (n - 1)) == 0) {  // 1st, 2nd, 4th, ...: the log stays short under a flood
    OSCAR_LOG_WARN("server: connection refused, open=%zu max_connections=%d rejected_total=%llu",
                   open, st->options.max_connections, static_cast<unsigned long long>(n));
  }
  ApiError e = invalid_request(
      str_format("the server has %zu open connections, its limit (--max-connections %d); retry "
                 "later",
                 open, st->options.max_connections),
      "", 503);
  e.type = "server_error";
  e.code = "too_many_connections";
  const std::string body = e.to_json();
  std::string res = "HTTP/1.1 503 Service Unavailable\r\nServer: oscar\r\nDate: " + http_date() +
                    "\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
                    "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::make_shared<Rejecter>(std::move(socket), std::move(res))->run();
}

// Out of descriptors (EMFILE/ENFILE), with a connection waiting: spends the spare descriptor to
// accept it, answers 503 (Retry-After) and closes it, then takes the spare back. False when
// there was no spare, or no connection could be taken with it.
bool take_one_with_spare_fd(HttpServer::State& st) {
  if (st.spare_fd < 0) return false;
  ::close(st.spare_fd);
  st.spare_fd = -1;
  beast::error_code ec;
  st.acceptor->non_blocking(true, ec);  // the connection that failed is queued: do not wait
  tcp::socket socket = ec ? tcp::socket(st.ioc) : st.acceptor->accept(ec);
  beast::error_code ignored;
  st.acceptor->non_blocking(false, ignored);
  const bool took = !ec && socket.is_open();
  if (took) {
    st.count_rejected_connection();
    ApiError e = invalid_request("the server is out of file descriptors; retry later", "", 503);
    e.type = "server_error";
    e.code = "too_many_connections";
    const std::string body = e.to_json();
    const std::string res =
        "HTTP/1.1 503 Service Unavailable\r\nServer: oscar\r\nContent-Type: application/json\r\n"
        "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(socket, net::buffer(res), ignored);  // a fresh socket's send buffer is empty
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }
  st.spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return took;
}

void do_accept(std::shared_ptr<HttpServer::State> st) {
  st->acceptor->async_accept(net::make_strand(st->ioc), [st](beast::error_code ec,
                                                             tcp::socket socket) {
    if (ec == net::error::operation_aborted || !st->acceptor->is_open()) return;
    if (ec) {
      // Out of file descriptors (EMFILE/ENFILE): the client gets a 503 through the spare
      // descriptor, not a hang, and the next connection is awaited at once.
      const bool no_fds = ec == net::error::no_descriptors || ec.value() == ENFILE;
      if (no_fds && !st->shutting_down && take_one_with_spare_fd(*st)) {
        const uint64_t n = st->count_accept_error();
        if ((n & (n - 1)) == 0) {
          OSCAR_LOG_WARN("server: out of file descriptors (%s): answered 503 with the spare "
                         "descriptor (errors_total=%llu)",
                         ec.message().c_str(), static_cast<unsigned long long>(n));
        }
        return do_accept(st);
      }
      // Otherwise (no spare, no connection waiting: Linux's accept() fails with EMFILE before it
      // looks at the queue; out of memory) retrying at once would spin. Back off, doubling from
      // 10 ms to 1 s; a connection that arrives meanwhile is answered at the next try.
      using std::chrono::milliseconds;
      st->accept_backoff = std::clamp(st->accept_backoff * 2, milliseconds(10), milliseconds(1000));
      const uint64_t n = st->count_accept_error();
      if ((n & (n - 1)) == 0) {
        OSCAR_LOG_WARN("server: accept failed: %s; retrying in %lld ms (errors_total=%llu)",
                       ec.message().c_str(), static_cast<long long>(st->accept_backoff.count()),
                       static_cast<unsigned long long>(n));
      }
      st->accept_timer->expires_after(st->accept_backoff);
      st->accept_timer->async_wait([st](beast::error_code wec) {
        if (wec || st->shutting_down || !st->acceptor->is_open()) return;
        do_accept(st);
      });
      return;
    }
    st->accept_backoff = std::chrono::milliseconds(0);
    if (!st->shutting_down) {
      // At the cap, the connection that has waited longest for a request makes room (idle
      // keep-alive connections, clients that send nothing or drip their request); only when
      // every connection has a request in progress is the new one refused.
      size_t open = 0;
      bool full = false;
      std::shared_ptr<HttpSession> victim;
      {
        std::lock_guard<std::mutex> lock(st->sessions_mu);
        open = st->sessions.size() -
               static_cast<size_t>(st->evicting_sessions + st->probe_sessions);
        full = st->options.max_connections > 0 &&
               open >= static_cast<size_t>(st->options.max_connections);
        std::chrono::steady_clock::time_point oldest = std::chrono::steady_clock::time_point::max();
        for (auto& [ptr, weak] : st->sessions) {
          std::chrono::steady_clock::time_point since;
          if (!full || !ptr->evictable(&since) || since >= oldest) continue;
          if (std::shared_ptr<HttpSession> s = weak.lock()) {
            victim = std::move(s);
            oldest = since;
          }
        }
        if (victim) victim->mark_evicting();
      }
      // Every connection busy: a few more may still ask /health and /metrics (a liveness probe
      // must not fail because the server is busy); beyond those, 503 at once.
      bool probe = false;
      if (full && !victim) {
        std::lock_guard<std::mutex> lock(st->sessions_mu);
        probe = st->probe_sessions < kProbeConnections;
        if (probe) ++st->probe_sessions;
      }
      if (full && !victim && !probe) {
        reject_connection(st, std::move(socket), open);
      } else if (probe) {
        std::make_shared<HttpSession>(std::move(socket), st, /*probe=*/true)->start();
      } else {
        if (victim) {
          const uint64_t n = st->count_evicted_connection();
          if ((n & (n - 1)) == 0) {
            OSCAR_LOG_INFO(
                "server: closing an idle connection for a new one, open=%zu "
                "max_connections=%d evicted_total=%llu",
                open, st->options.max_connections, static_cast<unsigned long long>(n));
          }
          net::post(victim->executor(), [victim] { victim->evict(); });
        }
        std::make_shared<HttpSession>(std::move(socket), st)->start();
      }
    }
    do_accept(st);
  });
}

std::vector<std::shared_ptr<HttpSession>> live_sessions(HttpServer::State& st) {
  std::vector<std::shared_ptr<HttpSession>> out;
  std::lock_guard<std::mutex> lock(st.sessions_mu);
  for (auto& [ptr, weak] : st.sessions) {
    if (auto s = weak.lock()) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

HttpServer::HttpServer(engine::Engine* engine, ServerOptions options)
    : state_(std::make_shared<State>()) {
  OSCAR_CHECK(engine != nullptr, "HttpServer needs an engine");
  state_->engine = engine;
  state_->options = std::move(options);
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  std::lock_guard<std::mutex> lock(state_->stop_mu);
  State& st = *state_;
  if (st.started) return internal_error("HttpServer::start called twice");
  if (st.options.n_threads < 1) {
    return invalid_argument("server: n_threads must be >= 1, got %d", st.options.n_threads);
  }
  st.model_name = st.options.served_model_name.empty() ? st.engine->info().model_name
                                                       : st.options.served_model_name;
  st.created = unix_now();

  if (st.options.max_connections == kMaxConnectionsAuto) {
    rlimit fds{};
    const uint64_t limit = getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur != RLIM_INFINITY
                               ? static_cast<uint64_t>(fds.rlim_cur)
                               : UINT64_MAX;
    st.options.max_connections = max_connections_for_fd_limit(limit);
  }
  if (st.options.max_connections < 0) {
    return invalid_argument("server: max_connections must be >= 0 or kMaxConnectionsAuto, got %d",
                            st.options.max_connections);
  }
  if (st.options.header_timeout.count() <= 0 || st.options.read_timeout.count() <= 0) {
    return invalid_argument("server: header_timeout and read_timeout must be > 0");
  }
  if (!st.options.reasoning_parser.empty() && st.options.reasoning_parser != "qwen3") {
    return invalid_argument("server: unknown reasoning parser '%s' (supported: qwen3)",
                            st.options.reasoning_parser.c_str());
  }
  if (!st.engine->has_chat_template()) {
    OSCAR_LOG_WARN("server: the model has no chat template; /v1/chat/completions answers 500");
  }
  beast::error_code ec;
  net::ip::address addr = net::ip::make_address(st.options.host, ec);
  if (ec) {
    // A host name ("localhost"): the first address it resolves to.
    tcp::resolver resolver(st.ioc);
    auto results = resolver.resolve(st.options.host, "", net::ip::resolver_base::passive, ec);
    if (ec || results.empty()) {
      return invalid_argument("server: bad host '%s': %s", st.options.host.c_str(),
                              ec ? ec.message().c_str() : "no address");
    }
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint endpoint(addr, st.options.port);
  st.acceptor.emplace(st.ioc);
  st.acceptor->open(endpoint.protocol(), ec);
  if (!ec) st.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) st.acceptor->bind(endpoint, ec);
  if (!ec) st.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(StatusCode::kInvalidArgument,
                  str_format("server: cannot listen on %s:%u: %s", st.options.host.c_str(),
                         st.options.port, ec.message().c_str()));
  }
  st.bound_port = st.acceptor->local_endpoint().port();
  st.spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  st.accept_timer.emplace(st.ioc);
  st.work.emplace(st.ioc.get_executor());
  do_accept(state_);
  for (int i = 0; i < st.options.n_threads; ++i) {
    st.threads.emplace_back([s = state_.get()] { s->ioc.run(); });
  }
  st.started = true;
  std::string origins;
  for (const std::string& o : st.options.allowed_origins) {
    origins += (origins.empty() ? "" : ",") + o;
  }
  OSCAR_LOG_INFO(
      "server: listening host=%s port=%u model=%s threads=%d auth=%s "
      "max_connections=%d header_timeout_ms=%lld read_timeout_ms=%lld cors=%s",
      st.options.host.c_str(), st.bound_port, st.model_name.c_str(), st.options.n_threads,
      st.options.api_key.empty() ? "off" : "bearer", st.options.max_connections,
      static_cast<long long>(st.options.header_timeout.count()),
      static_cast<long long>(st.options.read_timeout.count()),
      origins.empty() ? "off" : origins.c_str());
  return Status();
}

uint16_t HttpServer::port() const { return state_->bound_port; }

void HttpServer::stop() {
  std::lock_guard<std::mutex> lock(state_->stop_mu);
  State& st = *state_;
  if (!st.started || st.stopped) return;
  st.stopped = true;
  st.shutting_down = true;

  // 1. Stop accepting; close idle connections.
  net::post(st.ioc, [s = state_] {
    beast::error_code ec;
    s->acceptor->close(ec);
    s->accept_timer->cancel();
  });
  for (auto& s : live_sessions(st)) {
    net::post(s->executor(), [s] { s->on_shutdown(); });
  }
  // 2. Let running requests finish, up to the grace period.
  {
    std::unique_lock<std::mutex> l(st.sessions_mu);
    st.sessions_cv.wait_for(l, st.options.shutdown_grace, [&] { return st.busy_sessions == 0; });
  }
  // 3. Cancel the rest.
  for (auto& s : live_sessions(st)) {
    net::post(s->executor(), [s] { s->force_close(); });
  }
  {
    std::unique_lock<std::mutex> l(st.sessions_mu);
    st.sessions_cv.wait_for(l, std::chrono::seconds(1), [&] { return st.sessions.empty(); });
  }
  st.work.reset();
  st.ioc.stop();
  for (auto& t : st.threads) t.join();
  st.threads.clear();
  {
    std::lock_guard<std::mutex> g(st.gate->mu);
    st.gate->open = false;
  }
  for (auto& s : live_sessions(st)) s->release_after_join();
  OSCAR_LOG_INFO("server: stopped port=%u", st.bound_port);
}

int HttpServer::max_connections() const { return state_->options.max_connections; }

int max_connections_for_fd_limit(uint64_t fd_limit) {
  const uint64_t headroom = std::max<uint64_t>(32, fd_limit / 8);
  const uint64_t n = fd_limit > headroom ? fd_limit - headroom : 1;
  return static_cast<int>(std::min<uint64_t>(n, 16384));
}

ServerCounters HttpServer::counters() const {
  std::lock_guard<std::mutex> lock(state_->counters_mu);
  return state_->counters;
}

Status serve_until_signal(engine::Engine* engine, const ServerOptions& options) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // Block the signals in this thread before the I/O threads start, so they inherit the mask and
  // only sigwait below receives them.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  HttpServer server(engine, options);
  Status st = server.start();
  if (!st.ok()) return st;
  int sig = 0;
  sigwait(&set, &sig);
  OSCAR_LOG_INFO("server: signal=%d, shutting down", sig);
  server.stop();
  return Status();
}

}  // namespace oscar::server
