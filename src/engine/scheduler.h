// Scheduler: the continuous-batching Engine (engine/engine_api.h) over one Runtime.
//
// One thread runs the loop: take new requests and cancellations, admit waiting requests whose
// prefill pages fit what is free (plus a 1% watermark; the rest wait in FIFO order), build one
// batch of decode tokens plus chunked prefill (new requests
// join between steps), run the model once for the whole batch, sample, stream text, finish.
// Cancellation releases every page at once, also in the middle of a prefill.
//
// Prefix cache (kv/radix_cache.h): at admission the longest cached page-aligned prefix of the
// prompt is adopted in the form the sequence holds it (sinks, INT2 history, then full BF16
// recent-window pages, which the sequence only reads and later demotes into INT2 pages of its
// own: kv::choose_prefix_forms); a prompt is inserted as soon as its prefill ends (so requests
// sharing a system prompt hit while the first one still decodes), and again with its generated
// tokens when the request ends, so multi-turn conversations and agent loops reuse their own
// history.
// Hybrids (Gated DeltaNet layers, kv/radix_cache.h "hybrid mode"): a cached prefix is served
// only up to a node with a DeltaNet state snapshot, whose copy becomes the sequence's state.
// Each sequence keeps the state at the last page boundary its committed tokens reached
// (SequenceCache::keep_state_snapshot), and its prefill chunks end at its context's last page
// boundaries (that of the tokens a repeat of the prompt looks up, and that of the whole prompt),
// so that publishing stores a snapshot where reuse is likely: the prompt's last full pages when
// its prefill ends (n > 1 choices, retries, longer prompts), and the last full page of prompt +
// output when it ends or is preempted (the next turn of a conversation, the readmission of a
// preempted request). A prompt whose lookup found cached pages beyond the deepest snapshot
// branches off a cached path there (a shared system prompt): its prefill also stops at that
// page boundary and stores a snapshot, which the next prompt with that prefix adopts. At most
// prefix_state_snapshots are kept (LRU).
// Unlocked cached pages count as available at admission and are evicted (LRU) when a step's
// pages do not fit.
//
// Memory follows use: pages are taken as sequences grow (SequenceCache::reserve in each step), not
// reserved for a request's peak. When a pool runs dry in a step, the prefix cache's unlocked pages
// go first, then the latest-arrived running request is preempted: its pages are freed (its
// prefix published to the radix cache, its lock released), its prompt and generated tokens are
// kept, and it goes back to the head of the waiting queue. Readmitted, it prefills prompt +
// output (shortened by the radix cache) and its last logits give the next token with the same
// sampling draw index, so it continues exactly where it was; its stream is never re-sent. A
// request that cannot fit even alone fails with OutOfRange; one whose peak pages exceed a pool
// is refused at submit (InvalidArgument). tests/engine/test_scheduler.cpp: Preemption*.
//
// The choices of n > 1 are separate requests; each after the first names the first in
// share_prompt_with and waits at the head of the queue until the first's prefill is done, then
// adopts its prompt pages from the prefix cache (all but the last partial page).
// tests: NChoicesSharePromptPages.
//
// A step that fails (the forward pass, demotion, logits processing, sampling or log-probabilities
// return an error, e.g. a CUDA error on a GPU) fails the requests in that step with the error
// (the server's OpenAI error object or stream error event); the loop goes on serving the rest.
// FaultInjection makes a chosen step fail on purpose, so that tests can check this on the CPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine_api.h"
#include "engine/prefill_budget.h"
#include "engine/runtime.h"
#include "kv/admission.h"
#include "kv/kv_events.h"
#include "kv/radix_cache.h"
#include "kv/step_plan.h"
#include "tokenizer/chat_template.h"

namespace oscar::engine {

struct TokenTrie;  // engine/tool_constraint.h

// A deliberate failure, for tests and debugging: the n-th forward step (kStep) or the n-th
// sampling call (kSample), counted from 1 since start-up, returns an Internal error as a failed
// device step would; kDevice fails the n-th step and then reports the device lost
// (Backend::health), as a corrupted CUDA context would. Spelled "step:N", "sample:N" or
// "device:N" (SchedulerOptions::fault_inject or the environment variable OSCAR_FAULT_INJECT).
struct FaultInjection {
  enum Where { kNone, kStep, kSample, kDevice };
  Where where = kNone;
  int64_t n = 0;  // >= 1 when where != kNone
  static Result<FaultInjection> parse(std::string_view spec);
};

struct SchedulerOptions {
  std::string model_name = "tiny-qwen3";
  int max_running = 64;         // sequences decoded together
  int max_batch_tokens = 1024;  // tokens per forward step (decode tokens + prefill chunks)
  int prefill_chunk = 512;      // prefill tokens per request per step
  // While sequences decode, prefill chunks are sized so that a step lasts at most about this
  // many undisturbed decode steps (engine/prefill_budget.h); <= 1: off, only the two token
  // limits above apply.
  double prefill_itl_factor = 0;
  bool prefix_cache = true;     // share prompt prefixes between requests (radix cache)
  // Hybrid models (Gated DeltaNet layers): DeltaNet state snapshots the prefix cache keeps at
  // page boundaries (host memory, the runtime's state-pool bytes per slot each; beyond the KV
  // budget); a cached prefix is served only up to a snapshot. 0: the prefix cache is off for
  // hybrids. Dense models ignore it.
  int prefix_state_snapshots = 32;
  // Longest prompt + max_tokens accepted (info().max_context_tokens). 0: the model's
  // max_position_embeddings, lowered to the longest sequence whose peak pages fit the pools.
  int max_model_len = 0;
  // Requests queued for admission at most; submit() answers ResourceExhausted beyond (the server's
  // 429). The later choices of an n > 1 request may take max_running places more (submit()).
  // 0: unbounded.
  int max_waiting = 1024;
  // KV-cache events for routers (kv/kv_events.h; e.g. server::KvEventPublisher): every page the
  // radix cache stores or evicts, one batch per step. Not owned; outlives the scheduler. Needs
  // prefix_cache. Null = no events.
  kv::KvEventSink* kv_event_sink = nullptr;
  // FaultInjection::parse's spelling ("step:3", "sample:1"); "" = none, unless the environment
  // variable OSCAR_FAULT_INJECT gives one (a debugging knob: never set it in production).
  std::string fault_inject;
};

class Scheduler : public Engine {
 public:
  static Result<std::unique_ptr<Scheduler>> create(std::unique_ptr<Runtime> runtime,
                                                   const SchedulerOptions& options);
  ~Scheduler() override;

  Status submit(GenerationRequest req,
                std::function<void(const GenerationEvent&)> on_event) override;
  void cancel(const std::string& request_id) override;
  EngineInfo info() const override;
  EngineMetrics metrics() const override;
  Result<std::vector<int32_t>> tokenize(std::string_view text) const override;
  Result<std::string> apply_chat_template(
      const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
      bool add_generation_prompt, const nlohmann::ordered_json& chat_template_kwargs) const override;
  // The safe chat path (tokenizer/chat_prompt.h): special-token text inside client strings is
  // tokenized as text; only the template's own special tokens are control tokens.
  Result<std::vector<int32_t>> tokenize_chat(const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools,
                                             bool add_generation_prompt,
                                             const nlohmann::ordered_json& kwargs) const override;
  bool has_chat_template() const override { return chat_template_ != nullptr; }

  // Stops the loop; pending requests finish as "cancelled".
  void shutdown();

 private:
  struct Sequence;

  Scheduler(std::unique_ptr<Runtime> runtime, const SchedulerOptions& options);
  void loop();
  kv::PageNeed pages_needed(int64_t n_tokens) const;
  kv::PageNeed prefill_pages(int64_t n_tokens, std::span<const kv::CachedPage> cached) const;
  void available_pages(int64_t out[2]) const;
  void admit();
  bool prefilling(const std::string& id) const;
  void preempt(Sequence& s);
  kv::PrefixMatch match_prefix(const Sequence& s);
  void attach_prefix(Sequence& s, const kv::PrefixMatch& m);
  // Hybrids: kept_state stores the state the sequence kept at its last page boundary
  // (SequenceCache::keep_state_snapshot); live_state its live state, which must be that of its
  // committed tokens (after a step that succeeded), when those end on a page.
  void publish_prefix(Sequence& s, bool keep_locked, bool kept_state = true,
                      bool live_state = false);
  // Hybrid with the prefix cache: keeps the state when the committed tokens end on a page.
  void keep_boundary_state(Sequence& s);
  bool hybrid_prefix() const { return radix_ && radix_->hybrid(); }
  void step();
  void run_step(std::span<const kv::StepChunk> chunks, std::span<Sequence* const> owners);
  void handle_token(Sequence& s, int32_t token);
  void finish(Sequence& s, const std::string& reason);
  void fail(Sequence& s, const Status& error);
  void end(Sequence& s, const GenerationEvent& terminal);
  void release(Sequence& s);
  void publish_kv_events();
  void snapshot_pools();  // mu_ held
  // The injected failure of this call (FaultInjection), else OK. Loop thread.
  Status injected(FaultInjection::Where where);
  // After a failed step: asks the backend whether the device still runs work; if not, records
  // why (device_fault_, before any client hears of the failure) and returns it. Loop thread.
  Status probe_device();
  void fail_live(const Status& error);  // every live request not yet ended
  std::string device_fault() const;  // empty while the device is healthy
  // The tokenizer's TokenTrie for constrained decoding, built on first use (any thread).
  std::shared_ptr<const TokenTrie> token_trie();

  std::unique_ptr<Runtime> runtime_;
  SchedulerOptions options_;
  PrefillBudget prefill_budget_;  // loop thread
  int max_model_len_ = 0;  // resolved options_.max_model_len
  std::unique_ptr<tok::ChatTemplate> chat_template_;
  bool template_reads_reasoning_ = false;  // tok::template_reads_reasoning of its source
  std::unique_ptr<kv::RadixCache> radix_;  // null when prefix caching is off
  kv::KvEventCollector kv_events_;          // the radix cache's listener when events are on
  int64_t kv_events_dropped_seen_ = 0;

  // Guards incoming_, cancels_, live_ids_, stop_, next_arrival_, n_queued_, metrics_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  std::vector<std::string> cancels_;
  std::unordered_map<std::string, bool> live_ids_;
  bool stop_ = false;
  uint64_t next_arrival_ = 0;
  int n_queued_ = 0;  // submitted, never admitted, not ended (max_waiting counts these)
  EngineMetrics metrics_;
  std::atomic<bool> ready_{false};
  // Set once the device cannot run work any more (probe_device): the reason, read by info() and
  // submit() on other threads.
  mutable std::mutex fault_mu_;
  std::string device_fault_;
  std::mutex trie_mu_;  // guards token_trie_
  std::shared_ptr<const TokenTrie> token_trie_;

  // Loop-thread state.
  FaultInjection fault_;
  int64_t fault_calls_[4] = {0, 0, 0, 0};  // calls so far, by FaultInjection::Where
  bool device_lost_injected_ = false;
  DeviceBuffer logits_scratch_;  // [n_logit_rows, vocab] processed logits (grown when needed)
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::thread thread_;
};

}  // namespace oscar::engine
