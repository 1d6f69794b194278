// Clip-ratio search per (layer, KV head) for keys and values (OSCAR.md §1 "Clipping", beyond the
// release's fixed ρ_K = 0.96, ρ_V = 0.92), on a bounded in-memory sample of calibration windows.
//
// Every candidate ρ on a grid (e.g. 0.80 … 1.00; ρ >= 1 is "no clip") is scored by what attention
// does with the quantization error, as the study on the test model asked (unweighted logit error
// chose too small a ρ): the rotated keys or values of a window are clipped and quantized exactly
// as the cache does (quant/int2_quant.h, uniform or Lloyd-Max), and sampled queries attend over
// them. Only tokens the cache would hold in INT2 are quantized: for a query at position p, keys
// [n_sink, max(n_sink, p + 1 − n_recent)); sinks and the recent window stay exact (OSCAR.md §4,
// up to the page granularity of the recent window).
//
// Key objectives, summed over sampled queries i (z: exact logits, ẑ: logits over quantized keys,
// p, p̂ their softmax over keys t <= p_i):
//   prob            Σ_t (p_t − p̂_t)²              (error of the attention probabilities)
//   kl              Σ_t p_t (log p_t − log p̂_t)   (KL divergence of exact from quantized attention)
//   weighted-logit  Σ_t p_t (z_t − ẑ_t)²          (logit error weighted by attention probability)
//   logit           Σ_{t quantized} (z_t − ẑ_t)²  (unweighted; the study's objective, for reference)
// Value objective: attention-output error Σ_i ‖Σ_t p_it (v̂_t − v_t)‖², p from exact scores.
// Ties keep the larger ρ. Not here: collecting the sample (calib/calibrator.h), the quantizers.
// Thread-safety: search_clip is pure; callers run (layer, head) searches in parallel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "quant/row_codec.h"

namespace oscar::calib {

enum class KeyClipObjective { kProb, kKl, kWeightedLogit, kLogit };

Result<KeyClipObjective> parse_key_clip_objective(const std::string& name);
const char* key_clip_objective_name(KeyClipObjective o);
// "uniform" / "lloyd": the two INT2 quantizers; the clip search has no KIVI.
Result<quant::HistQuantizer> parse_quantizer(const std::string& name);
const char* quantizer_name(quant::HistQuantizer q);

// Candidate ratios min, min + step, …, max (inclusive, computed as min + i·step from integers).
struct ClipGrid {
  float min = 0.80f;
  float max = 1.00f;
  float step = 0.01f;
  Status validate() const;  // 0 < min <= max <= 1.5, step > 0, at most 1000 points
  std::vector<float> values() const;
};

// One calibration window of one (layer, KV head), exact (unrotated) activations.
struct ClipWindow {
  int64_t n_tokens = 0;
  std::vector<float> k;          // [n_tokens, head_dim] K after k_norm and RoPE
  std::vector<float> v;          // [n_tokens, head_dim] V
  std::vector<float> q;          // [n_queries, head_dim] sampled queries of the group's heads
  std::vector<int64_t> q_pos;    // [n_queries] position of each query, < n_tokens
};

struct ClipSearchConfig {
  int head_dim = 128;
  int group_size = 128;
  float attn_scale = 0.0f;  // logit scale; 0 means 1/sqrt(head_dim)
  int n_sink = 64;
  int n_recent = 256;
  quant::HistQuantizer quantizer = quant::HistQuantizer::kInt2Uniform;  // INT2 only: no KIVI
  KeyClipObjective key_objective = KeyClipObjective::kKl;
  ClipGrid grid;
};

struct ClipSearchResult {
  float k_clip = 1.0f, v_clip = 1.0f;
  std::vector<float> grid;                 // [n_grid] candidate ρ
  std::vector<double> k_loss, v_loss;      // [n_grid] objective per candidate (lower is better)
};

// Searches ρ_K and ρ_V for one (layer, KV head). Rotations: [head_dim, head_dim] row-major
// (x' = x R). Fails (InvalidArgument) on a bad config, empty or mis-shaped windows, or a
// quantizer error (non-finite activations).
// What the cache does to keys and queries: k' = (k − mean)·key, q' = q·query. For a plain
// rotation R: {R, R, nullptr}.
struct KeyTransform {
  const float* key = nullptr;    // [head_dim, head_dim]
  const float* query = nullptr;  // [head_dim, head_dim]
  const float* mean = nullptr;   // [head_dim] or nullptr
};

Result<ClipSearchResult> search_clip(const std::vector<ClipWindow>& windows,
                                     const KeyTransform& key, const float* v_rotation,
                                     const ClipSearchConfig& config);
// The same with a plain key rotation.
inline Result<ClipSearchResult> search_clip(const std::vector<ClipWindow>& windows,
                                            const float* k_rotation, const float* v_rotation,
                                            const ClipSearchConfig& config) {
  return search_clip(windows, KeyTransform{k_rotation, k_rotation, nullptr}, v_rotation, config);
}

}  // namespace oscar::calib
