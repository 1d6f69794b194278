// Helpers of the whole-model tests that check a model's logits against a float64 forward pass
// written in the test (test_moe_model.cpp, test_qwen3_5_model.cpp): a checkpoint's tensors in
// float64, the products, norms, RoPE and causal attention in float64 (transformers' operations),
// seeded random prompts, and the logits comparison with its report.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "format/model_config.h"
#include "format/safetensors.h"

namespace oscar::test {

using Vec = std::vector<double>;

// y[n, out] = x[n, in] W[out, in]^T
inline Vec matmul(const Vec& x, int64_t n, const Vec& W, int64_t out, int64_t in) {
  Vec y(static_cast<size_t>(n * out), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < out; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < in; ++c) acc += x[i * in + c] * W[r * in + c];
      y[i * out + r] = acc;
    }
  return y;
}

inline void add(Vec& x, const Vec& y) {
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

inline double silu(double g) { return g / (1.0 + std::exp(-g)); }

// A model directory's config and every tensor of its checkpoint widened to float64.
class Float64Checkpoint {
 public:
  explicit Float64Checkpoint(const std::string& dir) {
    auto config = format::ModelConfig::load(dir);
    EXPECT_TRUE(config.ok()) << config.status().to_string();
    if (config.ok()) c_ = config.value();
    auto ckpt = format::Checkpoint::open(dir);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    if (!ckpt.ok()) return;
    for (const format::TensorView* t : ckpt->all()) {
      const std::vector<float> f = t->to_f32();
      w_[t->name] = Vec(f.begin(), f.end());
    }
  }
  const format::ModelConfig& config() const { return c_; }
  const Vec& w(const std::string& name) const {
    static const Vec empty;
    auto it = w_.find(name);
    EXPECT_NE(it, w_.end()) << name;
    return it == w_.end() ? empty : it->second;
  }

 private:
  format::ModelConfig c_;
  std::map<std::string, Vec> w_;
};

// RMSNorm of rows of dim values: x / sqrt(mean(x²) + eps) · (offset + g). offset 0 is the plain
// weight; 1 the zero-centred (1 + w) of Qwen3.5.
inline Vec rms_norm(const Vec& x, int64_t rows, int64_t dim, const Vec& g, double eps,
                    double offset = 0.0) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += x[r * dim + i] * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = (offset + g[i]) * (x[r * dim + i] * inv);
  }
  return y;
}

// rotate_half RoPE on dims [0, rotary_dim) of each head of x [T, heads, head_dim] at positions
// 0 .. T-1, inv_freq = theta^(-2i / rotary_dim).
inline void rope(Vec& x, int64_t T, int heads, int64_t head_dim, int64_t rotary_dim,
                 double theta) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int hh = 0; hh < heads; ++hh) {
      double* r = &x[(t * heads + hh) * head_dim];
      for (int64_t i = 0; i < half; ++i) {
        const double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / rotary_dim);
        const double a = t * inv_freq, co = std::cos(a), si = std::sin(a);
        const double x0 = r[i], x1 = r[i + half];
        r[i] = x0 * co - x1 * si;
        r[i + half] = x1 * co + x0 * si;
      }
    }
}

// Causal softmax attention of q [T, Hq, d] over k, v [T, Hkv, d] (query head h reads KV head
// h / (Hq / Hkv)), scale 1/sqrt(d): out [T, Hq, d].
inline Vec causal_attention(const Vec& q, const Vec& k, const Vec& v, int64_t T, int Hq, int Hkv,
                            int64_t d) {
  Vec attn(static_cast<size_t>(T * Hq * d), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t t = 0; t < T; ++t)
    for (int hq = 0; hq < Hq; ++hq) {
      const int g = hq / (Hq / Hkv);
      const double* qr = &q[(t * Hq + hq) * d];
      Vec s(static_cast<size_t>(t + 1));
      double m = -INFINITY;
      for (int64_t u = 0; u <= t; ++u) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += qr[i] * k[(u * Hkv + g) * d + i];
        s[u] = dot * scale;
        m = std::max(m, s[u]);
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - m));
      for (int64_t u = 0; u <= t; ++u)
        for (int64_t i = 0; i < d; ++i)
          attn[(t * Hq + hq) * d + i] += s[u] / z * v[(u * Hkv + g) * d + i];
    }
  return attn;
}

inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids) t = pick(rng);
  return ids;
}

// got [rows, vocab] against want (float64) rows [row0, row0 + rows): every logit within tol and
// every row's cosine similarity at least min_cos_allowed; prints the max error and worst cosine.
inline void expect_close(const std::vector<float>& got, const Vec& want, int64_t row0,
                         int64_t rows, int vocab, double tol, const std::string& what,
                         double min_cos_allowed = 1 - 1e-6) {
  ASSERT_EQ(got.size(), static_cast<size_t>(rows * vocab)) << what;
  double max_err = 0, min_cos = 1;
  int64_t worst = -1;
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0, ng = 0, nw = 0;
    for (int c = 0; c < vocab; ++c) {
      const double a = got[r * vocab + c], b = want[(row0 + r) * vocab + c];
      if (std::fabs(a - b) > max_err) {
        max_err = std::fabs(a - b);
        worst = r * vocab + c;
      }
      dot += a * b;
      ng += a * a;
      nw += b * b;
    }
    min_cos = std::min(min_cos, dot / std::sqrt(ng * nw));
  }
  std::printf("%-28s max_abs %.3g min_cos %.9f\n", what.c_str(), max_err, min_cos);
  EXPECT_LE(max_err, tol) << what << ": first worst at row " << worst / vocab << " token "
                          << worst % vocab;
  EXPECT_GE(min_cos, min_cos_allowed) << what;
}

}  // namespace oscar::test
