// Prometheus text exposition (format 0.0.4) of the engine's metrics and the server's own request
// counters, for GET /metrics. Pure: a snapshot in, text out. Metric names are declared here and
// nowhere else.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/engine_api.h"

namespace oscar::server {

// Counters the HTTP layer keeps itself.
struct ServerCounters {
  std::map<int, uint64_t> responses_by_status;  // HTTP status -> responses sent
  uint64_t client_disconnects = 0;              // streams/requests cancelled by a disconnect
  uint64_t accept_errors = 0;                   // accept() failures (EMFILE, ...), each backed off
  uint64_t connections_rejected = 0;            // beyond max_connections: 503 and closed
  uint64_t connections_evicted = 0;             // idle ones closed to admit a new connection
};

// Emits, with HELP and TYPE lines:
//   oscar_requests_running, oscar_requests_waiting (gauges)
//   oscar_prompt_tokens_total, oscar_generation_tokens_total (counters)
//   oscar_time_to_first_token_seconds, oscar_time_per_output_token_seconds (histograms)
//   oscar_kv_pages_used{pool=...}, oscar_kv_pages_total{pool=...},
//   oscar_kv_pages_cached{pool=...}, oscar_kv_pages_evictable{pool=...} (gauges: pages the prefix
//   cache holds, and those only it holds)
//   oscar_prefix_cache_hit_rate, oscar_kv_effective_bits_per_element (gauges)
//   oscar_http_responses_total{status=...}, oscar_client_disconnects_total,
//   oscar_http_accept_errors_total, oscar_http_connections_rejected_total,
//   oscar_http_connections_evicted_total (counters)
// and, for routers that scrape vLLM (llm-d, Dynamo), vLLM's names labelled with model_name:
//   vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (0-1, the
//   fullest pool, evictable prefix-cache pages counted as free), vllm:num_preemptions_total,
//   vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (tokens, counters),
//   vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds (histograms),
//   vllm:cache_config_info{block_size=page_size} 1
std::string render_prometheus(const engine::EngineMetrics& m, const ServerCounters& c);

}  // namespace oscar::server
