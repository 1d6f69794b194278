// Tests of the 4-, 3- and 1-bit reference row quantizers (quant/bit_plan_quant.h): packing
// positions, a float64 reference of the 4-bit quantizer, error bounds the arithmetic gives,
// constant groups, the two-level Lloyd-Max fixed point and its Gaussian MSE, and NaN/Inf refusal.
// Seeded Gaussian inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/bit_plan_quant.h"
#include "quant/int2_quant.h"
#include "quant/int4_layout.h"
#include "quant/row_codec.h"

namespace oscar::quant {
namespace {

std::vector<float> gaussian(int n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(BitPlanLayout, PlanePositionsAreByEighths) {
  std::vector<uint8_t> plane(16, 0);
  plane_set_bit(plane.data(), 17, 128, 1);  // byte 17 % 16 = 1, bit 17 / 16 = 1
  EXPECT_EQ(plane[1], 0x02);
  EXPECT_EQ(plane_get_bit(plane.data(), 17, 128), 1);
  EXPECT_EQ(plane_get_bit(plane.data(), 1, 128), 0);
  plane_set_bit(plane.data(), 17, 128, 0);
  EXPECT_EQ(plane[1], 0);
}

// Every element reconstructs to within half a step of its clipped value (plus fp16 rounding of
// min, which shifts all levels by at most |min|·2^-11), and its code sits where the layout says.
TEST(Int3Row, ErrorWithinHalfAStepAndCodesWhereTheLayoutSays) {
  for (int G : {32, 64, 128}) {
    for (float rho : {1.0f, 0.96f}) {
      const std::vector<float> x = gaussian(128, 7 + G, 2.0f);
      std::vector<uint8_t> row(int3_row_bytes(128, G));
      ASSERT_TRUE(quantize_row_int3_ref(x.data(), 128, G, rho, row.data()).ok());
      std::vector<float> y(128);
      dequantize_row_int3_ref(row.data(), 128, G, y.data());
      for (int g = 0; g < 128 / G; ++g) {
        const float thr = clip_threshold_ref(x.data() + g * G, G, rho);
        Int2GroupMeta m;
        std::memcpy(&m, row.data() + int3_group_meta_offset(128, g), sizeof m);
        const float s = fp16_to_f32(m.slot0), mn = fp16_to_f32(m.slot1);
        ASSERT_GT(s, 0.0f);
        for (int i = 0; i < G; ++i) {
          const float xc = std::clamp(x[g * G + i], -thr, thr);
          EXPECT_LE(std::fabs(y[g * G + i] - xc), 0.5f * s + std::fabs(mn) * 1e-3f + 1e-6f)
              << "G " << G << " rho " << rho << " element " << g * G + i;
          const int q = int2_get_code(row.data() + int2_group_codes_offset(g, G), i, G) |
                        (plane_get_bit(row.data() + int3_group_high_offset(128, g, G), i, G) << 2);
          EXPECT_EQ(y[g * G + i], mn + static_cast<float>(q) * s);
        }
      }
    }
  }
}

TEST(Int3Row, ConstantGroupIsExactAndNonFiniteIsRefused) {
  std::vector<float> x(128, 0.75f);
  std::vector<uint8_t> row(int3_row_bytes(128, 64), 0xAB);
  ASSERT_TRUE(quantize_row_int3_ref(x.data(), 128, 64, 0.96f, row.data()).ok());
  std::vector<float> y(128);
  dequantize_row_int3_ref(row.data(), 128, 64, y.data());
  for (float v : y) EXPECT_EQ(v, 0.75f);
  x[70] = std::nanf("");
  const Status st = quantize_row_int3_ref(x.data(), 128, 64, 0.96f, row.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("element 70 (group 1) is NaN"), std::string::npos) << st.message();
  for (uint8_t b : row) EXPECT_EQ(b, 0);
  x[70] = 1e9f;  // min/scale beyond fp16
  EXPECT_EQ(quantize_row_int3_ref(x.data(), 128, 64, 1.0f, row.data()).code(),
            StatusCode::kOutOfRange);
}

// 8 levels beat 4: on Gaussian rows without clipping the 3-bit MSE is well under the INT2 MSE
// (uniform min/max steps: about (range/7)²/12 against (range/3)²/12, a ratio near 0.2).
TEST(Int3Row, FourTimesLessErrorThanInt2OnGaussians) {
  double e3 = 0, e2 = 0;
  std::vector<uint8_t> r3(int3_row_bytes(128, 128)), r2(int2_row_bytes(128, 128));
  std::vector<float> y(128);
  for (int t = 0; t < 200; ++t) {
    const std::vector<float> x = gaussian(128, 100 + t);
    ASSERT_TRUE(quantize_row_int3_ref(x.data(), 128, 128, 1.0f, r3.data()).ok());
    dequantize_row_int3_ref(r3.data(), 128, 128, y.data());
    for (int i = 0; i < 128; ++i) e3 += (y[i] - x[i]) * (y[i] - x[i]);
    ASSERT_TRUE(quantize_row_int2_ref(x.data(), 128, 128, 1.0f, r2.data()).ok());
    dequantize_row_int2_ref(r2.data(), 128, 128, y.data());
    for (int i = 0; i < 128; ++i) e2 += (y[i] - x[i]) * (y[i] - x[i]);
  }
  EXPECT_LT(e3 / e2, 0.25);
  EXPECT_GT(e3 / e2, 0.12);
}

// Two-level Lloyd-Max: each group reconstructs to its two stored levels, every element to the
// nearer one, the levels are the means of their cells (the fixed point, up to fp16 rounding of
// the levels: 2^-11 relative, and a boundary element that this rounding moves across the
// midpoint, which shifts a mean of ~16 values by < 0.02 here), and on unit Gaussians the MSE
// approaches 1 − 2/π ≈ 0.363.
TEST(Int1Row, NearestOfTwoCellMeansAndGaussianMse) {
  double se = 0;
  int n = 0;
  std::vector<uint8_t> row(int1_row_bytes(128, 32));
  std::vector<float> y(128);
  for (int t = 0; t < 100; ++t) {
    const std::vector<float> x = gaussian(128, 300 + t);
    ASSERT_TRUE(quantize_row_int1_ref(x.data(), 128, 32, row.data()).ok());
    dequantize_row_int1_ref(row.data(), 128, 32, y.data());
    for (int g = 0; g < 4; ++g) {
      Int2GroupMeta m;
      std::memcpy(&m, row.data() + int1_group_meta_offset(128, g), sizeof m);
      const float lo = fp16_to_f32(m.slot0), hi = fp16_to_f32(m.slot1);
      ASSERT_LT(lo, hi);
      double sl = 0, sh = 0;
      int nl = 0, nh = 0;
      for (int i = g * 32; i < (g + 1) * 32; ++i) {
        ASSERT_TRUE(y[i] == lo || y[i] == hi);
        EXPECT_EQ(y[i] == hi, x[i] >= 0.5f * (lo + hi)) << i;
        if (y[i] == hi) { sh += x[i]; ++nh; } else { sl += x[i]; ++nl; }
        se += (y[i] - x[i]) * (y[i] - x[i]);
        ++n;
      }
      EXPECT_NEAR(sl / nl, lo, 0.02) << "group " << g;
      EXPECT_NEAR(sh / nh, hi, 0.02) << "group " << g;
    }
  }
  // Per-group levels fitted to 32 samples do a little better than the population's 0.363.
  EXPECT_NEAR(se / n, 1.0 - 2.0 / M_PI, 0.05);
}

TEST(Int1Row, ConstantGroupAndNonFinite) {
  std::vector<float> x(128, -2.5f);
  std::vector<uint8_t> row(int1_row_bytes(128, 128));
  ASSERT_TRUE(quantize_row_int1_ref(x.data(), 128, 128, row.data()).ok());
  std::vector<float> y(128);
  dequantize_row_int1_ref(row.data(), 128, 128, y.data());
  for (float v : y) EXPECT_EQ(v, -2.5f);
  x[5] = -INFINITY;
  const Status st = quantize_row_int1_ref(x.data(), 128, 128, row.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("element 5 (group 0) is -Inf"), std::string::npos) << st.message();
}

// --- INT4 (quant/int4_layout.h) -------------------------------------------------------------

TEST(Int4Layout, SizesAndCodesByHalves) {
  EXPECT_EQ(int4_row_bytes(128, 128), 68);  // 4.25 bits per element
  EXPECT_EQ(int4_row_bytes(128, 64), 72);
  EXPECT_EQ(int4_row_bytes(64, 32), 40);
  EXPECT_EQ(bit_plan_row_bytes(4, 128, 128), 68);
  EXPECT_EQ(row_codec(RowFormat::kInt4).bits, 4);
  EXPECT_EQ(row_codec(RowFormat::kInt4).row_bytes(128, 128), 68);
  EXPECT_EQ(hist_row_format(HistQuantizer::kInt2Uniform, 0, 4), RowFormat::kInt4);
  std::mt19937 rng(4401);
  std::uniform_int_distribution<int> code(0, 15);
  for (int G : {32, 64, 128}) {
    std::vector<uint8_t> codes(G), bytes(G / 2, 0xA5);  // garbage first: set must mask
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    for (int i = 0; i < G; ++i) int4_set_code(bytes.data(), i, G, codes[i]);
    for (int j = 0; j < G / 2; ++j) {
      ASSERT_EQ(bytes[j] & 15, codes[j]) << "G " << G << " byte " << j;
      ASSERT_EQ(bytes[j] >> 4, codes[j + G / 2]) << "G " << G << " byte " << j;
    }
    for (int i = 0; i < G; ++i) ASSERT_EQ(int4_get_code(bytes.data(), i, G), codes[i]);
  }
}

// The 4-bit quantizer against a float64 reference of OSCAR.md §2 at 16 levels, on fresh seeded
// rows (Gaussian with outlier channels and an offset, like K): per group the ρ-quantile of |x|
// (numpy 'linear', float64), clipping, lo/hi, min = fp16(lo) exactly, s within one fp16 ulp of
// (hi − min)/15 (float vs float64 division before the fp16 rounding), every code equal to
// round((x_c − min)/s) in float64 except within 1e-4 of a tie, and |x̂ − x_c| <= s/2 plus the
// fp16 rounding of min and s at the ends of the range (<= 2^-11·(|lo| + 15 s) + 2^-24).
TEST(Int4Row, MatchesFloat64ReferenceOnFreshRows) {
  std::mt19937 rng(20261201);
  std::normal_distribution<double> normal(0.0, 1.0);
  int checked = 0, ties = 0;
  for (int G : {32, 64, 128}) {
    for (float rho : {1.0f, 0.96f, 0.92f, 0.8f}) {
      for (int r = 0; r < 50; ++r) {
        std::vector<float> x(128);
        for (int c = 0; c < 128; ++c)
          x[c] = static_cast<float>(((c % 37 == 5) ? 8.0 : 1.0) * normal(rng) + 0.3);
        std::vector<uint8_t> row(int4_row_bytes(128, G));
        ASSERT_TRUE(quantize_row_int4_ref(x.data(), 128, G, rho, row.data()).ok());
        std::vector<float> y(128);
        dequantize_row_int4_ref(row.data(), 128, G, y.data());
        for (int g = 0; g < 128 / G; ++g) {
          std::vector<double> a(G);
          for (int i = 0; i < G; ++i) a[i] = std::fabs(static_cast<double>(x[g * G + i]));
          std::sort(a.begin(), a.end());
          double thr = INFINITY;
          if (rho < 1.0f) {
            const double pos = static_cast<double>(rho) * (G - 1);
            const int k = static_cast<int>(std::floor(pos));
            thr = a[k] + (pos - k) * (a[std::min(k + 1, G - 1)] - a[k]);
          }
          std::vector<double> xc(G);
          double lo = INFINITY, hi = -INFINITY;
          for (int i = 0; i < G; ++i) {
            xc[i] = std::clamp(static_cast<double>(x[g * G + i]), -thr, thr);
            lo = std::min(lo, xc[i]);
            hi = std::max(hi, xc[i]);
          }
          Int2GroupMeta m;
          std::memcpy(&m, row.data() + int4_group_meta_offset(128, g), sizeof m);
          const double s = fp16_to_f32(m.slot0), mn = fp16_to_f32(m.slot1);
          // thr in float64 against the float quantile: a clipped end may differ by a float ulp.
          EXPECT_NEAR(mn, fp16_to_f32(f32_to_fp16(static_cast<float>(lo))),
                      std::fabs(lo) * 1e-3 + 1e-6);
          const double s_ref = (hi - mn) / 15.0;
          ASSERT_GT(s, 0.0);
          EXPECT_LE(std::fabs(s - s_ref), s_ref * std::ldexp(1.0, -10) + 1e-7)
              << "G " << G << " rho " << rho << " group " << g;
          for (int i = 0; i < G; ++i) {
            const double t = (xc[i] - mn) / s;
            const int q_ref = std::clamp(static_cast<int>(std::floor(t + 0.5)), 0, 15);
            const int q = int4_get_code(row.data() + int4_group_codes_offset(g, G), i, G);
            if (std::fabs(t - std::floor(t) - 0.5) < 1e-4) {
              EXPECT_LE(std::abs(q - q_ref), 1);
              ++ties;
            } else {
              EXPECT_EQ(q, q_ref) << "G " << G << " rho " << rho << " element " << g * G + i
                                  << " t " << t;
            }
            EXPECT_EQ(y[g * G + i],
                      static_cast<float>(mn) + static_cast<float>(q) * static_cast<float>(s));
            EXPECT_LE(std::fabs(y[g * G + i] - xc[i]),
                      0.5 * s + std::ldexp(1.0, -11) * (std::fabs(lo) + 15 * s) +
                          std::ldexp(1.0, -24) + 1e-6 * std::fabs(thr < INFINITY ? thr : hi))
                << "G " << G << " rho " << rho << " element " << g * G + i;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 4 * 50 * 128);
  EXPECT_LT(ties, checked / 100);
}

TEST(Int4Row, ConstantGroupIsExactAndBadInputIsRefused) {
  std::vector<float> x(128, -1.25f);
  std::vector<uint8_t> row(int4_row_bytes(128, 32), 0xCD);
  ASSERT_TRUE(quantize_row_int4_ref(x.data(), 128, 32, 0.92f, row.data()).ok());
  std::vector<float> y(128);
  dequantize_row_int4_ref(row.data(), 128, 32, y.data());
  for (float v : y) EXPECT_EQ(v, -1.25f);
  x[100] = INFINITY;
  const Status st = quantize_row_int4_ref(x.data(), 128, 32, 0.92f, row.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("element 100 (group 3) is +Inf"), std::string::npos) << st.message();
  for (uint8_t b : row) EXPECT_EQ(b, 0);
  x[100] = 1e9f;  // min/scale beyond fp16
  EXPECT_EQ(quantize_row_int4_ref(x.data(), 128, 32, 1.0f, row.data()).code(),
            StatusCode::kOutOfRange);
}

// 16 levels against 8: uniform min/max steps of range/15 against range/7, an MSE ratio near
// (7/15)² ≈ 0.22 on Gaussian rows without clipping.
TEST(Int4Row, AboutFiveTimesLessErrorThanInt3OnGaussians) {
  double e4 = 0, e3 = 0;
  std::vector<uint8_t> r4(int4_row_bytes(128, 128)), r3(int3_row_bytes(128, 128));
  std::vector<float> y(128);
  for (int t = 0; t < 200; ++t) {
    const std::vector<float> x = gaussian(128, 4400 + t);
    ASSERT_TRUE(quantize_row_int4_ref(x.data(), 128, 128, 1.0f, r4.data()).ok());
    dequantize_row_int4_ref(r4.data(), 128, 128, y.data());
    for (int i = 0; i < 128; ++i) e4 += (y[i] - x[i]) * (y[i] - x[i]);
    ASSERT_TRUE(quantize_row_int3_ref(x.data(), 128, 128, 1.0f, r3.data()).ok());
    dequantize_row_int3_ref(r3.data(), 128, 128, y.data());
    for (int i = 0; i < 128; ++i) e3 += (y[i] - x[i]) * (y[i] - x[i]);
  }
  EXPECT_GT(e4 / e3, 0.17);
  EXPECT_LT(e4 / e3, 0.27);
}

}  // namespace
}  // namespace oscar::quant
