// Tests of the KIVI-style baseline (quant/kivi.h) and the cache-mode names (quant/modes.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/int2_quant.h"
#include "quant/kivi.h"
#include "quant/modes.h"

namespace oscar::quant {
namespace {

constexpr int kHeadDim = 128;
constexpr int kT = kKiviKeyBlockTokens;

std::vector<float> make_keys(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> k(kT * kHeadDim);
  for (int t = 0; t < kT; ++t)
    for (int c = 0; c < kHeadDim; ++c)
      k[t * kHeadDim + c] = normal(rng) * (c % 16 == 3 ? 10.0f : 1.0f) + 0.1f * c;
  return k;
}

TEST(Kivi, ByteCostIsThreeBitsPerElement) {
  EXPECT_EQ(kivi_key_block_bytes(kHeadDim) * 8, 3 * kT * kHeadDim);
  EXPECT_EQ(kivi_value_row_bytes(kHeadDim) * 8, 3 * kHeadDim);
}

// Each channel of a key block is quantized exactly like a uniform INT2 group of its 32 tokens.
TEST(Kivi, KeyBlockIsPerChannelInt2OverTokens) {
  const std::vector<float> k = make_keys(17);
  std::vector<uint8_t> block(kivi_key_block_bytes(kHeadDim));
  ASSERT_TRUE(quantize_kivi_key_block_ref(k.data(), kHeadDim, block.data()).ok());
  std::vector<float> khat(kT * kHeadDim);
  dequantize_kivi_key_block_ref(block.data(), kHeadDim, khat.data());
  for (int c = 0; c < kHeadDim; ++c) {
    float col[kT], col_hat[kT];
    uint8_t row[int2_row_bytes(kT, kT)];
    for (int t = 0; t < kT; ++t) col[t] = k[t * kHeadDim + c];
    ASSERT_TRUE(quantize_row_int2_ref(col, kT, kT, 1.0f, row).ok());
    ASSERT_EQ(std::memcmp(row, block.data() + 8 * c, 8), 0) << "codes of channel " << c;
    ASSERT_EQ(std::memcmp(row + 8, block.data() + 8 * kHeadDim + 4 * c, 4), 0) << "meta " << c;
    dequantize_row_int2_ref(row, kT, kT, col_hat);
    const float scale = fp16_to_f32(read_group_meta(row, kT, 0).slot0);
    for (int t = 0; t < kT; ++t) {
      ASSERT_EQ(khat[t * kHeadDim + c], col_hat[t]);
      // s/2 plus fp16 rounding of min and scale (see test_int2_quant.cpp for the derivation)
      ASSERT_LE(std::fabs(khat[t * kHeadDim + c] - col[t]),
                scale / 2 + 1e-3 * (std::fabs(col[t]) + 3 * scale) + 1e-6);
    }
  }
}

TEST(Kivi, ConstantChannelAndNonFinite) {
  std::vector<float> k = make_keys(18);
  for (int t = 0; t < kT; ++t) k[t * kHeadDim + 9] = -0.75f;
  std::vector<uint8_t> block(kivi_key_block_bytes(kHeadDim));
  std::vector<float> khat(kT * kHeadDim);
  ASSERT_TRUE(quantize_kivi_key_block_ref(k.data(), kHeadDim, block.data()).ok());
  dequantize_kivi_key_block_ref(block.data(), kHeadDim, khat.data());
  for (int t = 0; t < kT; ++t) ASSERT_EQ(khat[t * kHeadDim + 9], -0.75f);
  k[5 * kHeadDim + 40] = std::numeric_limits<float>::quiet_NaN();
  Status st = quantize_kivi_key_block_ref(k.data(), kHeadDim, block.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("channel 40"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("element 5"), std::string::npos) << st.message();
}

TEST(Kivi, ValueRowIsInt2GroupOf32) {
  const std::vector<float> v = make_keys(19);
  std::vector<uint8_t> a(kivi_value_row_bytes(kHeadDim)), b(int2_row_bytes(kHeadDim, 32));
  ASSERT_TRUE(quantize_kivi_value_row_ref(v.data(), kHeadDim, a.data()).ok());
  ASSERT_TRUE(quantize_row_int2_ref(v.data(), kHeadDim, 32, 1.0f, b.data()).ok());
  EXPECT_EQ(a, b);
  std::vector<float> out(kHeadDim);
  dequantize_kivi_value_row_ref(a.data(), kHeadDim, out.data());
  for (int i = 0; i < kHeadDim; ++i) EXPECT_NEAR(out[i], v[i], 4.0);  // loose sanity
}

TEST(CacheModes, NamesRoundTrip) {
  const char* names[] = {"bf16", "f32", "int2-naive", "int2-hadamard", "kivi2", "oscar",
                         "oscar-lloyd"};
  for (const char* name : names) {
    Result<CacheMode> m = parse_cache_mode(name);
    ASSERT_TRUE(m.ok()) << name;
    EXPECT_STREQ(cache_mode_name(*m), name);
  }
  EXPECT_FALSE(cache_mode_is_quantized(CacheMode::kBF16));
  EXPECT_FALSE(cache_mode_is_quantized(CacheMode::kF32));
  EXPECT_TRUE(cache_mode_is_quantized(CacheMode::kOscarLloyd));
  Result<CacheMode> bad = parse_cache_mode("BF16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'BF16'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("oscar-lloyd"), std::string::npos);
  EXPECT_FALSE(parse_cache_mode("").ok());
}

}  // namespace
}  // namespace oscar::quant
