// End-to-end tests of HttpServer over real sockets: a server on 127.0.0.1 with an ephemeral port
// and a FakeEngine, driven by a small blocking HTTP client written with Beast. Each socket has a
// 10 s receive timeout so a server bug fails the test instead of hanging it.
#include "server/http_server.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/server/fake_engine.h"

namespace oscar::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using testing::FakeEngine;

struct Reply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;
  bool keep_alive = false;
};

class Client {
 public:
  explicit Client(uint16_t port) : socket_(ioc_) {
    socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    timeval tv{10, 0};
    setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }

  Reply request(http::verb verb, const std::string& target, const std::string& body = "",
                const std::map<std::string, std::string>& headers = {}) {
    http::request<http::string_body> req(verb, target, 11);
    req.set(http::field::host, "127.0.0.1");
    for (const auto& [k, v] : headers) req.set(k, v);
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(socket_, req);
    return read_reply();
  }

  Reply read_reply() {
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 * 1024 * 1024);
    beast::error_code ec;
    http::read(socket_, buffer_, parser, ec);
    Reply r;
    if (ec) {
      r.status = -1;
      r.body = ec.message();
      return r;
    }
    auto& res = parser.get();
    r.status = static_cast<int>(res.result_int());
    r.body = res.body();
    r.keep_alive = res.keep_alive();
    for (const auto& f : res) r.headers[std::string(f.name_string())] = std::string(f.value());
    return r;
  }

  tcp::socket& socket() { return socket_; }

 private:
  net::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

// "data: X\n\n" events of an SSE body, payloads only. Fails the test on bad framing.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos;
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(FakeEngine::Options eopt = {}, ServerOptions sopt = {}) {
    engine_ = std::make_unique<FakeEngine>(eopt);
    sopt.host = "127.0.0.1";
    sopt.port = 0;
    server_ = std::make_unique<HttpServer>(engine_.get(), sopt);
    Status st = server_->start();
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_NE(server_->port(), 0);
  }
  void TearDown() override {
    if (server_) server_->stop();
    server_.reset();
    engine_.reset();
  }
  Reply post(const std::string& target, const std::string& body,
             const std::map<std::string, std::string>& headers = {}) {
    return Client(server_->port()).request(http::verb::post, target, body, headers);
  }
  Reply get(const std::string& target, const std::map<std::string, std::string>& headers = {}) {
    return Client(server_->port()).request(http::verb::get, target, "", headers);
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
};

const char* kChat =
    R"({"model":"fake-model","messages":[{"role":"user","content":"Hi"}],"max_tokens":100})";
// The fake template renders that as "<|user|>Hi\n<|assistant|>" (24 bytes = 24 tokens), and the
// fake engine echoes the prompt, then stops.
const std::string kChatEcho = "<|user|>Hi\n<|assistant|>";

TEST_F(HttpServerTest, ChatNonStreaming) {
  start();
  Reply r = post("/v1/chat/completions", kChat);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["Content-Type"], "application/json");
  json j = json::parse(r.body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "fake-model");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], kChatEcho);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 24);
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_EQ(j["usage"]["total_tokens"], 48);
}

TEST_F(HttpServerTest, SamplingParametersReachTheEngine) {
  start();
  Reply r = post("/v1/chat/completions",
                 R"({"model":"fake-model","messages":[{"role":"user","content":"Hi"}],
                     "max_completion_tokens":5,"temperature":0.5,"top_p":0.8,"top_k":7,
                     "seed":11,"stop":["zz"],"ignore_eos":true,
                     "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto reqs = engine_->submitted();
  ASSERT_EQ(reqs.size(), 1u);
  const engine::GenerationRequest& g = reqs[0];
  EXPECT_EQ(g.max_tokens, 5);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.8f);
  EXPECT_EQ(g.sampling.top_k, 7);
  EXPECT_TRUE(g.sampling.has_seed);
  EXPECT_EQ(g.sampling.seed, 11u);
  EXPECT_EQ(g.stop, std::vector<std::string>{"zz"});
  EXPECT_TRUE(g.ignore_eos);
  // The template saw the kwargs: the prompt ends with the fake's "<nothink>" marker.
  std::string prompt(g.prompt_ids.begin(), g.prompt_ids.end());
  EXPECT_NE(prompt.find("<nothink>"), std::string::npos) << prompt;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
}

TEST_F(HttpServerTest, ChatStreamingFramingAndUsage) {
  start();
  Reply r = post("/v1/chat/completions",
                 R"({"model":"fake-model","messages":[{"role":"user","content":"Hi"}],
                     "stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["Content-Type"], "text/event-stream");
  std::vector<std::string> events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string id;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (i == 0) {
      id = c["id"];
      EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
    }
    EXPECT_EQ(c["id"], id);
    if (i + 2 == events.size()) {  // the usage chunk
      EXPECT_TRUE(c["choices"].empty());
      EXPECT_EQ(c["usage"]["prompt_tokens"], 24);
      EXPECT_EQ(c["usage"]["completion_tokens"], 24);
      EXPECT_EQ(c["usage"]["total_tokens"], 48);
      continue;
    }
    EXPECT_FALSE(c.contains("usage"));
    const json& choice = c["choices"][0];
    if (choice["delta"].contains("content")) text += choice["delta"]["content"].get<std::string>();
    if (i + 3 == events.size()) {
      EXPECT_EQ(choice["finish_reason"], "stop");
    } else {
      EXPECT_TRUE(choice["finish_reason"].is_null());
    }
  }
  EXPECT_EQ(text, kChatEcho);
}

TEST_F(HttpServerTest, StreamingWithoutUsageHasNoUsageChunk) {
  start();
  Reply r = post("/v1/completions", R"({"model":"fake-model","prompt":"abcdef","stream":true,
                                        "max_tokens":4})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(c["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_FALSE(c.contains("usage"));
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "abcd");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST_F(HttpServerTest, CompletionsPromptForms) {
  start();
  Reply text = post("/v1/completions", R"({"model":"fake-model","prompt":"hello world"})");
  ASSERT_EQ(text.status, 200) << text.body;
  json j = json::parse(text.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  Reply ids = post("/v1/completions", R"({"model":"fake-model","prompt":[104,105,300]})");
  ASSERT_EQ(ids.status, 200) << ids.body;
  EXPECT_EQ(json::parse(ids.body)["choices"][0]["text"], "hi<300>");

  Reply stop = post("/v1/completions",
                    R"({"model":"fake-model","prompt":"hello world","stop":["o w"]})");
  ASSERT_EQ(stop.status, 200) << stop.body;
  EXPECT_EQ(json::parse(stop.body)["choices"][0]["text"], "hell");
  EXPECT_EQ(json::parse(stop.body)["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpServerTest, ErrorsAreOpenAIShaped) {
  start(FakeEngine::Options{.max_context_tokens = 64});
  Reply bad = post("/v1/chat/completions", "{nope");
  EXPECT_EQ(bad.status, 400);
  json e = json::parse(bad.body);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"]["message"].is_string());

  Reply model = post("/v1/completions", R"({"model":"nope","prompt":"x"})");
  EXPECT_EQ(model.status, 404);
  EXPECT_EQ(json::parse(model.body)["error"]["code"], "model_not_found");

  Reply n = post("/v1/completions", R"({"model":"fake-model","prompt":"x","n":3})");
  EXPECT_EQ(n.status, 400);
  EXPECT_EQ(json::parse(n.body)["error"]["param"], "n");

  Reply ctx = post("/v1/completions", R"({"model":"fake-model","prompt":"abcd","max_tokens":61})");
  EXPECT_EQ(ctx.status, 400);
  EXPECT_NE(json::parse(ctx.body)["error"]["message"].get<std::string>().find(
                "65 tokens (4 in the prompt, 61 in the completion)"),
            std::string::npos)
      << ctx.body;

  Reply ids = post("/v1/completions", R"({"model":"fake-model","prompt":[1,5000]})");
  EXPECT_EQ(ids.status, 400);

  EXPECT_EQ(get("/nowhere").status, 404);
  EXPECT_EQ(get("/v1/chat/completions").status, 405);
  EXPECT_EQ(post("/health", "{}").status, 405);
  // Bad requests leave nothing behind.
  EXPECT_EQ(engine_->submitted().size(), 0u);
}

TEST_F(HttpServerTest, ModelsEndpoint) {
  start();
  Reply r = get("/v1/models");
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "fake-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

TEST_F(HttpServerTest, HealthFollowsReadiness) {
  start(FakeEngine::Options{.ready = false});
  EXPECT_EQ(get("/health").status, 503);
  Reply gen = post("/v1/completions", R"({"model":"fake-model","prompt":"x"})");
  EXPECT_EQ(gen.status, 503);
  EXPECT_EQ(json::parse(gen.body)["error"]["type"], "server_error");
  engine_->set_ready(true);
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(HttpServerTest, MetricsAreParsablePrometheusText) {
  start();
  ASSERT_EQ(post("/v1/completions", R"({"model":"fake-model","prompt":"abc"})").status, 200);
  Reply r = get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["Content-Type"].rfind("text/plain; version=0.0.4", 0), 0u);
  // Every line is a comment or "name{labels} value" with a numeric value.
  std::map<std::string, double> samples;
  size_t pos = 0;
  while (pos < r.body.size()) {
    size_t end = r.body.find('\n', pos);
    ASSERT_NE(end, std::string::npos);
    std::string line = r.body.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# ", 0) == 0) continue;
    size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    std::string value = line.substr(sp + 1);
    char* endp = nullptr;
    double v = std::strtod(value.c_str(), &endp);
    EXPECT_TRUE(*endp == '\0' || value == "+Inf") << line;
    samples[line.substr(0, sp)] = v;
  }
  for (const char* name :
       {"oscar_requests_running", "oscar_requests_waiting", "oscar_prompt_tokens_total",
        "oscar_generation_tokens_total", "oscar_time_to_first_token_seconds_count",
        "oscar_time_per_output_token_seconds_count", "oscar_kv_pages_used{pool=\"bf16\"}",
        "oscar_kv_pages_total{pool=\"int2\"}", "oscar_prefix_cache_hit_rate",
        "oscar_kv_effective_bits_per_element",
        "oscar_time_to_first_token_seconds_bucket{le=\"+Inf\"}"}) {
    EXPECT_TRUE(samples.count(name)) << name;
  }
  EXPECT_EQ(samples["oscar_prompt_tokens_total"], 3);
  EXPECT_EQ(samples["oscar_generation_tokens_total"], 3);
  EXPECT_EQ(samples["oscar_time_to_first_token_seconds_count"], 1);
  EXPECT_EQ(samples["oscar_time_to_first_token_seconds_bucket{le=\"+Inf\"}"], 1);
  EXPECT_EQ(samples["oscar_http_responses_total{status=\"200\"}"], 1);
}

TEST_F(HttpServerTest, ApiKey) {
  ServerOptions sopt;
  sopt.api_key = "sekrit";
  start({}, sopt);
  Reply none = post("/v1/completions", R"({"model":"fake-model","prompt":"x"})");
  EXPECT_EQ(none.status, 401);
  json e = json::parse(none.body);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "Bearer sekrit"}}).status, 200);
  EXPECT_EQ(post("/v1/completions", R"({"model":"fake-model","prompt":"x"})",
                 {{"Authorization", "Bearer sekrit"}})
                .status,
            200);
  EXPECT_EQ(get("/health").status, 200);  // open without a key
  EXPECT_EQ(get("/metrics").status, 200);
}

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  start();
  Client c(server_->port());
  for (int i = 0; i < 3; ++i) {
    Reply r = c.request(http::verb::post, "/v1/completions",
                        R"({"model":"fake-model","prompt":"ab","stream":)" +
                            std::string(i % 2 ? "true" : "false") + "}");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(r.keep_alive);
  }
  Reply h = c.request(http::verb::get, "/health");
  EXPECT_EQ(h.status, 200);
}

TEST_F(HttpServerTest, OversizedBodyIs413) {
  start();
  Client c(server_->port());
  // Announce 9 MB, send a little: the server answers from the header alone.
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 9000000\r\n\r\n{\"model\":";
  net::write(c.socket(), net::buffer(head));
  Reply r = c.read_reply();
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "request_too_large");
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(HttpServerTest, ExpectContinueGetsTheGoAhead) {
  start();
  Client c(server_->port());
  std::string body = R"({"model":"fake-model","prompt":"abc"})";
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  net::write(c.socket(), net::buffer(head));
  const std::string want = "HTTP/1.1 100 Continue\r\n\r\n";
  std::string got(want.size(), '\0');
  net::read(c.socket(), net::buffer(got));
  EXPECT_EQ(got, want);
  net::write(c.socket(), net::buffer(body));
  Reply r = c.read_reply();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "abc");
}

TEST_F(HttpServerTest, OversizedHeaderIs431) {
  start();
  Reply r = get("/health", {{"X-Big", std::string(20 * 1024, 'a')}});
  EXPECT_EQ(r.status, 431) << r.body;
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamCancelsAndFreesPages) {
  start(FakeEngine::Options{.token_delay = std::chrono::milliseconds(5)});
  {
    Client c(server_->port());
    std::string body =
        R"({"model":"fake-model","prompt":"abcdefgh","stream":true,"max_tokens":400,"ignore_eos":true})";
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(c.socket(), net::buffer(req));
    // Read until a few content events have arrived, then hang up.
    std::string got;
    char buf[4096];
    while (got.find("\"text\":\"c\"") == std::string::npos) {
      beast::error_code ec;
      size_t n = c.socket().read_some(net::buffer(buf), ec);
      ASSERT_FALSE(ec) << ec.message() << " after: " << got;
      got.append(buf, n);
    }
    EXPECT_GT(engine_->pages_used(), 0);
    EXPECT_EQ(engine_->live_requests(), 1);
  }  // the socket closes here
  EXPECT_TRUE(wait_until([&] { return engine_->cancel_calls() >= 1; }));
  EXPECT_TRUE(wait_until([&] { return engine_->live_requests() == 0; }));
  EXPECT_EQ(engine_->pages_used(), 0);
  EXPECT_EQ(engine_->cancelled_requests(), 1u);
  EXPECT_EQ(server_->counters().client_disconnects, 1u);
  // The server keeps serving.
  EXPECT_EQ(post("/v1/completions", R"({"model":"fake-model","prompt":"ok"})").status, 200);
}

TEST_F(HttpServerTest, ClientDisconnectDuringNonStreamingRequestCancels) {
  start(FakeEngine::Options{.token_delay = std::chrono::milliseconds(5)});
  {
    Client c(server_->port());
    std::string body =
        R"({"model":"fake-model","prompt":"abc","max_tokens":400,"ignore_eos":true})";
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(c.socket(), net::buffer(req));
    ASSERT_TRUE(wait_until([&] { return engine_->live_requests() == 1; }));
  }
  EXPECT_TRUE(wait_until([&] { return engine_->live_requests() == 0; }));
  EXPECT_EQ(engine_->cancelled_requests(), 1u);
  EXPECT_EQ(engine_->pages_used(), 0);
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(HttpServerTest, ConcurrentStreams) {
  start();
  std::vector<std::thread> threads;
  std::vector<int> ok(6, 0);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      Reply r = post("/v1/chat/completions",
                     R"({"model":"fake-model","stream":true,"messages":[{"role":"user","content":"n)" +
                         std::to_string(i) + R"("}]})");
      std::vector<std::string> ev = sse_payloads(r.body);
      ok[i] = r.status == 200 && !ev.empty() && ev.back() == "[DONE]";
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ok[i], 1) << i;
  EXPECT_EQ(engine_->pages_used(), 0);
}

TEST_F(HttpServerTest, StopCancelsRequestsPastTheGracePeriod) {
  ServerOptions sopt;
  sopt.shutdown_grace = std::chrono::milliseconds(100);
  start(FakeEngine::Options{.token_delay = std::chrono::milliseconds(5)}, sopt);
  std::thread client([&] {
    post("/v1/completions",
         R"({"model":"fake-model","prompt":"abc","max_tokens":400,"ignore_eos":true,"stream":true})");
  });
  ASSERT_TRUE(wait_until([&] { return engine_->live_requests() == 1; }));
  auto t0 = std::chrono::steady_clock::now();
  server_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  client.join();
  EXPECT_TRUE(wait_until([&] { return engine_->live_requests() == 0; }));
  EXPECT_EQ(engine_->pages_used(), 0);
}

TEST_F(HttpServerTest, StopLetsShortRequestsFinish) {
  start(FakeEngine::Options{.token_delay = std::chrono::milliseconds(2)});
  Reply r;
  std::thread client([&] {
    r = post("/v1/completions", R"({"model":"fake-model","prompt":"abcdefghij"})");
  });
  ASSERT_TRUE(wait_until([&] { return engine_->live_requests() == 1; }));
  server_->stop();
  client.join();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "abcdefghij");
}

TEST(HttpServerStart, BusyPortIsAnError) {
  FakeEngine engine;
  ServerOptions opt;
  opt.port = 0;
  HttpServer a(&engine, opt);
  ASSERT_TRUE(a.start().ok());
  opt.port = a.port();
  HttpServer b(&engine, opt);
  Status st = b.start();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot listen"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace oscar::server
