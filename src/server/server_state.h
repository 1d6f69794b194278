// HttpServer::State: what the listener, the sessions and the engine callbacks share: the engine,
// the resolved options, the io_context and acceptor, the live sessions (for the connection cap and
// for stop()), the /v1/generate ids and the counters /metrics reports. Owned by HttpServer through
// a shared_ptr that every session also holds. Private to src/server.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "server/generate_endpoint.h"
#include "server/http_server.h"
#include "server/prometheus.h"

namespace oscar::server {

class HttpSession;

// Lets engine threads post to sessions only while the server runs: stop() closes it after the I/O
// threads have been joined.
struct EventGate {
  std::mutex mu;
  bool open = true;
};

struct HttpServer::State {
  engine::Engine* engine = nullptr;
  ServerOptions options;
  std::string model_name;
  int64_t created = 0;

  boost::asio::io_context ioc;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::optional<boost::asio::ip::tcp::acceptor> acceptor;
  // accept() failures (EMFILE...): wait this long before the next try; 0 after a success.
  std::optional<boost::asio::steady_timer> accept_timer;
  std::chrono::milliseconds accept_backoff{0};
  // A descriptor held in reserve (/dev/null): out of descriptors, accept() fails and the client
  // would wait in the kernel's queue; closing this one lets us take the connection, answer 503
  // and close it (take_one_with_spare_fd). -1 while spent.
  int spare_fd = -1;
  ~State() {
    if (spare_fd >= 0) ::close(spare_fd);
  }
  std::vector<std::thread> threads;
  uint16_t bound_port = 0;
  std::atomic<bool> shutting_down{false};
  bool started = false;
  bool stopped = false;
  std::mutex stop_mu;  // serialises start()/stop()

  std::shared_ptr<EventGate> gate = std::make_shared<EventGate>();
  // Live /v1/generate request ids, for /v1/abort (shared with the engine callbacks).
  std::shared_ptr<GenerateRegistry> generate_ids = std::make_shared<GenerateRegistry>();

  // Live sessions, for shutdown; and the number with a request in progress.
  std::mutex sessions_mu;
  std::condition_variable sessions_cv;
  std::unordered_map<HttpSession*, std::weak_ptr<HttpSession>> sessions;
  int busy_sessions = 0;
  int evicting_sessions = 0;  // idle sessions asked to close for a new connection, not yet gone
  int probe_sessions = 0;     // sessions beyond max_connections that answer /health and /metrics

  mutable std::mutex counters_mu;
  ServerCounters counters;

  // The limits requests are validated against, from the engine's current info.
  ModelLimits limits(const engine::EngineInfo& info) const {
    return ModelLimits{model_name, info.max_context_tokens, info.vocab_size,
                       info.max_live_requests};
  }

  void count_response(int status) {
    std::lock_guard<std::mutex> lock(counters_mu);
    ++counters.responses_by_status[status];
  }
  void count_disconnect() {
    std::lock_guard<std::mutex> lock(counters_mu);
    ++counters.client_disconnects;
  }
  // Returns the new total.
  uint64_t count_accept_error() {
    std::lock_guard<std::mutex> lock(counters_mu);
    return ++counters.accept_errors;
  }
  uint64_t count_rejected_connection() {
    std::lock_guard<std::mutex> lock(counters_mu);
    ++counters.responses_by_status[503];
    return ++counters.connections_rejected;
  }
  uint64_t count_evicted_connection() {
    std::lock_guard<std::mutex> lock(counters_mu);
    return ++counters.connections_evicted;
  }
};

}  // namespace oscar::server
