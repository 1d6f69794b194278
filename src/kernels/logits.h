// logits: what a step does to the logits rows besides sampling them, for the requests that ask.
//   - process_logits: OpenAI presence/frequency penalties, the vLLM/HF repetition penalty and an
//     allowed-token mask (constrained decoding), in place, before sample() (kernels/sample.h);
//   - logprobs: log-softmax of rows (the raw logits, before any processing), the chosen token's
//     log-probability and the top-k alternatives, copied to the host.
// Neither runs in a step where no request asks (the scheduler skips them), so the common path
// pays nothing. The references below are plain loops in float64 where it matters; the Backend
// (kernels/backend.h) exposes both, and a device backend may implement them by downloading the
// rows (Backend's default does).
//
// Penalties (applied to one row l[0..vocab), in this order, as vLLM's apply_penalties):
//   repetition r (> 0; 1 = off): every token seen in the prompt or the output:
//       l_t = l_t > 0 ? l_t / r : l_t * r
//   frequency f, presence p ([-2, 2]; 0 = off): every token of the output, c_t its count:
//       l_t -= f * c_t + p * (c_t > 0)
//   mask: l_t = kMaskedLogit for every t with allowed[t] == 0.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace oscar::kernels {

// Finite (sample() refuses non-finite rows) and far below any real logit: exp((l - max) / T)
// is 0 for every temperature the server accepts.
inline constexpr float kMaskedLogit = -1e30f;

// The most alternatives logprobs() returns per row (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// The edits of one row. All pointers in host memory.
struct LogitsRowEdit {
  int32_t row = 0;                         // logits row this edit applies to
  float repetition_penalty = 1.f;          // > 0; 1 = off
  float presence_penalty = 0.f;            // 0 = off
  float frequency_penalty = 0.f;           // 0 = off
  const int32_t* token_ids = nullptr;      // [n_tokens] distinct ids of the prompt and output
  const int32_t* output_counts = nullptr;  // [n_tokens] occurrences in the output (0: prompt only)
  int32_t n_tokens = 0;
  const uint8_t* allowed = nullptr;  // [vocab] 0 = masked; null = every token allowed
};

struct LogitsProcessParams {
  float* logits = nullptr;  // [n_rows, vocab] in the backend's memory, edited in place
  int32_t n_rows = 0;
  int32_t vocab = 0;
  const LogitsRowEdit* edits = nullptr;  // [n_edits] host memory, rows distinct
  int32_t n_edits = 0;
};

// Host memory only. InvalidArgument for a bad shape, a row or token id out of range, a
// repetition penalty <= 0 or non-finite penalties.
Status process_logits_ref(const LogitsProcessParams& p);

struct LogprobsParams {
  const float* logits = nullptr;  // [n_rows, vocab] in the backend's memory
  int32_t n_rows = 0;
  int32_t vocab = 0;
  int32_t n = 0;                    // rows asked for
  const int32_t* rows = nullptr;    // [n] host: logits row of each
  const int32_t* tokens = nullptr;  // [n] host: the token whose log-probability is reported
  int32_t top_k = 0;                // [0, kMaxTopLogprobs] alternatives per row
  float* token_logprob = nullptr;   // [n] host out
  int32_t* top_ids = nullptr;       // [n, top_k] host out: by logit descending, ties lower id
  float* top_logprobs = nullptr;    // [n, top_k] host out
};

// log p_t = l_t - max - log Σ exp(l_j - max), in float64. Host memory only.
Status logprobs_ref(const LogprobsParams& p);

}  // namespace oscar::kernels
