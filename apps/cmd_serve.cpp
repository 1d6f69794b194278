// `oscar serve`: the OpenAI-compatible HTTP server over the continuous-batching scheduler.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "apps/commands.h"
#include "apps/runtime_options.h"
#include "core/device.h"
#include "core/log.h"
#include "engine/scheduler.h"
#include "server/http_server.h"
#include "server/kv_event_publisher.h"

namespace oscar::apps {

namespace {

// The step's token limits where the user left them unset, per device. The GPU's, measured on the
// H200 (docs/results/prefill_cuda.md, session 13): 8192-token chunks run the linear layers near
// the GEMM rate (512-token chunks at 0.77x cuBLAS, 8192 at 0.92x) and cut time to first token by
// 5-11% against 512 / 1024 (also vLLM's and SGLang's chunk on large GPUs). The CPU keeps its own:
// its linear layers reach their rate at small chunks.
void device_step_defaults(Device device, bool mbt, bool chunk, engine::SchedulerOptions* so) {
  if (device == Device::kCpu) return;
  if (mbt) so->max_batch_tokens = 8192;
  if (chunk) so->prefill_chunk = 8192;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto rt = std::make_shared<engine::RuntimeOptions>();
  auto sched = std::make_shared<engine::SchedulerOptions>();
  auto http = std::make_shared<server::ServerOptions>();
  auto budget_mib = std::make_shared<double>(1024);
  add_runtime_options(app, *rt);
  app.add_option("--host", http->host, "Address or host name to listen on")->capture_default_str();
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
  // Unset, these two take the device's defaults (device_step_defaults above).
  CLI::Option* mbt_opt = app.add_option(
      "--max-batch-tokens", sched->max_batch_tokens,
      "Tokens per forward step, decode + prefill chunks [CPU 1024, GPU 8192]");
  CLI::Option* chunk_opt = app.add_option("--prefill-chunk", sched->prefill_chunk,
                                          "Prefill tokens per request per step [CPU 512, GPU 8192]");
  app.add_option(
      "--prefill-itl-factor", sched->prefill_itl_factor,
      "While streams decode, size prefill chunks so that a step lasts about this many decode "
      "steps; 0: off (experimental: engine/prefill_budget.h)")
      ->capture_default_str();
  app.add_option("--max-model-len", sched->max_model_len,
                 "Longest prompt + completion accepted, in tokens (0: the model's "
                 "max_position_embeddings, lowered to what the KV pools hold)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--default-max-tokens", http->default_max_tokens,
                 "max_tokens of a request that leaves it out, capped by the room the context "
                 "leaves (0: all of it, max-model-len - prompt, as vLLM)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-queue", sched->max_waiting,
                 "Requests waiting for admission at most; more get 429 with Retry-After "
                 "(0: no cap)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("!--no-prefix-cache", sched->prefix_cache,
               "Do not share prompt prefixes between requests (radix prefix cache)");
  app.add_option("--prefix-snapshots", sched->prefix_state_snapshots,
                 "Hybrid models: DeltaNet state snapshots the prefix cache keeps at page "
                 "boundaries (host memory, one state-pool slot each; 0: no prefix cache for "
                 "hybrids)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--http-threads", http->n_threads, "HTTP I/O threads")->capture_default_str();
  app.add_option("--max-connections", http->max_connections,
                 "Open connections at most: at the cap a new one closes the connection idle "
                 "longest, and gets 503 when all have a request in progress (0: no cap; -1: "
                 "RLIMIT_NOFILE less a headroom of max(32, 1/8), at most 16384)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  auto header_timeout_s =
      std::make_shared<double>(std::chrono::duration<double>(http->header_timeout).count());
  app.add_option("--header-timeout", *header_timeout_s,
                 "Seconds for a request's headers to arrive, also the keep-alive idle time")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--allowed-origins", http->allowed_origins,
                 "Origins browsers may call from (CORS), e.g. http://localhost:3000, or '*'")
      ->delimiter(',');
  app.add_option("--reasoning-parser", http->reasoning_parser,
                 "Report a leading <think>...</think> as reasoning_content (qwen3)")
      ->check(CLI::IsMember({"qwen3"}));
  // KV-cache events for KV-aware routers (docs/formats/kv_events.md).
  auto events = std::make_shared<server::KvEventPublisherOptions>();
  events->endpoint.clear();
  auto events_encoding = std::make_shared<std::string>("map");
  app.add_option("--kv-events-endpoint", events->endpoint,
                 "Publish KV-cache events in vLLM's format over ZMQ PUB, e.g. "
                 "ipc:///run/oscar/kv-events (binds, this host only); tcp://*:5557 binds every "
                 "interface, tcp://HOST:PORT connects (as vLLM). The events carry the cached "
                 "prompts' and answers' token ids: expose them to trusted routers only. Off "
                 "when empty");
  app.add_option("--kv-events-replay-endpoint", events->replay_endpoint,
                 "ZMQ ROUTER endpoint answering replay requests from a starting sequence number");
  app.add_option("--kv-events-topic", events->topic,
                 "Topic frame of every batch (llm-d expects kv@<pod>@<model>)");
  app.add_option("--kv-events-encoding", *events_encoding,
                 "Event encoding: map (vLLM since mid-2026) or array (older vLLM)")
      ->capture_default_str()->check(CLI::IsMember({"map", "array"}));
  app.add_option("--data-parallel-rank", events->data_parallel_rank,
                 "Data-parallel rank carried in every event batch (tcp ports are offset by it)")
      ->capture_default_str();
  return [=]() -> int {
    engine::RuntimeOptions o = *rt;
    o.kv_budget_bytes = static_cast<size_t>(*budget_mib * 1024 * 1024);
    auto runtime = engine::Runtime::create(o);
    if (!runtime.ok()) {
      std::fprintf(stderr, "error: %s\n", runtime.status().message().c_str());
      return 1;
    }
    engine::SchedulerOptions so = *sched;
    device_step_defaults(runtime.value()->backend().device(), mbt_opt->count() == 0,
                         chunk_opt->count() == 0, &so);
    so.model_name = http->served_model_name.empty()
                        ? std::filesystem::path(o.model_dir).filename().string()
                        : http->served_model_name;
    if (so.model_name.empty()) so.model_name = "model";
    if (runtime.value()->tokenizer().chat_template().empty()) {
      OSCAR_LOG_WARN("serve: the model has no chat template (no chat_template in %s/"
                     "tokenizer_config.json): /v1/chat/completions will answer 500; "
                     "/v1/completions works", o.model_dir.c_str());
    }
    std::unique_ptr<server::KvEventPublisher> publisher;
    if (!events->endpoint.empty()) {
      server::KvEventPublisherOptions eo = *events;
      eo.encoding = *events_encoding == "array" ? server::KvEventEncoding::kArray
                                                : server::KvEventEncoding::kMap;
      auto made = server::KvEventPublisher::create(eo);
      if (!made.ok()) {
        std::fprintf(stderr, "error: %s\n", made.status().message().c_str());
        return 1;
      }
      publisher = std::move(made).value();
      so.kv_event_sink = publisher.get();
      OSCAR_LOG_INFO("serve: kv events endpoint=%s", publisher->endpoint().c_str());
    }
    auto scheduler = engine::Scheduler::create(std::move(runtime).value(), so);
    if (!scheduler.ok()) {
      std::fprintf(stderr, "error: %s\n", scheduler.status().message().c_str());
      return 1;
    }
    server::ServerOptions ho = *http;
    ho.served_model_name = so.model_name;
    ho.header_timeout = std::chrono::milliseconds(
        std::max<int64_t>(1, static_cast<int64_t>(*header_timeout_s * 1000)));
    OSCAR_LOG_INFO(
        "serve: model_name=%s host=%s port=%u kv_budget_mib=%.0f max_running=%d "
        "max_model_len=%d default_max_tokens=%d max_queue=%d max_batch_tokens=%d "
        "prefill_chunk=%d prefill_itl_factor=%g",
        so.model_name.c_str(), ho.host.c_str(), ho.port, *budget_mib, so.max_running,
        scheduler.value()->info().max_context_tokens, ho.default_max_tokens, so.max_waiting,
        so.max_batch_tokens, so.prefill_chunk, so.prefill_itl_factor);
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
