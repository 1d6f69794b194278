#include "calib/calibrator.h"

#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/check.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "calib/key_scaling.h"
#include "quant/hadamard.h"
#include "quant/int2_layout.h"

namespace oscar::calib {

namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// First index of sorted `pos` >= value.
size_t lower(const std::vector<int64_t>& pos, int64_t value) {
  return static_cast<size_t>(std::lower_bound(pos.begin(), pos.end(), value) - pos.begin());
}

}  // namespace

Result<ValueObjective> parse_value_objective(const std::string& name) {
  if (name == "full") return ValueObjective::kFull;
  if (name == "diag") return ValueObjective::kDiag;
  return invalid_argument("value objective '%s': expected full or diag", name.c_str());
}

Result<ClipMode> parse_clip_mode(const std::string& name) {
  if (name == "search") return ClipMode::kSearch;
  if (name == "fixed") return ClipMode::kFixed;
  return invalid_argument("clip mode '%s': expected search or fixed", name.c_str());
}

Result<KeyScalingMode> parse_key_scaling(const std::string& name) {
  if (name == "none") return KeyScalingMode::kNone;
  if (name == "centre" || name == "center") return KeyScalingMode::kCentre;
  if (name == "full") return KeyScalingMode::kFull;
  return invalid_argument("key scaling '%s': expected none, centre or full", name.c_str());
}

Status CalibrationOptions::validate() const {
  if (n_windows < 1) return invalid_argument("calibrate: windows %d must be >= 1", n_windows);
  if (window_tokens < 2)
    return invalid_argument("calibrate: window tokens %d must be >= 2", window_tokens);
  if (prefill_chunk < 1)
    return invalid_argument("calibrate: prefill chunk %d must be >= 1", prefill_chunk);
  if (diag_query_stride < 1)
    return invalid_argument("calibrate: diag query stride %d must be >= 1", diag_query_stride);
  if (!(fixed_k_clip > 0 && fixed_v_clip > 0))
    return invalid_argument("calibrate: fixed clip ratios %g / %g must be positive", fixed_k_clip,
                            fixed_v_clip);
  if (clip_mode == ClipMode::kSearch) {
    OSCAR_RETURN_IF_ERROR(clip.grid.validate());
    if (clip_windows < 1 || clip_queries < 1)
      return invalid_argument("calibrate: clip windows %d and clip queries %d must be >= 1",
                              clip_windows, clip_queries);
  }
  if (bit_plan_pairs < 0)
    return invalid_argument("calibrate: bit plan pairs %d must be >= 0", bit_plan_pairs);
  if (clip.quantizer != quant::HistQuantizer::kInt2Uniform &&
      clip.quantizer != quant::HistQuantizer::kInt2Lloyd)
    return invalid_argument("calibrate: quantizer %s is not an INT2 one (uniform or lloyd)",
                            quantizer_name(clip.quantizer));
  if (bit_plan_pairs > 0 && clip.quantizer != quant::HistQuantizer::kInt2Uniform)
    return invalid_argument("calibrate: a bit plan (--bit-plan-pairs %d) needs the uniform "
                            "quantizer; pass --bit-plan-pairs 0 with --quantizer lloyd",
                            bit_plan_pairs);
  if (!(key_scale_power >= 0 && key_scale_power <= 1))
    return invalid_argument("calibrate: key scale power %g must be in [0, 1]", key_scale_power);
  if (clip.n_sink < 0 || clip.n_recent < 0)
    return invalid_argument("calibrate: n_sink %d / n_recent %d must be >= 0", clip.n_sink,
                            clip.n_recent);
  return Status();
}

// --- CalibrationObserver ----------------------------------------------------------------------

CalibrationObserver::CalibrationObserver(int n_layers, int n_heads_q, int n_heads_kv, int head_dim,
                                         const CalibrationOptions& options)
    : n_layers_(n_layers), n_heads_q_(n_heads_q), n_heads_kv_(n_heads_kv), head_dim_(head_dim),
      gqa_(n_heads_kv > 0 ? n_heads_q / n_heads_kv : 0), options_(options),
      diag_(options.value_objective == ValueObjective::kDiag) {
  OSCAR_CHECK(n_layers > 0 && n_heads_kv > 0 && head_dim > 0 && n_heads_q % n_heads_kv == 0,
              "CalibrationObserver: layers %d heads %d/%d head_dim %d", n_layers, n_heads_q,
              n_heads_kv, head_dim);
  const size_t n = static_cast<size_t>(n_layers) * n_heads_kv;
  q_acc_.assign(n, CovarianceAccumulator(head_dim));
  k_acc_.assign(n, CovarianceAccumulator(head_dim));
  o_acc_.assign(n, CovarianceAccumulator(head_dim));
  if (diag_) d_acc_.assign(n, CovarianceAccumulator(head_dim));
  clip_.resize(n);
  win_k_.resize(n_layers);
  win_v_.resize(n_layers);
  win_qd_.resize(n_layers);
  win_qc_.resize(n_layers);
}

std::vector<int64_t> CalibrationObserver::clip_positions(int64_t T, int count, int n_sink,
                                                         int n_recent) {
  // Spread evenly over [lo, T) where lo skips the positions that read no INT2 history at all.
  const int64_t lo = std::min<int64_t>(T - 1, static_cast<int64_t>(n_sink) + n_recent);
  const int64_t span = T - lo;
  const int64_t c = std::min<int64_t>(count, span);
  std::vector<int64_t> pos;
  for (int64_t j = 0; j < c; ++j) pos.push_back(lo + (2 * j + 1) * span / (2 * c));
  pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
  return pos;
}

std::vector<int64_t> CalibrationObserver::diag_positions(int64_t T, int stride) {
  std::vector<int64_t> pos;
  for (int64_t p = stride - 1; p < T; p += stride) pos.push_back(p);
  return pos;
}

void CalibrationObserver::begin_window(int64_t n_tokens, bool keep_clip_sample) {
  OSCAR_CHECK(n_tokens > 0);
  T_ = n_tokens;
  keep_clip_ = keep_clip_sample;
  diag_pos_ = diag_ ? diag_positions(T_, options_.diag_query_stride) : std::vector<int64_t>{};
  clip_pos_ = keep_clip_ ? clip_positions(T_, options_.clip_queries, options_.clip.n_sink,
                                          options_.clip.n_recent)
                         : std::vector<int64_t>{};
  const bool keep_kv = diag_ || keep_clip_;
  const size_t kv = keep_kv ? static_cast<size_t>(T_) * n_heads_kv_ * head_dim_ : 0;
  for (int l = 0; l < n_layers_; ++l) {
    win_k_[l].assign(kv, 0.f);
    win_v_[l].assign(kv, 0.f);
    win_qd_[l].assign(diag_pos_.size() * n_heads_q_ * head_dim_, 0.f);
    win_qc_[l].assign(clip_pos_.size() * n_heads_q_ * head_dim_, 0.f);
  }
}

void CalibrationObserver::gather_rows(const std::vector<int64_t>& positions, const float* src,
                                      int heads, int64_t n, int64_t pos0,
                                      std::vector<float>& dst) const {
  const size_t row = static_cast<size_t>(heads) * head_dim_;
  for (size_t i = lower(positions, pos0); i < positions.size() && positions[i] < pos0 + n; ++i)
    std::memcpy(dst.data() + i * row, src + static_cast<size_t>(positions[i] - pos0) * row,
                row * sizeof(float));
}

void CalibrationObserver::on_qkv(int seq, int layer, const float* q, const float* k,
                                 const float* v, int64_t n, int64_t pos0) {
  OSCAR_CHECK(T_ > 0 && layer >= 0 && layer < n_layers_ && pos0 >= 0 && pos0 + n <= T_,
              "on_qkv: layer %d rows [%lld, %lld) outside the window of %lld (begin_window?)",
              layer, static_cast<long long>(pos0), static_cast<long long>(pos0 + n),
              static_cast<long long>(T_));
  const int d = head_dim_;
  const int64_t q_stride = static_cast<int64_t>(n_heads_q_) * d;
  // C_Q (OSCAR.md §1 "Keys"): pool the gqa query heads that read KV head h.
#pragma omp parallel for schedule(static)
  for (int h = 0; h < n_heads_kv_; ++h) {
    for (int g = 0; g < gqa_; ++g)
      q_acc_[idx(layer, h)].add_rows(q + static_cast<int64_t>(h * gqa_ + g) * d, n, q_stride);
    // Key statistics for the query-aware key scaling (calib/key_scaling.h).
    k_acc_[idx(layer, h)].add_rows(k + static_cast<int64_t>(h) * d, n,
                                   static_cast<int64_t>(n_heads_kv_) * d);
  }
  if (!win_k_[layer].empty()) {
    const size_t off = static_cast<size_t>(pos0) * n_heads_kv_ * d;
    const size_t count = static_cast<size_t>(n) * n_heads_kv_ * d;
    std::memcpy(win_k_[layer].data() + off, k, count * sizeof(float));
    std::memcpy(win_v_[layer].data() + off, v, count * sizeof(float));
  }
  gather_rows(diag_pos_, q, n_heads_q_, n, pos0, win_qd_[layer]);
  gather_rows(clip_pos_, q, n_heads_q_, n, pos0, win_qc_[layer]);
}

void CalibrationObserver::on_attention(int seq, int layer, const float* out, int64_t n,
                                       int64_t pos0) {
  OSCAR_CHECK(layer >= 0 && layer < n_layers_);
  const int d = head_dim_;
  const int64_t stride = static_cast<int64_t>(n_heads_q_) * d;
  // C_S full form (OSCAR.md §1 "Values"): OᵀO over the group's attention outputs.
#pragma omp parallel for schedule(static)
  for (int h = 0; h < n_heads_kv_; ++h)
    for (int g = 0; g < gqa_; ++g)
      o_acc_[idx(layer, h)].add_rows(out + static_cast<int64_t>(h * gqa_ + g) * d, n, stride);
}

void CalibrationObserver::end_window() {
  OSCAR_CHECK(T_ > 0, "end_window without begin_window");
  const int d = head_dim_;
  const int n_tasks = n_layers_ * n_heads_kv_;
  if (diag_) {
    // C_S diagonal form: w_t = Σ_i s_it² over the sampled query rows of the group's heads.
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const int64_t m = static_cast<int64_t>(diag_pos_.size());
#pragma omp parallel for schedule(static)
    for (int task = 0; task < n_tasks; ++task) {
      const int l = task / n_heads_kv_, h = task % n_heads_kv_;
      MatF K(T_, d), Q(m * gqa_, d);
      for (int64_t t = 0; t < T_; ++t)
        std::memcpy(K.row(t).data(), win_k_[l].data() + (t * n_heads_kv_ + h) * d, d * sizeof(float));
      for (int64_t i = 0; i < m; ++i)
        for (int g = 0; g < gqa_; ++g)
          std::memcpy(Q.row(i * gqa_ + g).data(),
                      win_qd_[l].data() + (i * n_heads_q_ + h * gqa_ + g) * d, d * sizeof(float));
      const MatF Z = (Q * K.transpose()) * scale;
      std::vector<double> w(static_cast<size_t>(T_), 0.0);
      for (int64_t r = 0; r < Z.rows(); ++r) {
        const int64_t len = diag_pos_[r / gqa_] + 1;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t t = 0; t < len; ++t) mx = std::max(mx, static_cast<double>(Z(r, t)));
        double s = 0;
        for (int64_t t = 0; t < len; ++t) s += std::exp(static_cast<double>(Z(r, t)) - mx);
        for (int64_t t = 0; t < len; ++t) {
          const double p = std::exp(static_cast<double>(Z(r, t)) - mx) / s;
          w[t] += p * p;
        }
      }
      std::vector<float> wf(w.begin(), w.end());
      d_acc_[idx(l, h)].add_rows(win_v_[l].data() + static_cast<int64_t>(h) * d, T_,
                                 static_cast<int64_t>(n_heads_kv_) * d, wf.data());
    }
  }
  if (keep_clip_) {
    for (int task = 0; task < n_tasks; ++task) {
      const int l = task / n_heads_kv_, h = task % n_heads_kv_;
      ClipWindow cw;
      cw.n_tokens = T_;
      cw.k.resize(static_cast<size_t>(T_) * d);
      cw.v.resize(static_cast<size_t>(T_) * d);
      for (int64_t t = 0; t < T_; ++t) {
        const size_t src = static_cast<size_t>(t * n_heads_kv_ + h) * d;
        std::memcpy(cw.k.data() + t * d, win_k_[l].data() + src, d * sizeof(float));
        std::memcpy(cw.v.data() + t * d, win_v_[l].data() + src, d * sizeof(float));
      }
      for (size_t i = 0; i < clip_pos_.size(); ++i)
        for (int g = 0; g < gqa_; ++g) {
          const float* src = win_qc_[l].data() + (i * n_heads_q_ + h * gqa_ + g) * d;
          cw.q.insert(cw.q.end(), src, src + d);
          cw.q_pos.push_back(clip_pos_[i]);
        }
      clip_[idx(l, h)].push_back(std::move(cw));
    }
  }
  for (int l = 0; l < n_layers_; ++l) {
    std::vector<float>().swap(win_k_[l]);
    std::vector<float>().swap(win_v_[l]);
    std::vector<float>().swap(win_qd_[l]);
    std::vector<float>().swap(win_qc_[l]);
  }
  T_ = 0;
}

const CovarianceAccumulator& CalibrationObserver::query_acc(int layer, int head) const {
  return q_acc_.at(idx(layer, head));
}
const CovarianceAccumulator& CalibrationObserver::key_acc(int layer, int head) const {
  return k_acc_.at(idx(layer, head));
}
const CovarianceAccumulator& CalibrationObserver::output_acc(int layer, int head) const {
  return o_acc_.at(idx(layer, head));
}
const CovarianceAccumulator& CalibrationObserver::diag_acc(int layer, int head) const {
  OSCAR_CHECK(diag_, "diag_acc: the diagonal value objective is not enabled");
  return d_acc_.at(idx(layer, head));
}
const std::vector<ClipWindow>& CalibrationObserver::clip_sample(int layer, int head) const {
  return clip_.at(idx(layer, head));
}

// --- calibrate --------------------------------------------------------------------------------

Result<CalibrationResult> calibrate(engine::Runtime& runtime, std::span<const int32_t> tokens,
                                    const CalibrationOptions& options, ProgressBar* progress) {
  OSCAR_RETURN_IF_ERROR(options.validate());
  // The exact f32 cache on the CPU; a GPU backend stores K/V pages only as BF16, which the
  // statistics see only through the attention outputs (the value statistics), as BF16 rounding.
  const bool on_device = runtime.backend().device() != Device::kCpu;
  const quant::CacheMode exact = on_device ? quant::CacheMode::kBF16 : quant::CacheMode::kF32;
  if (runtime.spec().mode != exact)
    return invalid_argument("calibrate: the runtime must use the exact %s cache on %s (got %s)",
                            on_device ? "bf16" : "f32", device_name(runtime.backend().device()),
                            runtime.spec().describe().c_str());
  model::Qwen3Model& model = runtime.model();
  const format::ModelConfig& c = model.config();
  // One entry per KV-cache layer (ModelConfig::kv_layer): every layer of a dense model, the
  // full-attention layers of a hybrid (the observer sees them by their cache index). The
  // DeltaNet layers run as in any forward and have no statistics.
  const int L = c.n_kv_layers, Hkv = c.n_heads_kv, d = c.head_dim;
  if (!quant::is_power_of_two(d))
    return invalid_argument("calibrate: R = U·H·P_br needs a power-of-two head_dim, model has %d",
                            d);
  if (!quant::int2_valid_group(d, options.clip.group_size))
    return invalid_argument("calibrate: group size %d is not valid for head_dim %d",
                            options.clip.group_size, d);
  const int64_t W = options.window_tokens;
  if (W > c.max_position_embeddings)
    return invalid_argument("calibrate: window of %lld tokens exceeds the model context %d",
                            static_cast<long long>(W), c.max_position_embeddings);
  const int64_t available = static_cast<int64_t>(tokens.size()) / W;
  if (available < 1)
    return invalid_argument("calibrate: the data has %zu tokens, fewer than one window of %lld",
                            tokens.size(), static_cast<long long>(W));
  CalibrationResult result;
  result.n_windows = static_cast<int>(std::min<int64_t>(options.n_windows, available));
  result.n_tokens = result.n_windows * W;
  result.n_data_tokens = static_cast<int64_t>(tokens.size());
  if (result.n_windows < options.n_windows)
    OSCAR_LOG_WARN("calibrate: data holds only %d windows of %lld tokens (asked for %d)",
                   result.n_windows, static_cast<long long>(W), options.n_windows);

  // Clip-sample windows, spread evenly over the windows used.
  std::vector<int> clip_windows;
  if (options.clip_mode == ClipMode::kSearch) {
    const int n = std::min(options.clip_windows, result.n_windows);
    for (int j = 0; j < n; ++j) clip_windows.push_back(j * result.n_windows / n);
  }

  CalibrationObserver observer(L, c.n_heads_q, Hkv, d, options);
  model::ForwardOptions fwd;
  fwd.attend_mode = kv::AttendMode::kPrefill;
  fwd.observer = &observer;
  auto t0 = Clock::now();
  for (int w = 0; w < result.n_windows; ++w) {
    const bool keep = std::find(clip_windows.begin(), clip_windows.end(), w) != clip_windows.end();
    observer.begin_window(W, keep);
    auto cache = runtime.new_cache();
    for (int64_t p = 0; p < W; p += options.prefill_chunk) {
      const int64_t n = std::min<int64_t>(options.prefill_chunk, W - p);
      OSCAR_RETURN_IF_ERROR(
          model.forward_one(tokens.subspan(static_cast<size_t>(w * W + p), static_cast<size_t>(n)),
                            *cache, nullptr, false, fwd)
              .with_context(str_format("calibrate: window %d", w)));
    }
    observer.end_window();
    if (progress) progress->update(w + 1, (w + 1) * W);
  }
  if (progress) progress->finish();
  result.forward_s = seconds_since(t0);

  // Eigendecomposition and rotations (OSCAR.md §1 "Rotation").
  t0 = Clock::now();
  quant::RotationSet& set = result.rotations;
  set.n_layers = L;
  set.layers = quant::rotation_layers(c);
  OSCAR_CHECK(set.layers.n_entries() == L, "calibrate: %d KV layers, %d entries", L,
              set.layers.n_entries());
  set.n_heads_kv = Hkv;
  set.head_dim = d;
  set.group_size = options.clip.group_size;
  const size_t dd = static_cast<size_t>(d) * d;
  set.k_rot.resize(L * Hkv * dd);
  set.v_rot.resize(L * Hkv * dd);
  set.k_eig.resize(static_cast<size_t>(L) * Hkv * d);
  set.v_eig.resize(static_cast<size_t>(L) * Hkv * d);
  set.k_clip.assign(static_cast<size_t>(L) * Hkv, options.fixed_k_clip);
  set.v_clip.assign(static_cast<size_t>(L) * Hkv, options.fixed_v_clip);
  result.key_error_ratio.assign(static_cast<size_t>(L) * Hkv, 1.0);
  result.key_logit_error.assign(static_cast<size_t>(L) * Hkv, 0.0);
  result.value_energy.assign(static_cast<size_t>(L) * Hkv, 0.0);
  if (options.key_scaling != KeyScalingMode::kNone) {
    set.k_scale.resize(static_cast<size_t>(L) * Hkv * d);
    set.k_mean.resize(static_cast<size_t>(L) * Hkv * d);
  }
  const int n_tasks = L * Hkv;
#pragma omp parallel for schedule(static)
  for (int task = 0; task < n_tasks; ++task) {
    const int l = task / Hkv, h = task % Hkv;
    const EigenBasis bk = eigen_decompose(observer.query_acc(l, h).covariance(), d);
    const CovarianceAccumulator& vacc = options.value_objective == ValueObjective::kFull
                                            ? observer.output_acc(l, h)
                                            : observer.diag_acc(l, h);
    const EigenBasis bv = eigen_decompose(vacc.covariance(), d);
    const std::vector<float> rk = rotation_from_basis(bk), rv = rotation_from_basis(bv);
    const CovarianceAccumulator& ka = observer.key_acc(l, h);
    const KeyScaling ks = key_scaling(bk, ka.covariance(), ka.mean(),
                                      options.key_scaling != KeyScalingMode::kNone,
                                      options.key_scaling == KeyScalingMode::kFull,
                                      options.key_scale_power);
    result.key_logit_error[task] = ks.logit_error;
    for (int j = 0; j < d; ++j) result.value_energy[task] += std::max(bv.eigenvalues[j], 0.0);
    if (options.key_scaling != KeyScalingMode::kNone) {
      for (int j = 0; j < d; ++j) {
        set.k_scale[static_cast<size_t>(task) * d + j] = static_cast<float>(ks.scale[j]);
        set.k_mean[static_cast<size_t>(task) * d + j] = static_cast<float>(ks.mean[j]);
      }
      result.key_error_ratio[task] = ks.predicted_error_ratio;
    }
    std::copy(rk.begin(), rk.end(), set.k_rot.begin() + task * dd);
    std::copy(rv.begin(), rv.end(), set.v_rot.begin() + task * dd);
    for (int j = 0; j < d; ++j) {
      set.k_eig[static_cast<size_t>(task) * d + j] = static_cast<float>(bk.eigenvalues[j]);
      set.v_eig[static_cast<size_t>(task) * d + j] = static_cast<float>(bv.eigenvalues[j]);
    }
  }
  result.decompose_s = seconds_since(t0);
  // The statistic `--kv-bits` plans from (kv::plan_for_bits; rotation file version 4).
  set.k_logit_error.assign(result.key_logit_error.begin(), result.key_logit_error.end());

  // Bit plan (calib/bit_plan.h), from the statistics above.
  // At most half the (layer, KV head) planes: a model with few (a hybrid's full-attention layers
  // with one KV head: tiny-qwen3-5 has 1) keeps most values above 1 bit.
  const int pairs = std::min(options.bit_plan_pairs, n_tasks / 2);
  if (pairs < options.bit_plan_pairs)
    OSCAR_LOG_INFO("calibrate: bit plan pairs=%d of %d asked (%d (layer, kv head) planes)", pairs,
                   options.bit_plan_pairs, n_tasks);
  if (pairs > 0) {
    OSCAR_ASSIGN_OR_RETURN(BitPlanChoice plan,
                           choose_bit_plan(result.key_logit_error, result.value_energy, pairs));
    set.k_bits = std::move(plan.k_bits);
    set.v_bits = std::move(plan.v_bits);
    set.metadata["bit_plan"] = str_format(
        "%d key plane(s) at 3 bits (largest expected INT2 logit error), %d value plane(s) at 1 "
        "bit (smallest tr C_S)", pairs, pairs);
  }

  // Clip search (OSCAR.md §1 "Clipping", beyond).
  t0 = Clock::now();
  if (options.clip_mode == ClipMode::kSearch) {
    result.clip.resize(n_tasks);
    std::vector<Status> status(n_tasks);
    ClipSearchConfig cfg = options.clip;
    cfg.head_dim = d;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int l = task / Hkv, h = task % Hkv;
      const std::vector<float> mk = set.key_transform(l, h), mq = set.query_transform(l, h);
      const float* mean = set.has_key_scaling() ? set.k_mean.data() + static_cast<size_t>(task) * d : nullptr;
      auto r = search_clip(observer.clip_sample(l, h), KeyTransform{mk.data(), mq.data(), mean},
                           set.v_rot.data() + task * dd, cfg);
      if (!r.ok()) {
        status[task] = r.status().with_context(str_format("layer %d head %d", l, h));
        continue;
      }
      result.clip[task] = std::move(r).value();
      set.k_clip[task] = result.clip[task].k_clip;
      set.v_clip[task] = result.clip[task].v_clip;
    }
    for (const Status& st : status) OSCAR_RETURN_IF_ERROR(st);
  }
  result.clip_s = seconds_since(t0);

  // Metadata (OSCAR.md §7); no timestamps, so equal inputs give byte-identical files.
  set.metadata["value_objective"] = options.value_objective == ValueObjective::kFull
                                        ? "full (C_S = O^T O)"
                                        : str_format("diag (C_S = sum_t w_t v_t^T v_t / sum_t w_t, "
                                                     "w_t = sum_i s_it^2, query stride %d)",
                                                     options.diag_query_stride);
  set.metadata["model_config_sha256"] = c.sha256;
  set.metadata["key_scaling"] =
      options.key_scaling == KeyScalingMode::kNone
          ? "none"
          : options.key_scaling == KeyScalingMode::kCentre
                ? "centre (keys minus their calibration mean)"
                : str_format("full (keys minus their calibration mean, scaled by "
                             "(lambda_j/kappa_j)^%g in the C_Q eigenbasis, queries by the inverse)",
                             options.key_scale_power);
  std::string clip_desc;
  if (options.clip_mode == ClipMode::kFixed) {
    clip_desc = str_format("clip fixed rho_K %.2f rho_V %.2f", options.fixed_k_clip,
                           options.fixed_v_clip);
  } else {
    clip_desc = str_format(
        "clip searched per (layer, kv head) over %.2f..%.2f step %.3f on %zu windows x %d "
        "query positions, K objective %s, V objective attention-output error, %s quantizer, "
        "sinks %d and recent %d exact",
        options.clip.grid.min, options.clip.grid.max, options.clip.grid.step, clip_windows.size(),
        options.clip_queries, key_clip_objective_name(options.clip.key_objective),
        quantizer_name(options.clip.quantizer), options.clip.n_sink, options.clip.n_recent);
  }
  set.metadata["calibration"] =
      str_format("%s: %d x %lld tokens (%lld of %lld tokens); C_Q and C_S normalised by the "
                 "number of pooled vectors; %s",
                 options.data_label.empty() ? "data" : options.data_label.c_str(),
                 result.n_windows, static_cast<long long>(W),
                 static_cast<long long>(result.n_tokens),
                 static_cast<long long>(result.n_data_tokens), clip_desc.c_str());
  set.metadata[kRecommendedModeKey] =
      options.clip.quantizer == quant::HistQuantizer::kInt2Lloyd ? "oscar-lloyd" : "oscar";
  set.metadata[kRecommendedRecentKey] = std::to_string(options.clip.n_recent);
  set.metadata["created_by"] = "oscar calibrate 0.1";
  return result;
}

Result<CalibrationResult> calibrate_model_dir(const std::string& model_dir,
                                              const std::string& data_path,
                                              const CalibrationOptions& options,
                                              bool show_progress, std::string_view device) {
  OSCAR_RETURN_IF_ERROR(options.validate());
  std::ifstream in(data_path, std::ios::binary);
  if (!in) return not_found("calibrate: cannot open data file %s", data_path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  engine::RuntimeOptions ro;
  ro.model_dir = model_dir;
  {  // "auto" resolved here: the cache mode follows the device (see calibrate)
    OSCAR_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> probe, kernels::make_backend(device));
    ro.device = device_name(probe->device());
    ro.cache_mode = probe->device() == Device::kCpu ? "f32" : "bf16";
  }
  OSCAR_ASSIGN_OR_RETURN(std::unique_ptr<engine::Runtime> rt, engine::Runtime::create(ro));
  const std::vector<int32_t> tokens = rt->tokenizer().encode(text);
  CalibrationOptions o = options;
  if (o.data_label.empty()) o.data_label = std::filesystem::path(data_path).filename().string();
  const int64_t windows =
      std::min<int64_t>(o.n_windows, static_cast<int64_t>(tokens.size()) / o.window_tokens);
  std::unique_ptr<ProgressBar> bar;
  if (show_progress && windows > 0) bar = std::make_unique<ProgressBar>("calibrate", windows, "tok");
  return calibrate(*rt, tokens, o, bar.get());
}

}  // namespace oscar::calib
