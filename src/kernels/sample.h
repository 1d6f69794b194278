// sample: one token id per logits row, for a whole step in one call; only the ids leave the op
// (a device backend copies back n_rows int32). Greedy when temperature is 0 (argmax, lowest id
// on ties), else temperature, top-k and top-p (nucleus) filtering and a draw.
//
// The draw is counter-based: row r uses u = U(seed_r, step_r), a SplitMix64 hash of the request's
// seed and the index of the token being drawn, so a seeded request gives the same tokens on any
// backend and in any batch, with no generator state to carry between steps.
//
// With neither top-k nor top-p the draw walks all tokens in id order (nothing is sorted).
// Otherwise candidates are ordered by logit, descending, ties by lower id. Probabilities are
// p_i = exp((l_i − l_max) / T) in float64. With top_k = k > 0 the candidates are the first k; the
// mass M is Σ p_i over them in that order; else the candidates are all tokens and M = Σ p_i in id
// order. top_p keeps the shortest prefix whose prefix sum (in candidate order) reaches top_p · M.
// The draw picks the first candidate whose prefix sum exceeds u · S, S the kept prefix's sum.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace oscar::kernels {

struct SamplingConfig {
  float temperature = 0.f;  // 0 = greedy
  int32_t top_k = 0;        // 0 = no limit
  float top_p = 1.f;        // 1 = no limit
  uint64_t seed = 0;
};

// InvalidArgument naming the value: temperature finite and >= 0, top_k >= 0, top_p in (0, 1].
Status validate_sampling(const SamplingConfig& c);

inline constexpr int32_t kSampleNonFinite = -1;
// sample_cuda only: a row the device does not sample (top_k > 0, top_p < 1, or an invalid
// config, which it cannot report as a Status): the caller samples that row on the host.
inline constexpr int32_t kSampleOnHost = -2;

struct SampleParams {
  const float* logits = nullptr;          // [n_rows, vocab]
  int32_t n_rows = 0;
  int32_t vocab = 0;
  const SamplingConfig* config = nullptr;  // [n_rows]
  const uint64_t* step = nullptr;          // [n_rows] index of the token each row draws
  int32_t* ids = nullptr;                  // [n_rows] out; kSampleNonFinite for a row with a
                                           // NaN or infinite logit
};

// Sorts the whole vocabulary: defines "correct".
Status sample_ref(const SampleParams& p);
// Selects without sorting the vocabulary: one pass for the max (greedy: done), nth_element for
// top-k, and for top-p alone a prefix of the candidates that grows until it holds the mass.
Status sample(const SampleParams& p);
// CUDA (kernels/cuda/sample.cu): every pointer of `p` in device memory (logits, config, step,
// ids); one block per row; asynchronous on `stream` (a cudaStream_t). Greedy and unfiltered
// temperature rows on the device; rows with top-k / top-p get kSampleOnHost.
Status sample_cuda(const SampleParams& p, void* stream);

// One row (tools that decode one sequence): sample() on a batch of one. The config must be valid.
int32_t sample_one(const float* logits, int32_t vocab, const SamplingConfig& config, uint64_t step);

// The uniform draw in [0, 1) of (seed, step).
double sample_uniform(uint64_t seed, uint64_t step);

}  // namespace oscar::kernels
