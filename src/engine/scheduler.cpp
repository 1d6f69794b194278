#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include "core/check.h"
#include "core/log.h"
#include "engine/tool_constraint.h"
#include "kernels/logits.h"
#include "kernels/sample.h"
#include "kv/admission.h"
#include "tokenizer/chat_prompt.h"

namespace oscar::engine {

using Clock = std::chrono::steady_clock;

namespace {

Histogram make_histogram(std::vector<double> bounds) {
  Histogram h;
  h.counts.assign(bounds.size() + 1, 0);
  h.upper_bounds = std::move(bounds);
  return h;
}

void observe(Histogram& h, double seconds) {
  size_t i = std::lower_bound(h.upper_bounds.begin(), h.upper_bounds.end(), seconds) -
             h.upper_bounds.begin();
  h.counts[i] += 1;
  h.sum += seconds;
}

Status no_chat_template() {
  return internal_error("the model has no chat template (tokenizer_config.json has no "
                        "chat_template); use /v1/completions");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Result<FaultInjection> FaultInjection::parse(std::string_view spec) {
  FaultInjection f;
  if (spec.empty()) return f;
  const size_t colon = spec.find(':');
  const std::string_view where = spec.substr(0, colon);
  const std::string count =
      colon == std::string_view::npos ? "" : std::string(spec.substr(colon + 1));
  char* end = nullptr;
  const long long n = count.empty() ? 0 : std::strtoll(count.c_str(), &end, 10);
  if (where == "step") f.where = kStep;
  if (where == "sample") f.where = kSample;
  if (where == "device") f.where = kDevice;
  if (f.where == kNone || count.empty() || *end != '\0' || n < 1)
    return invalid_argument(
        "fault injection '%.*s': expected step:N, sample:N or device:N with N >= 1",
                            static_cast<int>(spec.size()), spec.data());
  f.n = n;
  return f;
}

struct Scheduler::Sequence {
  GenerationRequest req;
  std::function<void(const GenerationEvent&)> on_event;
  std::unique_ptr<kv::SequenceCache> cache;
  kernels::SamplingConfig sampling;
  std::unique_ptr<tok::StreamDecoder> decoder;
  // The tokens to prefill: the prompt; after a preemption, prompt + every generated token, so that
  // the recompute's last logits give the next token (draw index output.size(), as decode would).
  std::vector<int32_t> context;
  int64_t prefilled = 0;       // tokens of `context` in the cache (adopted or computed)
  int64_t cached_tokens = 0;   // prompt tokens adopted from the prefix cache (first admission)
  int64_t cached_context = 0;  // tokens of `context` adopted at the last admission
  // Hybrid with the prefix cache: where the context branches off a cached path that has no state
  // snapshot there (0: none); its prefill stops at this page boundary and snapshots it.
  int64_t branch_tokens = 0;
  uint64_t arrival = 0;        // submit order; preemption takes the latest first
  int preemptions = 0;
  bool preempted = false;      // preempted in this step; moved back to the waiting queue after it
  bool admitted = false;       // admitted at least once (no longer counts against max_waiting)
  kv::PageNeed promised;       // pages its prefill was admitted with (radix-cached part excluded)
  int64_t blocked_avail = -1;  // pages available when admission last refused it (-1: never)
  kv::NodeHandle prefix_node; // locked radix node while running
  std::vector<int32_t> output;
  std::string text;      // decoded output so far, whole UTF-8 characters
  size_t emitted = 0;    // bytes of `text` already streamed
  int32_t next_token = -1;
  // Penalties (req.sampling's, when any is on): the distinct tokens seen (the prompt's only when
  // the repetition penalty is on) and their counts in the output.
  bool penalized = false;
  std::vector<int32_t> seen_ids, seen_counts;
  std::unordered_map<int32_t, int32_t> seen_at;  // token id -> index in seen_ids
  void see(int32_t id, bool in_output) {
    auto [it, fresh] = seen_at.emplace(id, static_cast<int32_t>(seen_ids.size()));
    if (fresh) {
      seen_ids.push_back(id);
      seen_counts.push_back(0);
    }
    if (in_output) seen_counts[it->second] += 1;
  }
  // tool_call_names: the constrained decoding of one tool call, and its mask for the next token.
  std::unique_ptr<ToolCallConstraint> constraint;
  std::vector<uint8_t> allowed;  // [vocab]
  // The log-probabilities of the token being handled (req.logprobs >= 0), filled by run_step.
  bool has_logprobs = false;
  float token_logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // [req.logprobs]
  Clock::time_point t_submit, t_last;
  bool done = false;

  bool prefilling() const { return prefilled < static_cast<int64_t>(context.size()); }
  bool holds_pages() const { return cache && (cache->n_tokens() > 0 || cache->n_staged() > 0); }
  GenerationEvent event(GenerationEvent::Kind kind) const {
    GenerationEvent e;
    e.kind = kind;
    e.prompt_tokens = static_cast<int>(req.prompt_ids.size());
    e.completion_tokens = static_cast<int>(output.size());
    e.cached_tokens = static_cast<int>(cached_tokens);
    return e;
  }
};

Scheduler::Scheduler(std::unique_ptr<Runtime> runtime, const SchedulerOptions& options)
    : runtime_(std::move(runtime)),
      options_(options),
      prefill_budget_(runtime_->model().config(), options.prefill_itl_factor) {
  metrics_.time_to_first_token_seconds =
      make_histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  metrics_.time_per_output_token_seconds =
      make_histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(std::unique_ptr<Runtime> runtime,
                                                     const SchedulerOptions& options) {
  if (options.max_running <= 0 || options.max_batch_tokens <= 0 || options.prefill_chunk <= 0)
    return invalid_argument("scheduler: max_running, max_batch_tokens and prefill_chunk must be > 0");
  if (options.max_model_len < 0 || options.max_waiting < 0)
    return invalid_argument("scheduler: max_model_len %d and max_waiting %d must be >= 0",
                            options.max_model_len, options.max_waiting);
  const int max_pos = runtime->model().config().max_position_embeddings;
  if (options.max_model_len > max_pos)
    return invalid_argument("--max-model-len %d exceeds the model's max_position_embeddings %d",
                            options.max_model_len, max_pos);
  std::string fault_spec = options.fault_inject;
  if (const char* env = std::getenv("OSCAR_FAULT_INJECT"); fault_spec.empty() && env != nullptr)
    fault_spec = env;
  OSCAR_ASSIGN_OR_RETURN(FaultInjection fault, FaultInjection::parse(fault_spec));
  if (fault.where != FaultInjection::kNone)
    OSCAR_LOG_WARN("scheduler: fault injection on: %s call %lld fails (OSCAR_FAULT_INJECT)",
                   fault.where == FaultInjection::kSample ? "sample" : "step",
                   static_cast<long long>(fault.n));
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(runtime), options));
  s->fault_ = fault;
  s->max_model_len_ = options.max_model_len > 0 ? options.max_model_len : max_pos;
  {
    // The longest sequence whose peak pages fit the pools (peak pages grow with the length).
    const int64_t totals[2] = {s->runtime_->exact_pool().n_pages(),
                               s->runtime_->int2_pool() ? s->runtime_->int2_pool()->n_pages() : 0};
    auto fits = [&](int64_t n) {
      const kv::PageNeed need = s->pages_needed(n);
      return need.bf16_pages() <= totals[0] && need.int2_pages() <= totals[1];
    };
    int64_t lo = 0, hi = s->max_model_len_;  // fits(lo) (or lo == 0); find the largest
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (fits(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    if (lo < s->max_model_len_) {
      if (options.max_model_len == 0) {
        OSCAR_LOG_INFO(
            "scheduler: max_model_len=%lld (the longest sequence the KV pools hold; "
            "the model allows %d)",
            static_cast<long long>(lo), max_pos);
        s->max_model_len_ = static_cast<int>(std::max<int64_t>(1, lo));
      } else {
        OSCAR_LOG_WARN(
            "scheduler: max_model_len=%d but the KV pools hold at most %lld tokens "
            "of one sequence; longer requests are refused",
            s->max_model_len_, static_cast<long long>(lo));
      }
    }
  }
  const std::string& source = s->runtime_->tokenizer().chat_template();
  if (!source.empty()) {
    auto tmpl = tok::ChatTemplate::parse(source);
    if (!tmpl.ok()) return tmpl.status().with_context("chat template of the model");
    s->chat_template_ = std::make_unique<tok::ChatTemplate>(std::move(tmpl).value());
    s->template_reads_reasoning_ = tok::template_reads_reasoning(source);
  }
  // A hybrid model's cached prefix needs its DeltaNet state at the page boundary: the radix cache
  // keeps up to prefix_state_snapshots of them (kv/radix_cache.h, hybrid mode); with none, the
  // prefix cache is off for hybrids (every prompt computed).
  const bool hybrid = s->runtime_->model().config().is_hybrid();
  if (options.prefix_state_snapshots < 0)
    return invalid_argument("scheduler: prefix_state_snapshots %d must be >= 0",
                            options.prefix_state_snapshots);
  const bool prefix_cache = options.prefix_cache && (!hybrid || options.prefix_state_snapshots > 0);
  if (hybrid && options.prefix_cache && !prefix_cache)
    OSCAR_LOG_INFO("scheduler: prefix cache off for the hybrid %s (--prefix-snapshots 0)",
                   s->runtime_->model().config().architecture_name.c_str());
  if (prefix_cache) {
    std::vector<kv::PagePool*> pools = {&s->runtime_->exact_pool()};
    if (s->runtime_->int2_pool()) pools.push_back(s->runtime_->int2_pool());
    s->radix_ = std::make_unique<kv::RadixCache>(s->runtime_->spec().regions.page_size, pools);
    if (hybrid) {
      kv::StatePool* states = s->runtime_->state_pool();
      OSCAR_CHECK(states != nullptr, "scheduler: a hybrid runtime without a state pool");
      s->radix_->attach_state_pool(states, options.prefix_state_snapshots);
      OSCAR_LOG_INFO("scheduler: prefix cache for the hybrid %s: snapshots=%d bytes_each=%lld "
                     "max_bytes=%lld (DeltaNet states at page boundaries, host memory)",
                     s->runtime_->model().config().architecture_name.c_str(),
                     options.prefix_state_snapshots,
                     static_cast<long long>(states->bytes_per_slot()),
                     static_cast<long long>(states->bytes_per_slot() *
                                            options.prefix_state_snapshots));
    }
    // Attaching queues AllBlocksCleared: routers learn that this replica starts empty.
    if (options.kv_event_sink) s->radix_->set_listener(&s->kv_events_);
  } else if (options.kv_event_sink) {
    return invalid_argument(
        hybrid ? "KV-cache events need the prefix cache (drop --no-prefix-cache, and a hybrid "
                 "needs --prefix-snapshots > 0)"
               : "KV-cache events need the prefix cache (drop --no-prefix-cache)");
  }
  {
    std::lock_guard<std::mutex> lock(s->mu_);
    s->snapshot_pools();
  }
  s->thread_ = std::thread([p = s.get()] { p->loop(); });
  s->ready_ = true;
  return s;
}

Scheduler::~Scheduler() {
  shutdown();
  if (radix_) radix_->set_listener(nullptr);
}

// One batch of the radix cache's events per loop iteration. After the sink dropped batches, the
// listener is attached again: AllBlocksCleared and the whole cache, so routers resynchronise.
void Scheduler::publish_kv_events() {
  kv::KvEventSink* sink = options_.kv_event_sink;
  if (sink == nullptr || !radix_) return;
  if (sink->dropped_batches() > kv_events_dropped_seen_) {
    kv_events_dropped_seen_ = sink->dropped_batches();
    radix_->set_listener(&kv_events_);
  }
  if (!kv_events_.empty()) sink->publish(kv_events_.take());
}

void Scheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

kv::PageNeed Scheduler::pages_needed(int64_t n_tokens) const {
  return kv::peak_pages(runtime_->spec().regions, runtime_->spec().quantized(), n_tokens);
}

std::shared_ptr<const TokenTrie> Scheduler::token_trie() {
  std::lock_guard<std::mutex> lock(trie_mu_);
  if (!token_trie_) token_trie_ = TokenTrie::build(runtime_->tokenizer());
  return token_trie_;
}

Status Scheduler::submit(GenerationRequest req,
                         std::function<void(const GenerationEvent&)> on_event) {
  const format::ModelConfig& config = runtime_->model().config();
  if (std::string f = device_fault(); !f.empty()) return unavailable("%s", f.c_str());
  if (req.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  for (int32_t id : req.prompt_ids)
    if (id < 0 || id >= config.vocab_size)
      return invalid_argument("prompt token id %d is out of range [0, %d)", id, config.vocab_size);
  if (req.max_tokens <= 0) return invalid_argument("max_tokens must be > 0");
  const int64_t total = static_cast<int64_t>(req.prompt_ids.size()) + req.max_tokens;
  if (total > max_model_len_)
    return invalid_argument(
        "prompt (%zu tokens) + max_tokens (%d) = %lld exceeds the maximum context length of %d "
        "tokens",
        req.prompt_ids.size(), req.max_tokens, static_cast<long long>(total), max_model_len_);
  kernels::SamplingConfig sc = req.sampling.config;
  OSCAR_RETURN_IF_ERROR(kernels::validate_sampling(sc));
  const SamplingParams& sp = req.sampling;
  if (!(std::abs(sp.presence_penalty) <= 2.f) || !(std::abs(sp.frequency_penalty) <= 2.f))
    return invalid_argument("presence_penalty %g and frequency_penalty %g must be in [-2, 2]",
                            sp.presence_penalty, sp.frequency_penalty);
  if (!(sp.repetition_penalty >= kMinRepetitionPenalty) ||
      !(sp.repetition_penalty <= kMaxRepetitionPenalty))
    return invalid_argument("repetition_penalty %g must be in [%g, %g]", sp.repetition_penalty,
                            kMinRepetitionPenalty, kMaxRepetitionPenalty);
  if (req.logprobs < -1 || req.logprobs > kMaxLogprobs)
    return invalid_argument("logprobs %d must be in [0, %d] (or -1: none)", req.logprobs,
                            kMaxLogprobs);
  // A request whose peak pages exceed a whole pool could never finish, even alone: a client
  // error (400), not a retryable one. Anything smaller runs, preempting others if it must.
  const kv::PageNeed need = pages_needed(total);
  const int64_t int2_total = runtime_->int2_pool() ? runtime_->int2_pool()->n_pages() : 0;
  if (need.bf16_pages() > runtime_->exact_pool().n_pages() || need.int2_pages() > int2_total)
    return invalid_argument(
        "prompt (%zu tokens) + max_tokens (%d) = %lld tokens need %lld %s and %lld int2 KV pages "
        "at their peak; the pools hold %lld and %lld pages in all (lower max_tokens, or raise "
        "--kv-budget)",
        req.prompt_ids.size(), req.max_tokens, static_cast<long long>(total),
        static_cast<long long>(need.bf16_pages()), runtime_->exact_pool().name().c_str(),
        static_cast<long long>(need.int2_pages()),
        static_cast<long long>(runtime_->exact_pool().n_pages()),
        static_cast<long long>(int2_total));

  auto s = std::make_unique<Sequence>();
  if ((req.json_object || req.json_schema) && !req.tool_call_names.empty())
    return invalid_argument("json output and a constrained tool call exclude each other");
  if (req.json_object && req.json_schema)
    return invalid_argument("json_object and json_schema output exclude each other");
  if (!req.tool_call_names.empty() && req.tool_call_on_start) {
    // A tokenizer without a single <tool_call> token cannot tell a call's start from text: such a
    // model's calls under tool_choice "auto" stay unconstrained, as before strict tools.
    auto c = ToolCallConstraint::create_on_call(runtime_->tokenizer(), req.tool_call_names,
                                                req.tool_call_schemas, token_trie());
    if (c.ok()) s->constraint = std::move(c).value();
  } else if (!req.tool_call_names.empty()) {
    auto c = ToolCallConstraint::create(runtime_->tokenizer(), req.tool_call_names,
                                        req.tool_call_schemas, token_trie());
    if (!c.ok()) return c.status();
    s->constraint = std::move(c).value();
  } else if (req.json_object) {
    s->constraint = ToolCallConstraint::create_json_object(runtime_->tokenizer(), token_trie());
  } else if (req.json_schema) {
    s->constraint = ToolCallConstraint::create_json_schema(runtime_->tokenizer(), req.json_schema,
                                                           token_trie());
  }
  if (!req.sampling.has_seed) sc.seed = std::random_device{}();
  s->sampling = sc;
  s->decoder = std::make_unique<tok::StreamDecoder>(runtime_->tokenizer(), /*skip_special=*/true);
  s->req = std::move(req);
  s->context = s->req.prompt_ids;
  s->penalized =
      sp.presence_penalty != 0.f || sp.frequency_penalty != 0.f || sp.repetition_penalty != 1.f;
  if (s->penalized && sp.repetition_penalty != 1.f)
    for (int32_t id : s->req.prompt_ids) s->see(id, /*in_output=*/false);
  s->on_event = std::move(on_event);
  s->t_submit = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Status(StatusCode::kCancelled, "the engine is shutting down");
    if (live_ids_.count(s->req.request_id))
      return invalid_argument("request id '%s' is already running", s->req.request_id.c_str());
    // The choices of one request (n > 1) are submitted together, and the later ones wait for
    // the first one's prefill: they may fill max_running more places, so that a request of
    // info().max_live_requests choices fits an idle engine (the server refuses more with a 400).
    const bool choice =
        !s->req.share_prompt_with.empty() && live_ids_.count(s->req.share_prompt_with) > 0;
    const int cap = options_.max_waiting + (choice ? options_.max_running : 0);
    if (options_.max_waiting > 0 && n_queued_ >= cap)
      return resource_exhausted(
          "the waiting queue is full (%d requests, --max-queue %d); retry "
          "later",
          n_queued_, options_.max_waiting);
    n_queued_ += 1;
    s->arrival = next_arrival_++;
    live_ids_[s->req.request_id] = true;
    incoming_.push_back(std::move(s));
  }
  cv_.notify_one();
  return Status();
}

void Scheduler::cancel(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_ids_.count(request_id)) return;
    cancels_.push_back(request_id);
  }
  cv_.notify_one();
}

EngineInfo Scheduler::info() const {
  EngineInfo i;
  i.model_name = options_.model_name;
  i.max_context_tokens = max_model_len_;
  i.vocab_size = runtime_->model().config().vocab_size;
  i.max_live_requests = options_.max_waiting > 0 ? options_.max_running + options_.max_waiting : 0;
  i.ready = ready_;
  i.fault = device_fault();
  return i;
}

EngineMetrics Scheduler::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m = metrics_;
  }
  // Device memory is a driver call: read when asked, not in every loop iteration.
  m.device = device_name(runtime_->backend().device());
  size_t free_b = 0, total_b = 0;
  if (runtime_->backend().memory_info(&free_b, &total_b)) {
    m.device_memory_used_bytes = static_cast<int64_t>(total_b - free_b);
    m.device_memory_total_bytes = static_cast<int64_t>(total_b);
  }
  return m;
}

Result<std::vector<int32_t>> Scheduler::tokenize(std::string_view text) const {
  return runtime_->tokenizer().encode(text);
}

Result<std::string> Scheduler::apply_chat_template(const nlohmann::ordered_json& messages,
                                                   const nlohmann::ordered_json& tools,
                                                   bool add_generation_prompt,
                                                   const nlohmann::ordered_json& kwargs) const {
  if (!chat_template_) return no_chat_template();
  const tok::Tokenizer& t = runtime_->tokenizer();
  // OpenAI clients send "content": null on assistant turns that only carry tool calls; the
  // templates (Qwen3's among them) expect a string.
  nlohmann::ordered_json msgs = messages;
  for (auto& m : msgs)
    if (m.is_object() && m.contains("content") && m["content"].is_null()) m["content"] = "";
  return tok::render_chat(*chat_template_, msgs, tools, add_generation_prompt,
                          kwargs.is_null() ? nlohmann::ordered_json::object() : kwargs,
                          t.bos_token(), t.eos_token());
}

Result<std::vector<int32_t>> Scheduler::tokenize_chat(const nlohmann::ordered_json& messages,
                                                      const nlohmann::ordered_json& tools,
                                                      bool add_generation_prompt,
                                                      const nlohmann::ordered_json& kwargs) const {
  if (!chat_template_) return no_chat_template();
  tok::ChatPromptOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.split_reasoning = template_reads_reasoning_;
  OSCAR_ASSIGN_OR_RETURN(tok::ChatPrompt p,
                         tok::encode_chat(runtime_->tokenizer(), *chat_template_, messages, tools,
                                          kwargs.is_null() ? nlohmann::ordered_json::object()
                                                           : kwargs,
                                          o));
  return std::move(p.ids);
}

void Scheduler::release(Sequence& s) {
  if (s.cache) {
    if (radix_) publish_prefix(s, /*keep_locked=*/false);
    s.cache.reset();  // the sequence's page references back to the pools
  }
}

void Scheduler::finish(Sequence& s, const std::string& reason) {
  GenerationEvent e = s.event(GenerationEvent::kFinished);
  e.finish_reason = reason;
  end(s, e);
}

void Scheduler::fail(Sequence& s, const Status& error) {
  GenerationEvent e = s.event(GenerationEvent::kError);
  e.error = error;
  end(s, e);
}

// The terminal event: pages back first, then the callback's last call, then the id is free.
void Scheduler::end(Sequence& s, const GenerationEvent& terminal) {
  if (s.done) return;
  release(s);
  s.done = true;
  s.on_event(terminal);
  s.on_event = nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  live_ids_.erase(s.req.request_id);
  if (!s.admitted) n_queued_ -= 1;
}

// Pages an admission may count on, per pool (0 = exact, 1 = INT2): free pages, plus the prefix
// cache's unlocked (evictable) pages, minus what the running requests' unfinished prefills were
// admitted with (scaled by the part still to compute). Decode growth is not counted: when a pool
// runs dry mid-way, step() evicts and preempts.
void Scheduler::available_pages(int64_t out[2]) const {
  out[0] = runtime_->exact_pool().n_free();
  out[1] = runtime_->int2_pool() ? runtime_->int2_pool()->n_free() : 0;
  if (radix_) {
    const auto& evictable = radix_->stats().evictable_pages;
    for (size_t pool = 0; pool < 2 && pool < evictable.size(); ++pool) out[pool] += evictable[pool];
  }
  for (const auto& sp : running_) {
    const Sequence& s = *sp;
    if (s.done || !s.prefilling()) continue;
    const int64_t todo = static_cast<int64_t>(s.context.size()) - s.prefilled;
    const int64_t span =
        std::max<int64_t>(1, static_cast<int64_t>(s.context.size()) - s.cached_context);
    out[0] -= ceil_div(s.promised.bf16_pages() * todo, span);
    out[1] -= ceil_div(s.promised.int2_pages() * todo, span);
  }
}

// Pages a prefill of n_tokens leaves the sequence holding, less the cached pages that the prefix
// cache supplies (kv::choose_prefix_forms: sinks, history, then recent pages; every page is an
// exact page when the cache has no history region). A cached BF16 page where the prefilled
// sequence holds history is demoted into a fresh INT2 page, which stays counted.
kv::PageNeed Scheduler::prefill_pages(int64_t n_tokens,
                                      std::span<const kv::CachedPage> cached) const {
  const kv::KvCacheSpec& spec = runtime_->spec();
  const int64_t p = spec.regions.page_size;
  kv::PageNeed need;
  if (!spec.quantized()) {
    need.recent_pages = ceil_div(n_tokens, p) - static_cast<int64_t>(cached.size());
    return need;
  }
  need = kv::pages_for_length(spec.regions, n_tokens);
  const size_t n_sink_pages = static_cast<size_t>(spec.regions.n_sink / p);
  for (size_t i = 0; i < cached.size(); ++i) {
    if (i < n_sink_pages) need.sink_pages -= 1;
    else if (cached[i].pool == kv::kPoolInt2) need.hist_pages -= 1;
    else need.recent_pages -= 1;
  }
  need.sink_pages = std::max<int64_t>(0, need.sink_pages);
  need.hist_pages = std::max<int64_t>(0, need.hist_pages);
  need.recent_pages = std::max<int64_t>(0, need.recent_pages);
  return need;
}

// Inserts the sequence's shareable pages (prompt, then generated tokens) into the prefix cache.
// keep_locked: the sequence goes on running and keeps the inserted path from eviction.
void Scheduler::publish_prefix(Sequence& s, bool keep_locked, bool kept_state, bool live_state) {
  const int64_t n = s.cache->shareable_tokens();
  kv::NodeHandle node;
  if (n > 0) {
    std::vector<int32_t> tokens(s.req.prompt_ids.begin(),
                                s.req.prompt_ids.begin() +
                                    std::min<int64_t>(n, s.req.prompt_ids.size()));
    for (size_t i = 0; static_cast<int64_t>(tokens.size()) < n; ++i) tokens.push_back(s.output[i]);
    node = radix_->insert(tokens, s.cache->shareable_pages()).last_node;
    if (radix_->hybrid()) {
      // The kept boundary state (committed tokens only), and the live one after a good step that
      // ended on a page. store_snapshot may split edges; node keeps its id.
      const int64_t at = s.cache->state_snapshot_tokens();
      OSCAR_CHECK(at <= n, "kept state at %lld of %lld shareable tokens",
                  static_cast<long long>(at), static_cast<long long>(n));
      if (kept_state && at > 0 && s.cache->state_snapshot_slot() >= 0)
        radix_->store_snapshot(std::span<const int32_t>(tokens).first(at),
                               s.cache->state_snapshot_slot());
      if (live_state && n == s.cache->n_tokens() && n != at)
        radix_->store_snapshot(tokens, s.cache->state_slot());
    }
    if (keep_locked) radix_->lock(node);
  }
  if (s.prefix_node.id != 0) radix_->unlock(s.prefix_node);
  s.prefix_node = keep_locked ? node : kv::NodeHandle{};
}

void Scheduler::keep_boundary_state(Sequence& s) {
  if (!hybrid_prefix() || !s.cache) return;
  const int64_t n = s.cache->n_tokens();
  if (n == 0 || n % runtime_->spec().regions.page_size != 0 ||
      n <= s.cache->state_snapshot_tokens())
    return;
  const Status st = s.cache->keep_state_snapshot();
  if (!st.ok())  // no host memory: this boundary is not snapshotted (correct, only slower later)
    OSCAR_LOG_WARN("scheduler: request %s keeps no state at %lld tokens: %s",
                   s.req.request_id.c_str(), static_cast<long long>(n), st.to_string().c_str());
}

kv::PrefixMatch Scheduler::match_prefix(const Sequence& s) {
  if (!radix_) return {};
  const kv::KvCacheSpec& spec = runtime_->spec();
  const int64_t n_context = static_cast<int64_t>(s.context.size());
  // Sinks, history and recent pages in the form the sequence holds them; at least one token is
  // always computed (its logits give the next token), so the full pages before the last token
  // are what a lookup asks for.
  const int64_t p = spec.regions.page_size;
  const std::span<const int32_t> asked(s.context.data(),
                                       std::max<int64_t>(0, n_context - 1) / p * p);
  return radix_->match_prefix(asked, [&](std::span<const kv::CachedChunk> chunks) {
    return kv::choose_prefix_forms(spec.regions, spec.quantized(), n_context, chunks,
                                   runtime_->options().deterministic);
  });
}

// m: match_prefix(s), with no cache call in between.
void Scheduler::attach_prefix(Sequence& s, const kv::PrefixMatch& m) {
  s.branch_tokens = 0;
  if (radix_ && radix_->hybrid() && m.n_tokens_cached > m.n_tokens_matched)
    s.branch_tokens = m.n_tokens_cached;
  if (!radix_ || m.n_tokens_matched == 0) return;
  radix_->lock(m.last_node);
  radix_->retain_pages(m.pages);
  // A hybrid's adoption copies the matched state snapshot (m.state_slot) into its own slot.
  Status st = s.cache->adopt_prefix(m.pages, m.state_slot);
  if (st.code() == StatusCode::kResourceExhausted) {  // no host memory for the state: cold start
    OSCAR_LOG_WARN("scheduler: request %s computes its cached prefix again: %s",
                   s.req.request_id.c_str(), st.to_string().c_str());
    radix_->release_pages(m.pages);
    radix_->unlock(m.last_node);
    return;
  }
  OSCAR_CHECK(st.ok(), "prefix cache handed out a prefix of the wrong shape: %s",
              st.to_string().c_str());
  s.prefix_node = m.last_node;
  s.prefilled = m.n_tokens_matched;
  s.cached_context = m.n_tokens_matched;
  if (s.preemptions == 0) s.cached_tokens = m.n_tokens_matched;
}

// Whether the running request `id` is still prefilling (false when it is not running).
bool Scheduler::prefilling(const std::string& id) const {
  for (const auto& sp : running_)
    if (sp->req.request_id == id) return !sp->done && sp->prefilling();
  return false;
}

// Memory follows use: a waiting request is admitted when the pages its prefill will hold fit
// what is available (available_pages) with a watermark to spare (1% of each pool, as vLLM's
// default), not its peak. FIFO: the head waits until it fits. With nothing running the head is
// always admitted, so that a request that cannot fit fails in step() instead of waiting forever.
void Scheduler::admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    Sequence& s = *waiting_.front();
    int64_t avail[2];
    available_pages(avail);
    const bool idle = running_.empty();
    // n > 1: a choice waits until the choice it shares its prompt with has prefilled it (then the
    // prompt's pages are in the prefix cache, and this admission adopts them instead of storing
    // a copy).
    if (radix_ && !s.req.share_prompt_with.empty() && prefilling(s.req.share_prompt_with)) break;
    // Nothing was freed since the head was last refused: do not probe the prefix cache again.
    if (!idle && s.blocked_avail >= 0 && avail[0] + avail[1] <= s.blocked_avail) break;
    kv::PrefixMatch m = match_prefix(s);
    const kv::PageNeed need =
        prefill_pages(static_cast<int64_t>(s.context.size()), m.pages);
    if (!idle) {
      // The matched pages count as evictable now, but adopting them locks them.
      int64_t matched[2] = {0, 0};
      for (const kv::CachedPage& cp : m.pages) matched[cp.pool < 2 ? cp.pool : 1] += 1;
      const int64_t totals[2] = {runtime_->exact_pool().n_pages(),
                                 runtime_->int2_pool() ? runtime_->int2_pool()->n_pages() : 0};
      const int64_t wanted[2] = {need.bf16_pages(), need.int2_pages()};
      bool fits = true;
      for (int pool = 0; pool < 2; ++pool) {
        const int64_t watermark = totals[pool] > 0 ? std::max<int64_t>(1, totals[pool] / 100) : 0;
        if (wanted[pool] + watermark + matched[pool] > avail[pool]) fits = false;
      }
      if (!fits) {
        s.blocked_avail = avail[0] + avail[1];
        break;
      }
    }
    s.blocked_avail = -1;
    s.promised = need;
    s.cache = runtime_->new_cache();
    attach_prefix(s, m);
    if (!s.admitted) {
      s.admitted = true;
      std::lock_guard<std::mutex> lock(mu_);
      n_queued_ -= 1;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

// Frees a running request's pages (publishing its prefix to the cache and unlocking its node,
// as a finished request does) and keeps its tokens: it goes back to the head of the waiting
// queue (after step()), and its readmission prefills prompt + output. Its stream is untouched:
// the decoder, the text and what was emitted stay, so the client sees one continuous stream.
void Scheduler::preempt(Sequence& s) {
  if (s.cache && s.cache->n_staged() > 0) s.cache->unreserve();
  release(s);
  s.context = s.req.prompt_ids;
  s.context.insert(s.context.end(), s.output.begin(), s.output.end());
  s.prefilled = 0;
  s.cached_context = 0;
  s.branch_tokens = 0;
  s.promised = {};
  s.preemptions += 1;
  s.preempted = true;
  OSCAR_LOG_INFO("scheduler: preempted request=%s tokens=%zu preemptions=%d",
                 s.req.request_id.c_str(), s.context.size(), s.preemptions);
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.num_preemptions_total += 1;
}

void Scheduler::handle_token(Sequence& s, int32_t token) {
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.generation_tokens_total += 1;
    if (s.output.empty()) observe(metrics_.time_to_first_token_seconds, seconds_between(s.t_submit, now));
    else observe(metrics_.time_per_output_token_seconds, seconds_between(s.t_last, now));
  }
  s.t_last = now;
  s.output.push_back(token);
  // The constrained tool call: the token was drawn from its mask; the call's end ends the request.
  bool call_done = false;
  if (s.constraint) {
    if (!s.constraint->advance(token)) {
      const Status bad =
          internal_error("constrained decoding drew token %d, which its mask excluded", token);
      OSCAR_LOG_ERROR("scheduler: request %s failed: %s", s.req.request_id.c_str(),
                      bad.to_string().c_str());
      return fail(s, bad);
    }
    call_done = s.constraint->done();
  }
  if (s.penalized) s.see(token, /*in_output=*/true);
  const auto eos = runtime_->tokenizer().eos_token_id();
  const bool is_eos = !s.req.ignore_eos && eos && token == *eos;
  const bool at_length = static_cast<int>(s.output.size()) >= s.req.max_tokens;
  if (!is_eos) s.text += s.decoder->push(token);
  if (is_eos || at_length || call_done) s.text += s.decoder->flush();

  // Stop strings: find the earliest match in the text not yet streamed (plus the overlap a match
  // may have with what was streamed), stream what precedes it, finish.
  size_t max_stop = 0;
  size_t stop_at = std::string::npos;
  for (const std::string& stop : s.req.stop) {
    if (stop.empty()) continue;
    max_stop = std::max(max_stop, stop.size());
    const size_t from = s.emitted >= stop.size() - 1 ? s.emitted - (stop.size() - 1) : 0;
    const size_t p = s.text.find(stop, from);
    if (p != std::string::npos) stop_at = std::min(stop_at, p);
  }
  size_t send_to = s.text.size();
  if (stop_at != std::string::npos) {
    send_to = std::max(stop_at, s.emitted);
  } else if (!is_eos && !at_length && !call_done) {
    // Hold back a tail that could still grow into a stop string.
    for (size_t hold = std::min(max_stop - (max_stop > 0), s.text.size() - s.emitted); hold > 0; --hold) {
      bool prefix = false;
      for (const std::string& stop : s.req.stop)
        if (stop.size() > hold && s.text.compare(s.text.size() - hold, hold, stop, 0, hold) == 0)
          prefix = true;
      if (prefix) {
        send_to = s.text.size() - hold;
        break;
      }
    }
  }
  GenerationEvent e = s.event(GenerationEvent::kToken);
  e.token_id = token;
  if (s.has_logprobs && !is_eos) {
    const tok::Tokenizer& t = runtime_->tokenizer();
    e.has_logprobs = true;
    e.chosen = TokenLogprob{token, std::string(t.token_bytes(token)), s.token_logprob};
    e.top_logprobs.reserve(s.top_logprobs.size());
    for (const auto& [id, lp] : s.top_logprobs)
      e.top_logprobs.push_back(TokenLogprob{id, std::string(t.token_bytes(id)), lp});
  }
  s.has_logprobs = false;
  e.text_delta = s.text.substr(s.emitted, send_to - s.emitted);
  s.emitted = send_to;
  s.on_event(e);

  if (stop_at != std::string::npos || is_eos || call_done)
    finish(s, "stop");
  else if (at_length) finish(s, "length");
  else s.next_token = token;
}

// One step, owned here from end to end: choose the chunks, reserve their pages, plan, forward,
// demote, commit, sample. A failure that belongs to one request (a K/V value that the history
// cannot store, non-finite logits) fails that request alone; the others go on.
//
// Pages are taken as sequences grow (SequenceCache::reserve). When a pool runs dry: first the
// prefix cache's unlocked pages are evicted, then running requests that arrived after this one
// are preempted, latest first (one that already reserved in this step gives its pages back and
// leaves the step). A decode token that still does not fit preempts its own request when an
// earlier one holds pages (that one will finish and free them), and fails it when no other
// request holds any (it cannot fit the pools even alone). A prefill chunk that does not fit is
// halved down to one page, then waits for a later step.
void Scheduler::step() {
  if (running_.empty()) return;
  // Arrival order: earlier requests get pages first and are preempted last.
  std::stable_sort(running_.begin(), running_.end(),
                   [](const std::unique_ptr<Sequence>& a, const std::unique_ptr<Sequence>& b) {
                     return a->arrival < b->arrival;
                   });
  std::vector<kv::StepChunk> chunks;
  std::vector<Sequence*> owners;
  int budget = options_.max_batch_tokens;
  const int64_t page = runtime_->spec().regions.page_size;
  auto evict_some = [&](int64_t n_tokens) {
    if (!radix_) return false;
    int64_t freed = 0;
    const int64_t pages = n_tokens / page + 2;
    for (size_t pool = 0; pool < radix_->stats().evictable_pages.size(); ++pool)
      if (radix_->stats().evictable_pages[pool] > 0)
        freed += radix_->evict(pages, static_cast<uint8_t>(pool));
    return freed > 0;
  };
  // Reserves n tokens for s, evicting and preempting later arrivals as needed.
  auto reserve = [&](Sequence& s, int64_t n, bool may_preempt) {
    for (;;) {
      if (s.cache->reserve(n).ok()) return true;
      if (evict_some(n)) continue;
      if (!may_preempt) return false;
      Sequence* victim = nullptr;
      for (auto& sp : running_) {
        Sequence& v = *sp;
        if (&v == &s || v.done || v.preempted || !v.holds_pages() || v.arrival < s.arrival)
          continue;
        if (!victim || v.arrival > victim->arrival) victim = &v;
      }
      if (!victim) return false;
      for (size_t i = 0; i < owners.size(); ++i) {
        if (owners[i] != victim) continue;
        budget += static_cast<int>(chunks[i].tokens.size());
        chunks.erase(chunks.begin() + static_cast<std::ptrdiff_t>(i));
        owners.erase(owners.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
      preempt(*victim);
    }
  };
  auto others_hold_pages = [&](const Sequence& s) {
    for (auto& sp : running_)
      if (sp.get() != &s && !sp->done && !sp->preempted && sp->holds_pages()) return true;
    return false;
  };
  auto add = [&](Sequence& s, std::span<const int32_t> tokens) {
    chunks.push_back(kv::StepChunk{s.cache.get(), tokens, false});
    owners.push_back(&s);
    budget -= static_cast<int>(tokens.size());
  };
  auto cannot_fit = [&](Sequence& s, int64_t n) {
    // OutOfRange (a 400, not the retryable 429 of ResourceExhausted): it cannot fit, ever.
    const Status st = out_of_range(
        "request needs more KV pages than the pools hold: %lld tokens in its cache + %lld more "
        "(%s pool %lld pages, int2 pool %lld pages; raise --kv-budget or lower max_tokens)",
        static_cast<long long>(s.cache->n_tokens()), static_cast<long long>(n),
        runtime_->exact_pool().name().c_str(),
        static_cast<long long>(runtime_->exact_pool().n_pages()),
        static_cast<long long>(runtime_->int2_pool() ? runtime_->int2_pool()->n_pages() : 0));
    OSCAR_LOG_WARN("scheduler: request %s failed: %s", s.req.request_id.c_str(),
                   st.to_string().c_str());
    fail(s, st);
  };
  for (auto& sp : running_) {  // decode tokens first: they keep latency low
    Sequence& s = *sp;
    if (s.done || s.preempted || s.prefilling() || budget <= 0) continue;
    if (reserve(s, 1, /*may_preempt=*/true)) {
      add(s, std::span<const int32_t>(&s.next_token, 1));
    } else if (others_hold_pages(s)) {
      preempt(s);
    } else {
      cannot_fit(s, 1);
    }
  }
  // Then prefill chunks, within the token budget and, while streams decode, the step-time budget
  // (prefill_budget_), which the first chunks take first.
  const int n_decode = static_cast<int>(chunks.size());
  double prefill_flops_left = prefill_budget_.budget(n_decode > 0), prefill_flops = 0;
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.done || s.preempted || !s.prefilling() || budget <= 0) continue;
    const int64_t left = static_cast<int64_t>(s.context.size()) - s.prefilled;
    const int64_t depth = s.cache->n_tokens();
    int64_t n = prefill_budget_.fit(prefill_flops_left, depth,
                                    std::min<int64_t>({left, options_.prefill_chunk, budget}), page);
    if (hybrid_prefix()) {
      // End a chunk where the DeltaNet state is to be snapshotted: where the context branches
      // off a cached path, the end of the pages a repeat of this prompt looks up (all but its
      // last token), and the end of its last full page.
      const int64_t c = static_cast<int64_t>(s.context.size());
      for (const int64_t b : {s.branch_tokens, (c - 1) / page * page, c / page * page})
        if (s.prefilled < b && s.prefilled + n > b) {
          n = b - s.prefilled;
          break;
        }
    }
    bool ok = reserve(s, n, /*may_preempt=*/false);
    while (!ok && n > page) {
      n = std::max<int64_t>(page, n / 2 / page * page);
      ok = reserve(s, n, /*may_preempt=*/false);
    }
    if (!ok) ok = reserve(s, n, /*may_preempt=*/true);
    if (ok) {
      add(s, std::span<const int32_t>(s.context.data() + s.prefilled, n));
      prefill_flops_left -= prefill_budget_.cost(n, depth);
      prefill_flops += prefill_budget_.cost(n, depth);
    } else if (!others_hold_pages(s)) {
      cannot_fit(s, n);
    }  // else: it waits, holding its pages, for an earlier request to free some
  }
  if (!chunks.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    run_step(chunks, owners);
    prefill_budget_.record(
        n_decode, prefill_flops,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Preempted requests go back to the head of the waiting queue, in arrival order.
  std::vector<std::unique_ptr<Sequence>> back;
  for (auto& sp : running_)
    if (!sp->done && sp->preempted) {
      sp->preempted = false;
      back.push_back(std::move(sp));
    }
  for (auto& sp : back) waiting_.push_front(std::move(sp));
  if (!back.empty())  // running requests arrived before every request never admitted (FIFO)
    std::stable_sort(waiting_.begin(), waiting_.end(),
                     [](const std::unique_ptr<Sequence>& a, const std::unique_ptr<Sequence>& b) {
                       return a->arrival < b->arrival;
                     });
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::unique_ptr<Sequence>& s) { return !s || s->done; }),
                 running_.end());
}

Status Scheduler::injected(FaultInjection::Where where) {
  if (fault_.where != where || ++fault_calls_[where] != fault_.n) return Status();
  if (where == FaultInjection::kDevice) device_lost_injected_ = true;
  return internal_error("injected fault: %s call %lld failed (OSCAR_FAULT_INJECT)",
                        where == FaultInjection::kSample ? "sample" : "step",
                        static_cast<long long>(fault_.n));
}

Status Scheduler::probe_device() {
  const Status h = device_lost_injected_
                       ? unavailable("the device failed (injected: OSCAR_FAULT_INJECT)")
                       : runtime_->backend().health();
  if (h.ok()) return h;
  OSCAR_LOG_ERROR("scheduler: the device cannot run work any more, failing every request: %s",
                  h.to_string().c_str());
  std::lock_guard<std::mutex> lock(fault_mu_);
  device_fault_ = h.message();
  return h;
}

void Scheduler::fail_live(const Status& error) {
  for (auto& s : running_)
    if (!s->done) fail(*s, error);
  for (auto& s : waiting_)
    if (!s->done) fail(*s, error);
}

std::string Scheduler::device_fault() const {
  std::lock_guard<std::mutex> lock(fault_mu_);
  return device_fault_;
}

void Scheduler::run_step(std::span<const kv::StepChunk> chunks, std::span<Sequence* const> owners) {
  model::Qwen3Model& model = runtime_->model();
  // Deterministic: a prompt query reads each key as decode would at its position (exact or
  // quantized), not as the chunk boundaries left the cache (in a quantized mode, which keys of a
  // long prompt are demoted before a later chunk reads them depends on the chunking).
  const kv::StepPlan plan = kv::StepPlan::make(chunks, runtime_->options().deterministic
                                                           ? kv::AttendMode::kDecodeEquivalent
                                                           : kv::AttendMode::kPrefill);
  // forward -> demote -> commit (model::StepRunner::step); the logits stay in the backend's
  // memory. The injected faults fall between the forward pass and the demotions.
  std::vector<Status> per_chunk;
  Status st = model.step(plan, {}, &per_chunk, [&] {
    Status fault = injected(FaultInjection::kStep);
    return fault.ok() ? injected(FaultInjection::kDevice) : fault;
  });
  if (!st.ok()) {  // every cache of the step unreserved
    OSCAR_LOG_ERROR("scheduler: step failed for %zu sequences: %s", owners.size(),
                    st.to_string().c_str());
    const Status device = probe_device();
    for (Sequence* s : owners) fail(*s, st);
    if (!device.ok()) fail_live(device);
    return;
  }
  // One sampling call for the step's logits rows (the last row of each sequence); only ids
  // come back. Rows of prefill chunks that do not end their prompt are drawn and ignored.
  std::vector<kernels::SamplingConfig> configs(plan.n_logit_rows());
  std::vector<uint64_t> draws(plan.n_logit_rows());
  std::vector<int32_t> ids(plan.n_logit_rows(), kernels::kSampleNonFinite);
  for (int32_t p = 0; p < plan.n_seqs(); ++p) {
    const Sequence& s = *owners[plan.chunk[p]];
    configs[plan.cu_logits[p]] = s.sampling;
    draws[plan.cu_logits[p]] = s.output.size();
  }
  // Penalties and tool-call masks for the rows that ask, on a copy of the logits, so that the raw
  // logits stay for log-probabilities; nothing of this runs when no row asks.
  const float* sample_logits = model.logits();
  std::vector<kernels::LogitsRowEdit> edits;
  std::vector<int32_t> edit_seqs;  // the plan sequence of each edit
  for (int32_t p = 0; p < plan.n_seqs(); ++p) {
    Sequence& s = *owners[plan.chunk[p]];
    const int64_t n = plan.cu_seqlens[p + 1] - plan.cu_seqlens[p];
    const bool masked = s.constraint && s.constraint->active();
    if (!s.penalized && !masked) continue;
    if (s.prefilled + n < static_cast<int64_t>(s.context.size())) continue;  // mid-prefill
    kernels::LogitsRowEdit e;
    e.row = plan.cu_logits[p];
    e.repetition_penalty = s.req.sampling.repetition_penalty;
    e.presence_penalty = s.req.sampling.presence_penalty;
    e.frequency_penalty = s.req.sampling.frequency_penalty;
    e.token_ids = s.seen_ids.data();
    e.output_counts = s.seen_counts.data();
    e.n_tokens = static_cast<int32_t>(s.seen_ids.size());
    if (masked) {
      s.constraint->allowed_tokens(&s.allowed,
                                   s.req.max_tokens - static_cast<int64_t>(s.output.size()));
      s.allowed.resize(model.config().vocab_size, 0);  // ids past the tokenizer's: never drawn
      e.allowed = s.allowed.data();
    }
    edits.push_back(e);
    edit_seqs.push_back(p);
  }
  if (!edits.empty()) {
    const int32_t vocab = model.config().vocab_size;
    const size_t bytes = static_cast<size_t>(plan.n_logit_rows()) * vocab * sizeof(float);
    st = Status();
    if (logits_scratch_.bytes() < bytes) {
      logits_scratch_.reset();
      auto buf = model.backend().alloc(bytes, "processed logits");
      if (buf.ok())
        logits_scratch_ = std::move(buf).value();
      else
        st = buf.status();
    }
    float* processed = logits_scratch_.as<float>();
    if (st.ok()) st = model.backend().copy(model.logits(), bytes, processed);
    if (st.ok())
      st = model.backend().process_logits({processed, plan.n_logit_rows(), vocab, edits.data(),
                                           static_cast<int32_t>(edits.size())});
    if (st.ok()) {
      sample_logits = processed;
    } else {  // the requests that asked fail; the others are sampled from the raw logits
      OSCAR_LOG_ERROR("scheduler: logits processing failed: %s", st.to_string().c_str());
      for (int32_t p : edit_seqs) fail(*owners[plan.chunk[p]], st);
    }
  }
  kernels::SampleParams sp;
  sp.logits = sample_logits;
  sp.n_rows = plan.n_logit_rows();
  sp.vocab = model.config().vocab_size;
  sp.config = configs.data();
  sp.step = draws.data();
  sp.ids = ids.data();
  st = model.backend().sample(sp);
  if (st.ok()) st = injected(FaultInjection::kSample);
  if (!st.ok()) {
    // The configs were validated at submit, so this is the device failing (a CUDA error): every
    // request of the step fails (their K/V was committed; ending them frees it), and the loop
    // goes on unless the device cannot run work any more.
    OSCAR_LOG_ERROR("scheduler: sampling failed for %zu sequences: %s", owners.size(),
                    st.to_string().c_str());
    const Status device = probe_device();
    for (Sequence* s : owners) fail(*s, st);
    if (!device.ok()) fail_live(device);
    return;
  }
  // Log-probabilities of the drawn tokens, for the requests that ask (off the common path).
  {
    std::vector<int32_t> lp_rows, lp_tokens, lp_seq;
    int32_t top_k = 0;
    for (int32_t p = 0; p < plan.n_seqs(); ++p) {
      const Sequence& s = *owners[plan.chunk[p]];
      const int64_t n = plan.cu_seqlens[p + 1] - plan.cu_seqlens[p];
      const int32_t id = ids[plan.cu_logits[p]];
      if (s.done || s.req.logprobs < 0 || id < 0 || !per_chunk[plan.chunk[p]].ok()) continue;
      if (s.prefilled + n < static_cast<int64_t>(s.context.size())) continue;  // mid-prefill
      lp_rows.push_back(plan.cu_logits[p]);
      lp_tokens.push_back(id);
      lp_seq.push_back(p);
      top_k = std::max(top_k, s.req.logprobs);
    }
    if (!lp_rows.empty()) {
      const size_t n = lp_rows.size();
      std::vector<float> token_lp(n), top_lp(n * top_k);
      std::vector<int32_t> top_ids(n * top_k);
      kernels::LogprobsParams lp;
      lp.logits = model.logits();
      lp.n_rows = plan.n_logit_rows();
      lp.vocab = model.config().vocab_size;
      lp.n = static_cast<int32_t>(n);
      lp.rows = lp_rows.data();
      lp.tokens = lp_tokens.data();
      lp.top_k = top_k;
      lp.token_logprob = token_lp.data();
      lp.top_ids = top_ids.data();
      lp.top_logprobs = top_lp.data();
      st = model.backend().logprobs(lp);
      if (!st.ok()) OSCAR_LOG_ERROR("scheduler: logprobs failed: %s", st.to_string().c_str());
      for (size_t i = 0; i < n; ++i) {
        Sequence& s = *owners[plan.chunk[lp_seq[i]]];
        if (!st.ok()) {  // the requests that asked fail; the others go on
          fail(s, st);
          continue;
        }
        s.has_logprobs = true;
        s.token_logprob = token_lp[i];
        s.top_logprobs.clear();
        for (int32_t k = 0; k < s.req.logprobs; ++k)
          s.top_logprobs.emplace_back(top_ids[i * top_k + k], top_lp[i * top_k + k]);
      }
    }
  }
  for (int32_t p = 0; p < plan.n_seqs(); ++p) {
    Sequence& s = *owners[plan.chunk[p]];
    if (s.done) continue;  // failed in this step (logits processing)
    if (!per_chunk[plan.chunk[p]].ok()) {
      OSCAR_LOG_WARN("scheduler: request %s failed: %s", s.req.request_id.c_str(),
                     per_chunk[plan.chunk[p]].to_string().c_str());
      fail(s, per_chunk[plan.chunk[p]]);
      continue;
    }
    const int64_t n = plan.cu_seqlens[p + 1] - plan.cu_seqlens[p];
    if (s.prefilling()) {
      s.prefilled += n;
      if (s.preemptions == 0) {  // a recompute after a preemption is not new prompt work
        std::lock_guard<std::mutex> lock(mu_);
        metrics_.prompt_tokens_total += static_cast<uint64_t>(n);
      }
      if (s.prefilling()) {
        if (hybrid_prefix() && s.cache->n_tokens() == s.branch_tokens) { // a snapshot there only
          publish_prefix(s, /*keep_locked=*/true, /*kept_state=*/false, /*live_state=*/true);
        }
        keep_boundary_state(s);
        continue;
      }
      if (radix_) publish_prefix(s, /*keep_locked=*/true, /*kept_state=*/true, /*live_state=*/true);
    }
    keep_boundary_state(s);  // before handle_token, which may end the request and publish it
    const int32_t token = ids[plan.cu_logits[p]];
    if (token == kernels::kSampleNonFinite) {
      const Status bad = internal_error("the model produced non-finite logits at position %lld",
                                        static_cast<long long>(plan.pos0[p] + n - 1));
      OSCAR_LOG_WARN("scheduler: request %s failed: %s", s.req.request_id.c_str(),
                     bad.to_string().c_str());
      fail(s, bad);
      continue;
    }
    handle_token(s, token);
  }
}

// metrics_: the model, the page size and the pools' pages (used, cached, evictable). Called with
// mu_ held, from the loop and once at start-up, so that /metrics has them before any request.
void Scheduler::snapshot_pools() {
  metrics_.model_name = options_.model_name;
  metrics_.kv_page_size = runtime_->spec().regions.page_size;
  metrics_.kv_pools.clear();
  std::vector<kv::PagePool*> pools = {&runtime_->exact_pool()};
  if (runtime_->int2_pool()) pools.push_back(runtime_->int2_pool());
  metrics_.prefix_cache_pages = 0;
  metrics_.prefix_cache_blocks = radix_ ? radix_->stats().cached_chunks : 0;
  for (size_t i = 0; i < pools.size(); ++i) {
    KvPoolUsage u{i == 0 ? pools[i]->name() : "int2", pools[i]->n_used(), pools[i]->n_pages()};
    // The radix cache's pool i is this pool i (create() hands it the same list).
    if (radix_ && i < radix_->stats().cached_pages.size()) {
      u.pages_cached = radix_->stats().cached_pages[i];
      u.pages_evictable = radix_->stats().evictable_pages[i];
      metrics_.prefix_cache_pages += u.pages_cached;
    }
    metrics_.kv_pools.push_back(std::move(u));
  }
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::string> cancels;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !incoming_.empty() || !cancels_.empty() || !running_.empty() ||
               !waiting_.empty();
      });
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      cancels.swap(cancels_);
      if (stop_) break;
    }
    for (const std::string& id : cancels) {
      for (auto& s : running_)
        if (s->req.request_id == id) finish(*s, "cancelled");
      for (auto& s : waiting_)
        if (s->req.request_id == id) finish(*s, "cancelled");
    }
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const std::unique_ptr<Sequence>& s) { return s->done; }),
                   running_.end());
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                  [](const std::unique_ptr<Sequence>& s) { return s->done; }),
                   waiting_.end());
    if (device_fault().empty()) {
      admit();
      step();
    } else {  // requests that arrived before submit() saw the fault: they cannot run
      fail_live(unavailable("%s", device_fault().c_str()));
    }
    publish_kv_events();

    // Metrics snapshot.
    int64_t bytes = 0, elements = 0;
    const auto& c = runtime_->model().config();
    for (auto& s : running_) {
      if (!s->cache) continue;
      bytes += s->cache->bytes().total();
      elements += 2 * s->cache->n_tokens() * c.n_layers * c.n_heads_kv * c.head_dim;
    }
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.requests_running = static_cast<int>(running_.size());
    metrics_.requests_waiting = static_cast<int>(waiting_.size());
    snapshot_pools();
    // Idle (nothing stored): 0, not the last request's value or 0/0.
    metrics_.kv_effective_bits_per_element = elements > 0 ? 8.0 * bytes / elements : 0.0;
    if (radix_) {
      metrics_.prefix_cache_query_tokens = static_cast<uint64_t>(radix_->stats().lookup_tokens);
      metrics_.prefix_cache_hit_tokens = static_cast<uint64_t>(radix_->stats().matched_tokens);
    }
    if (radix_ && radix_->stats().lookup_tokens > 0)
      metrics_.prefix_cache_hit_rate = static_cast<double>(radix_->stats().matched_tokens) /
                                       static_cast<double>(radix_->stats().lookup_tokens);
  }
  // Shutdown: everything still queued or running ends as cancelled.
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  for (auto& s : running_) finish(*s, "cancelled");
  for (auto& s : waiting_) finish(*s, "cancelled");
  running_.clear();
  waiting_.clear();
  publish_kv_events();
}

}  // namespace oscar::engine
