// Attention fidelity of a cache mode against the bf16 cache, per layer, on a few windows of the
// evaluation text. A window is run as chunks in AttendMode::kDecodeEquivalent (so every position
// reads what decode would read, whatever the chunking), cut so that a few sampled query
// positions are single-token steps through the real cache:
//   [0, p1) [p1] [p1+1, p2) [p2] ... [pk+1, W)
// At a single-token step the observer recomputes the attention scores of every query head from
// q (rotated by R_K where the mode rotates keys; q·k is invariant under the common rotation) and
// the keys the cache holds (SequenceCache::read_row: INT2 rows dequantized, exact rows as stored),
// so the score distribution is exactly the one decode uses.
//
// Metrics (reference = the bf16 mode on the same windows):
//   score_kl[l]   mean over steps and query heads of KL(P_bf16 || P_mode) of attention probs
//   out_err[l]    sqrt(sum ||o - o_bf16||^2 / sum ||o_bf16||^2) of the attention output (before
//                 o_proj; unrotated by R_Vᵀ where the mode folds a value rotation), pooled over
//                 the sampled positions (every `stride`-th position) and query heads
//   hidden_err    the same pooled relative error of the final hidden state (after the final norm)
//   logit_kl      mean over the sampled positions of KL(softmax bf16 || softmax mode)
// A self-check: at single-token steps the output recomputed from the probabilities and the
// cache's V rows must equal the model's attention output (score_check_max_err, relative).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/runtime.h"

namespace oscar::eval {

struct FidelityOptions {
  int n_windows = 4;
  int window_tokens = 4096;
  int n_score_steps = 8;  // single-token steps per window, spread over [window/8, window)
  int stride = 8;         // positions p with p % stride == stride - 1 are sampled
};

// What one mode's pass recorded on the fidelity windows (the bf16 pass is the reference).
struct FidelityCapture {
  int n_layers = 0, n_heads_q = 0, head_dim = 0, hidden = 0, vocab = 0;
  std::vector<int64_t> steps;  // single-token step positions (same for every window)
  // Per window, in order. probs: [step][layer][head] attention probabilities over keys [0, p].
  struct Window {
    std::vector<std::vector<float>> probs;  // index (step * n_layers + layer) * n_heads_q + head
    std::vector<float> attn_out;            // [sampled pos][layer][n_heads_q * head_dim]
    std::vector<float> hidden;              // [sampled pos][hidden]
    std::vector<float> log_probs;           // [sampled pos][vocab] log-softmax
  };
  std::vector<Window> windows;
  double score_check_max_err = 0.0;  // self-check, see above
};

struct FidelityResult {
  std::vector<double> score_kl, out_err;  // [n_layers]
  double hidden_err = 0.0, logit_kl = 0.0;
  double score_check_max_err = 0.0;
  int n_windows = 0;
  double seconds = 0.0;
  double mean_score_kl() const;
  double mean_out_err() const;
};

// The single-token step positions of a window of W tokens (strictly increasing, in [1, W)).
std::vector<int64_t> fidelity_steps(int window_tokens, int n_steps);

// Runs the fidelity windows (windows 0 .. n_windows-1 of the perplexity protocol) in `runtime`'s
// mode and records what the metrics need.
Result<FidelityCapture> capture_fidelity(engine::Runtime& runtime, std::span<const int32_t> tokens,
                                         const FidelityOptions& options);

// Compares a mode's capture with the bf16 reference capture (same options).
Result<FidelityResult> compare_fidelity(const FidelityCapture& reference,
                                        const FidelityCapture& mode);

}  // namespace oscar::eval
