// engine::PrefillBudget: the cost model against its formula for a Qwen3-8B-shaped config, fit()
// as the cost's inverse (the largest n whose cost fits, within [floor, want]), and the budget:
// unlimited until both times are measured, when off and in steps without decode rows, then
// (factor - 1) x the decode step x the prefill rate, from the recorded steps.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/prefill_budget.h"

namespace oscar::engine {
namespace {

format::ModelConfig qwen3_8b_like() {
  format::ModelConfig c;
  c.vocab_size = 151936;
  c.hidden_size = 4096;
  c.intermediate_size = 12288;
  c.n_layers = 36;
  c.n_heads_q = 32;
  c.n_heads_kv = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  EXPECT_TRUE(c.validate().ok());
  return c;
}

TEST(PrefillBudget, CostIsLinearPlusCausalAttention) {
  const format::ModelConfig c = qwen3_8b_like();
  const PrefillBudget b(c, 2.5);
  const double token = 2.0 * static_cast<double>(c.n_active_params());
  const double pair = 4.0 * 128 * 32 * 36;
  EXPECT_DOUBLE_EQ(b.cost(1, 0), token + 0.5 * pair);
  EXPECT_DOUBLE_EQ(b.cost(512, 100000), 512 * token + 512 * (100000 + 256.0) * pair);
  EXPECT_EQ(b.cost(0, 5000), 0.0);
}

TEST(PrefillBudget, FitIsTheCostsInverse) {
  const PrefillBudget b(qwen3_8b_like(), 2.5);
  for (const int64_t depth : {0LL, 1000LL, 32768LL, 102400LL})
    for (const double flops : {1e12, 1e13, 7.5e13, 1e15}) {
      const int64_t n = b.fit(flops, depth, 8192, 16);
      ASSERT_GE(n, 16);
      ASSERT_LE(n, 8192);
      if (n > 16) {
        EXPECT_LE(b.cost(n, depth), flops) << depth << " " << flops;
      }
      if (n < 8192) {
        EXPECT_GT(b.cost(n + 1, depth), flops) << depth << " " << flops;
      }
    }
  EXPECT_EQ(b.fit(1.0, 102400, 8192, 16), 16);  // a page at least: the prompt advances
  EXPECT_EQ(b.fit(1.0, 102400, 5, 16), 5);      // never more than wanted
  EXPECT_EQ(b.fit(INFINITY, 102400, 8192, 16), 8192);
  EXPECT_EQ(b.fit(1e15, 0, 0, 16), 0);
}

TEST(PrefillBudget, BudgetFromMeasuredSteps) {
  PrefillBudget b(qwen3_8b_like(), 3.0);
  EXPECT_TRUE(std::isinf(b.budget(true)));  // nothing measured yet
  b.record(8, 0, 0.010);                    // decode steps: 10 ms
  EXPECT_TRUE(std::isinf(b.budget(true)));  // no prefill rate yet
  b.record(0, 4e14, 1.0);                   // a prefill step alone: 400 TFLOP/s
  EXPECT_NEAR(b.decode_step_seconds(), 0.010, 1e-12);
  EXPECT_NEAR(b.prefill_flops_per_second(), 4e14, 1);
  EXPECT_NEAR(b.budget(true), 2 * 0.010 * 4e14, 1);
  EXPECT_TRUE(std::isinf(b.budget(false)));  // no streams to protect
  // A mixed step: 8e12 flops in 30 ms, of which the decode rows take their 10 ms: 400 TFLOP/s.
  b.record(8, 8e12, 0.030);
  EXPECT_NEAR(b.prefill_flops_per_second(), 4e14, 1e3);
  // The averages follow: slower decode steps give the prefill more room.
  for (int i = 0; i < 50; ++i) b.record(8, 0, 0.020);
  EXPECT_NEAR(b.decode_step_seconds(), 0.020, 1e-6);
  EXPECT_NEAR(b.budget(true), 2 * 0.020 * 4e14, 1e9);

  PrefillBudget off(qwen3_8b_like(), 0);
  off.record(8, 0, 0.010);
  off.record(0, 4e14, 1.0);
  EXPECT_FALSE(off.enabled());
  EXPECT_TRUE(std::isinf(off.budget(true)));
}

}  // namespace
}  // namespace oscar::engine
