// Engine: the interface between the HTTP layer (src/server/) and whatever runs the model (the
// continuous-batching scheduler in src/engine/, or a fake in tests/server/). The server turns an
// OpenAI request into a GenerationRequest, submits it with a callback, and relays the
// GenerationEvents it receives. Nothing about HTTP, JSON schemas or the scheduler's internals
// lives here. Header-only: plain data plus one abstract class.
//
// Threading contract (implementations must honour it; the server relies on it):
//   - Every method may be called from any thread, concurrently.
//   - on_event is invoked from the engine's own thread(s), never from inside submit() or
//     cancel(). It must return quickly and must not call back into the Engine synchronously.
//   - For one request, events arrive in order and never concurrently: zero or more kToken, then
//     exactly one terminal event (kFinished or kError), after which on_event is never called
//     again and is destroyed. This holds for cancelled requests too (finish_reason "cancelled"),
//     so a callback that owns resources is always released.
//   - If submit() returns an error, on_event is never called.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "kernels/sample.h"

namespace oscar::engine {

// How the next token is drawn. temperature 0 means greedy (argmax).
struct SamplingParams {
  // Temperature, top-k, top-p and seed, as the sampling kernel takes them (kernels/sample.h).
  // A request samples at temperature 1 unless it asks otherwise; config.seed is used only when
  // has_seed, else the engine picks a seed.
  kernels::SamplingConfig config{.temperature = 1.0f};
  bool has_seed = false;
  // Penalties (kernels/logits.h), applied to the logits before temperature, greedy included.
  float presence_penalty = 0.f;    // [-2, 2], OpenAI: output tokens, once each
  float frequency_penalty = 0.f;   // [-2, 2], OpenAI: output tokens, per occurrence
  // vLLM/HF: prompt and output tokens; 1 = off. In [kMinRepetitionPenalty, kMaxRepetitionPenalty].
  float repetition_penalty = 1.f;
};

// The repetition penalty's range. vLLM takes any r > 0, but a positive logit divided by a tiny r
// (or a negative one multiplied by a huge r) overflows to infinity and the request fails with
// non-finite logits. Useful values are near 1 (1.05 .. 1.5); 0.01 and 100 scale a logit 100x
// at most, which keeps any finite logit a model produces finite.
inline constexpr float kMinRepetitionPenalty = 0.01f;
inline constexpr float kMaxRepetitionPenalty = 100.f;

// Log-probabilities are the log-softmax of the model's raw logits (before penalties, masks and
// temperature: vLLM's default "raw logprobs").
inline constexpr int kMaxLogprobs = 20;

class JsonSchema;  // engine/json_schema.h

struct GenerationRequest {
  std::string request_id;           // unique among live requests; cancel() uses it
  std::vector<int32_t> prompt_ids;  // [n_prompt_tokens], each in [0, vocab_size)
  SamplingParams sampling;
  int max_tokens = 16;              // > 0; prompt + max_tokens <= max_context_tokens
  std::vector<std::string> stop;    // stop strings, matched on the decoded text; not emitted
  bool ignore_eos = false;          // keep generating past the end-of-sequence token
  // -1: no log-probabilities. k in [0, kMaxLogprobs]: each kToken event carries the token's
  // log-probability and the k most likely tokens with theirs.
  int logprobs = -1;
  // Non-empty: the output is constrained to be exactly one tool call to one of these functions,
  // `<tool_call>\n{"name": "<name>", "arguments": <JSON object>}\n</tool_call>`, after which the
  // request finishes with "stop" (engine/tool_constraint.h says what is constrained).
  std::vector<std::string> tool_call_names;
  // Empty, or one per tool_call_names: the arguments of a call to that function follow the
  // schema (strict tools); null: any JSON object.
  std::vector<std::shared_ptr<const JsonSchema>> tool_call_schemas;
  // tool_choice "auto" with strict tools: tool_call_names and tool_call_schemas constrain a call
  // only once the model starts one (ToolCallConstraint::create_on_call); before, nothing is.
  bool tool_call_on_start = false;
  // JSON mode (response_format json_object): the output is constrained to be one JSON object,
  // after which the request finishes with "stop". Not with tool_call_names.
  bool json_object = false;
  // Structured outputs (response_format json_schema): the output is constrained to be one
  // document valid under this schema (engine/json_schema.h), after which the request finishes
  // with "stop". Not with tool_call_names or json_object.
  std::shared_ptr<const JsonSchema> json_schema;
  // The id of a request submitted just before with the same prompt (the choices of n > 1): this
  // one is admitted only once that one's prompt is in the prefix cache, so that the prompt's
  // pages are shared, not computed and stored again. Ignored without the prefix cache, or when
  // that request is no longer live.
  std::string share_prompt_with;
};

struct TokenLogprob {
  int32_t token_id = -1;
  std::string bytes;  // what the token decodes to, raw (may be part of a UTF-8 character)
  float logprob = 0.f;
};

struct GenerationEvent {
  enum Kind { kToken, kFinished, kError };
  Kind kind = kToken;
  // kToken: new text, always whole UTF-8 characters (the engine holds back a partial character
  // and any text that could still become a stop string). May be empty.
  std::string text_delta;
  int32_t token_id = -1;       // kToken: the sampled token
  // kToken of a request with logprobs >= 0 (not the end-of-sequence token that ends it):
  bool has_logprobs = false;
  TokenLogprob chosen;                     // the sampled token
  std::vector<TokenLogprob> top_logprobs;  // [logprobs] most likely first, ties lower id
  std::string finish_reason;   // kFinished: "stop" (EOS or stop string) | "length" | "cancelled"
  Status error;                // kError: why the request failed
  // Usage so far; final on the terminal event.
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;       // prompt tokens served from the prefix cache
};

struct EngineInfo {
  std::string model_name;      // what /v1/models lists and requests must name
  int max_context_tokens = 0;  // prompt + completion
  int vocab_size = 0;
  // Requests that can be live at once (running + queued): the most choices (n) one request can
  // have, since its choices run as that many requests. 0: no cap.
  int max_live_requests = 0;
  bool ready = false;          // false while loading or warming up (/health answers 503)
  // Non-empty once the device cannot run work any more (a corrupted CUDA context): why. /health
  // and every new request then answer 503, so that a router sends the traffic elsewhere.
  std::string fault;
};

// A latency histogram as Prometheus wants it. counts has upper_bounds.size() + 1 entries: counts[i]
// observations fell in (upper_bounds[i-1], upper_bounds[i]], the last entry is the +Inf bucket.
// Counts are per bucket (not cumulative); the server accumulates them.
struct Histogram {
  std::vector<double> upper_bounds;  // seconds, ascending
  std::vector<uint64_t> counts;      // [upper_bounds.size() + 1]
  double sum = 0.0;                  // seconds, over all observations
};

struct KvPoolUsage {
  std::string pool;  // "bf16", "int2", ...
  int64_t pages_used = 0;  // not free: held by requests or by the prefix cache
  int64_t pages_total = 0;
  // Of pages_used: pages the prefix cache references (some may be in use by requests too), and
  // those only it holds (evictable whenever a request needs room: vLLM counts them as free).
  int64_t pages_cached = 0;
  int64_t pages_evictable = 0;
};

// A snapshot; totals are monotonic since engine start. model_name, kv_page_size and kv_pools are
// filled from start-up (before the first request).
struct EngineMetrics {
  int requests_running = 0;
  int requests_waiting = 0;
  uint64_t prompt_tokens_total = 0;
  uint64_t generation_tokens_total = 0;
  uint64_t num_preemptions_total = 0;  // running requests preempted (pages ran out)
  std::vector<KvPoolUsage> kv_pools;
  double prefix_cache_hit_rate = 0.0;          // [0, 1]
  int64_t prefix_cache_pages = 0;              // pages the prefix cache references (all pools)
  int64_t prefix_cache_blocks = 0;  // page-sized chunks it holds, in one form or two (KV events)
  uint64_t prefix_cache_query_tokens = 0;      // prompt tokens looked up in the prefix cache
  uint64_t prefix_cache_hit_tokens = 0;        // of those, tokens found
  std::string model_name;                      // the served model (metric labels)
  int32_t kv_page_size = 0;                    // tokens per KV page (routers' block size)
  double kv_effective_bits_per_element = 0.0;  // averaged over the stored KV cache
  std::string device;                          // the backend: cpu or cuda
  int64_t device_memory_used_bytes = -1;       // a GPU's memory in use (all of it, not only
  int64_t device_memory_total_bytes = -1;      // ours); -1 on the CPU
  Histogram time_to_first_token_seconds;
  Histogram time_per_output_token_seconds;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Queues a request. Returns an error at once (and never calls on_event) when the request can
  // never run: InvalidArgument for prompt plus max_tokens beyond the context or beyond what the KV
  // pools can ever hold, ids out of range, a duplicate id; ResourceExhausted when the waiting
  // queue is full (retry later).
  virtual Status submit(GenerationRequest req,
                        std::function<void(const GenerationEvent&)> on_event) = 0;
  // Stops a request soon (queued or running) and frees its KV pages; its terminal event is
  // kFinished with finish_reason "cancelled" (unless it finished first). Unknown ids are ignored.
  virtual void cancel(const std::string& request_id) = 0;

  virtual EngineInfo info() const = 0;
  virtual EngineMetrics metrics() const = 0;

  // Text to prompt ids, without special tokens added.
  virtual Result<std::vector<int32_t>> tokenize(std::string_view text) const = 0;
  // Renders the model's chat template. messages is the OpenAI array as received (validated by the
  // server only for shape: non-empty, objects with a string "role"); tools is an array or null;
  // chat_template_kwargs is an object or null (e.g. {"enable_thinking": false}).
  virtual Result<std::string> apply_chat_template(
      const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
      bool add_generation_prompt, const nlohmann::ordered_json& chat_template_kwargs) const = 0;

  // The prompt ids of a chat on the safe path (tokenizer/chat_prompt.h, tok::encode_chat): only
  // the special tokens the chat template writes are control tokens; special-token text inside
  // messages, tools or kwargs is tokenized as ordinary text. This is what the server calls;
  // tokenize(apply_chat_template(...)) would let a user forge turns. messages are as the server
  // normalized them (string content, roles system/user/assistant/tool). Errors: InvalidArgument
  // for template errors (a client error), Internal when the model has no chat template (a server
  // error). The default refuses, so that an engine can never fall back to the unsafe path.
  virtual Result<std::vector<int32_t>> tokenize_chat(
      const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
      bool add_generation_prompt, const nlohmann::ordered_json& chat_template_kwargs) const {
    (void)messages, (void)tools, (void)add_generation_prompt, (void)chat_template_kwargs;
    return Status(StatusCode::kInternal, "this engine does not implement tokenize_chat");
  }
  // Whether the model has a chat template (false: /v1/chat/completions answers 500).
  virtual bool has_chat_template() const { return true; }
};

}  // namespace oscar::engine
