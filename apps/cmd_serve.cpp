// `oscar serve`: the OpenAI-compatible HTTP server over the continuous-batching scheduler.
#include <cstdio>
#include <filesystem>
#include <optional>

#include "apps/commands.h"
#include "apps/runtime_options.h"
#include "core/log.h"
#include "core/check.h"
#include "engine/scheduler.h"
#include "server/http_server.h"
#include "tokenizer/chat_prompt.h"

namespace oscar::apps {

namespace {

// The scheduler plus the safe chat path (Engine::tokenize_chat). Until Scheduler implements
// tokenize_chat and has_chat_template itself (with its own tokenizer and parsed template), this
// forwards every other call to it. `tokenizer` belongs to the scheduler's runtime.
class ServeEngine final : public engine::Engine {
 public:
  ServeEngine(engine::Scheduler* scheduler, const tok::Tokenizer* tokenizer)
      : scheduler_(scheduler), tokenizer_(tokenizer) {
    const std::string& source = tokenizer_->chat_template();
    if (source.empty()) return;
    auto parsed = tok::ChatTemplate::parse(source);
    // The scheduler has parsed the same source successfully already.
    OSCAR_CHECK(parsed.ok(), "chat template: %s", parsed.status().message().c_str());
    template_.emplace(std::move(parsed).value());
    split_reasoning_ = tok::template_reads_reasoning(source);
  }

  Status submit(engine::GenerationRequest req,
                std::function<void(const engine::GenerationEvent&)> on_event) override {
    return scheduler_->submit(std::move(req), std::move(on_event));
  }
  void cancel(const std::string& request_id) override { scheduler_->cancel(request_id); }
  engine::EngineInfo info() const override { return scheduler_->info(); }
  engine::EngineMetrics metrics() const override { return scheduler_->metrics(); }
  Result<std::vector<int32_t>> tokenize(std::string_view text) const override {
    return scheduler_->tokenize(text);
  }
  Result<std::string> apply_chat_template(const nlohmann::ordered_json& messages,
                                          const nlohmann::ordered_json& tools, bool agp,
                                          const nlohmann::ordered_json& kwargs) const override {
    return scheduler_->apply_chat_template(messages, tools, agp, kwargs);
  }
  Result<std::vector<int32_t>> tokenize_chat(const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools, bool agp,
                                             const nlohmann::ordered_json& kwargs) const override {
    if (!template_) {
      return Status(StatusCode::kInternal,
                    "the model has no chat template (tokenizer_config.json has no chat_template); "
                    "use /v1/completions");
    }
    tok::ChatPromptOptions o;
    o.add_generation_prompt = agp;
    o.split_reasoning = split_reasoning_;
    OSCAR_ASSIGN_OR_RETURN(tok::ChatPrompt p,
                           tok::encode_chat(*tokenizer_, *template_, messages, tools, kwargs, o));
    return std::move(p.ids);
  }
  bool has_chat_template() const override { return template_.has_value(); }

 private:
  engine::Scheduler* scheduler_;
  const tok::Tokenizer* tokenizer_;
  std::optional<tok::ChatTemplate> template_;
  bool split_reasoning_ = false;
};

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
  app.add_option("--max-batch-tokens", sched->max_batch_tokens,
                 "Tokens per forward step (decode + prefill chunks)")->capture_default_str();
  app.add_option("--prefill-chunk", sched->prefill_chunk, "Prefill tokens per request per step")
      ->capture_default_str();
  app.add_flag("!--no-prefix-cache", sched->prefix_cache,
               "Do not share prompt prefixes between requests (radix prefix cache)");
  app.add_option("--http-threads", http->n_threads, "HTTP I/O threads")->capture_default_str();
  app.add_option("--max-connections", http->max_connections,
                 "Open connections at most; more get 503 and are closed (0: no cap)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--allowed-origins", http->allowed_origins,
                 "Origins browsers may call from (CORS), e.g. http://localhost:3000, or '*'")
      ->delimiter(',');
  app.add_option("--reasoning-parser", http->reasoning_parser,
                 "Report a leading <think>...</think> as reasoning_content (qwen3)")
      ->check(CLI::IsMember({"qwen3"}));
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
    // The tokenizer lives on the heap inside the runtime, which the scheduler then owns.
    const tok::Tokenizer* tokenizer = &runtime.value()->tokenizer();
    if (tokenizer->chat_template().empty()) {
      OSCAR_LOG_WARN("serve: the model has no chat template (no chat_template in %s/"
                     "tokenizer_config.json): /v1/chat/completions will answer 500; "
                     "/v1/completions works", o.model_dir.c_str());
    }
    auto scheduler = engine::Scheduler::create(std::move(runtime).value(), so);
    if (!scheduler.ok()) {
      std::fprintf(stderr, "error: %s\n", scheduler.status().message().c_str());
      return 1;
    }
    server::ServerOptions ho = *http;
    ho.served_model_name = so.model_name;
    OSCAR_LOG_INFO("serve: model_name=%s host=%s port=%u kv_budget_mib=%.0f max_running=%d",
                   so.model_name.c_str(), ho.host.c_str(), ho.port, *budget_mib, so.max_running);
    ServeEngine serve_engine(scheduler.value().get(), tokenizer);
    Status st = server::serve_until_signal(&serve_engine, ho);
    scheduler.value()->shutdown();
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace oscar::apps
