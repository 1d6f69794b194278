// Perplexity of a cache mode on a token stream, by the protocol of models/tiny-qwen3/README.md:
// non-overlapping windows of window_tokens + 1 tokens from token 0 (window j = tokens
// [W·j, W·j + W]), a fresh cache per window, the W next-token predictions of each window scored,
// loss averaged over all predictions, then exponentiated.
//
// Each window is ONE forward of W tokens with all logits, in AttendMode::kDecodeEquivalent, so
// every prediction reads the cache exactly as decode would at its position (sinks and the last
// n_recent .. n_recent + page_size - 1 tokens exact, the rest INT2). Losses are computed from
// log-softmax in double precision.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/runtime.h"
#include "kv/sequence_cache.h"

namespace oscar::eval {

struct PplOptions {
  int n_windows = 100;
  int first_window = 0;  // windows first_window … first_window + n_windows − 1 (for shards)
  int window_tokens = 4096;
  // Predictions made at positions >= tail_from (the input token's position in its window) are
  // also reported separately ("ppl >= 1024").
  int tail_from = 1024;
  kv::AttendMode attend_mode = kv::AttendMode::kDecodeEquivalent;
};

struct PplResult {
  int n_windows = 0;
  int64_t n_predictions = 0, n_tail = 0;
  double nll_sum = 0.0, nll_tail_sum = 0.0;  // natural log
  std::vector<double> window_nll;            // mean loss of each window
  double seconds = 0.0;                      // wall time of the forwards and losses
  double ppl() const;
  double ppl_tail() const;
};

// How many whole windows a stream of n tokens holds (each needs window_tokens + 1 tokens).
int64_t available_windows(int64_t n_tokens, int window_tokens);

// Negative log-likelihood of `target` under `logits` [vocab] (log-softmax in double).
double token_nll(std::span<const float> logits, int32_t target);

// Scores windows first_window .. first_window + n_windows - 1 of `tokens`. InvalidArgument when the stream holds fewer.
// `on_window(done, result_so_far)` is called after each window (progress display); may be empty.
Result<PplResult> evaluate_perplexity(
    engine::Runtime& runtime, std::span<const int32_t> tokens, const PplOptions& options,
    const std::function<void(int, const PplResult&)>& on_window = {});

}  // namespace oscar::eval
