// linear (kernels/linear.h): the fast CPU path against the float64 reference, for F32 and BF16
// weights, across the few-rows (decode) and many-rows (prefill) paths and ragged shapes, with and
// without batch_invariant; and the batch-invariant rows bitwise against each row alone.
// Tolerance: float32 accumulation of `in` products of |x||w| gives |err| <= in · u · Σ|x_c w_c|
// (u = 2^-24, a loose form of the usual γ_in bound); the test uses 2 · in · u · Σ|x_c w_c|.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/linear.h"

namespace oscar::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

void run(DType dtype, int64_t n, int64_t in, int64_t out, bool bias, uint32_t seed,
         bool batch_invariant = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n * in), wf(out * in), b(out), y(n * out, -7.f), y_ref(n * out, -7.f);
  for (float& v : x) v = normal(rng);
  for (float& v : wf) v = round_to_bf16(normal(rng));
  for (float& v : b) v = normal(rng);
  std::vector<bf16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  LinearParams p;
  p.x = x.data();
  p.n = n;
  p.w = WeightView{dtype == DType::kBF16 ? static_cast<const void*>(wb.data()) : wf.data(), dtype,
                   out, in};
  p.bias = bias ? b.data() : nullptr;
  p.batch_invariant = batch_invariant;
  p.y = y_ref.data();
  ASSERT_TRUE(linear_ref(p).ok());
  p.y = y.data();
  ASSERT_TRUE(linear(p).ok());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < out; ++r) {
      double mag = bias ? std::fabs(b[r]) : 0.0;
      for (int64_t c = 0; c < in; ++c) mag += std::fabs(x[i * in + c] * wf[r * in + c]);
      const double tol = 2.0 * in * kU * mag + 1e-30;
      const double err = std::fabs(static_cast<double>(y[i * out + r]) - y_ref[i * out + r]);
      ASSERT_LE(err, tol) << "dtype " << static_cast<int>(dtype) << " n " << n << " in " << in
                          << " out " << out << ": first mismatch at row " << i << " col " << r
                          << ": got " << y[i * out + r] << " want " << y_ref[i * out + r];
    }
}

TEST(Linear, FastMatchesReference) {
  uint32_t seed = 1;
  for (bool invariant : {false, true})
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (int64_t n : {1, 2, 3, 4, 5, 8, 9, 33, 130})
        for (auto [in, out] : {std::pair<int64_t, int64_t>{256, 512}, {256, 70}, {37, 129},
                               {768, 256}, {16, 1}})
          for (bool bias : {false, true}) run(dtype, n, in, out, bias, seed++, invariant);
}

// Batch invariance: with batch_invariant, each row of a call of M rows is bitwise the row computed
// alone (M = 1), for M across the tile (4 rows), the default path's switch (8) and the x blocks
// (64), for BF16 (split lanes, and the ragged in % 16 != 0 path) and F32 weights.
TEST(Linear, InvariantRowsEqualTheRowAlone) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (DType dtype : {DType::kBF16, DType::kF32})
    for (auto [in, out] : {std::pair<int64_t, int64_t>{256, 200}, {40, 70}}) {
      std::vector<float> wf(out * in), b(out);
      for (float& v : wf) v = round_to_bf16(normal(rng));
      for (float& v : b) v = normal(rng);
      std::vector<bf16_t> wb(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
      for (int64_t m : {2, 3, 5, 8, 9, 17, 64, 65, 130}) {
        std::vector<float> x(m * in), y(m * out), y1(out);
        for (float& v : x) v = normal(rng);
        LinearParams p;
        p.x = x.data();
        p.n = m;
        p.w = WeightView{dtype == DType::kBF16 ? static_cast<const void*>(wb.data()) : wf.data(),
                         dtype, out, in};
        p.bias = b.data();
        p.y = y.data();
        p.batch_invariant = true;
        ASSERT_TRUE(linear(p).ok());
        for (int64_t i = 0; i < m; ++i) {
          LinearParams one = p;
          one.x = x.data() + i * in;
          one.n = 1;
          one.y = y1.data();
          ASSERT_TRUE(linear(one).ok());
          for (int64_t r = 0; r < out; ++r)
            ASSERT_EQ(y[i * out + r], y1[r]) << "dtype " << static_cast<int>(dtype) << " in " << in
                                             << " M " << m << ": row " << i << " col " << r;
        }
      }
    }
}

// linear_group runs q/k/v-like and gate/up-like groups of one x in one parallel region: the bits
// of one linear() each, for decode and prefill rows, with and without bias.
TEST(Linear, GroupMatchesOneByOne) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t in = 256;
  for (int64_t n : {1, 3, 8, 9})
    for (const std::vector<int64_t>& outs : {std::vector<int64_t>{512, 256, 256},
                                            std::vector<int64_t>{768, 768}, {70, 129}})
      for (bool bias : {false, true}) {
        std::vector<float> x(n * in);
        for (float& v : x) v = normal(rng);
        std::vector<std::vector<bf16_t>> w(outs.size());
        std::vector<std::vector<float>> b(outs.size()), y(outs.size()), y_one(outs.size());
        std::vector<LinearParams> ps(outs.size());
        for (size_t i = 0; i < outs.size(); ++i) {
          w[i].resize(outs[i] * in);
          for (bf16_t& v : w[i]) v = f32_to_bf16(normal(rng));
          b[i].resize(outs[i]);
          for (float& v : b[i]) v = normal(rng);
          y[i].assign(n * outs[i], -7.f);
          y_one[i].assign(n * outs[i], -7.f);
          ps[i].x = x.data();
          ps[i].n = n;
          ps[i].w = WeightView{w[i].data(), DType::kBF16, outs[i], in};
          ps[i].bias = bias ? b[i].data() : nullptr;
          ps[i].y = y_one[i].data();
          ASSERT_TRUE(linear(ps[i]).ok());
          ps[i].y = y[i].data();
        }
        ASSERT_TRUE(linear_group(ps.data(), static_cast<int>(ps.size())).ok());
        for (size_t i = 0; i < outs.size(); ++i)
          ASSERT_EQ(y[i], y_one[i]) << "n " << n << " product " << i << " of " << outs.size();
      }
}

TEST(Linear, RefusesBadShapes) {
  LinearParams p;
  p.n = 1;
  EXPECT_FALSE(linear(p).ok());
  float x = 1, y = 0;
  p.x = &x;
  p.y = &y;
  p.w = WeightView{&x, static_cast<DType>(7), 1, 1};
  EXPECT_FALSE(linear(p).ok());
  EXPECT_FALSE(linear_group(&p, 1).ok());
}

}  // namespace
}  // namespace oscar::kernels
