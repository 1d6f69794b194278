// HttpServer implementation. One Session per TCP connection, all its handlers on one strand. A
// Session reads a request, answers it, and reads the next (keep-alive). Generation requests hand
// the engine a callback that posts each event back onto the session's strand.
//
// Lifetimes: while its engine request is live a Session keeps itself alive (self_hold_), released
// on the terminal event or by stop(). The engine callback reaches the Session only through the
// server-wide EventGate, which stop() closes after the I/O threads have been joined, so no event
// can touch a Session once the io_context is gone.
#include "server/http_server.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "server/generate_endpoint.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/output_parser.h"

namespace oscar::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::ordered_json;

class Session;

// Beyond max_connections, when every connection has a request in progress: this many more may
// connect to ask GET /health or /metrics (one request each, within kProbeHeaderTimeout).
constexpr int kProbeConnections = 8;
constexpr std::chrono::milliseconds kProbeHeaderTimeout{2'000};

// Lets engine threads post to sessions only while the server runs.
struct EventGate {
  std::mutex mu;
  bool open = true;
};

struct HttpServer::State {
  engine::Engine* engine = nullptr;
  ServerOptions options;
  std::string model_name;
  int64_t created = 0;

  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  // accept() failures (EMFILE...): wait this long before the next try; 0 after a success.
  std::optional<net::steady_timer> accept_timer;
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
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  int busy_sessions = 0;
  int evicting_sessions = 0;  // idle sessions asked to close for a new connection, not yet gone
  int probe_sessions = 0;     // sessions beyond max_connections that answer /health and /metrics

  mutable std::mutex counters_mu;
  ServerCounters counters;

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

namespace {

// Constant-time comparison, so the API key can not be guessed byte by byte from timings.
bool equal_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// RFC 9110 IMF-fixdate: "Tue, 01 Dec 2026 09:35:27 GMT".
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

// A client's X-Request-Id is echoed when it is 1..128 visible ASCII characters; else a fresh id.
std::string request_id_for(std::string_view client_id) {
  bool sane = !client_id.empty() && client_id.size() <= 128;
  for (char c : client_id) sane = sane && c > 0x20 && c < 0x7f;
  if (sane) return std::string(client_id);
  std::string id = make_response_id(Endpoint::kCompletions);  // "cmpl-<24 hex>"
  return "req-" + id.substr(5);
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

// The Access-Control-Allow-Origin value for `origin`, or "" when it is not allowed.
std::string cors_allow_origin(const ServerOptions& o, std::string_view origin) {
  if (origin.empty()) return "";
  for (const std::string& a : o.allowed_origins) {
    if (a == "*") return "*";
    if (a == origin) return std::string(origin);
  }
  return "";
}

// The methods a route answers, for Allow and 405; nullptr for no route.
const char* route_methods(std::string_view target, std::string_view model_prefix) {
  if (target == "/health" || target == "/metrics" || target == "/v1/models" ||
      (target.size() > model_prefix.size() &&
       target.substr(0, model_prefix.size()) == model_prefix)) {
    return "GET, HEAD, OPTIONS";
  }
  if (target == "/v1/chat/completions" || target == "/v1/completions" ||
      target == "/v1/responses" || target == "/v1/generate" || target == "/v1/abort") {
    return "POST, OPTIONS";
  }
  return nullptr;
}

constexpr std::string_view kModelPrefix = "/v1/models/";

}  // namespace

class Session : public std::enable_shared_from_this<Session> {
 public:
  // probe: a connection beyond max_connections while every other one has a request in progress
  // (do_accept): it answers one GET /health or /metrics, anything else 503, then closes.
  Session(tcp::socket socket, std::shared_ptr<HttpServer::State> st, bool probe = false)
      : st_(std::move(st)), stream_(std::move(socket)), probe_(probe) {}

  ~Session() {
    std::lock_guard<std::mutex> lock(st_->sessions_mu);
    st_->sessions.erase(this);
    if (busy_) --st_->busy_sessions;
    if (evicting_) --st_->evicting_sessions;
    if (probe_) --st_->probe_sessions;
    st_->sessions_cv.notify_all();
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(st_->sessions_mu);
      st_->sessions[this] = weak_from_this();
    }
    net::dispatch(stream_.get_executor(),
                  [self = shared_from_this()] { self->do_read(); });
  }

  net::any_io_executor get_executor_for_shutdown() { return stream_.get_executor(); }

  // stop(), phase 1: close idle connections; busy ones close after their response.
  void on_shutdown() {
    if (!busy_) close();
  }

  // stop(), phase 2: cancel whatever still runs. An open stream ends with an error event and
  // [DONE], a request waiting for its whole answer gets a 503; then the connection closes.
  void force_close() {
    if (generating_) {
      cancel_engine_requests();
      generating_ = false;
      self_hold_.reset();  // the pending write keeps the session alive until it is done
      if (!client_gone_ && !closed_) {
        ApiError e = invalid_request("the server is shutting down; the request was cancelled", "",
                                     503);
        e.type = "server_error";
        e.code = "server_shutting_down";
        if (streaming_) return stream_error(e);
        stop_watching();
        return send_error(e, /*keep_alive=*/false);
      }
    }
    close();
    self_hold_.reset();
  }

  // stop(), after the I/O threads have been joined: break the self-reference.
  void release_after_join() { self_hold_.reset(); }

  // At max_connections (do_accept), with st_->sessions_mu held: whether this connection waits
  // for, or is still reading, a request (no request in progress) and is not yet asked to close;
  // *since: when it started waiting.
  bool evictable(std::chrono::steady_clock::time_point* since) const {
    *since = waiting_since_;
    return !busy_ && !evicting_ && !probe_;
  }
  // With st_->sessions_mu held: chosen to close for a new connection (counted until it is gone).
  void mark_evicting() {
    evicting_ = true;
    ++st_->evicting_sessions;
  }
  // On the session's strand, after mark_evicting: closes the connection unless a request arrived
  // in between (then it stays, and counts as open again).
  void evict() {
    if (busy_) {
      std::lock_guard<std::mutex> lock(st_->sessions_mu);
      evicting_ = false;
      --st_->evicting_sessions;
      return;
    }
    close();
  }

 private:
  // One choice of the response (n of them): one engine request each.
  struct Choice {
    std::string request_id;              // the engine request (response id, "-<i>" when n > 1)
    bool live = false;                   // submitted, terminal event not yet seen
    std::string text;                    // completions (non-streaming) and responses: text so far
    std::optional<OutputParser> parser;  // chat: tool calls and reasoning out of the text
    ChatOutput chat_out;                 // non-streaming chat: the answer so far
    int calls_sent = 0;                  // streaming chat: tool calls sent (their index)
    std::vector<LogprobEntry> logprobs;  // not yet sent (streaming) / all (non-streaming)
    int64_t text_offset = 0;             // bytes of the tokens so far (completions' text_offset)
    std::string finish_reason;
    int completion_tokens = 0;
    int cached_tokens = 0;
  };

  // ---- reading ----

  void do_read() {
    if (st_->shutting_down) return close();
    {
      std::lock_guard<std::mutex> lock(st_->sessions_mu);
      waiting_since_ = std::chrono::steady_clock::now();
    }
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(kMaxHeaderBytes));
    parser_->body_limit(kMaxBodyBytes);
    stream_.expires_after(probe_ ? std::min(st_->options.header_timeout, kProbeHeaderTimeout)
                                 : st_->options.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->on_header(ec);
                            });
  }

  // Headers are in (and within limits, including a Content-Length within kMaxBodyBytes). Clients
  // such as curl send "Expect: 100-continue" before a large body and wait for our go-ahead.
  void on_header(beast::error_code ec) {
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

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->on_read(ec);
                     });
  }

  void on_read(beast::error_code ec) {
    head_ = false;
    origin_.clear();
    req_id_ = request_id_for("");
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted ||
        ec == beast::error::timeout || ec == net::error::connection_reset || ec == net::error::eof) {
      return close();
    }
    set_busy(true);
    if (ec == http::error::header_limit) {
      ApiError e = invalid_request(
          str_format("request headers exceed %zu bytes", kMaxHeaderBytes), "", 431);
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
    http::request<http::string_body> req = parser_->release();
    version_ = req.version();
    keep_alive_ = req.keep_alive() && !probe_;
    head_ = req.method() == http::verb::head;
    if (auto o = req.find(http::field::origin); o != req.end()) {
      origin_ = std::string(o->value().data(), o->value().size());
    }
    if (auto id = req.find("X-Request-Id"); id != req.end()) {
      req_id_ = request_id_for(std::string_view(id->value().data(), id->value().size()));
    }
    handle(req);
  }

  // ---- routing ----

  void handle(const http::request<http::string_body>& req) {
    std::string_view target(req.target().data(), req.target().size());
    if (size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
    const bool post = req.method() == http::verb::post;
    if (probe_ && !(get && (target == "/health" || target == "/metrics"))) {
      ApiError e = invalid_request(
          str_format("every connection (--max-connections %d) has a request in progress; only "
                     "GET /health and /metrics are answered now; retry later",
                     st_->options.max_connections),
          "", 503);
      e.type = "server_error";
      e.code = "too_many_connections";
      return send_error(e, /*keep_alive=*/false);
    }
    const char* methods = route_methods(target, kModelPrefix);
    if (!methods) {
      ApiError e = invalid_request("no route for " + std::string(target), "", 404);
      e.code = "not_found";
      return send_error(e, keep_alive_);
    }
    allow_ = methods;
    if (req.method() == http::verb::options) return send_options(req);

    if (target == "/health") {
      if (!get) return send_method_not_allowed();
      bool ready = st_->engine->info().ready;
      return send(ready ? 200 : 503, ready ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}",
                  "application/json");
    }
    if (target == "/metrics") {
      if (!get) return send_method_not_allowed();
      ServerCounters counters;
      {
        std::lock_guard<std::mutex> lock(st_->counters_mu);
        counters = st_->counters;
      }
      // Labelled with the name clients send (vLLM labels with the served model name).
      engine::EngineMetrics m = st_->engine->metrics();
      m.model_name = st_->model_name;
      return send(200, render_prometheus(m, counters), "text/plain; version=0.0.4; charset=utf-8");
    }
    if (!st_->options.api_key.empty()) {
      auto it = req.find(http::field::authorization);
      std::string_view got = it == req.end()
                                 ? std::string_view()
                                 : std::string_view(it->value().data(), it->value().size());
      if (!equal_constant_time(got, "Bearer " + st_->options.api_key)) {
        ApiError e = invalid_request("missing or incorrect API key in the Authorization header",
                                     "", 401);
        e.code = "invalid_api_key";
        return send_error(e, keep_alive_);
      }
    }
    if (target == "/v1/models") {
      if (!get) return send_method_not_allowed();
      return send(200,
                  dump_json(models_body(st_->model_name, st_->created,
                                        st_->engine->info().max_context_tokens)),
                  "application/json");
    }
    if (target.substr(0, kModelPrefix.size()) == kModelPrefix) {
      if (!get) return send_method_not_allowed();
      std::optional<std::string> id = percent_decode(target.substr(kModelPrefix.size()));
      if (!id || *id != st_->model_name) {
        ApiError e = invalid_request(
            str_format("The model '%s' does not exist; this server serves '%s'",
                       id ? id->c_str() : std::string(target.substr(kModelPrefix.size())).c_str(),
                       st_->model_name.c_str()),
            "model", 404);
        e.code = "model_not_found";
        return send_error(e, keep_alive_);
      }
      return send(200,
                  dump_json(model_json(st_->model_name, st_->created,
                                       st_->engine->info().max_context_tokens)),
                  "application/json");
    }
    if (!post) return send_method_not_allowed();
    if (target == "/v1/generate") return start_token_generation(req.body());
    if (target == "/v1/abort") return abort_generation(req.body());
    start_generation(target == "/v1/chat/completions" ? Endpoint::kChatCompletions
                     : target == "/v1/responses"     ? Endpoint::kResponses
                                                     : Endpoint::kCompletions,
                     req.body());
  }

  // ---- generation ----

  void start_generation(Endpoint endpoint, const std::string& body) {
    engine::EngineInfo info = st_->engine->info();
    if (!info.ready) return send_error(model_loading_error(), keep_alive_);
    ModelLimits limits{st_->model_name, info.max_context_tokens, info.vocab_size,
                       info.max_live_requests};
    ParseResult parsed = parse_openai_request(endpoint, body, limits);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*e, keep_alive_);
    OpenAIRequest& req = std::get<OpenAIRequest>(parsed);
    token_api_ = false;

    std::vector<int32_t> prompt_ids;
    if (endpoint == Endpoint::kChatCompletions || endpoint == Endpoint::kResponses) {
      Result<std::vector<int32_t>> ids = st_->engine->tokenize_chat(
          req.messages, req.tools, /*add_generation_prompt=*/true, req.chat_template_kwargs);
      if (!ids.ok()) {
        return send_error(error_from_status(ids.status(), "chat template"), keep_alive_);
      }
      prompt_ids = std::move(ids).value();
    } else if (req.prompt_is_ids) {
      prompt_ids = std::move(req.prompt_ids);
    } else {
      Result<std::vector<int32_t>> ids = st_->engine->tokenize(req.prompt_text);
      if (!ids.ok()) return send_error(error_from_status(ids.status(), "tokenizer"), keep_alive_);
      prompt_ids = std::move(ids).value();
    }
    auto fit = check_context_fit(static_cast<int>(prompt_ids.size()), req.max_tokens,
                                 info.max_context_tokens, st_->options.default_max_tokens);
    if (auto* e = std::get_if<ApiError>(&fit)) return send_error(*e, keep_alive_);

    meta_ = ResponseMeta{endpoint, make_response_id(endpoint), unix_now(), st_->model_name,
                         req.text_format};
    item_id_ = "msg_" + make_response_id(Endpoint::kCompletions).substr(5);
    seq_ = 0;
    request_id_ = meta_.id;
    streaming_ = req.stream;
    include_usage_ = req.include_usage;
    logprobs_ = req.logprobs;
    usage_ = Usage{static_cast<int>(prompt_ids.size()), 0, 0};
    const int n_choices = req.n;
    choices_.assign(n_choices, Choice{});
    for (int i = 0; i < n_choices; ++i) {
      Choice& c = choices_[i];
      c.request_id = n_choices == 1 ? meta_.id : str_format("%s-%d", meta_.id.c_str(), i);
      if (endpoint == Endpoint::kChatCompletions) {
        const bool tools = req.tools.is_array() && req.tool_choice != "none";
        const bool reasoning = st_->options.reasoning_parser == "qwen3";
        c.parser.emplace(tools, reasoning);
        c.chat_out.with_reasoning = reasoning;
      }
    }

    engine::GenerationRequest greq;
    greq.prompt_ids = std::move(prompt_ids);
    greq.sampling = req.sampling;
    greq.max_tokens = std::get<int>(fit);
    greq.stop = std::move(req.stop);
    greq.ignore_eos = req.ignore_eos;
    greq.logprobs = req.logprobs;
    greq.tool_call_names = req.tool_call_names;
    greq.json_object = req.json_object;
    greq.json_schema = req.json_schema;
    greq.tool_call_schemas = req.tool_call_schemas;

    std::weak_ptr<Session> weak = weak_from_this();
    std::shared_ptr<EventGate> gate = st_->gate;
    auto executor = stream_.get_executor();
    const uint64_t gen = ++response_gen_;
    for (int i = 0; i < n_choices; ++i) {
      engine::GenerationRequest one = greq;
      one.request_id = choices_[i].request_id;
      // Choice i draws with seed + i (vLLM's rule); unseeded choices get their own seeds from the
      // engine. Choices after the first share the first's prompt pages.
      if (one.sampling.has_seed) one.sampling.config.seed += static_cast<uint64_t>(i);
      if (i > 0) one.share_prompt_with = choices_[0].request_id;
      Status submitted = st_->engine->submit(
          std::move(one), [weak, gate, executor, gen, i](const engine::GenerationEvent& ev) {
            std::lock_guard<std::mutex> lock(gate->mu);
            if (!gate->open) return;
            if (std::shared_ptr<Session> s = weak.lock()) {
              net::post(executor, [s, ev, gen, i] { s->on_event(gen, i, ev); });
            }
          });
      if (!submitted.ok()) {
        cancel_engine_requests();  // the choices already submitted (their events are ignored)
        choices_.clear();
        return send_error(error_from_status(submitted, "engine"), keep_alive_);
      }
      choices_[i].live = true;
    }

    generating_ = true;
    self_hold_ = shared_from_this();
    watch_for_disconnect();
    if (streaming_) {
      chunked_ = version_ >= 11;
      if (!chunked_) keep_alive_ = false;
      std::string head = "HTTP/1.1 200 OK\r\nServer: oscar\r\nContent-Type: text/event-stream\r\n"
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
      if (endpoint == Endpoint::kChatCompletions) {
        for (int i = 0; i < n_choices; ++i)
          queue_event(sse_event(stream_chunk(meta_, "", /*role_first=*/true, "", i)));
      }
      if (endpoint == Endpoint::kResponses) {
        using json = nlohmann::ordered_json;
        const json r = response_object(meta_, "in_progress", item_id_, "", usage_);
        queue_event(response_event("response.created", json{{"response", r}}, &seq_));
        queue_event(response_event("response.in_progress", json{{"response", r}}, &seq_));
        queue_event(response_event(
            "response.output_item.added",
            json{{"output_index", 0},
                 {"item", response_message_item(item_id_, "in_progress", nullptr)}},
            &seq_));
        queue_event(response_event("response.content_part.added",
                                   json{{"item_id", item_id_},
                                        {"output_index", 0},
                                        {"content_index", 0},
                                        {"part", output_text_part("")}},
                                   &seq_));
      }
      flush();
    }
  }

  // One event of choice i (the engine request choices_[i].request_id) of the response `gen`.
  void on_event(uint64_t gen, int i, const engine::GenerationEvent& ev) {
    // A late event of an earlier response on this connection (a choice cancelled after another
    // failed), or after an error: nothing is left to send for it.
    if (gen != response_gen_ || !generating_) return;
    if (token_api_) return on_generate_event(ev);
    Choice& c = choices_[i];
    if (!c.live) return;
    usage_.prompt_tokens = ev.prompt_tokens > 0 ? ev.prompt_tokens : usage_.prompt_tokens;
    c.completion_tokens = ev.completion_tokens;
    c.cached_tokens = ev.cached_tokens;
    update_usage();
    switch (ev.kind) {
      case engine::GenerationEvent::kToken:
        if (ev.has_logprobs) {
          c.logprobs.push_back(LogprobEntry{ev.chosen, ev.top_logprobs, c.text_offset});
          c.text_offset += static_cast<int64_t>(ev.chosen.bytes.size());
        }
        if (meta_.endpoint == Endpoint::kResponses) {
          c.text += ev.text_delta;
          if (streaming_ && !ev.text_delta.empty() && !client_gone_) {
            queue_event(response_event("response.output_text.delta",
                                       {{"item_id", item_id_},
                                        {"output_index", 0},
                                        {"content_index", 0},
                                        {"delta", ev.text_delta}},
                                       &seq_));
            flush();
          }
        } else if (c.parser) {
          relay(i, c.parser->push(ev.text_delta), "");
        } else if (streaming_) {
          if ((!ev.text_delta.empty() || !c.logprobs.empty()) && !client_gone_) {
            queue_event(
                sse_event(stream_chunk(meta_, ev.text_delta, false, "", i, take_logprobs(c))));
            flush();
          }
        } else {
          c.text += ev.text_delta;
        }
        return;
      case engine::GenerationEvent::kFinished: {
        c.live = false;
        std::string reason = ev.finish_reason;
        if (c.parser) {
          OutputDelta last = c.parser->finish();
          if (c.parser->tool_calls_seen() > 0 && reason == "stop") reason = "tool_calls";
          c.finish_reason = reason;
          if (!client_gone_) relay(i, std::move(last), streaming_ ? reason : "");
        } else {
          c.finish_reason = reason;
          if (streaming_ && !client_gone_ && meta_.endpoint != Endpoint::kResponses) {
            queue_event(sse_event(stream_chunk(meta_, "", false, reason, i, take_logprobs(c))));
            flush();
          }
        }
        for (const Choice& other : choices_)
          if (other.live) return;  // the response ends with its last choice
        generating_ = false;
        self_hold_.reset();
        if (client_gone_) return;
        if (meta_.endpoint == Endpoint::kResponses)
          return finish_response(choices_[0].finish_reason);
        if (streaming_) {
          if (include_usage_) queue_event(sse_event(usage_chunk(meta_, usage_)));
          return end_stream();
        }
        json all = json::array();
        for (size_t k = 0; k < choices_.size(); ++k) {
          Choice& ck = choices_[k];
          if (meta_.endpoint == Endpoint::kChatCompletions) {
            all.push_back(
                chat_choice(static_cast<int>(k), ck.chat_out, ck.finish_reason, take_logprobs(ck)));
          } else {
            all.push_back(completion_choice(static_cast<int>(k), ck.text, ck.finish_reason,
                                            take_logprobs(ck)));
          }
        }
        stop_watching();
        send(200, dump_json(body_with_choices(meta_, std::move(all), usage_)), "application/json");
        return;
      }
      case engine::GenerationEvent::kError: {
        c.live = false;
        generating_ = false;
        cancel_engine_requests();  // the other choices: their events are ignored from now on
        self_hold_.reset();
        if (client_gone_) return;
        ApiError e = error_from_status(ev.error, "generation failed");
        if (streaming_) {
          stream_error(e);
        } else {
          stop_watching();
          send_error(e, keep_alive_);
        }
        return;
      }
    }
  }

  // Usage of the whole response: the prompt once, the completion tokens of every choice.
  void update_usage() {
    usage_.completion_tokens = 0;
    for (const Choice& c : choices_) usage_.completion_tokens += c.completion_tokens;
    usage_.cached_tokens = choices_.empty() ? 0 : choices_[0].cached_tokens;
  }

  // The choice's log-probabilities not yet sent, as the endpoint's JSON (null when the request
  // asked for none), and forgets them.
  nlohmann::ordered_json take_logprobs(Choice& c) {
    if (logprobs_ < 0) return nullptr;
    nlohmann::ordered_json j = meta_.endpoint == Endpoint::kChatCompletions
                                   ? chat_logprobs_json(c.logprobs)
                                   : completion_logprobs_json(c.logprobs);
    c.logprobs.clear();
    return j;
  }

  // Cancels every engine request of the response that is still live. Their terminal events still
  // come (and end the response when generating_ is still true, e.g. after a disconnect).
  void cancel_engine_requests() {
    if (token_api_) return st_->engine->cancel(request_id_);
    for (const Choice& c : choices_)
      if (c.live) st_->engine->cancel(c.request_id);
  }

  // ---- /v1/generate and /v1/abort (generate_endpoint.h) ----

  void start_token_generation(const std::string& body) {
    engine::EngineInfo info = st_->engine->info();
    if (!info.ready) return send_error(model_loading_error(), keep_alive_);
    ModelLimits limits{st_->model_name, info.max_context_tokens, info.vocab_size,
                       info.max_live_requests};
    auto parsed = parse_generate_request(body, limits);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*e, keep_alive_);
    GenerateRequest& req = std::get<GenerateRequest>(parsed);
    auto fit = check_context_fit(static_cast<int>(req.input_ids.size()), req.max_tokens,
                                 info.max_context_tokens);
    if (auto* e = std::get_if<ApiError>(&fit)) return send_error(*e, keep_alive_);
    const std::string id = req.request_id.empty() ? make_generate_id() : req.request_id;
    std::shared_ptr<GenerateRegistry> registry = st_->generate_ids;
    if (!registry->add(id)) {
      ApiError e = invalid_request(
          str_format("a request with request_id '%s' is already running", id.c_str()),
          "request_id");
      e.code = "duplicate_request_id";
      return send_error(e, keep_alive_);
    }

    token_api_ = true;
    meta_ = ResponseMeta{Endpoint::kCompletions, id, unix_now(), st_->model_name};  // [DONE] ends
    request_id_ = id;
    streaming_ = req.stream;
    output_ids_.clear();
    stop_token_ids_ = std::move(req.stop_token_ids);
    stopped_by_token_ = false;
    usage_ = Usage{static_cast<int>(req.input_ids.size()), 0, 0};

    engine::GenerationRequest greq;
    greq.request_id = id;
    greq.prompt_ids = std::move(req.input_ids);
    greq.sampling = req.sampling;
    greq.max_tokens = std::get<int>(fit);
    greq.ignore_eos = req.ignore_eos;

    std::weak_ptr<Session> weak = weak_from_this();
    std::shared_ptr<EventGate> gate = st_->gate;
    auto executor = stream_.get_executor();
    const uint64_t gen = ++response_gen_;
    Status submitted = st_->engine->submit(
        std::move(greq),
        [weak, gate, executor, registry, id, gen](const engine::GenerationEvent& ev) {
          // The id leaves the registry with the terminal event, whatever became of the session.
          if (ev.kind != engine::GenerationEvent::kToken) registry->remove(id);
          std::lock_guard<std::mutex> lock(gate->mu);
          if (!gate->open) return;
          if (std::shared_ptr<Session> s = weak.lock()) {
            net::post(executor, [s, ev, gen] { s->on_event(gen, 0, ev); });
          }
        });
    if (!submitted.ok()) {
      registry->remove(id);
      return send_error(error_from_status(submitted, "engine"), keep_alive_);
    }
    generating_ = true;
    self_hold_ = shared_from_this();
    watch_for_disconnect();
    if (streaming_) {
      open_event_stream();
      flush();
    }
  }

  // The SSE response head of /v1/generate (as start_generation writes it for the OpenAI routes).
  void open_event_stream() {
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

  void on_generate_event(const engine::GenerationEvent& ev) {
    usage_.prompt_tokens = ev.prompt_tokens > 0 ? ev.prompt_tokens : usage_.prompt_tokens;
    usage_.cached_tokens = ev.cached_tokens;
    switch (ev.kind) {
      case engine::GenerationEvent::kToken: {
        // After a stop token: the engine was told to cancel; later tokens are not ours.
        if (stopped_by_token_ || ev.token_id < 0) return;
        output_ids_.push_back(ev.token_id);
        usage_.completion_tokens = static_cast<int>(output_ids_.size());
        if (std::find(stop_token_ids_.begin(), stop_token_ids_.end(), ev.token_id) !=
            stop_token_ids_.end()) {
          stopped_by_token_ = true;
          st_->engine->cancel(request_id_);
        }
        if (streaming_ && !client_gone_) {
          queue_event(sse_event(generate_chunk(request_id_, {ev.token_id}, "", 0, 0, 0)));
          flush();
        }
        return;
      }
      case engine::GenerationEvent::kFinished: {
        generating_ = false;
        self_hold_.reset();
        if (client_gone_) return;
        const std::string reason = stopped_by_token_ ? "stop" : ev.finish_reason;
        if (streaming_) {
          queue_event(sse_event(generate_chunk(request_id_, {}, reason, usage_.prompt_tokens,
                                               usage_.completion_tokens, usage_.cached_tokens)));
          return end_stream();
        }
        stop_watching();
        return send(200,
                    dump_json(generate_body(request_id_, output_ids_, reason, usage_.prompt_tokens,
                                            usage_.completion_tokens, usage_.cached_tokens)),
                    "application/json");
      }
      case engine::GenerationEvent::kError: {
        generating_ = false;
        self_hold_.reset();
        if (client_gone_) return;
        ApiError e = error_from_status(ev.error, "generation failed");
        if (streaming_) return stream_error(e);
        stop_watching();
        return send_error(e, keep_alive_);
      }
    }
  }

  // POST /v1/abort: cancels a live /v1/generate request (its own stream or answer then ends with
  // finish_reason "cancelled"); an id that is not live is a 404.
  void abort_generation(const std::string& body) {
    auto parsed = parse_abort_request(body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*e, keep_alive_);
    const std::string& id = std::get<std::string>(parsed);
    if (!st_->generate_ids->contains(id)) {
      ApiError e = invalid_request(
          str_format("no running /v1/generate request has request_id '%s'", id.c_str()),
          "request_id", 404);
      e.code = "request_not_found";
      return send_error(e, keep_alive_);
    }
    st_->engine->cancel(id);
    OSCAR_LOG_INFO("server: abort request_id=%s", id.c_str());
    send(200, dump_json(nlohmann::ordered_json{{"request_id", id}, {"aborted", true}}),
         "application/json");
  }

  // A parsed chat delta of choice i: streamed as one chunk (with finish_reason when given, even if
  // the delta is empty; with the log-probabilities of the tokens since the last chunk), or added
  // to the whole answer.
  void relay(int i, OutputDelta d, const std::string& finish_reason) {
    Choice& c = choices_[i];
    if (!streaming_) {
      c.chat_out.content += d.content;
      c.chat_out.reasoning += d.reasoning;
      for (ToolCall& call : d.tool_calls) c.chat_out.tool_calls.push_back(std::move(call));
      return;
    }
    if (client_gone_ || (d.empty() && finish_reason.empty() && c.logprobs.empty())) return;
    queue_event(
        sse_event(chat_delta_chunk(meta_, d, c.calls_sent, finish_reason, i, take_logprobs(c))));
    c.calls_sent += static_cast<int>(d.tool_calls.size());
    flush();
  }

  // A readable socket while we are answering means the client closed it (or pipelined the next
  // request, which we then leave for after the response).
  void watch_for_disconnect() {
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
            size_t n = self->stream_.socket().receive(net::buffer(&c, 1),
                                                      tcp::socket::message_peek, peek_ec);
            if (peek_ec == net::error::would_block || peek_ec == net::error::try_again) {
              return self->watch_for_disconnect();  // nothing there after all: keep watching
            }
            if (n > 0 && !peek_ec) return;  // pipelined data: not a disconnect
          }
          self->on_client_gone();
        });
  }

  void stop_watching() {
    ++watch_gen_;
    beast::error_code ec;
    stream_.socket().cancel(ec);
  }

  void on_client_gone() {
    if (client_gone_) return;
    client_gone_ = true;
    if (generating_) {
      st_->count_disconnect();
      cancel_engine_requests();
      OSCAR_LOG_INFO("server: client disconnected, cancelled request_id=%s", request_id_.c_str());
    }
    close();
  }

  // ---- streaming writes ----

  void queue_event(const std::string& data) {
    if (chunked_) {
      pending_ += str_format("%zx\r\n", data.size());
      pending_ += data;
      pending_ += "\r\n";
    } else {
      pending_ += data;
    }
  }

  // /v1/responses: the closing events, or the whole Response object.
  void finish_response(const std::string& reason) {
    using json = nlohmann::ordered_json;
    const std::string status = response_status(reason);
    const std::string& text = choices_[0].text;
    json r = response_object(meta_, status, item_id_, text, usage_);
    if (!streaming_) {
      stop_watching();
      return send(200, dump_json(r), "application/json");
    }
    queue_event(response_event(
        "response.output_text.done",
        json{{"item_id", item_id_}, {"output_index", 0}, {"content_index", 0}, {"text", text}},
        &seq_));
    queue_event(response_event("response.content_part.done",
                               json{{"item_id", item_id_},
                                    {"output_index", 0},
                                    {"content_index", 0},
                                    {"part", output_text_part(text)}},
                               &seq_));
    queue_event(response_event(
        "response.output_item.done",
        json{{"output_index", 0}, {"item", response_message_item(item_id_, "completed", &text)}},
        &seq_));
    queue_event(response_event(status == "completed" ? "response.completed" : "response.incomplete",
                               json{{"response", r}}, &seq_));
    end_stream();
  }

  // An error in an open stream: an error event (chat/completions: a data line with the OpenAI
  // error body; responses: an "error" event), then the end of the stream.
  void stream_error(const ApiError& e) {
    if (meta_.endpoint == Endpoint::kResponses) {
      queue_event(response_event("error",
                                 {{"code", e.code.empty() ? nlohmann::ordered_json(nullptr)
                                                          : nlohmann::ordered_json(e.code)},
                                  {"message", e.message},
                                  {"param", nullptr}},
                                 &seq_));
    } else {
      queue_event("data: " + e.to_json() + "\n\n");
    }
    end_stream();
  }

  // [DONE] (not for /v1/responses, whose stream ends with its last event), then the last chunk.
  void end_stream() {
    if (meta_.endpoint != Endpoint::kResponses) queue_event(std::string(kSseDone));
    if (chunked_) pending_ += "0\r\n\r\n";
    end_after_flush_ = true;
    flush();
  }

  void flush() {
    if (writing_ || pending_.empty() || client_gone_) return;
    writing_ = true;
    inflight_.swap(pending_);
    pending_.clear();
    stream_.expires_after(st_->options.write_timeout);
    net::async_write(stream_, net::buffer(inflight_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->on_stream_write(ec);
                     });
  }

  void on_stream_write(beast::error_code ec) {
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

  // ---- whole responses ----

  // Headers every response carries.
  void decorate(http::response<http::string_body>& res) const {
    res.set(http::field::server, "oscar");
    res.set(http::field::date, http_date());
    res.set("X-Request-Id", req_id_);
    if (std::string acao = cors_allow_origin(st_->options, origin_); !acao.empty()) {
      res.set(http::field::access_control_allow_origin, acao);
      res.set(http::field::access_control_expose_headers, "X-Request-Id");
      res.set(http::field::vary, "Origin");
    }
  }

  // OPTIONS: 204 with Allow; a CORS preflight from an allowed origin also gets what it asks for.
  void send_options(const http::request<http::string_body>& req) {
    auto res = std::make_shared<http::response<http::string_body>>(http::status::no_content,
                                                                     version_);
    decorate(*res);
    res->set(http::field::allow, allow_);
    if (!cors_allow_origin(st_->options, origin_).empty() &&
        req.find(http::field::access_control_request_method) != req.end()) {
      res->set(http::field::access_control_allow_methods, allow_);
      auto h = req.find(http::field::access_control_request_headers);
      res->set(http::field::access_control_allow_headers,
               h != req.end() ? std::string(h->value().data(), h->value().size())
                              : std::string("Authorization, Content-Type, X-Request-Id"));
      res->set(http::field::access_control_max_age, "600");
    }
    res->keep_alive(keep_alive_ && !st_->shutting_down);
    res->prepare_payload();
    res->erase(http::field::content_length);  // a 204 carries none (RFC 9110 §8.6)
    write_response(res, 204, keep_alive_);
  }

  void send(int status, std::string body, const char* content_type) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(status), version_);
    decorate(*res);
    res->set(http::field::content_type, content_type);
    res->keep_alive(keep_alive_ && !st_->shutting_down);
    res->body() = std::move(body);
    res->prepare_payload();
    write_response(res, status, keep_alive_);
  }

  void send_error(const ApiError& e, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(e.http_status), version_);
    decorate(*res);
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

  void send_method_not_allowed() {
    ApiError e = invalid_request(str_format("method not allowed; this route answers %s", allow_),
                                 "", 405);
    e.code = "method_not_allowed";
    send_error(e, keep_alive_);
  }

  void write_response(std::shared_ptr<http::response<http::string_body>> res, int status,
                      bool keep_alive) {
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

  void finish_request(bool keep_alive) {
    set_busy(false);
    if (keep_alive && !st_->shutting_down && !client_gone_) return do_read();
    lingering_close();
  }

  // Half-close, then drain what the client still sends for a moment, so that it reads our answer
  // (e.g. a 413) instead of a connection reset caused by unread data.
  void lingering_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    stream_.expires_after(st_->shutting_down ? std::chrono::milliseconds(200)
                                             : std::chrono::milliseconds(1000));
    drain_buf_.resize(16 * 1024);
    drain();
  }

  void drain() {
    stream_.async_read_some(net::buffer(drain_buf_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain();
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    set_busy(false);
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  void set_busy(bool busy) {
    if (busy == busy_) return;
    std::lock_guard<std::mutex> lock(st_->sessions_mu);
    busy_ = busy;
    st_->busy_sessions += busy ? 1 : -1;
    st_->sessions_cv.notify_all();
  }

  std::shared_ptr<HttpServer::State> st_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::vector<char> drain_buf_;

  // The request being answered.
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;          // a HEAD request: headers only
  std::string origin_;         // its Origin header ("" when none)
  std::string req_id_;         // X-Request-Id of the answer
  const char* allow_ = "GET, HEAD, OPTIONS";  // methods of the route, for Allow
  bool busy_ = false;     // from a request read to its response written (guarded by sessions_mu)
  const bool probe_;      // beyond max_connections: /health and /metrics only, then close
  // Guarded by sessions_mu: when the connection last started waiting for a request, and whether
  // do_accept chose it to close for a new connection.
  std::chrono::steady_clock::time_point waiting_since_ = std::chrono::steady_clock::now();
  bool evicting_ = false;
  bool closed_ = false;
  bool client_gone_ = false;

  // Generation state (strand only).
  std::shared_ptr<Session> self_hold_;  // set while the engine request is live
  std::string request_id_;
  bool generating_ = false;  // engine request submitted, terminal event not yet seen
  bool streaming_ = false;
  bool include_usage_ = false;
  bool chunked_ = true;
  ResponseMeta meta_;
  std::vector<Choice> choices_;
  int logprobs_ = -1;                       // the request's logprobs (-1: none)
  uint64_t response_gen_ = 0;               // counts the responses started; events carry theirs
  std::string item_id_;                     // responses: the output message item's id
  int seq_ = 0;                             // responses: the next event's sequence_number
  Usage usage_;
  uint64_t watch_gen_ = 0;
  // /v1/generate (token_api_): ids out so far, the request's stop tokens, whether one was seen.
  bool token_api_ = false;
  std::vector<int32_t> output_ids_;
  std::vector<int32_t> stop_token_ids_;
  bool stopped_by_token_ = false;

  // Streaming output: bytes queued, bytes being written.
  std::string pending_;
  std::string inflight_;
  bool writing_ = false;
  bool end_after_flush_ = false;
};

namespace {

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
      std::shared_ptr<Session> victim;
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
          if (std::shared_ptr<Session> s = weak.lock()) {
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
        std::make_shared<Session>(std::move(socket), st, /*probe=*/true)->start();
      } else {
        if (victim) {
          const uint64_t n = st->count_evicted_connection();
          if ((n & (n - 1)) == 0) {
            OSCAR_LOG_INFO(
                "server: closing an idle connection for a new one, open=%zu "
                "max_connections=%d evicted_total=%llu",
                open, st->options.max_connections, static_cast<unsigned long long>(n));
          }
          net::post(victim->get_executor_for_shutdown(), [victim] { victim->evict(); });
        }
        std::make_shared<Session>(std::move(socket), st)->start();
      }
    }
    do_accept(st);
  });
}

std::vector<std::shared_ptr<Session>> live_sessions(HttpServer::State& st) {
  std::vector<std::shared_ptr<Session>> out;
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
    net::post(s->get_executor_for_shutdown(), [s] { s->on_shutdown(); });
  }
  // 2. Let running requests finish, up to the grace period.
  {
    std::unique_lock<std::mutex> l(st.sessions_mu);
    st.sessions_cv.wait_for(l, st.options.shutdown_grace, [&] { return st.busy_sessions == 0; });
  }
  // 3. Cancel the rest.
  for (auto& s : live_sessions(st)) {
    net::post(s->get_executor_for_shutdown(), [s] { s->force_close(); });
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
