// Tests of quant/hadamard.h and quant/rotation.h: orthogonality of H, H·P_br and U·H·P_br, FWHT
// against the matrix product, the bit-reversal placement of directions, and row rotations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "quant/hadamard.h"
#include "quant/rotation.h"

namespace oscar::quant {
namespace {

using Mat = std::vector<double>;  // row-major [d, d]

Mat matmul(const Mat& a, const Mat& b, int d) {
  Mat c(static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int k = 0; k < d; ++k)
      for (int j = 0; j < d; ++j) c[i * d + j] += a[i * d + k] * b[k * d + j];
  return c;
}

// A random orthogonal matrix (modified Gram-Schmidt on Gaussian columns), seeded.
Mat random_orthogonal(int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  Mat u(static_cast<size_t>(d) * d);
  for (auto& v : u) v = normal(rng);
  for (int j = 0; j < d; ++j) {
    for (int p = 0; p < j; ++p) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += u[i * d + j] * u[i * d + p];
      for (int i = 0; i < d; ++i) u[i * d + j] -= dot * u[i * d + p];
    }
    double norm = 0;
    for (int i = 0; i < d; ++i) norm += u[i * d + j] * u[i * d + j];
    norm = std::sqrt(norm);
    for (int i = 0; i < d; ++i) u[i * d + j] /= norm;
  }
  return u;
}

double orthogonality_error_d(const Mat& m, int d) {
  std::vector<float> f(m.begin(), m.end());
  return orthogonality_error(f.data(), d);
}

TEST(Hadamard, OrthogonalSymmetricSylvester) {
  for (int d : {1, 2, 4, 8, 32, 64, 128, 256}) {
    const Mat h = hadamard_matrix(d);
    const Mat hh = matmul(h, h, d);  // H symmetric, so HᵀH = HH
    double err = 0;
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) {
        err = std::max(err, std::fabs(hh[i * d + j] - (i == j ? 1.0 : 0.0)));
        ASSERT_EQ(h[i * d + j], h[j * d + i]);
      }
    EXPECT_LT(err, 1e-12) << "d " << d;
  }
  const Mat h4 = hadamard_matrix(4);  // Sylvester order: [[1,1,1,1],[1,-1,1,-1],[1,1,-1,-1],...]
  EXPECT_EQ(h4[1 * 4 + 1], -0.5);
  EXPECT_EQ(h4[2 * 4 + 1], 0.5);
  EXPECT_EQ(h4[3 * 4 + 3], 0.5);
}

TEST(Hadamard, FwhtEqualsMatrixProduct) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int d : {2, 16, 64, 128, 256}) {
    const Mat h = hadamard_matrix(d);
    std::vector<float> x(d);
    for (auto& v : x) v = normal(rng);
    std::vector<float> y = x;
    fwht_inplace(y.data(), d);
    std::vector<double> yd(x.begin(), x.end());
    fwht_inplace(yd.data(), d);
    double max_err = 0, max_err_d = 0, norm = 0;
    for (int j = 0; j < d; ++j) {
      double ref = 0;  // (x H)_j
      for (int k = 0; k < d; ++k) ref += static_cast<double>(x[k]) * h[k * d + j];
      max_err = std::max(max_err, std::fabs(ref - y[j]));
      max_err_d = std::max(max_err_d, std::fabs(ref - yd[j]));
      norm += ref * ref;
    }
    // float butterflies: log2(d) roundings of values bounded by the vector norm
    EXPECT_LT(max_err, 1e-6 * std::log2(d) * std::sqrt(norm)) << "d " << d;
    EXPECT_LT(max_err_d, 1e-13) << "d " << d;
  }
}

TEST(Hadamard, BitReversal) {
  EXPECT_EQ(bitrev(0, 128), 0);
  EXPECT_EQ(bitrev(1, 128), 64);
  EXPECT_EQ(bitrev(2, 128), 32);
  EXPECT_EQ(bitrev(3, 128), 96);
  EXPECT_EQ(bitrev(127, 128), 127);
  EXPECT_EQ(bitrev(1, 8), 4);
  EXPECT_EQ(bitrev(6, 8), 3);
  EXPECT_EQ(bitrev(0, 1), 0);
  for (int d : {2, 64, 128}) {
    std::vector<int> seen(d, 0);
    for (int j = 0; j < d; ++j) {
      ASSERT_EQ(bitrev(bitrev(j, d), d), j);  // involution
      ++seen[bitrev(j, d)];
    }
    for (int c : seen) ASSERT_EQ(c, 1);  // permutation
  }
}

// (A · P_br) puts column j of A at column bitrev(j), for any A; and H·P_br puts column j of H at
// column bitrev(j).
TEST(Hadamard, BitReversalPermutationMovesColumnJToBitrevJ) {
  constexpr int d = 128;
  std::mt19937 rng(11);
  std::normal_distribution<double> normal;
  Mat a(d * d);
  for (auto& v : a) v = normal(rng);
  const Mat ap = matmul(a, bitrev_permutation_matrix(d), d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) ASSERT_EQ(ap[i * d + bitrev(j, d)], a[i * d + j]);
  const Mat h = hadamard_matrix(d);
  const std::vector<float> hp = hadamard_bitrev_rotation(d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j)
      ASSERT_EQ(hp[i * d + bitrev(j, d)], static_cast<float>(h[i * d + j]));
  EXPECT_LT(orthogonality_error(hp.data(), d), 1e-6);
  // With groups of 32, the four most important directions land in four different groups.
  std::vector<int> group_of_first4;
  for (int j = 0; j < 4; ++j) group_of_first4.push_back(bitrev(j, d) / 32);
  std::sort(group_of_first4.begin(), group_of_first4.end());
  EXPECT_EQ(group_of_first4, (std::vector<int>{0, 1, 2, 3}));
}

TEST(Rotation, ComposeEqualsUTimesHTimesPbr) {
  for (int d : {64, 128}) {
    const Mat u = random_orthogonal(d, 100 + d);
    const std::vector<float> r = compose_rotation(u.data(), d);
    const Mat uh = matmul(u, hadamard_matrix(d), d);
    const Mat expected = matmul(uh, bitrev_permutation_matrix(d), d);
    double max_err = 0;
    for (int i = 0; i < d * d; ++i) max_err = std::max(max_err, std::fabs(expected[i] - r[i]));
    EXPECT_LT(max_err, 1e-7) << "d " << d;  // float rounding of entries of size <= 1
    // Column j of U·H at column bitrev(j) of R.
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j)
        ASSERT_NEAR(r[i * d + bitrev(j, d)], uh[i * d + j], 1e-7);
    EXPECT_LT(orthogonality_error_d(u, d), 1e-6);
    const double orth = orthogonality_error(r.data(), d);
    std::printf("d=%d: max|RᵀR − I| = %.3g for random U·H·P_br\n", d, orth);
    EXPECT_LT(orth, 1e-6);
  }
  // U = I gives H·P_br exactly.
  constexpr int d = 32;
  Mat eye(d * d, 0.0);
  for (int i = 0; i < d; ++i) eye[i * d + i] = 1.0;
  EXPECT_EQ(compose_rotation(eye.data(), d), hadamard_bitrev_rotation(d));
}

TEST(Rotation, RotateUnrotateRoundTripAndDotProducts) {
  constexpr int d = 128, n = 33;
  const Mat u = random_orthogonal(d, 7);
  const std::vector<float> r = compose_rotation(u.data(), d);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(n * d), xr(n * d), back(n * d);
  for (auto& v : x) v = 3.0f * normal(rng);
  rotate_rows(x.data(), n, r.data(), d, xr.data());
  unrotate_rows(xr.data(), n, r.data(), d, back.data());
  double max_err = 0;
  for (int i = 0; i < n * d; ++i) max_err = std::max(max_err, double{std::fabs(x[i] - back[i])});
  EXPECT_LT(max_err, 1e-5);  // |x| ~ 10: two float roundings plus R's 1e-7 non-orthogonality
  // q·kᵀ = (qR)(kR)ᵀ (OSCAR.md §3): rows 0 and 1 as q and k, and norms preserved.
  double qk = 0, qk_rot = 0, nn = 0, nn_rot = 0;
  for (int c = 0; c < d; ++c) {
    qk += static_cast<double>(x[c]) * x[d + c];
    qk_rot += static_cast<double>(xr[c]) * xr[d + c];
    nn += static_cast<double>(x[c]) * x[c];
    nn_rot += static_cast<double>(xr[c]) * xr[c];
  }
  EXPECT_NEAR(qk, qk_rot, 1e-4 * nn);
  EXPECT_NEAR(nn, nn_rot, 1e-5 * nn);
}

// Key scaling (OSCAR.md §1 "Key scaling"): the key transform U·W·H·P_br and the query transform
// U·W⁻¹·H·P_br keep every dot product; w = 1 gives R itself; and each transform is U·diag(w)·H·P_br
// as composed directly.
TEST(Rotation, ScaledRotationKeepsDotProductsAndComposesUWHP) {
  constexpr int d = 64, n = 9;
  const Mat u = random_orthogonal(d, 11);
  const std::vector<float> r = compose_rotation(u.data(), d);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(0.3f, 3.0f);
  std::normal_distribution<float> normal;
  std::vector<float> w(d), ones(d, 1.0f);
  for (float& v : w) v = uni(rng);
  const std::vector<float> mk = scaled_rotation(r.data(), w.data(), d, false);
  const std::vector<float> mq = scaled_rotation(r.data(), w.data(), d, true);
  // w = 1: R to float rounding (R is recovered as (R·Bᵀ)·B in double).
  const std::vector<float> same = scaled_rotation(r.data(), ones.data(), d, false);
  for (int i = 0; i < d * d; ++i) EXPECT_NEAR(same[i], r[i], 1e-6) << i;
  // Direct composition: U·diag(w), then ·H·P_br.
  Mat uw = u;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) uw[i * d + j] *= w[j];
  const std::vector<float> direct = compose_rotation(uw.data(), d);
  for (int i = 0; i < d * d; ++i) EXPECT_NEAR(mk[i], direct[i], 1e-5) << i;
  // (q·M_Q)·(k·M_K)ᵀ = q·kᵀ for random rows; the key transform is not orthogonal.
  std::vector<float> x(n * d), xk(n * d), xq(n * d);
  for (auto& v : x) v = normal(rng);
  rotate_rows(x.data(), n, mk.data(), d, xk.data());
  rotate_rows(x.data(), n, mq.data(), d, xq.data());
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      double exact = 0, got = 0, norm = 0;
      for (int c = 0; c < d; ++c) {
        exact += static_cast<double>(x[a * d + c]) * x[b * d + c];
        got += static_cast<double>(xq[a * d + c]) * xk[b * d + c];
        norm += static_cast<double>(x[a * d + c]) * x[a * d + c];
      }
      EXPECT_NEAR(got, exact, 1e-5 * norm) << a << " " << b;  // float transforms, |w| <= 3
    }
  EXPECT_GT(orthogonality_error(mk.data(), d), 0.1);
}

}  // namespace
}  // namespace oscar::quant
