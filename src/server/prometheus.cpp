#include "server/prometheus.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/status.h"

namespace oscar::server {

namespace {

// Prometheus floats: shortest round-trip form, +Inf/-Inf/NaN spelled as the format wants.
std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // Prefer the short form when it round-trips.
  char short_buf[64];
  std::snprintf(short_buf, sizeof(short_buf), "%g", v);
  return std::strtod(short_buf, nullptr) == v ? short_buf : buf;
}

// Label values escape backslash, quote and newline.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void head(std::string* out, const char* name, const char* type, const char* help) {
  *out += str_format("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void scalar(std::string* out, const char* name, const char* type, const char* help, double v) {
  head(out, name, type, help);
  *out += str_format("%s %s\n", name, num(v).c_str());
}

void histogram(std::string* out, const char* name, const char* help, const engine::Histogram& h) {
  head(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
    if (i < h.counts.size()) cumulative += h.counts[i];
    *out += str_format("%s_bucket{le=\"%s\"} %llu\n", name, num(h.upper_bounds[i]).c_str(),
                   static_cast<unsigned long long>(cumulative));
  }
  for (size_t i = h.upper_bounds.size(); i < h.counts.size(); ++i) cumulative += h.counts[i];
  *out += str_format("%s_bucket{le=\"+Inf\"} %llu\n", name, static_cast<unsigned long long>(cumulative));
  *out += str_format("%s_sum %s\n", name, num(h.sum).c_str());
  *out += str_format("%s_count %llu\n", name, static_cast<unsigned long long>(cumulative));
}

}  // namespace

// The families a router that scrapes vLLM reads (vLLM v1 names and units), labelled with the
// model as vLLM labels them.
void vllm_families(std::string* out, const engine::EngineMetrics& m) {
  const std::string l = "{model_name=\"" + label(m.model_name) + "\"}";
  auto sample = [&](const char* name, const char* type, const char* help, double v) {
    head(out, name, type, help);
    *out += str_format("%s%s %s\n", name, l.c_str(), num(v).c_str());
  };
  sample("vllm:num_requests_running", "gauge", "Requests in the running batch (oscar).",
         m.requests_running);
  sample("vllm:num_requests_waiting", "gauge", "Requests waiting for admission (oscar).",
         m.requests_waiting);
  sample("vllm:num_preemptions_total", "counter",
         "Running requests preempted because the KV cache ran out (recomputed later).",
         static_cast<double>(m.num_preemptions_total));
  // One fraction for several pools: the fullest pool is the one that stops admission. Pages only
  // the prefix cache holds are evictable on demand, so they count as free (as in vLLM, whose idle
  // warm replica reads about 0).
  double usage = 0;
  for (const engine::KvPoolUsage& p : m.kv_pools)
    if (p.pages_total > 0)
      usage = std::max(usage, static_cast<double>(p.pages_used - p.pages_evictable) /
                                  static_cast<double>(p.pages_total));
  sample("vllm:kv_cache_usage_perc", "gauge",
         "KV-cache usage, 0 to 1: the fullest of oscar's page pools, evictable prefix-cache pages "
         "excluded.",
         usage);
  // Counters under their exposed names (what prometheus_client writes for vLLM's counters).
  sample("vllm:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.",
         static_cast<double>(m.prefix_cache_query_tokens));
  sample("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
         static_cast<double>(m.prefix_cache_hit_tokens));
  auto hist = [&](const char* name, const char* help, const engine::Histogram& h) {
    std::string body;
    histogram(&body, name, help, h);
    // Label every sample line (not the HELP/TYPE lines) with the model.
    std::string labelled;
    size_t at = 0;
    while (at < body.size()) {
      size_t end = body.find('\n', at);
      std::string line = body.substr(at, end - at);
      at = end + 1;
      if (line.rfind("#", 0) != 0) {
        const size_t brace = line.find('{'), space = line.find(' ');
        if (brace != std::string::npos && brace < space)
          line.insert(brace + 1, "model_name=\"" + label(m.model_name) + "\",");
        else
          line.insert(space, l);
      }
      labelled += line + "\n";
    }
    *out += labelled;
  };
  hist("vllm:time_to_first_token_seconds", "Time to first token.", m.time_to_first_token_seconds);
  hist("vllm:time_per_output_token_seconds", "Time per output token.",
       m.time_per_output_token_seconds);
  head(out, "vllm:cache_config_info", "gauge", "KV-cache configuration (value 1).");
  *out += str_format("vllm:cache_config_info{block_size=\"%d\",model_name=\"%s\"} 1\n",
                     m.kv_page_size, label(m.model_name).c_str());
}

std::string render_prometheus(const engine::EngineMetrics& m, const ServerCounters& c) {
  std::string out;
  scalar(&out, "oscar_requests_running", "gauge", "Requests being decoded.", m.requests_running);
  scalar(&out, "oscar_requests_waiting", "gauge", "Requests queued for admission.",
         m.requests_waiting);
  scalar(&out, "oscar_prompt_tokens_total", "counter", "Prompt tokens processed.",
         static_cast<double>(m.prompt_tokens_total));
  scalar(&out, "oscar_generation_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(m.generation_tokens_total));
  scalar(&out, "oscar_preemptions_total", "counter",
         "Running requests preempted because a KV pool ran dry (resumed by recompute).",
         static_cast<double>(m.num_preemptions_total));
  histogram(&out, "oscar_time_to_first_token_seconds", "Time from arrival to first token.",
            m.time_to_first_token_seconds);
  histogram(&out, "oscar_time_per_output_token_seconds", "Time between output tokens.",
            m.time_per_output_token_seconds);
  head(&out, "oscar_kv_pages_used", "gauge", "KV cache pages in use, per pool.");
  for (const auto& p : m.kv_pools) {
    out += str_format("oscar_kv_pages_used{pool=\"%s\"} %lld\n", label(p.pool).c_str(),
                  static_cast<long long>(p.pages_used));
  }
  head(&out, "oscar_kv_pages_total", "gauge", "KV cache pages, per pool.");
  for (const auto& p : m.kv_pools) {
    out += str_format("oscar_kv_pages_total{pool=\"%s\"} %lld\n", label(p.pool).c_str(),
                  static_cast<long long>(p.pages_total));
  }
  head(&out, "oscar_kv_pages_cached", "gauge",
       "KV cache pages the prefix cache holds, per pool (part of oscar_kv_pages_used).");
  for (const auto& p : m.kv_pools) {
    out += str_format("oscar_kv_pages_cached{pool=\"%s\"} %lld\n", label(p.pool).c_str(),
                      static_cast<long long>(p.pages_cached));
  }
  head(&out, "oscar_kv_pages_evictable", "gauge",
       "KV cache pages only the prefix cache holds, per pool: freed when a request needs room.");
  for (const auto& p : m.kv_pools) {
    out += str_format("oscar_kv_pages_evictable{pool=\"%s\"} %lld\n", label(p.pool).c_str(),
                      static_cast<long long>(p.pages_evictable));
  }
  if (m.device_memory_total_bytes >= 0) {
    scalar(&out, "oscar_device_memory_used_bytes", "gauge",
           "GPU memory in use (weights, KV pages, activations, and other processes').",
           static_cast<double>(m.device_memory_used_bytes));
    scalar(&out, "oscar_device_memory_total_bytes", "gauge", "GPU memory in all.",
           static_cast<double>(m.device_memory_total_bytes));
  }
  scalar(&out, "oscar_prefix_cache_hit_rate", "gauge",
         "Fraction of prompt tokens served from the prefix cache.", m.prefix_cache_hit_rate);
  scalar(&out, "oscar_kv_effective_bits_per_element", "gauge",
         "Average stored bits per KV element, scales included.", m.kv_effective_bits_per_element);
  head(&out, "oscar_http_responses_total", "counter", "HTTP responses sent, by status.");
  for (const auto& [status, n] : c.responses_by_status) {
    out += str_format("oscar_http_responses_total{status=\"%d\"} %llu\n", status,
                  static_cast<unsigned long long>(n));
  }
  scalar(&out, "oscar_client_disconnects_total", "counter",
         "Requests cancelled because the client went away.",
         static_cast<double>(c.client_disconnects));
  scalar(&out, "oscar_http_accept_errors_total", "counter",
         "accept() failures (e.g. out of file descriptors); each one backs off before retrying.",
         static_cast<double>(c.accept_errors));
  scalar(&out, "oscar_http_connections_rejected_total", "counter",
         "Connections beyond --max-connections, answered 503 and closed.",
         static_cast<double>(c.connections_rejected));
  scalar(&out, "oscar_http_connections_evicted_total", "counter",
         "Idle connections closed at --max-connections to admit a new one.",
         static_cast<double>(c.connections_evicted));
  vllm_families(&out, m);
  return out;
}

}  // namespace oscar::server
