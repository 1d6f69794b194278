// Unit tests of calib/: the float64 accumulators (streaming, weighted, merged), the
// eigendecomposition and rotation pipeline on a covariance with known eigenvectors, the GQA
// pooling and window bookkeeping of CalibrationObserver on synthetic activations, the clip search
// objectives, and the progress bar's text. Seeded inputs; tolerances stated at each check.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "calib/bit_plan.h"
#include "calib/calibrator.h"
#include "calib/clip_search.h"
#include "calib/covariance.h"
#include "calib/key_scaling.h"
#include "core/progress.h"
#include "quant/hadamard.h"
#include "quant/rotation.h"

namespace oscar::calib {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// A random orthogonal [d, d] matrix (QR of a seeded Gaussian), row-major double.
std::vector<double> random_orthogonal(int d, uint32_t seed) {
  std::vector<float> g = gaussian(static_cast<size_t>(d) * d, seed);
  Eigen::MatrixXd A(d, d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) A(i, j) = g[static_cast<size_t>(i) * d + j];
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(A);
  Eigen::MatrixXd Q = qr.householderQ();
  std::vector<double> out(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) out[static_cast<size_t>(i) * d + j] = Q(i, j);
  return out;
}

TEST(Covariance, MatchesDirectSumStreamingAndMerged) {
  constexpr int d = 16, n = 300;
  const std::vector<float> x = gaussian(static_cast<size_t>(n) * d, 1);
  CovarianceAccumulator all(d), a(d), b(d);
  all.add_rows(x.data(), n, d);
  a.add_rows(x.data(), 100, d);             // streamed in two pieces ...
  b.add_rows(x.data() + 100 * d, n - 100, d);
  a.merge(b);                               // ... and merged
  std::vector<double> direct(d * d, 0.0);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j)
        direct[i * d + j] += static_cast<double>(x[r * d + i]) * x[r * d + j];
  const std::vector<double> c1 = all.covariance(), c2 = a.covariance();
  EXPECT_EQ(all.weight_sum(), n);
  EXPECT_EQ(a.n_rows(), n);
  for (int i = 0; i < d * d; ++i) {
    EXPECT_NEAR(c1[i], direct[i] / n, 1e-12) << i;  // float64 sums of float products: exact-ish
    EXPECT_NEAR(c2[i], c1[i], 1e-12) << i;
  }
}

TEST(Covariance, MeanIsTheWeightedAverageRow) {
  constexpr int d = 8, n = 50;
  const std::vector<float> x = gaussian(static_cast<size_t>(n) * d, 3);
  std::vector<float> w(n);
  for (int r = 0; r < n; ++r) w[r] = 0.5f + static_cast<float>(r % 5);
  CovarianceAccumulator acc(d), empty(d);
  acc.add_rows(x.data(), n, d, w.data());
  const std::vector<double> m = acc.mean();
  for (int j = 0; j < d; ++j) {
    double num = 0, den = 0;
    for (int r = 0; r < n; ++r) {
      num += static_cast<double>(w[r]) * x[r * d + j];
      den += w[r];
    }
    EXPECT_NEAR(m[j], num / den, 1e-12) << j;
    EXPECT_EQ(empty.mean()[j], 0.0);
  }
}

// Query-aware key scaling (key_scaling.h) on a basis where everything is known: queries with
// eigenvalues λ_j along the columns of U, keys with variances κ_j along the same columns plus a
// mean. w_j must be (λ_j/κ_j)^(1/4) up to a common factor (geometric mean 1), the predicted error
// ratio (Σ sqrt(λ_j κ_j))² / (Σ κ⁰_j · Σ λ_j), and centring must remove exactly the mean's part.
TEST(KeyScaling, MatchesTheClosedFormOnAKnownBasis) {
  constexpr int d = 8;
  const std::vector<double> U = random_orthogonal(d, 21);
  const double lambda[d] = {9, 5, 3, 2, 1, 0.5, 0.2, 0.1};
  const double kappa[d] = {0.5, 1, 4, 2, 3, 6, 1, 2};
  const double mean_coef[d] = {1.0, 0, 0, 0.5, 0, 0, 0, 0};  // μ = Σ c_j u_j
  EigenBasis qb;
  qb.d = d;
  qb.eigenvalues.assign(lambda, lambda + d);
  qb.eigenvectors = U;
  // C_K = U diag(κ) Uᵀ + μμᵀ (second moment), μ in the key basis.
  std::vector<double> mu(d, 0.0), ck(d * d, 0.0);
  for (int a = 0; a < d; ++a)
    for (int j = 0; j < d; ++j) mu[a] += U[a * d + j] * mean_coef[j];
  for (int a = 0; a < d; ++a)
    for (int b = 0; b < d; ++b) {
      for (int j = 0; j < d; ++j) ck[a * d + b] += U[a * d + j] * kappa[j] * U[b * d + j];
      ck[a * d + b] += mu[a] * mu[b];
    }
  const KeyScaling full = key_scaling(qb, ck, mu, /*centre=*/true, /*scale=*/true);
  double log_sum = 0, sqrt_sum = 0, k0 = 0, l0 = 0;
  for (int j = 0; j < d; ++j) {
    log_sum += std::log(full.scale[j]);
    sqrt_sum += std::sqrt(lambda[j] * kappa[j]);
    k0 += kappa[j] + mean_coef[j] * mean_coef[j];
    l0 += lambda[j];
  }
  EXPECT_NEAR(log_sum, 0.0, 1e-9);  // geometric mean 1
  for (int j = 1; j < d; ++j)
    EXPECT_NEAR(full.scale[j] / full.scale[0],
                std::pow((lambda[j] / kappa[j]) / (lambda[0] / kappa[0]), 0.25), 1e-9) << j;
  EXPECT_NEAR(full.predicted_error_ratio, sqrt_sum * sqrt_sum / (k0 * l0), 1e-9);
  // Absolute error with the optimal scaling: (Σ sqrt(λκ))² / d².
  EXPECT_NEAR(full.logit_error, sqrt_sum * sqrt_sum / (d * d), 1e-9);
  for (int a = 0; a < d; ++a) EXPECT_NEAR(full.mean[a], mu[a], 1e-12);
  // Centre only: W = I, ratio Σκ / Σκ⁰. Neither: ratio 1, zero mean.
  const KeyScaling centre = key_scaling(qb, ck, mu, true, false);
  double ksum = 0;
  for (int j = 0; j < d; ++j) {
    EXPECT_EQ(centre.scale[j], 1.0);
    ksum += kappa[j];
  }
  EXPECT_NEAR(centre.predicted_error_ratio, ksum / k0, 1e-9);
  const KeyScaling none = key_scaling(qb, ck, mu, false, false);
  EXPECT_NEAR(none.predicted_error_ratio, 1.0, 1e-12);
  for (int a = 0; a < d; ++a) EXPECT_EQ(none.mean[a], 0.0);
  // The optimum beats any other power of the same family.
  for (double p : {0.0, 0.125, 0.375, 0.5})
    EXPECT_GE(key_scaling(qb, ck, mu, true, true, p).predicted_error_ratio,
              full.predicted_error_ratio - 1e-12) << p;
}

TEST(Covariance, WeightsEqualRepeatedRowsAndStrideSkipsColumns) {
  constexpr int d = 8, stride = 12;
  const std::vector<float> x = gaussian(3 * stride, 2);
  const float w[3] = {2.0f, 0.0f, 3.0f};
  CovarianceAccumulator weighted(d), repeated(d);
  weighted.add_rows(x.data(), 3, stride, w);
  for (int k = 0; k < 2; ++k) repeated.add_rows(x.data(), 1, stride);
  for (int k = 0; k < 3; ++k) repeated.add_rows(x.data() + 2 * stride, 1, stride);
  EXPECT_DOUBLE_EQ(weighted.weight_sum(), 5.0);
  const auto c1 = weighted.covariance(), c2 = repeated.covariance();
  for (int i = 0; i < d * d; ++i) EXPECT_NEAR(c1[i], c2[i], 1e-12) << i;
}

TEST(EigenPipeline, KnownCovarianceGivesKnownBasisAndOrthogonalRotation) {
  constexpr int d = 128;
  const std::vector<double> U0 = random_orthogonal(d, 3);
  std::vector<double> lambda(d);
  for (int j = 0; j < d; ++j) lambda[j] = 100.0 * std::pow(0.93, j);  // distinct, descending
  // Rows r_j = sqrt(d λ_j) u_jᵀ (in a shuffled order): (1/d) Σ r_jᵀ r_j = U0 Λ U0ᵀ exactly.
  CovarianceAccumulator acc(d);
  std::vector<float> row(d);
  for (int jj = 0; jj < d; ++jj) {
    const int j = (jj * 37) % d;
    for (int i = 0; i < d; ++i)
      row[i] = static_cast<float>(std::sqrt(d * lambda[j]) * U0[static_cast<size_t>(i) * d + j]);
    acc.add_rows(row.data(), 1, d);
  }
  const EigenBasis b = eigen_decompose(acc.covariance(), d);
  for (int j = 0; j < d; ++j) {
    // The rows were rounded to float: eigenvalues agree to ~float precision relative to λ_0.
    EXPECT_NEAR(b.eigenvalues[j], lambda[j], 1e-5 * lambda[0]) << j;
    if (j > 0) {
      EXPECT_GE(b.eigenvalues[j - 1], b.eigenvalues[j]);
    }
  }
  // Eigenvectors equal ±u_j (well separated eigenvalues: |cos| > 1 − 1e-6 for the top 32).
  for (int j = 0; j < 32; ++j) {
    double dot = 0;
    for (int i = 0; i < d; ++i)
      dot += b.eigenvectors[static_cast<size_t>(i) * d + j] * U0[static_cast<size_t>(i) * d + j];
    EXPECT_GT(std::abs(dot), 1.0 - 1e-6) << j;
  }
  // Sign convention: the largest-magnitude entry of every column is positive.
  for (int j = 0; j < d; ++j) {
    int arg = 0;
    for (int i = 1; i < d; ++i)
      if (std::abs(b.eigenvectors[static_cast<size_t>(i) * d + j]) >
          std::abs(b.eigenvectors[static_cast<size_t>(arg) * d + j]))
        arg = i;
    EXPECT_GT(b.eigenvectors[static_cast<size_t>(arg) * d + j], 0.0) << j;
  }
  const std::vector<float> R = rotation_from_basis(b);
  EXPECT_LT(quant::orthogonality_error(R.data(), d), 1e-6);
  // R = U · H · P_br: column bitrev(j) of R is U·H column j; check j = 0 against a direct product.
  const std::vector<double> H = quant::hadamard_matrix(d);
  for (int i = 0; i < d; ++i) {
    double uh = 0;
    for (int k = 0; k < d; ++k)
      uh += b.eigenvectors[static_cast<size_t>(i) * d + k] * H[static_cast<size_t>(k) * d + 0];
    EXPECT_NEAR(R[static_cast<size_t>(i) * d + quant::bitrev(0, d)], uh, 1e-6);
  }
  // Deterministic: the same covariance gives bit-identical output.
  const EigenBasis b2 = eigen_decompose(acc.covariance(), d);
  EXPECT_EQ(b.eigenvectors, b2.eigenvectors);
}

TEST(Observer, PoolsGqaHeadsAndKeepsBoundedClipSample) {
  constexpr int L = 2, Hq = 4, Hkv = 2, d = 8, T = 40;
  CalibrationOptions o;
  o.value_objective = ValueObjective::kDiag;
  o.diag_query_stride = 1;  // every row: w_t exact
  o.clip_queries = 5;
  o.clip.n_sink = 4;
  o.clip.n_recent = 8;
  CalibrationObserver obs(L, Hq, Hkv, d, o);
  const std::vector<float> q = gaussian(static_cast<size_t>(T) * Hq * d, 4);
  const std::vector<float> k = gaussian(static_cast<size_t>(T) * Hkv * d, 5);
  const std::vector<float> v = gaussian(static_cast<size_t>(T) * Hkv * d, 6);
  const std::vector<float> out = gaussian(static_cast<size_t>(T) * Hq * d, 7);
  obs.begin_window(T, /*keep_clip_sample=*/true);
  for (int l = 0; l < L; ++l) {  // two chunks: [0, 25) and [25, 40)
    for (int64_t p0 : {0, 25}) {
      const int64_t n = p0 == 0 ? 25 : 15;
      obs.on_qkv(0, l, q.data() + p0 * Hq * d, k.data() + p0 * Hkv * d, v.data() + p0 * Hkv * d,
                 n, p0);
      obs.on_attention(0, l, out.data() + p0 * Hq * d, n, p0);
    }
  }
  obs.end_window();
  // KV head 1 pools query heads 2 and 3 (GQA ratio 2): N = 2T vectors.
  const CovarianceAccumulator& qa = obs.query_acc(1, 1);
  EXPECT_EQ(qa.weight_sum(), 2 * T);
  CovarianceAccumulator direct(d);
  direct.add_rows(q.data() + 2 * d, T, Hq * d);
  direct.add_rows(q.data() + 3 * d, T, Hq * d);
  const auto c1 = qa.covariance(), c2 = direct.covariance();
  for (int i = 0; i < d * d; ++i) EXPECT_NEAR(c1[i], c2[i], 1e-12);
  EXPECT_EQ(obs.output_acc(0, 0).weight_sum(), 2 * T);
  // Keys of KV head 1: T rows (no pooling), the key scaling's C_K and μ_K.
  CovarianceAccumulator kdirect(d);
  kdirect.add_rows(k.data() + d, T, Hkv * d);
  EXPECT_EQ(obs.key_acc(0, 1).weight_sum(), T);
  const auto k1 = obs.key_acc(0, 1).covariance(), k2 = kdirect.covariance();
  for (int i = 0; i < d * d; ++i) EXPECT_NEAR(k1[i], k2[i], 1e-12);
  for (int i = 0; i < d; ++i) EXPECT_NEAR(obs.key_acc(0, 1).mean()[i], kdirect.mean()[i], 1e-12);
  // Diag weights: Σ_t w_t = Σ_i Σ_t s_it² over 2T query rows; each row's Σ s² is in (1/len, 1].
  const double wsum = obs.diag_acc(0, 1).weight_sum();
  double lo = 0;
  for (int p = 0; p < T; ++p) lo += 2.0 / (p + 1);
  EXPECT_GT(wsum, lo - 1e-4);
  EXPECT_LE(wsum, 2.0 * T + 1e-4);
  // Clip sample: one window, 5 positions in [n_sink + n_recent, T), each with both group heads.
  const std::vector<ClipWindow>& cs = obs.clip_sample(1, 0);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].n_tokens, T);
  ASSERT_EQ(cs[0].q_pos.size(), 10u);
  for (int64_t p : cs[0].q_pos) {
    EXPECT_GE(p, 12);
    EXPECT_LT(p, T);
  }
  const int64_t p = cs[0].q_pos[2];  // second position, first head of the group (query head 0)
  for (int i = 0; i < d; ++i) EXPECT_EQ(cs[0].q[2 * d + i], q[(p * Hq + 0) * d + i]);
  for (int i = 0; i < d; ++i) EXPECT_EQ(cs[0].k[p * d + i], k[(p * Hkv + 0) * d + i]);
}

TEST(ClipPositions, SpreadAndBounded) {
  const auto pos = CalibrationObserver::clip_positions(4096, 64, 64, 256);
  ASSERT_EQ(pos.size(), 64u);
  EXPECT_GE(pos.front(), 320);
  EXPECT_LT(pos.back(), 4096);
  const auto diag = CalibrationObserver::diag_positions(100, 16);
  ASSERT_EQ(diag.size(), 6u);
  EXPECT_EQ(diag[0], 15);
  EXPECT_EQ(diag[5], 95);
}

TEST(ClipGrid, IncludesBothEndsAndOne) {
  ClipGrid g;
  const std::vector<float> v = g.values();
  ASSERT_EQ(v.size(), 21u);
  EXPECT_FLOAT_EQ(v.front(), 0.80f);
  EXPECT_FLOAT_EQ(v[16], 0.96f);
  EXPECT_EQ(v.back(), 1.0f);
  EXPECT_FALSE((ClipGrid{0.9f, 0.8f, 0.01f}).validate().ok());
  EXPECT_FALSE((ClipGrid{0.8f, 1.0f, 0.0f}).validate().ok());
}

// Keys and values with two huge channels that the queries do not read (q is zero there): clipping
// them costs nothing in attention and buys resolution elsewhere, so every objective picks ρ < 1.
TEST(ClipSearch, OutliersFavourClippingUnderEveryObjective) {
  constexpr int d = 64, T = 600, m = 24;
  ClipWindow w;
  w.n_tokens = T;
  w.k = gaussian(static_cast<size_t>(T) * d, 8);
  w.v = gaussian(static_cast<size_t>(T) * d, 9);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < 2; ++c) {
      w.k[static_cast<size_t>(t) * d + c] = 40.0f + c;
      w.v[static_cast<size_t>(t) * d + c] = 40.0f + c;  // constant: no output error from clipping
    }
  w.q = gaussian(static_cast<size_t>(m) * d, 11, 2.0f);
  for (int i = 0; i < m; ++i) w.q[static_cast<size_t>(i) * d] = w.q[static_cast<size_t>(i) * d + 1] = 0;
  for (int i = 0; i < m; ++i) w.q_pos.push_back(200 + i * 16);
  std::vector<float> I(d * d, 0.f);
  for (int i = 0; i < d; ++i) I[i * d + i] = 1.f;
  for (KeyClipObjective obj : {KeyClipObjective::kProb, KeyClipObjective::kKl,
                               KeyClipObjective::kWeightedLogit, KeyClipObjective::kLogit}) {
    ClipSearchConfig c;
    c.head_dim = d;
    c.group_size = 64;
    c.n_sink = 16;
    c.n_recent = 32;
    c.key_objective = obj;
    auto r = search_clip({w}, I.data(), I.data(), c);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->k_loss.size(), 21u);
    EXPECT_LT(r->k_clip, 1.0f) << key_clip_objective_name(obj);
    EXPECT_LT(r->v_clip, 1.0f);
    for (size_t g = 0; g < r->grid.size(); ++g) {
      EXPECT_GE(r->k_loss[g], 0.0);
      EXPECT_GE(r->k_loss[g], r->k_loss[std::find(r->grid.begin(), r->grid.end(), r->k_clip) -
                                        r->grid.begin()]);
    }
  }
}

// Without any quantized keys (all within sinks + recent window) every loss is zero and the
// tie-break keeps ρ = 1 (no clipping).
TEST(ClipSearch, NothingQuantizedKeepsNoClip) {
  constexpr int d = 32, T = 40;
  ClipWindow w;
  w.n_tokens = T;
  w.k = gaussian(T * d, 12);
  w.v = gaussian(T * d, 13);
  w.q = gaussian(2 * d, 14);
  w.q_pos = {30, 39};
  std::vector<float> I(d * d, 0.f);
  for (int i = 0; i < d; ++i) I[i * d + i] = 1.f;
  ClipSearchConfig c;
  c.head_dim = d;
  c.group_size = 32;
  c.n_sink = 8;
  c.n_recent = 64;
  auto r = search_clip({w}, I.data(), I.data(), c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->k_clip, 1.0f);
  EXPECT_EQ(r->v_clip, 1.0f);
  for (double x : r->k_loss) EXPECT_EQ(x, 0.0);
}

TEST(ClipSearch, RejectsBadInput) {
  ClipSearchConfig c;
  c.head_dim = 32;
  c.group_size = 32;
  std::vector<float> I(32 * 32, 0.f);
  EXPECT_FALSE(search_clip({}, I.data(), I.data(), c).ok());
  ClipWindow w;
  w.n_tokens = 4;
  w.k.resize(3 * 32);  // wrong
  EXPECT_EQ(search_clip({w}, I.data(), I.data(), c).status().code(), StatusCode::kInvalidArgument);
}

// The bit plan takes the keys with the largest expected logit error and the values with the
// least energy, `pairs` of each, ties to the lower index; 0 pairs is all-INT2.
TEST(BitPlanChoice, LargestKeyErrorAndSmallestValueEnergy) {
  const std::vector<double> key = {0.8, 0.6, 4.2, 3.1, 3.1, 1.0};
  const std::vector<double> val = {0.005, 0.008, 60, 2.7, 40, 0.005};
  auto one = choose_bit_plan(key, val, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->k_bits, (std::vector<int8_t>{2, 2, 3, 2, 2, 2}));
  EXPECT_EQ(one->v_bits, (std::vector<int8_t>{1, 2, 2, 2, 2, 2}));
  auto three = choose_bit_plan(key, val, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->k_bits, (std::vector<int8_t>{2, 2, 3, 3, 3, 2}));
  EXPECT_EQ(three->v_bits, (std::vector<int8_t>{1, 1, 2, 2, 2, 1}));
  auto none = choose_bit_plan(key, val, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->k_bits, std::vector<int8_t>(6, 2));
  EXPECT_FALSE(choose_bit_plan(key, val, 7).ok());
  EXPECT_FALSE(choose_bit_plan(key, {1.0}, 1).ok());
}

TEST(Options, ParseAndValidate) {
  EXPECT_TRUE(parse_value_objective("full").ok());
  EXPECT_TRUE(parse_value_objective("diag").ok());
  EXPECT_FALSE(parse_value_objective("both").ok());
  EXPECT_FALSE(parse_clip_mode("auto").ok());
  EXPECT_FALSE(parse_key_clip_objective("mse").ok());
  EXPECT_FALSE(parse_quantizer("int4").ok());
  EXPECT_EQ(parse_key_scaling("full").value(), KeyScalingMode::kFull);
  EXPECT_EQ(parse_key_scaling("centre").value(), KeyScalingMode::kCentre);
  EXPECT_EQ(parse_key_scaling("none").value(), KeyScalingMode::kNone);
  EXPECT_FALSE(parse_key_scaling("half").ok());
  CalibrationOptions o;
  EXPECT_TRUE(o.validate().ok());
  EXPECT_EQ(o.key_scaling, KeyScalingMode::kFull);  // the shipped default (ablation.md)
  o.key_scale_power = 1.5;
  EXPECT_FALSE(o.validate().ok());
  o.key_scale_power = kKeyScalePower;
  EXPECT_EQ(o.bit_plan_pairs, 2);  // the shipped default (ablation.md)
  EXPECT_EQ(parse_quantizer("lloyd").value(), quant::HistQuantizer::kInt2Lloyd);
  o.clip.quantizer = quant::HistQuantizer::kKivi;  // the clip search is INT2 only
  EXPECT_NE(o.validate().message().find("not an INT2"), std::string::npos);
  o.clip.quantizer = quant::HistQuantizer::kInt2Lloyd;
  EXPECT_NE(o.validate().message().find("uniform quantizer"), std::string::npos);
  o.bit_plan_pairs = 0;
  EXPECT_TRUE(o.validate().ok());
  o.window_tokens = 1;
  EXPECT_FALSE(o.validate().ok());
}

TEST(Progress, RendersCountsRateAndEta) {
  ProgressBar bar("calibrate", 4, "tok", nullptr);
  const std::string s = bar.render(1, 4096, 2.0);
  EXPECT_NE(s.find("1/4"), std::string::npos) << s;
  EXPECT_NE(s.find("2048 tok/s"), std::string::npos) << s;
  EXPECT_NE(s.find("ETA 0:06"), std::string::npos) << s;
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(-1), "?");
}

}  // namespace
}  // namespace oscar::calib
