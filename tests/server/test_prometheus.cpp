// render_prometheus: every sample line parses as Prometheus text (name, optional labels, a
// number), every family has HELP and TYPE before its samples, and the vLLM-named families that
// KV-aware routers scrape carry the model label and the values of the snapshot.
#include "server/prometheus.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <regex>
#include <sstream>
#include <string>

namespace oscar::server {
namespace {

engine::EngineMetrics snapshot() {
  engine::EngineMetrics m;
  m.requests_running = 3;
  m.requests_waiting = 2;
  m.kv_pools = {{"bf16", 30, 120, /*cached=*/25, /*evictable=*/10},
                {"int2", 90, 100, /*cached=*/70, /*evictable=*/50}};
  m.prefix_cache_query_tokens = 1000;
  m.prefix_cache_hit_tokens = 640;
  m.model_name = "tiny \"qwen3\"";
  m.kv_page_size = 16;
  m.time_to_first_token_seconds.upper_bounds = {0.1, 1};
  m.time_to_first_token_seconds.counts = {1, 2, 3};
  m.time_to_first_token_seconds.sum = 9.5;
  m.time_per_output_token_seconds.upper_bounds = {0.01};
  m.num_preemptions_total = 7;
  m.time_per_output_token_seconds.counts = {4, 0};
  return m;
}

TEST(Prometheus, ParsesAndCarriesVllmFamilies) {
  const std::string text = render_prometheus(snapshot(), ServerCounters{});
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEInfNa]+)$)");
  std::map<std::string, std::string> typed;  // family -> TYPE
  std::map<std::string, double> values;      // whole sample (name + labels) -> value
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      typed[name] = type;
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "not a sample line: " << line;
    std::string family = m[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!typed.count(family) && family.size() > std::strlen(suffix) &&
          family.compare(family.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
        family = family.substr(0, family.size() - std::strlen(suffix));
    EXPECT_TRUE(typed.count(family)) << "sample before its TYPE: " << line;
    values[std::string(m[1]) + std::string(m[2])] = std::stod(m[3]);
  }
  const std::string l = R"({model_name="tiny \"qwen3\""})";
  EXPECT_EQ(typed["vllm:num_requests_running"], "gauge");
  EXPECT_EQ(values["vllm:num_requests_running" + l], 3);
  EXPECT_EQ(values["vllm:num_requests_waiting" + l], 2);
  EXPECT_EQ(typed["vllm:num_preemptions_total"], "counter");
  EXPECT_EQ(values["vllm:num_preemptions_total" + l], 7);
  EXPECT_EQ(values["oscar_preemptions_total"], 7);
  // The fullest pool, evictable prefix-cache pages counted as free: (90 - 50) / 100.
  EXPECT_DOUBLE_EQ(values["vllm:kv_cache_usage_perc" + l], 0.4);
  EXPECT_EQ(values[R"(oscar_kv_pages_used{pool="int2"})"], 90);
  EXPECT_EQ(values[R"(oscar_kv_pages_cached{pool="bf16"})"], 25);
  EXPECT_EQ(values[R"(oscar_kv_pages_cached{pool="int2"})"], 70);
  EXPECT_EQ(typed["oscar_kv_pages_evictable"], "gauge");
  EXPECT_EQ(values[R"(oscar_kv_pages_evictable{pool="int2"})"], 50);
  // vLLM's counter names, as its /metrics exposes them (with _total).
  EXPECT_EQ(typed["vllm:prefix_cache_queries_total"], "counter");
  EXPECT_EQ(values["vllm:prefix_cache_queries_total" + l], 1000);
  EXPECT_EQ(typed["vllm:prefix_cache_hits_total"], "counter");
  EXPECT_EQ(values["vllm:prefix_cache_hits_total" + l], 640);
  EXPECT_EQ(typed.count("vllm:prefix_cache_queries"), 0u);
  EXPECT_EQ(typed["vllm:time_to_first_token_seconds"], "histogram");
  EXPECT_EQ(values[R"(vllm:time_to_first_token_seconds_bucket{model_name="tiny \"qwen3\"",le="1"})"], 3);
  EXPECT_EQ(values[R"(vllm:time_to_first_token_seconds_bucket{model_name="tiny \"qwen3\"",le="+Inf"})"], 6);
  EXPECT_EQ(values["vllm:time_to_first_token_seconds_count" + l], 6);
  EXPECT_DOUBLE_EQ(values["vllm:time_to_first_token_seconds_sum" + l], 9.5);
  EXPECT_EQ(values["vllm:time_per_output_token_seconds_count" + l], 4);
  EXPECT_EQ(values[R"(vllm:cache_config_info{block_size="16",model_name="tiny \"qwen3\""})"], 1);
  // oscar's own families are still there.
  EXPECT_EQ(values["oscar_requests_running"], 3);
}

}  // namespace
}  // namespace oscar::server
