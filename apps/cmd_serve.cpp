// `oscar serve`: the OpenAI-compatible HTTP server over the continuous-batching scheduler.
#include <cstdio>
#include <filesystem>

#include "apps/commands.h"
#include "apps/runtime_options.h"
#include "core/log.h"
#include "engine/scheduler.h"
#include "server/http_server.h"

namespace oscar::apps {

Command add_serve(CLI::App& app) {
  auto rt = std::make_shared<engine::RuntimeOptions>();
  auto sched = std::make_shared<engine::SchedulerOptions>();
  auto http = std::make_shared<server::ServerOptions>();
  auto budget_mib = std::make_shared<double>(1024);
  add_runtime_options(app, *rt);
  app.add_option("--host", http->host, "Address to listen on")->capture_default_str();
  app.add_option("--port", http->port, "Port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--api-key", http->api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  app.add_option("--served-model-name", http->served_model_name,
                 "Model name clients send (default: the model directory's name)");
  app.add_option("--kv-budget", *budget_mib, "KV-cache memory for all sequences, in MiB")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-split-tokens", rt->split_tokens,
                 "Split the budget between the BF16 and INT2 pools for sequences of this length")
      ->capture_default_str();
  app.add_option("--max-running", sched->max_running, "Sequences decoded together")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", sched->max_batch_tokens,
                 "Tokens per forward step (decode + prefill chunks)")->capture_default_str();
  app.add_option("--prefill-chunk", sched->prefill_chunk, "Prefill tokens per request per step")
      ->capture_default_str();
  app.add_flag("!--no-prefix-cache", sched->prefix_cache,
               "Do not share prompt prefixes between requests (radix prefix cache)");
  app.add_option("--http-threads", http->n_threads, "HTTP I/O threads")->capture_default_str();
  return [=]() -> int {
    engine::RuntimeOptions o = *rt;
    o.kv_budget_bytes = static_cast<size_t>(*budget_mib * 1024 * 1024);
    auto runtime = engine::Runtime::create(o);
    if (!runtime.ok()) {
      std::fprintf(stderr, "error: %s\n", runtime.status().message().c_str());
      return 1;
    }
    engine::SchedulerOptions so = *sched;
    so.model_name = http->served_model_name.empty()
                        ? std::filesystem::path(o.model_dir).filename().string()
                        : http->served_model_name;
    if (so.model_name.empty()) so.model_name = "model";
    auto scheduler = engine::Scheduler::create(std::move(runtime).value(), so);
    if (!scheduler.ok()) {
      std::fprintf(stderr, "error: %s\n", scheduler.status().message().c_str());
      return 1;
    }
    server::ServerOptions ho = *http;
    ho.served_model_name = so.model_name;
    OSCAR_LOG_INFO("serve: model_name=%s host=%s port=%u kv_budget_mib=%.0f max_running=%d",
                   so.model_name.c_str(), ho.host.c_str(), ho.port, *budget_mib, so.max_running);
    Status st = server::serve_until_signal(scheduler.value().get(), ho);
    scheduler.value()->shutdown();
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace oscar::apps
