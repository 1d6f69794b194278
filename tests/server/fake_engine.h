// FakeEngine: a deterministic engine::Engine for the HTTP layer's tests and for oscar_fake_server.
// It needs no model. Tokens are bytes (id = byte value; ids >= 256 decode to "<id>"), the chat
// template is "<|role|>content\n" per message plus "<|assistant|>", and generation echoes the
// prompt: output token i is prompt token i % n_prompt. Without ignore_eos a request ends with
// "stop" once the prompt has been echoed once; at max_tokens it ends with "length". Stop strings
// are honoured (held back while they could still match, never emitted). With logprobs >= 0 every
// token carries scripted log-probabilities (fake_engine.cpp says which).
//
// A worker thread advances every live request by one token per token_delay (a toy continuous
// batch), delivering events outside its lock, per the contract of engine_api.h. Each request holds
// ceil(tokens / page_size) simulated KV pages, released when it ends, so tests can check that a
// cancelled request returns the pool to idle.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_api.h"

namespace oscar::server::testing {

class FakeEngine : public engine::Engine {
 public:
  struct Options {
    std::string model_name = "fake-model";
    int max_context_tokens = 512;
    int vocab_size = 1000;
    std::chrono::microseconds token_delay{1000};
    int page_size_tokens = 16;
    int64_t pages_total = 4096;
    bool ready = true;
    bool has_chat_template = true;  // false: tokenize_chat fails as a model without one does
    // true: a chat prompt is only the last message's content, so the echo is exactly that text
    // (tests of tool-call and reasoning parsing script the "model output" this way).
    bool chat_prompt_is_last_content = false;
  };

  explicit FakeEngine(Options options);
  FakeEngine() : FakeEngine(Options()) {}
  ~FakeEngine() override;  // finishes live requests as "cancelled", joins the worker

  Status submit(engine::GenerationRequest req,
                std::function<void(const engine::GenerationEvent&)> on_event) override;
  void cancel(const std::string& request_id) override;
  engine::EngineInfo info() const override;
  engine::EngineMetrics metrics() const override;
  Result<std::vector<int32_t>> tokenize(std::string_view text) const override;
  Result<std::string> apply_chat_template(const nlohmann::ordered_json& messages,
                                          const nlohmann::ordered_json& tools,
                                          bool add_generation_prompt,
                                          const nlohmann::ordered_json& kwargs) const override;
  // apply_chat_template() then tokenize() (the fake has no special tokens to guard).
  Result<std::vector<int32_t>> tokenize_chat(const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools,
                                             bool add_generation_prompt,
                                             const nlohmann::ordered_json& kwargs) const override;
  bool has_chat_template() const override { return opt_.has_chat_template; }

  // Test hooks. All thread-safe.
  void set_ready(bool ready) { ready_ = ready; }
  int64_t pages_used() const;
  int live_requests() const;
  uint64_t cancel_calls() const { return cancel_calls_; }
  uint64_t cancelled_requests() const { return cancelled_requests_; }
  // Copies of every request submitted so far, in order.
  std::vector<engine::GenerationRequest> submitted() const;
  // The messages of the last tokenize_chat() call, as the server normalized them.
  nlohmann::ordered_json last_chat() const;

 private:
  struct Live;
  void worker();

  Options opt_;
  std::atomic<bool> ready_;
  std::atomic<uint64_t> cancel_calls_{0};
  std::atomic<uint64_t> cancelled_requests_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  std::vector<std::unique_ptr<Live>> live_;
  std::vector<engine::GenerationRequest> submitted_;
  mutable nlohmann::ordered_json last_chat_;  // guarded by mu_
  int64_t pages_used_ = 0;
  uint64_t prompt_tokens_total_ = 0;
  uint64_t generation_tokens_total_ = 0;
  engine::Histogram ttft_;
  engine::Histogram tpot_;
  std::thread thread_;
};

}  // namespace oscar::server::testing
