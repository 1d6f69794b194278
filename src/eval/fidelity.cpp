#include "eval/fidelity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "model/qwen3.h"

namespace oscar::eval {

namespace {

// log-softmax of x [n] into out [n], in double.
void log_softmax(const float* x, int64_t n, float* out) {
  const float mx = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
  const double lse = std::log(sum) + mx;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] - lse);
}

// KL(P || Q) from log-probabilities, in double.
double kl_from_logp(const float* lp, const float* lq, int64_t n) {
  double kl = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double p = std::exp(static_cast<double>(lp[i]));
    if (p > 0.0) kl += p * (static_cast<double>(lp[i]) - lq[i]);
  }
  return std::max(kl, 0.0);
}

// Records one mode's attention outputs, step score distributions and final hidden states.
class CaptureObserver : public model::LayerObserver {
 public:
  CaptureObserver(const kv::KvCacheSpec& spec, FidelityCapture& cap, int stride)
      : spec_(spec), cap_(cap), stride_(stride) {}

  void begin_chunk(const kv::SequenceCache* cache, FidelityCapture::Window* win, int step) {
    cache_ = cache;
    win_ = win;
    step_ = step;
  }

  void on_qkv(int seq, int layer, const float* q, const float* k, const float* v, int64_t n,
              int64_t pos0) override {
    if (step_ < 0) return;
    OSCAR_CHECK(n == 1, "a score step is one token, got %lld", static_cast<long long>(n));
    q_step_.assign(q, q + static_cast<size_t>(cap_.n_heads_q) * cap_.head_dim);
  }

  void on_attention(int seq, int layer, const float* out, int64_t n, int64_t pos0) override {
    const int d = cap_.head_dim, Hq = cap_.n_heads_q;
    const int gqa = Hq / spec_.n_heads_kv;
    const size_t row = static_cast<size_t>(Hq) * d;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = pos0 + i;
      if (pos % stride_ != stride_ - 1) continue;
      float* dst = win_->attn_out.data() +
                   (static_cast<size_t>(pos / stride_) * cap_.n_layers + layer) * row;
      const float* src = out + i * row;
      if (spec_.v_rotation.empty()) {
        std::copy(src, src + row, dst);
        continue;
      }
      // x' = x R  =>  x = x' Rᵀ: x[r] = sum_c x'[c] R[r, c] (OSCAR.md §3, value rotation).
      for (int h = 0; h < Hq; ++h) {
        const float* R = spec_.v_rotation.data() +
                         (static_cast<size_t>(layer) * spec_.n_heads_kv + h / gqa) * d * d;
        for (int r = 0; r < d; ++r) {
          double acc = 0.0;
          for (int c = 0; c < d; ++c) acc += static_cast<double>(src[h * d + c]) * R[r * d + c];
          dst[h * d + r] = static_cast<float>(acc);
        }
      }
    }
    if (step_ >= 0) record_scores(layer, out, pos0);
  }

  void on_final_hidden(int seq, const float* hidden, int64_t n, int64_t pos0) override {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = pos0 + i;
      if (pos % stride_ != stride_ - 1) continue;
      std::copy(hidden + i * cap_.hidden, hidden + (i + 1) * cap_.hidden,
                win_->hidden.data() + static_cast<size_t>(pos / stride_) * cap_.hidden);
    }
  }

 private:
  // Scores of the step token (position pos) over keys [0, pos] as the cache holds them.
  void record_scores(int layer, const float* out, int64_t pos) {
    const int d = cap_.head_dim, Hq = cap_.n_heads_q, Hkv = spec_.n_heads_kv;
    const int gqa = Hq / Hkv;
    const int64_t n_keys = pos + 1;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    keys_.resize(static_cast<size_t>(n_keys) * d);
    vals_.resize(static_cast<size_t>(n_keys) * d);
    std::vector<float> qr(d), scores(n_keys);
    std::vector<double> o(d);
    for (int g = 0; g < Hkv; ++g) {
      for (int64_t j = 0; j < n_keys; ++j) {
        cache_->read_row(layer, 0, g, j, keys_.data() + j * d);
        cache_->read_row(layer, 1, g, j, vals_.data() + j * d);
      }
      for (int h = g * gqa; h < (g + 1) * gqa; ++h) {
        const float* q = q_step_.data() + static_cast<size_t>(h) * d;
        if (spec_.k_rotation.empty()) {
          std::copy(q, q + d, qr.begin());
        } else {  // q' = q R_K (OSCAR.md §3): the cache's keys are rotated the same way.
          const float* R = spec_.query_rotation(layer, g);
          for (int c = 0; c < d; ++c) {
            double acc = 0.0;
            for (int r = 0; r < d; ++r) acc += static_cast<double>(q[r]) * R[r * d + c];
            qr[c] = static_cast<float>(acc);
          }
        }
        for (int64_t j = 0; j < n_keys; ++j) {
          double acc = 0.0;
          for (int c = 0; c < d; ++c) acc += static_cast<double>(qr[c]) * keys_[j * d + c];
          scores[j] = static_cast<float>(acc * scale);
        }
        std::vector<float>& lp =
            win_->probs[(static_cast<size_t>(step_) * cap_.n_layers + layer) * Hq + h];
        lp.resize(n_keys);
        log_softmax(scores.data(), n_keys, lp.data());
        // Self-check: the model's output (in the cache's value basis) from these probabilities.
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < n_keys; ++j) {
          const double p = std::exp(static_cast<double>(lp[j]));
          for (int c = 0; c < d; ++c) o[c] += p * vals_[j * d + c];
        }
        double num = 0.0, den = 0.0;
        for (int c = 0; c < d; ++c) {
          const double ref = out[h * d + c];
          num += (o[c] - ref) * (o[c] - ref);
          den += ref * ref;
        }
        cap_.score_check_max_err =
            std::max(cap_.score_check_max_err, std::sqrt(num / std::max(den, 1e-30)));
      }
    }
  }

  const kv::KvCacheSpec& spec_;
  FidelityCapture& cap_;
  int stride_;
  const kv::SequenceCache* cache_ = nullptr;
  FidelityCapture::Window* win_ = nullptr;
  int step_ = -1;
  std::vector<float> q_step_, keys_, vals_;
};

}  // namespace

double FidelityResult::mean_score_kl() const {
  if (score_kl.empty()) return 0.0;
  double s = 0.0;
  for (double x : score_kl) s += x;
  return s / static_cast<double>(score_kl.size());
}

double FidelityResult::mean_out_err() const {
  if (out_err.empty()) return 0.0;
  double s = 0.0;
  for (double x : out_err) s += x;
  return s / static_cast<double>(out_err.size());
}

std::vector<int64_t> fidelity_steps(int window_tokens, int n_steps) {
  std::vector<int64_t> steps;
  const int64_t lo = std::max(1, window_tokens / 8);
  for (int k = 0; k < n_steps; ++k) {
    const int64_t p = lo + (static_cast<int64_t>(k) + 1) * (window_tokens - lo) / n_steps - 1;
    if (p >= 1 && p < window_tokens && (steps.empty() || p > steps.back())) steps.push_back(p);
  }
  return steps;
}

Result<FidelityCapture> capture_fidelity(engine::Runtime& runtime, std::span<const int32_t> tokens,
                                         const FidelityOptions& options) {
  const int W = options.window_tokens;
  if (W <= 1 || options.stride <= 0 || options.n_windows < 0 || options.n_score_steps < 0)
    return invalid_argument("fidelity: window %d, stride %d, %d windows, %d steps", W,
                            options.stride, options.n_windows, options.n_score_steps);
  if (static_cast<int64_t>(tokens.size()) < static_cast<int64_t>(options.n_windows) * W)
    return invalid_argument("fidelity: %d windows of %d tokens need more than %zu tokens",
                            options.n_windows, W, tokens.size());
  const format::ModelConfig& cfg = runtime.model().config();
  FidelityCapture cap;
  cap.n_layers = cfg.n_kv_layers;  // the layers with attention (the observer's cache layers)
  cap.n_heads_q = cfg.n_heads_q;
  cap.head_dim = cfg.head_dim;
  cap.hidden = cfg.hidden_size;
  cap.vocab = cfg.vocab_size;
  cap.steps = fidelity_steps(W, options.n_score_steps);
  const int64_t n_sampled = W / options.stride;

  CaptureObserver observer(runtime.spec(), cap, options.stride);
  model::ForwardOptions fwd;
  fwd.attend_mode = kv::AttendMode::kDecodeEquivalent;
  fwd.observer = &observer;
  std::vector<float> logits;
  for (int w = 0; w < options.n_windows; ++w) {
    FidelityCapture::Window& win = cap.windows.emplace_back();
    win.probs.resize(cap.steps.size() * cap.n_layers * cap.n_heads_q);
    win.attn_out.resize(static_cast<size_t>(n_sampled) * cap.n_layers * cap.n_heads_q *
                        cap.head_dim);
    win.hidden.resize(static_cast<size_t>(n_sampled) * cap.hidden);
    win.log_probs.resize(static_cast<size_t>(n_sampled) * cap.vocab);
    const std::span<const int32_t> win_tokens = tokens.subspan(static_cast<size_t>(w) * W, W);
    auto cache = runtime.new_cache();
    auto run_chunk = [&](int64_t begin, int64_t end, int step) -> Status {
      observer.begin_chunk(cache.get(), &win, step);
      OSCAR_RETURN_IF_ERROR(runtime.model().forward_one(
          win_tokens.subspan(begin, end - begin), *cache, &logits, /*all_logits=*/true, fwd));
      for (int64_t pos = begin; pos < end; ++pos) {
        if (pos % options.stride != options.stride - 1) continue;
        log_softmax(logits.data() + (pos - begin) * cap.vocab, cap.vocab,
                    win.log_probs.data() + static_cast<size_t>(pos / options.stride) * cap.vocab);
      }
      return Status();
    };
    int64_t start = 0;
    for (size_t s = 0; s < cap.steps.size(); ++s) {
      const int64_t p = cap.steps[s];
      if (p > start) OSCAR_RETURN_IF_ERROR(run_chunk(start, p, -1));
      OSCAR_RETURN_IF_ERROR(run_chunk(p, p + 1, static_cast<int>(s)));
      start = p + 1;
    }
    if (start < W) OSCAR_RETURN_IF_ERROR(run_chunk(start, W, -1));
  }
  return cap;
}

Result<FidelityResult> compare_fidelity(const FidelityCapture& ref, const FidelityCapture& m) {
  if (ref.windows.size() != m.windows.size() || ref.steps != m.steps ||
      ref.n_layers != m.n_layers || ref.n_heads_q != m.n_heads_q || ref.head_dim != m.head_dim ||
      ref.hidden != m.hidden || ref.vocab != m.vocab)
    return invalid_argument("fidelity: captures differ in shape (%zu vs %zu windows)",
                            ref.windows.size(), m.windows.size());
  const int L = ref.n_layers, Hq = ref.n_heads_q;
  const size_t row = static_cast<size_t>(Hq) * ref.head_dim;
  FidelityResult r;
  r.n_windows = static_cast<int>(ref.windows.size());
  r.score_kl.assign(L, 0.0);
  r.out_err.assign(L, 0.0);
  r.score_check_max_err = m.score_check_max_err;
  std::vector<double> out_num(L, 0.0), out_den(L, 0.0);
  std::vector<int64_t> kl_count(L, 0);
  double hid_num = 0.0, hid_den = 0.0, logit_kl = 0.0;
  int64_t n_logit = 0;
  for (size_t w = 0; w < ref.windows.size(); ++w) {
    const FidelityCapture::Window& a = ref.windows[w];
    const FidelityCapture::Window& b = m.windows[w];
    for (size_t s = 0; s < ref.steps.size(); ++s)
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < Hq; ++h) {
          const size_t idx = (s * L + l) * Hq + h;
          OSCAR_CHECK(a.probs[idx].size() == b.probs[idx].size());
          r.score_kl[l] += kl_from_logp(a.probs[idx].data(), b.probs[idx].data(),
                                        static_cast<int64_t>(a.probs[idx].size()));
          ++kl_count[l];
        }
    const size_t n_sampled = a.hidden.size() / ref.hidden;
    for (size_t p = 0; p < n_sampled; ++p) {
      for (int l = 0; l < L; ++l) {
        const float* x = a.attn_out.data() + (p * L + l) * row;
        const float* y = b.attn_out.data() + (p * L + l) * row;
        for (size_t i = 0; i < row; ++i) {
          out_num[l] += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
          out_den[l] += static_cast<double>(x[i]) * x[i];
        }
      }
      for (int i = 0; i < ref.hidden; ++i) {
        const double x = a.hidden[p * ref.hidden + i], y = b.hidden[p * ref.hidden + i];
        hid_num += (y - x) * (y - x);
        hid_den += x * x;
      }
      logit_kl += kl_from_logp(a.log_probs.data() + p * ref.vocab,
                               b.log_probs.data() + p * ref.vocab, ref.vocab);
      ++n_logit;
    }
  }
  for (int l = 0; l < L; ++l) {
    if (kl_count[l] > 0) r.score_kl[l] /= static_cast<double>(kl_count[l]);
    r.out_err[l] = std::sqrt(out_num[l] / std::max(out_den[l], 1e-30));
  }
  r.hidden_err = std::sqrt(hid_num / std::max(hid_den, 1e-30));
  r.logit_kl = n_logit > 0 ? logit_kl / static_cast<double>(n_logit) : 0.0;
  return r;
}

}  // namespace oscar::eval
