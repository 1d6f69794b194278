// POST /v1/generate and POST /v1/abort (server/generate_endpoint.h) over the real scheduler on the
// embedded model: greedy output ids are the tokens /v1/completions answers with (its text is their
// decoding) and the ids the engine gives directly; a stream's ids concatenate to the whole answer;
// stop_token_ids end the answer at the stop token; an abort ends a running stream with
// "cancelled" and gives every KV page back; bad input is an OpenAI-format 400, an unknown abort id
// a 404. One server for the whole suite; raw sockets with Connection: close.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "raw_http.h"
#include "server/http_server.h"

namespace oscar::server {
namespace {

using json = nlohmann::json;

struct Reply {
  int status = 0;
  std::string body;  // after the headers (chunked framing left in for streams)
};
Reply split(const std::string& raw) {
  Reply r;
  if (raw.size() > 12) r.status = std::atoi(raw.substr(9, 3).c_str());
  const size_t at = raw.find("\r\n\r\n");
  if (at != std::string::npos) r.body = raw.substr(at + 4);
  return r;
}

Reply request(uint16_t port, const std::string& method, const std::string& path,
              const std::string& body) {
  return split(test::raw_roundtrip(port, test::raw_request(method, path, body)));
}

// The data events of a /v1/generate stream.
struct Stream {
  std::vector<int32_t> ids;
  std::string finish_reason;
  json usage;
  std::string error;
  bool done = false;
};
Stream parse_stream(const std::string& raw) {
  Stream s;
  for (size_t at = raw.find("data: "); at != std::string::npos; at = raw.find("data: ", at + 1)) {
    const size_t end = raw.find("\n", at);
    const std::string data = raw.substr(at + 6, end - at - 6);
    if (data.rfind("[DONE]", 0) == 0) {
      s.done = true;
      continue;
    }
    const json j = json::parse(data, nullptr, false);
    if (j.contains("error")) s.error = j["error"].value("message", "?");
    if (j.contains("output_ids")) {
      for (const auto& t : j["output_ids"]) s.ids.push_back(t.get<int32_t>());
    }
    if (j.contains("finish_reason")) s.finish_reason = j["finish_reason"].get<std::string>();
    if (j.contains("usage")) s.usage = j["usage"];
  }
  return s;
}

class GenerateEndpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine::RuntimeOptions o;
    o.model_dir = "models/tiny-qwen3";
    o.cache_mode = "int2-hadamard";
    o.kv_budget_bytes = size_t{64} << 20;
    auto rt = engine::Runtime::create(o);
    ASSERT_TRUE(rt.ok()) << rt.status().to_string();
    runtime_ = rt.value().get();
    engine::SchedulerOptions so;
    so.prefix_cache = false;  // so that every page comes back when nothing runs
    auto sched = engine::Scheduler::create(std::move(rt).value(), so);
    ASSERT_TRUE(sched.ok()) << sched.status().to_string();
    sched_ = std::move(sched).value().release();
    ServerOptions sopt;
    sopt.port = 0;
    server_ = new HttpServer(sched_, sopt);
    ASSERT_TRUE(server_->start().ok());
    prompt_ = new std::vector<int32_t>(sched_->tokenize("def add(a, b):\n    return").value());
  }
  static void TearDownTestSuite() {
    if (server_) server_->stop();
    delete server_;
    if (sched_) sched_->shutdown();
    delete sched_;
    delete prompt_;
  }

  static uint16_t port() { return server_->port(); }
  static int64_t pages_used() {
    int64_t used = 0;
    for (const auto& p : sched_->metrics().kv_pools) used += p.pages_used;
    return used;
  }
  static std::string gen_body(const std::vector<int32_t>& ids, int max_tokens, bool stream,
                              json extra = json::object()) {
    json j = {
        {"input_ids", ids}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", stream}};
    j.update(extra);
    return j.dump();
  }

  static inline engine::Runtime* runtime_ = nullptr;
  static inline engine::Scheduler* sched_ = nullptr;
  static inline HttpServer* server_ = nullptr;
  static inline std::vector<int32_t>* prompt_ = nullptr;
};

TEST_F(GenerateEndpoint, GreedyIdsAreTheCompletionsTokens) {
  const Reply g = request(port(), "POST", "/v1/generate", gen_body(*prompt_, 12, false));
  ASSERT_EQ(g.status, 200) << g.body;
  const json gj = json::parse(g.body);
  const auto ids = gj["output_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_TRUE(gj["request_id"].get<std::string>().rfind("gen-", 0) == 0) << g.body;
  EXPECT_EQ(gj["usage"]["prompt_tokens"].get<int>(), static_cast<int>(prompt_->size()));
  EXPECT_EQ(gj["usage"]["completion_tokens"].get<int>(), static_cast<int>(ids.size()));

  const Reply c = request(
      port(), "POST", "/v1/completions",
      json{{"model", "tiny-qwen3"}, {"prompt", *prompt_}, {"max_tokens", 12}, {"temperature", 0}}
          .dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = json::parse(c.body);
  EXPECT_EQ(cj["usage"]["completion_tokens"].get<int>(), static_cast<int>(ids.size()));
  EXPECT_EQ(cj["choices"][0]["finish_reason"], gj["finish_reason"]);
  EXPECT_EQ(runtime_->tokenizer().decode(ids, /*skip_special=*/true),
            cj["choices"][0]["text"].get<std::string>());

  // The engine's own ids for the same request.
  std::promise<std::vector<int32_t>> done;
  std::vector<int32_t> direct;
  engine::GenerationRequest req;
  req.request_id = "direct";
  req.prompt_ids = *prompt_;
  req.sampling.config.temperature = 0;
  req.max_tokens = 12;
  ASSERT_TRUE(sched_
                  ->submit(req,
                           [&](const engine::GenerationEvent& ev) {
                             if (ev.kind == engine::GenerationEvent::kToken)
                               direct.push_back(ev.token_id);
                             else
                               done.set_value(direct);
                           })
                  .ok());
  EXPECT_EQ(done.get_future().get(), ids);
}

TEST_F(GenerateEndpoint, StreamConcatenatesToTheWholeAnswer) {
  const Reply whole = request(port(), "POST", "/v1/generate",
                              gen_body(*prompt_, 10, false, {{"request_id", "mine-1"}}));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json wj = json::parse(whole.body);
  EXPECT_EQ(wj["request_id"], "mine-1");
  const Reply st = request(port(), "POST", "/v1/generate", gen_body(*prompt_, 10, true));
  ASSERT_EQ(st.status, 200);
  const Stream s = parse_stream(st.body);
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(s.error.empty()) << s.error;
  EXPECT_EQ(s.ids, wj["output_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(s.finish_reason, wj["finish_reason"].get<std::string>());
  EXPECT_EQ(s.usage, wj["usage"]);
}

TEST_F(GenerateEndpoint, StopTokenIdsEndTheAnswer) {
  const Reply whole =
      request(port(), "POST", "/v1/generate", gen_body(*prompt_, 8, false, {{"ignore_eos", true}}));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const auto ids = json::parse(whole.body)["output_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 3u);
  const int32_t stop = ids[2];
  const size_t first = static_cast<size_t>(std::find(ids.begin(), ids.end(), stop) - ids.begin());
  const Reply cut =
      request(port(), "POST", "/v1/generate",
              gen_body(*prompt_, 8, false, {{"ignore_eos", true}, {"stop_token_ids", {stop}}}));
  ASSERT_EQ(cut.status, 200) << cut.body;
  const json cj = json::parse(cut.body);
  EXPECT_EQ(cj["output_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(first) + 1));
  EXPECT_EQ(cj["finish_reason"], "stop");
}

TEST_F(GenerateEndpoint, AbortEndsTheStreamAndFreesPages) {
  const int fd = test::raw_connect(port());
  ASSERT_GE(fd, 0);
  const std::string req = test::raw_request(
      "POST", "/v1/generate",
      gen_body(*prompt_, 4000, true, {{"ignore_eos", true}, {"request_id", "abort-me"}}));
  (void)!write(fd, req.data(), req.size());
  // Read until the first token event, so the request is running.
  std::string raw;
  char buf[4096];
  while (raw.find("output_ids") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof buf);
    ASSERT_GT(n, 0) << raw;
    raw.append(buf, static_cast<size_t>(n));
  }
  // The metrics snapshot follows the scheduler's loop, a step behind the first token.
  for (int i = 0; i < 200 && (pages_used() == 0 || sched_->metrics().requests_running == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(pages_used(), 0);
  EXPECT_EQ(sched_->metrics().requests_running, 1);
  const Reply a = request(port(), "POST", "/v1/abort", R"({"request_id": "abort-me"})");
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(json::parse(a.body, nullptr, false)["aborted"], true) << a.body;
  const Stream s = parse_stream(test::raw_read_all(fd, raw));
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.finish_reason, "cancelled");
  EXPECT_LT(s.ids.size(), 4000u);
  for (int i = 0; i < 200 && (pages_used() != 0 || sched_->metrics().requests_running != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pages_used(), 0);
  EXPECT_EQ(sched_->metrics().requests_running, 0);
  EXPECT_EQ(sched_->metrics().requests_waiting, 0);

  // Gone now: a second abort is a 404 in the OpenAI format.
  const Reply again = request(port(), "POST", "/v1/abort", R"({"request_id": "abort-me"})");
  EXPECT_EQ(again.status, 404) << again.body;
  EXPECT_EQ(json::parse(again.body)["error"]["code"], "request_not_found");
}

TEST_F(GenerateEndpoint, BadInputIs400) {
  const int vocab = sched_->info().vocab_size;
  const int ctx = sched_->info().max_context_tokens;
  struct Case {
    std::string path, body, param;
  };
  const std::vector<Case> cases = {
      {"/v1/generate", R"({"input_ids": []})", "input_ids"},
      {"/v1/generate", R"({"max_tokens": 4})", "input_ids"},
      {"/v1/generate", R"({"input_ids": "hello"})", "input_ids"},
      {"/v1/generate", json{{"input_ids", {1, vocab}}}.dump(), "input_ids"},
      {"/v1/generate", R"({"input_ids": [1, -2]})", "input_ids"},
      {"/v1/generate", R"({"input_ids": [1, 2.5]})", "input_ids"},
      {"/v1/generate", json{{"input_ids", std::vector<int>(static_cast<size_t>(ctx), 1)}}.dump(),
       "input_ids"},
      {"/v1/generate", json{{"input_ids", {1, 2}}, {"max_tokens", ctx}}.dump(), ""},
      {"/v1/generate", R"({"input_ids": [1], "max_tokens": 0})", "max_tokens"},
      {"/v1/generate", R"({"input_ids": [1], "temperature": 3})", "temperature"},
      {"/v1/generate", R"({"input_ids": [1], "top_p": 0})", "top_p"},
      {"/v1/generate", json{{"input_ids", {1}}, {"stop_token_ids", {vocab}}}.dump(),
       "stop_token_ids"},
      {"/v1/generate", R"({"input_ids": [1], "stream": "yes"})", "stream"},
      {"/v1/generate", R"({"input_ids": [1], "request_id": ""})", "request_id"},
      {"/v1/generate", "not json", ""},
      {"/v1/abort", R"({})", "request_id"},
      {"/v1/abort", R"({"request_id": 7})", "request_id"},
  };
  for (const Case& c : cases) {
    const Reply r = request(port(), "POST", c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.path << " " << c.body.substr(0, 80) << " -> " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param) << r.body;
    }
  }
  EXPECT_EQ(request(port(), "GET", "/v1/generate", "").status, 405);
  // The server still answers.
  EXPECT_EQ(request(port(), "POST", "/v1/generate", gen_body(*prompt_, 2, false)).status, 200);
}

}  // namespace
}  // namespace oscar::server
