#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/bf16.h"

namespace oscar {
namespace {

TEST(Fp16, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = fp16_to_f32(static_cast<fp16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_fp16(f), h) << "half bits " << h << " value " << f;
  }
}

TEST(Fp16, RoundsToNearestEvenAndSaturatesToInf) {
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(1.0f + 1.0f / 4096)), 1.0f);  // below half ulp
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_f32(f32_to_fp16(1e6f))));
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(1e-9f)), 0.0f);
}

TEST(Bf16, RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<bf16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h);
  }
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace oscar
