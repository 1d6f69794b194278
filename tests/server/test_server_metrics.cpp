// GET /metrics of the real scheduler behind the server, parsed as Prometheus text (name, labels,
// value; every sample after its family's TYPE): before the first request the vLLM families carry
// the served model name, cache_config_info the page size and the page gauges every pool; after a
// request whose prompt stays in the prefix cache, an idle server reads vllm:kv_cache_usage_perc
// 0 (as vLLM: evictable pages are free) while oscar_kv_pages_cached shows the cache, and the
// prefix-cache counters have vLLM's _total names. Raw sockets with Connection: close.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "raw_http.h"
#include "server/http_server.h"

namespace oscar::server {
namespace {

using json = nlohmann::json;

std::string roundtrip(uint16_t port, const std::string& request) {
  return test::raw_roundtrip(port, request);
}
std::string post(uint16_t port, const std::string& path, const std::string& body) {
  return test::raw_post(port, path, body);
}

// /metrics as {sample name + labels: value}; fails the test on a line that is not Prometheus
// text or a sample before its family's TYPE.
struct Metrics {
  std::map<std::string, std::string> types;  // family -> TYPE
  std::map<std::string, double> values;      // name{labels} -> value
  bool has(const std::string& key) const { return values.count(key) > 0; }
  double at(const std::string& key) const {
    auto it = values.find(key);
    EXPECT_NE(it, values.end()) << "no sample " << key;
    return it == values.end() ? -1 : it->second;
  }
  // The sum over a per-pool family's samples.
  double sum(const std::string& family) const {
    double s = 0;
    for (const auto& [k, v] : values)
      if (k.rfind(family + "{", 0) == 0) s += v;
    return s;
  }
};

Metrics scrape(uint16_t port) {
  const std::string raw =
      roundtrip(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  Metrics m;
  const size_t at = raw.find("\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw.substr(0, 60);
  if (at == std::string::npos) return m;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEInfNa]+)$)");
  std::istringstream in(raw.substr(at + 4));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      m.types[name] = type;
      continue;
    }
    std::smatch s;
    EXPECT_TRUE(std::regex_match(line, s, sample)) << "not a sample line: " << line;
    if (s.empty()) continue;
    std::string family = s[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!m.types.count(family) && family.size() > std::strlen(suffix) &&
          family.compare(family.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
        family = family.substr(0, family.size() - std::strlen(suffix));
    EXPECT_TRUE(m.types.count(family)) << "sample before its TYPE: " << line;
    m.values[std::string(s[1]) + std::string(s[2])] = std::stod(s[3]);
  }
  return m;
}

TEST(ServerMetrics, VllmFamiliesFromStartAndIdleUsageExcludesTheCache) {
  engine::RuntimeOptions o;
  o.model_dir = "models/tiny-qwen3";
  o.cache_mode = "int2-hadamard";  // two pools: bf16 (sinks, recent window) and int2 (history)
  o.kv_budget_bytes = size_t{16} << 20;
  auto rt = engine::Runtime::create(o);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  const int32_t page_size = rt.value()->spec().regions.page_size;
  auto sched = engine::Scheduler::create(std::move(rt).value(), engine::SchedulerOptions{});
  ASSERT_TRUE(sched.ok()) << sched.status().to_string();
  ServerOptions sopt;
  sopt.port = 0;
  sopt.served_model_name = "tiny";
  HttpServer server(sched.value().get(), sopt);
  ASSERT_TRUE(server.start().ok());
  const std::string l = R"({model_name="tiny"})";

  // Before the first request.
  Metrics m0 = scrape(server.port());
  EXPECT_EQ(
      m0.at(str_format(R"(vllm:cache_config_info{block_size="%d",model_name="tiny"})", page_size)),
      1);
  EXPECT_EQ(m0.at("vllm:kv_cache_usage_perc" + l), 0);
  EXPECT_EQ(m0.at("vllm:num_requests_running" + l), 0);
  EXPECT_EQ(m0.types["vllm:prefix_cache_queries_total"], "counter");
  EXPECT_EQ(m0.at("vllm:prefix_cache_queries_total" + l), 0);
  EXPECT_EQ(m0.at("vllm:prefix_cache_hits_total" + l), 0);
  EXPECT_FALSE(m0.has("vllm:prefix_cache_queries" + l));
  EXPECT_GT(m0.at(R"(oscar_kv_pages_total{pool="bf16"})"), 0);
  EXPECT_GT(m0.at(R"(oscar_kv_pages_total{pool="int2"})"), 0);
  EXPECT_EQ(m0.sum("oscar_kv_pages_used"), 0);
  EXPECT_EQ(m0.sum("oscar_kv_pages_cached"), 0);

  // A prompt long enough to leave sink and history pages in the prefix cache, twice.
  std::vector<int32_t> prompt;
  while (prompt.size() < 1200) {
    auto more = sched.value()->tokenize("def add(a, b):\n    return a + b\n\n").value();
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  const std::string body =
      json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}}.dump();
  for (int i = 0; i < 2; ++i) {
    const std::string r = post(server.port(), "/v1/completions", body);
    ASSERT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r.substr(0, 300);
  }
  // Idle: the snapshot follows the request's end within a loop iteration.
  Metrics m1;
  for (int i = 0; i < 200; ++i) {
    m1 = scrape(server.port());
    if (m1.at("vllm:num_requests_running" + l) == 0 && m1.sum("oscar_kv_pages_cached") > 0 &&
        m1.at("vllm:kv_cache_usage_perc" + l) == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(m1.sum("oscar_kv_pages_cached"), 0);
  EXPECT_EQ(m1.sum("oscar_kv_pages_evictable"), m1.sum("oscar_kv_pages_cached"));
  EXPECT_EQ(m1.sum("oscar_kv_pages_used"), m1.sum("oscar_kv_pages_cached"));
  EXPECT_EQ(m1.at("vllm:kv_cache_usage_perc" + l), 0);  // vLLM's reading of a warm idle server
  EXPECT_GE(m1.at("vllm:prefix_cache_queries_total" + l), static_cast<double>(prompt.size()));
  EXPECT_GT(m1.at("vllm:prefix_cache_hits_total" + l), 0);  // the second request's prefix
  EXPECT_LE(m1.at("vllm:prefix_cache_hits_total" + l),
            m1.at("vllm:prefix_cache_queries_total" + l));
  server.stop();
}

}  // namespace
}  // namespace oscar::server
