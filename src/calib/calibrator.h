// `oscar calibrate` as a library (OSCAR.md §6): run the model over calibration windows with an
// exact f32 cache, accumulate C_Q and C_S per (layer, KV head) in float64 as a stream, decompose,
// compose R = U · H · P_br, search (or fix) clip ratios and return a RotationSet ready for
// quant::write_rotation_file (§7).
//
// Layers are KV-cache layers (ModelConfig::kv_layer): every layer of a dense model, only the
// full-attention layers of a hybrid (Qwen3.5), whose DeltaNet layers run but have no statistics;
// the RotationSet records the decoder layers it serves (RotationSet::layers, OSCAR.md §7).
// Accumulated per (layer l, KV head j), pooling the query heads j·gqa … j·gqa + gqa − 1 (GQA):
//   C_Q      = (1/N) Σ qᵀq over every pooled query vector (post q_norm and RoPE), N = their count
//   C_S full = (1/N) Σ oᵀo over the pooled attention outputs o (before o_proj, exact cache)
//   C_S diag = Σ_t w_t v_tᵀv_t / Σ_t w_t, w_t = Σ_i s_it² with s the exact attention
//              probabilities of query rows i of the group's heads. To bound the cost, the rows i
//              are every `diag_query_stride`-th position of each window (all of the group's heads);
//              w_t is then an estimate, and the ratio is unaffected by the sampling rate.
// Only one window of K/V/sampled queries is held at a time, plus the bounded clip sample
// (clip_windows windows × clip_queries queries per query head); nothing goes to disk.
//
// Determinism: for the same model, tokens, options and thread count the result is bit-identical
// (static OpenMP schedules, per-task serial accumulation, a sign convention on eigenvectors).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "calib/bit_plan.h"
#include "calib/clip_search.h"
#include "calib/covariance.h"
#include "calib/key_scaling.h"
#include "core/progress.h"
#include "core/status.h"
#include "engine/runtime.h"
#include "model/qwen3.h"
#include "quant/rotation_file.h"

namespace oscar::calib {

enum class ValueObjective { kFull, kDiag };
enum class ClipMode { kSearch, kFixed };
// Query-aware key scaling (calib/key_scaling.h): none (R = U·H·P_br as the release), centre
// (subtract μ_K only), full (centre and scale by w_j = (λ_j/κ_j)^(1/4)).
enum class KeyScalingMode { kNone, kCentre, kFull };

Result<ValueObjective> parse_value_objective(const std::string& name);  // "full" | "diag"
Result<ClipMode> parse_clip_mode(const std::string& name);              // "search" | "fixed"
Result<KeyScalingMode> parse_key_scaling(const std::string& name);  // "none" | "centre" | "full"

// Rotation-file metadata naming the cache the file was made for (quant/rotation_file.h), read by
// `--kv-cache auto`. Calibration writes:
//   recommended_mode      "oscar" (uniform INT2) or "oscar-lloyd", from clip.quantizer
//   recommended_n_recent  the BF16 recent window, from clip.n_recent (docs/results/ablation.md:
//                         384 beat 256 end to end and keeps the 128K cache under 2.30 bits)
using quant::kRecommendedModeKey;
using quant::kRecommendedRecentKey;
// Default recent window of calibration (clip objective and recommended_n_recent).
inline constexpr int kDefaultRecent = 384;

// The release's fixed clip quantiles (OSCAR.md §1).
inline constexpr float kReleaseKeyClip = 0.96f;
inline constexpr float kReleaseValueClip = 0.92f;

struct CalibrationOptions {
  int n_windows = 24;            // at most this many consecutive windows (fewer if data is short)
  int window_tokens = 4096;      // tokens per window, fresh cache per window
  int prefill_chunk = 4096;      // tokens per forward call within a window
  ValueObjective value_objective = ValueObjective::kFull;
  KeyScalingMode key_scaling = KeyScalingMode::kFull;  // won end to end (docs/results/ablation.md)
  double key_scale_power = kKeyScalePower;  // kFull: w_j = (λ_j/κ_j)^power
  // Mixed-precision bit plan (calib/bit_plan.h): this many (layer, KV head) key planes at 3 bits,
  // paid for by as many value planes at 1 bit; 0 = uniform INT2. Capped at half the planes (a
  // hybrid with one KV layer and one KV head, tiny-qwen3-5, gets none). 2 was the best of 0, 1, 2 and 4
  // end to end on tiny-qwen3 (docs/results/ablation.md, "Bit plans, built"). Needs the uniform
  // quantizer.
  int bit_plan_pairs = 2;
  int diag_query_stride = 16;    // diag form: query rows at positions stride−1, 2·stride−1, …
  ClipMode clip_mode = ClipMode::kFixed;  // fixed won end to end so far (docs/results/calibration.md)
  float fixed_k_clip = kReleaseKeyClip;   // clip_mode kFixed
  float fixed_v_clip = kReleaseValueClip;
  // group_size, objective, grid, windows kept exact, and the quantizer: the one the clip search
  // uses AND the cache quantizer the file recommends (recommended_mode), in both clip modes.
  ClipSearchConfig clip = [] {
    ClipSearchConfig c;
    c.n_recent = kDefaultRecent;
    return c;
  }();
  int clip_windows = 4;          // windows kept for the clip search, spread over the data
  int clip_queries = 64;         // sampled query positions per clip window (all group heads)
  std::string data_label;        // names the data in the file's `calibration` metadata

  Status validate() const;
};

// The observer that feeds the accumulators; public so tests can drive it with synthetic
// activations. Usage per window: begin_window(T, keep) → forward passes → end_window().
class CalibrationObserver : public model::LayerObserver {
 public:
  CalibrationObserver(int n_layers, int n_heads_q, int n_heads_kv, int head_dim,
                      const CalibrationOptions& options);

  void begin_window(int64_t n_tokens, bool keep_clip_sample);
  void on_qkv(int seq, int layer, const float* q, const float* k, const float* v, int64_t n,
              int64_t pos0) override;
  void on_attention(int seq, int layer, const float* out, int64_t n, int64_t pos0) override;
  void end_window();

  const CovarianceAccumulator& query_acc(int layer, int head) const;
  const CovarianceAccumulator& key_acc(int layer, int head) const;     // (1/N) Σ kᵀk and μ_K
  const CovarianceAccumulator& output_acc(int layer, int head) const;  // C_S full
  const CovarianceAccumulator& diag_acc(int layer, int head) const;    // C_S diag (if enabled)
  // The clip sample of (layer, head): one ClipWindow per kept window.
  const std::vector<ClipWindow>& clip_sample(int layer, int head) const;

  // Sampled query positions of a window of T tokens (sorted, distinct).
  static std::vector<int64_t> clip_positions(int64_t T, int count, int n_sink, int n_recent);
  static std::vector<int64_t> diag_positions(int64_t T, int stride);

 private:
  int idx(int layer, int head) const { return layer * n_heads_kv_ + head; }
  // Copies rows of `src` ([n, heads, d] at positions pos0…) whose position is in `positions`
  // into dst ([positions.size(), heads, d]).
  void gather_rows(const std::vector<int64_t>& positions, const float* src, int heads, int64_t n,
                   int64_t pos0, std::vector<float>& dst) const;

  int n_layers_, n_heads_q_, n_heads_kv_, head_dim_, gqa_;
  CalibrationOptions options_;
  bool diag_;
  std::vector<CovarianceAccumulator> q_acc_, k_acc_, o_acc_, d_acc_;  // [n_layers * n_heads_kv]
  std::vector<std::vector<ClipWindow>> clip_;                 // [n_layers * n_heads_kv]
  // Current window.
  int64_t T_ = 0;
  bool keep_clip_ = false;
  std::vector<int64_t> diag_pos_, clip_pos_;
  std::vector<std::vector<float>> win_k_, win_v_;    // [n_layers][T, n_heads_kv, d]
  std::vector<std::vector<float>> win_qd_, win_qc_;  // [n_layers][n_pos, n_heads_q, d]
};

struct CalibrationResult {
  quant::RotationSet rotations;
  int n_windows = 0;                 // windows used
  int64_t n_tokens = 0;              // tokens used (n_windows × window_tokens)
  int64_t n_data_tokens = 0;         // tokens in the data
  std::vector<ClipSearchResult> clip;  // [n_layers * n_heads_kv]; empty for ClipMode::kFixed
  // [n_layers * n_heads_kv] expected key logit error relative to plain U·H·P_br (key_scaling.h).
  std::vector<double> key_error_ratio;
  // [n_layers * n_heads_kv] KeyScaling::logit_error of each head (as stored: with the scaling
  // the options chose) and tr C_S; the bit plan (calib/bit_plan.h) ranks heads by them.
  std::vector<double> key_logit_error, value_energy;
  double forward_s = 0, decompose_s = 0, clip_s = 0;
};

// Calibrates the runtime's model on `tokens`. The runtime must use the exact cache: "f32" on
// the CPU, "bf16" on a GPU backend, which has no f32 pages (InvalidArgument otherwise). progress
// (nullable) counts windows, then is finished.
Result<CalibrationResult> calibrate(engine::Runtime& runtime, std::span<const int32_t> tokens,
                                    const CalibrationOptions& options, ProgressBar* progress);

// Loads DIR on `device` (cpu, cuda or auto) with its exact cache, tokenizes the whole data file
// (special tokens recognised) and calibrates. Shows a progress bar on stderr when show_progress.
Result<CalibrationResult> calibrate_model_dir(const std::string& model_dir,
                                              const std::string& data_path,
                                              const CalibrationOptions& options,
                                              bool show_progress, std::string_view device = "cpu");

}  // namespace oscar::calib
