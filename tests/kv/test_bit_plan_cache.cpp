// Bit plans (kv/bit_plan.h) in kv::SequenceCache: the plan's shape and errors, the page layout it
// gives, and a cache that stores each history plane at its own width.
//   - read_row() of a history row equals the reference quantizer of that plane's width applied to
//     the bf16-rounded row written, bit for bit (3-bit keys with the key clip, 1-bit values with no
//     clip, INT2 elsewhere);
//   - a balanced plan (as many 3-bit as 1-bit planes) costs exactly the uniform cache's bytes;
//   - a chunk attended in decode-equivalent mode (materialising path) gives what the same tokens
//     give one decode step at a time (packed-page kernel): both read the same quantized rows, so
//     they differ only by float summation order, tol 2e-5 on O(1) outputs;
//   - specs that cannot take a plan are refused with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kv/bit_plan.h"
#include "kv/sequence_cache.h"
#include "quant/bit_plan_quant.h"
#include "quant/int2_quant.h"
#include "quant/modes.h"

namespace oscar::kv {
namespace {

TEST(BitPlan, ShapeBytesAndErrors) {
  // 2 layers x 2 heads, d = G = 128: one K plane at 3 bits, one V plane at 1 bit.
  auto plan = BitPlan::create(2, 2, 128, 128, {2, 2, 2, 3}, {1, 2, 2, 2});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const BitPlan& p = *plan.value();
  EXPECT_EQ(p.bits(1, 0, 1), 3);
  EXPECT_EQ(p.bits(0, 1, 0), 1);
  EXPECT_EQ(p.bits(0, 0, 0), 2);
  EXPECT_EQ(p.token_bytes(), 8 * 36);  // 52 + 20 = 2 x 36
  EXPECT_DOUBLE_EQ(p.bits_per_element(), 2.25);
  EXPECT_EQ(p.describe(), "3-bit: K L1H1; 1-bit: V L0H0");
  // Planes in order (layer, kv, head): L0K0 L0K1 L0V0 L0V1 L1K0 L1K1 L1V0 L1V1.
  const std::vector<uint32_t> prefix(p.row_prefix(), p.row_prefix() + 9);
  EXPECT_EQ(prefix, (std::vector<uint32_t>{0, 36, 72, 92, 128, 164, 216, 252, 288}));

  EXPECT_FALSE(BitPlan::create(2, 2, 128, 128, {2, 2, 2}, {2, 2, 2, 2}).ok());
  const Status five = BitPlan::create(2, 2, 128, 128, {2, 2, 5, 2}, {2, 2, 2, 2}).status();
  EXPECT_NE(five.to_string().find("layer 1 K head 0 has 5 bits per element; expected 1, 2, 3 or 4"),
            std::string::npos)
      << five.to_string();
  EXPECT_FALSE(BitPlan::create(2, 2, 128, 128, {2, 2, 2, 2}, {0, 2, 2, 2}).ok());
  EXPECT_FALSE(BitPlan::create(2, 2, 128, 48, {2, 2, 2, 2}, {2, 2, 2, 2}).ok());
  auto uniform = BitPlan::create(1, 1, 64, 32, {2}, {2});
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform.value()->describe(), "uniform");
  // A 4-bit plane: 68 bytes (quant/int4_layout.h), listed first.
  auto wide = BitPlan::create(2, 2, 128, 128, {4, 2, 2, 2}, {2, 2, 1, 3});
  ASSERT_TRUE(wide.ok()) << wide.status().to_string();
  EXPECT_EQ(wide.value()->token_bytes(), 68 + 36 + 36 + 36 + 36 + 36 + 20 + 52);
  EXPECT_EQ(wide.value()->describe(), "4-bit: K L0H0; 3-bit: V L1H1; 1-bit: V L1H0");
  // One width everywhere: oscar4 / oscar3.
  for (int b : {4, 3}) {
    auto u = BitPlan::uniform(2, 2, 128, 128, b);
    ASSERT_TRUE(u.ok()) << u.status().to_string();
    EXPECT_DOUBLE_EQ(u.value()->bits_per_element(), b + 0.25);
    EXPECT_EQ(u.value()->describe(), b == 4 ? "uniform 4-bit" : "uniform 3-bit");
    EXPECT_DOUBLE_EQ(uniform_plan_bits(b, 128, 128), b + 0.25);
  }
  EXPECT_FALSE(BitPlan::uniform(2, 2, 128, 128, 5).ok());
}

// The noise model of plan_for_bits: per unit variance on Gaussian rows, decreasing in the width,
// 4 bits about (3/15)² of INT2's without clipping, and the 1-bit Lloyd row near 1 − 2/π.
TEST(PlanForBits, NoiseModelIsTheCodecsMeasuredError) {
  const double n1 = row_noise_per_unit_variance(1, 128, 128, 1.0f);
  const double n2 = row_noise_per_unit_variance(2, 128, 128, 1.0f);
  const double n3 = row_noise_per_unit_variance(3, 128, 128, 1.0f);
  const double n4 = row_noise_per_unit_variance(4, 128, 128, 1.0f);
  EXPECT_NEAR(n1, 1.0 - 2.0 / M_PI, 0.03);
  EXPECT_GT(n1, n2);
  EXPECT_GT(n2, n3);
  EXPECT_GT(n3, n4);
  EXPECT_NEAR(n4 / n2, 9.0 / 225.0, 0.01);
  EXPECT_EQ(row_noise_per_unit_variance(4, 128, 128, 0.96f),
            row_noise_per_unit_variance(4, 128, 128, 0.96f));  // deterministic
}

// Budgets: the ends are the uniform plans, any X between gives an average within one step
// (d/8 bytes over the token's planes) below X, more bits go where the statistics are larger,
// keys never go below 2 bits, and bad input is refused with the range.
TEST(PlanForBits, SpendsTheBudgetWhereTheStatisticsSay) {
  PlanStatistics s;
  // 2 layers x 2 heads: key error concentrated in L1H1, value energy smallest in L0H0.
  s.key_logit_error = {1.0, 1.0, 1.0, 20.0};
  s.value_energy = {0.01, 1.0, 1.0, 1.0};
  // The release's clips, as in the shipped file: with them INT2 is much better than 1 bit, so the
  // rule only moves a value plane to 1 bit where it is nearly free. (Without clips, 2-bit min/max
  // rows are so coarse that one 1-bit plus one 3-bit plane beat two 2-bit ones anywhere.)
  s.k_clip.assign(4, 0.96f);
  s.v_clip.assign(4, 0.92f);
  auto at = [&](double x) {
    auto p = plan_for_bits(2, 2, 128, 128, x, s);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return p.value();
  };
  EXPECT_EQ(at(4.25)->describe(), "uniform 4-bit");
  const double step = 16.0 * 8 / (8 * 128);  // one bit of one plane, in average bits
  for (double x : {2.25, 2.5, 2.8, 3.0, 3.25, 3.6, 4.0, 4.25}) {
    auto p = at(x);
    EXPECT_LE(p->bits_per_element(), x + 1e-12) << x;
    EXPECT_GT(p->bits_per_element(), x - step - 1e-12) << x;
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h) EXPECT_GE(p->bits(l, 0, h), 2) << x;
    // The heaviest key plane is never narrower than another key plane; the lightest value plane
    // never wider than another value plane.
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h) {
        EXPECT_GE(p->bits(1, 0, 1), p->bits(l, 0, h)) << x;
        EXPECT_LE(p->bits(0, 1, 0), p->bits(l, 1, h)) << x;
      }
  }
  // At 2.25 the rule trades like calib::choose_bit_plan's pairs: the 20x key gets 3 bits, paid by
  // the 100x lighter value at 1 bit.
  EXPECT_EQ(at(2.25)->describe(), "3-bit: K L1H1; 1-bit: V L0H0");
  for (double bad : {2.0, 4.5, 5.0, std::nan("")}) {
    const Status st = plan_for_bits(2, 2, 128, 128, bad, s).status();
    EXPECT_NE(st.message().find("expected 2.25..4.25"), std::string::npos) << st.to_string();
  }
  PlanStatistics short_stats = s;
  short_stats.value_energy.pop_back();
  EXPECT_FALSE(plan_for_bits(2, 2, 128, 128, 3.0, short_stats).ok());
  PlanStatistics negative = s;
  negative.key_logit_error[0] = -1;
  EXPECT_FALSE(plan_for_bits(2, 2, 128, 128, 3.0, negative).ok());
}

KvCacheSpec plan_spec(quant::CacheMode mode) {
  KvCacheSpec spec;
  spec.n_layers = 2;
  spec.n_heads_kv = 2;
  spec.head_dim = 128;
  spec.group_size = 128;
  spec.regions.n_sink = 16;
  spec.regions.n_recent = 32;
  spec.regions.page_size = 16;
  spec.mode = mode;
  spec.k_clip.assign(4, 0.96f);
  spec.v_clip.assign(4, 0.92f);
  return spec;
}

std::shared_ptr<const BitPlan> balanced_plan() {
  auto plan = BitPlan::create(2, 2, 128, 128, {2, 2, 2, 3}, {1, 2, 2, 2});
  EXPECT_TRUE(plan.ok());
  return plan.value();
}

void rows_are_the_plane_widths_quantizer(quant::CacheMode mode, bool balanced);

TEST(BitPlanCache, RowsAreThePlaneWidthsQuantizerAndBytesMatchUniform) {
  rows_are_the_plane_widths_quantizer(quant::CacheMode::kOscar, true);
}

// oscar4 / oscar3: every history row is the 4- / 3-bit reference quantizer's with the head's
// clip, and the history costs 68 / 52 bytes per row.
TEST(BitPlanCache, Oscar4AndOscar3RowsAndBytes) {
  rows_are_the_plane_widths_quantizer(quant::CacheMode::kOscar4, false);
  rows_are_the_plane_widths_quantizer(quant::CacheMode::kOscar3, false);
}

void rows_are_the_plane_widths_quantizer(quant::CacheMode mode, bool balanced) {
  KvCacheSpec spec = plan_spec(mode);
  KvCacheSpec uniform = plan_spec(quant::CacheMode::kOscar);
  const int fixed = quant::cache_mode_fixed_bits(mode);
  spec.bit_plan = balanced ? balanced_plan() : BitPlan::uniform(2, 2, 128, 128, fixed).value();
  ASSERT_TRUE(spec.validate().ok()) << spec.validate().to_string();
  const kernels::KvPageLayout L = spec.layout(), LU = uniform.layout();
  if (balanced)
    EXPECT_EQ(L.int2_page_bytes(), LU.int2_page_bytes());
  else
    EXPECT_EQ(L.int2_page_bytes(), LU.int2_page_bytes() / 36 * (fixed == 4 ? 68 : 52));
  PagePool exact("bf16", 64, L.exact_page_bytes()), hist("int2", 64, L.int2_page_bytes());
  PagePool exact_u("bf16", 64, LU.exact_page_bytes()), hist_u("int2", 64, LU.int2_page_bytes());
  SequenceCache cache(&spec, &exact, &hist), cache_u(&uniform, &exact_u, &hist_u);

  const int H = 2, d = 128, n = 200;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::vector<float>> k(2), v(2);
  ASSERT_TRUE(cache.reserve(n).ok());
  ASSERT_TRUE(cache_u.reserve(n).ok());
  for (int layer = 0; layer < 2; ++layer) {
    k[layer].resize(static_cast<size_t>(n) * H * d);
    v[layer].resize(k[layer].size());
    for (float& x : k[layer]) x = normal(rng) + 0.3f;
    for (float& x : v[layer]) x = normal(rng);
    cache.write(layer, k[layer].data(), v[layer].data(), n);
    cache_u.write(layer, k[layer].data(), v[layer].data(), n);
  }
  ASSERT_TRUE(cache.commit(n).ok());
  ASSERT_TRUE(cache_u.commit(n).ok());
  ASSERT_GT(cache.hist_end(), spec.regions.n_sink);
  if (balanced) {
    EXPECT_EQ(cache.bytes().history, cache_u.bytes().history);
    EXPECT_EQ(cache.bytes().total(), cache_u.bytes().total());
  } else {
    EXPECT_EQ(cache.bytes().history, cache_u.bytes().history / 36 * (fixed == 4 ? 68 : 52));
    EXPECT_EQ(cache.bytes().sink + cache.bytes().recent,
              cache_u.bytes().sink + cache_u.bytes().recent);
  }

  std::vector<float> x(d), got(d), want(d);
  std::vector<uint8_t> row(68);
  for (int layer = 0; layer < 2; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < H; ++h) {
        const int bits = spec.bit_plan->bits(layer, kv, h);
        const float clip = (kv == 0 ? spec.k_clip : spec.v_clip)[layer * H + h];
        for (int64_t t = spec.regions.n_sink; t < cache.hist_end(); ++t) {
          const float* src = (kv == 0 ? k : v)[layer].data() + (t * H + h) * d;
          for (int c = 0; c < d; ++c) x[c] = bf16_to_f32(f32_to_bf16(src[c]));
          if (bits == 4) {
            ASSERT_TRUE(quant::quantize_row_int4_ref(x.data(), d, 128, clip, row.data()).ok());
            quant::dequantize_row_int4_ref(row.data(), d, 128, want.data());
          } else if (bits == 3) {
            ASSERT_TRUE(quant::quantize_row_int3_ref(x.data(), d, 128, clip, row.data()).ok());
            quant::dequantize_row_int3_ref(row.data(), d, 128, want.data());
          } else if (bits == 1) {
            ASSERT_TRUE(quant::quantize_row_int1_ref(x.data(), d, 128, row.data()).ok());
            quant::dequantize_row_int1_ref(row.data(), d, 128, want.data());
          } else {
            ASSERT_TRUE(quant::quantize_row_int2_ref(x.data(), d, 128, clip, row.data()).ok());
            quant::dequantize_row_int2_ref(row.data(), d, 128, want.data());
          }
          cache.read_row(layer, kv, h, t, got.data());
          for (int c = 0; c < d; ++c)
            ASSERT_EQ(got[c], want[c])
                << quant::cache_mode_name(mode) << " layer " << layer << " kv " << kv << " head "
                << h << " bits " << bits << " token " << t << " dim " << c;
        }
      }
}

TEST(BitPlanCache, DecodeEquivalentChunkEqualsDecodeSteps) {
  KvCacheSpec spec = plan_spec(quant::CacheMode::kOscar);
  spec.bit_plan = balanced_plan();
  const kernels::KvPageLayout L = spec.layout();
  PagePool ea("a", 64, L.exact_page_bytes()), ha("ha", 64, L.int2_page_bytes());
  PagePool eb("b", 64, L.exact_page_bytes()), hb("hb", 64, L.int2_page_bytes());
  SequenceCache chunked(&spec, &ea, &ha), stepped(&spec, &eb, &hb);
  AttendScratch sa, sb;
  const int Hq = 4, H = 2, d = 128, n = 160;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::vector<float>> k(2), v(2), q(2), out(2);
  for (int layer = 0; layer < 2; ++layer) {
    k[layer].resize(static_cast<size_t>(n) * H * d);
    v[layer].resize(k[layer].size());
    q[layer].resize(static_cast<size_t>(n) * Hq * d);
    for (float& x : k[layer]) x = normal(rng);
    for (float& x : v[layer]) x = normal(rng);
    for (float& x : q[layer]) x = 1.5f * normal(rng);
    out[layer].resize(q[layer].size());
  }
  ASSERT_TRUE(chunked.reserve(n).ok());
  for (int layer = 0; layer < 2; ++layer) {
    chunked.write(layer, k[layer].data(), v[layer].data(), n);
    ASSERT_TRUE(chunked.attend(layer, q[layer].data(), Hq, n, out[layer].data(),
                               AttendMode::kDecodeEquivalent, sa).ok());
  }
  ASSERT_TRUE(chunked.commit(n).ok());
  std::vector<float> o(static_cast<size_t>(Hq) * d);
  for (int64_t t = 0; t < n; ++t) {
    ASSERT_TRUE(stepped.reserve(1).ok());
    for (int layer = 0; layer < 2; ++layer) {
      stepped.write(layer, k[layer].data() + t * H * d, v[layer].data() + t * H * d, 1);
      ASSERT_TRUE(stepped.attend(layer, q[layer].data() + t * Hq * d, Hq, 1, o.data(),
                                 AttendMode::kPrefill, sb).ok());
      for (int i = 0; i < Hq * d; ++i)
        ASSERT_NEAR(o[i], out[layer][t * Hq * d + i], 2e-5)
            << "token " << t << " layer " << layer << " i " << i << " hist_end "
            << stepped.hist_end();
    }
    ASSERT_TRUE(stepped.commit(1).ok());
  }
  EXPECT_GT(stepped.hist_end(), spec.regions.n_sink + 64);
}

TEST(BitPlanCache, SpecsThatCannotTakeAPlanAreRefused) {
  KvCacheSpec lloyd = plan_spec(quant::CacheMode::kOscarLloyd);
  lloyd.bit_plan = balanced_plan();
  EXPECT_NE(lloyd.validate().to_string().find("needs a uniform mode"), std::string::npos)
      << lloyd.validate().to_string();
  // oscar4 needs 4 bits in every plane; oscar3 3 bits, or a plan of about its bytes.
  KvCacheSpec three = plan_spec(quant::CacheMode::kOscar3);
  three.bit_plan = balanced_plan();  // 2.25 bits: below oscar3's bytes by a whole bit
  EXPECT_NE(three.validate().to_string().find("oscar3 needs a bit plan of 3 bits in every plane "
                                              "or a plan of 2.75-3.25"),
            std::string::npos)
      << three.validate().to_string();
  three.bit_plan = BitPlan::create(2, 2, 128, 128, {4, 4, 3, 3}, {3, 3, 2, 2}).value();  // 3.25
  EXPECT_TRUE(three.validate().ok()) << three.validate().to_string();
  KvCacheSpec four = plan_spec(quant::CacheMode::kOscar4);
  EXPECT_NE(four.validate().to_string().find("oscar4 needs a bit plan of 4 bits in every plane"),
            std::string::npos)
      << four.validate().to_string();
  four.bit_plan = balanced_plan();
  EXPECT_FALSE(four.validate().ok());
  four.bit_plan = BitPlan::uniform(2, 2, 128, 128, 4).value();
  EXPECT_TRUE(four.validate().ok()) << four.validate().to_string();
  EXPECT_NE(four.describe().find("mode=oscar4"), std::string::npos) << four.describe();
  EXPECT_NE(four.describe().find("bit_plan=uniform 4-bit"), std::string::npos) << four.describe();
  KvCacheSpec bf16 = plan_spec(quant::CacheMode::kBF16);
  bf16.bit_plan = balanced_plan();
  EXPECT_FALSE(bf16.validate().ok());
  KvCacheSpec other_group = plan_spec(quant::CacheMode::kOscar);
  other_group.group_size = 64;
  other_group.bit_plan = balanced_plan();
  EXPECT_NE(other_group.validate().to_string().find("bit plan for"), std::string::npos);
  KvCacheSpec ok = plan_spec(quant::CacheMode::kInt2Hadamard);
  ok.bit_plan = balanced_plan();
  EXPECT_TRUE(ok.validate().ok());
  EXPECT_NE(ok.describe().find("bit_plan=3-bit: K L1H1; 1-bit: V L0H0"), std::string::npos)
      << ok.describe();
}

}  // namespace
}  // namespace oscar::kv
