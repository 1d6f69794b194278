// Helpers of the whole-model tests that check a model's logits against a float64 forward pass
// written in the test (test_moe_model.cpp, test_qwen3_5_model.cpp): the products and
// activations in float64, seeded random prompts, and the logits comparison with its report.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

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

inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids) t = pick(rng);
  return ids;
}

// got [rows, vocab] against want (float64) rows [row0, row0 + rows): every logit within tol and
// every row's cosine similarity at least min_cos_allowed; prints the max error and the worst cosine.
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
