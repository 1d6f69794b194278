// The engine-wide part of a step plan (kv/step_plan.h, kv/kv_op_params.h): the KV ops' layout,
// transforms, scale and pool bases, made once per plan, are the ones every cache of the plan would
// give (SequenceCache::*_params); the prefill params follow the attend mode; the hybrids' state
// pool and each sequence's slot are carried in plan order (-1 for a cache without a slot).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kv/state_pool.h"
#include "kv/step_plan.h"

namespace oscar::kv {
namespace {

KvCacheSpec spec() {
  KvCacheSpec s;
  s.n_layers = 2;
  s.n_heads_kv = 2;
  s.head_dim = 64;
  s.group_size = 64;
  s.mode = quant::CacheMode::kInt2Naive;
  s.regions.page_size = 16;
  s.regions.n_sink = 16;
  s.regions.n_recent = 32;
  return s;
}

TEST(StepPlanEngine, OpParamsAreEveryCachesParams) {
  const KvCacheSpec sp = spec();
  ASSERT_TRUE(sp.validate().ok());
  const auto L = sp.layout();
  PagePool exact("bf16", 64, L.exact_page_bytes()), hist("int2", 64, L.int2_page_bytes());
  SequenceCache a(&sp, &exact, &hist), b(&sp, &exact, &hist);
  const std::vector<int32_t> prompt = {1, 2, 3}, tok = {4};
  ASSERT_TRUE(a.reserve(3).ok());
  ASSERT_TRUE(b.reserve(1).ok());
  const std::vector<StepChunk> chunks = {{&a, prompt, false}, {&b, tok, false}};
  for (AttendMode mode : {AttendMode::kPrefill, AttendMode::kDecodeEquivalent}) {
    const StepPlan p = StepPlan::make(chunks, mode);
    for (const SequenceCache* c : {&a, &b}) {
      const kernels::DecodeAttnParams d = c->decode_params(0, 4);
      EXPECT_EQ(p.ops.decode.exact_pool, d.exact_pool);
      EXPECT_EQ(p.ops.decode.hist_pool, d.hist_pool);
      EXPECT_EQ(p.ops.decode.scale, d.scale);
      EXPECT_EQ(p.ops.decode.group_size, d.group_size);
      EXPECT_EQ(p.ops.decode.quantizer, d.quantizer);
      EXPECT_EQ(p.ops.decode.layout.n_layers, d.layout.n_layers);
      const kernels::PrefillAttnParams f = c->prefill_params(0, 4, mode);
      EXPECT_EQ(p.ops.prefill.decode_equivalent, mode == AttendMode::kDecodeEquivalent);
      EXPECT_EQ(p.ops.prefill.decode_equivalent, f.decode_equivalent);
      EXPECT_EQ(p.ops.prefill.n_sink, f.n_sink);
      EXPECT_EQ(p.ops.prefill.n_recent, f.n_recent);
      EXPECT_EQ(p.ops.prefill.quantized, f.quantized);
      EXPECT_EQ(p.ops.prefill.hist_pool, f.hist_pool);
      const kernels::KvAppendParams ap = c->append_params(0);
      EXPECT_EQ(p.ops.append.exact_pool, ap.exact_pool);
      EXPECT_EQ(p.ops.append.k_rotation, ap.k_rotation);
      EXPECT_EQ(p.ops.append.k_mean, ap.k_mean);
      const kernels::DemotePagesParams dm = c->demote_params();
      EXPECT_EQ(p.ops.demote.exact_pool, dm.exact_pool);
      EXPECT_EQ(p.ops.demote.hist_pool, dm.hist_pool);
    }
    EXPECT_EQ(p.ops.decode.scale, 1.0f / std::sqrt(64.0f));
    EXPECT_EQ(p.ops.rotate_queries.q_rotation, sp.op_query_rotations());
    EXPECT_EQ(p.state_pool, nullptr);
    EXPECT_EQ(p.state_slots, (std::vector<int32_t>{-1, -1}));
  }
  a.unreserve();
  b.unreserve();
}

TEST(StepPlanEngine, CarriesTheStateSlotsInPlanOrder) {
  KvCacheSpec sp = spec();
  sp.mode = quant::CacheMode::kBF16;
  ASSERT_TRUE(sp.validate().ok());
  PagePool exact("bf16", 64, sp.layout().exact_page_bytes());
  StatePool states(3, 4, 8);
  SequenceCache a(&sp, &exact, nullptr, &states), b(&sp, &exact, nullptr, &states);
  const std::vector<int32_t> prompt = {1, 2, 3}, tok = {4};
  ASSERT_TRUE(a.reserve(3).ok());  // slot 0
  ASSERT_TRUE(b.reserve(1).ok());  // slot 1
  const std::vector<StepChunk> chunks = {{&a, prompt, false}, {&b, tok, false}};
  const StepPlan p = StepPlan::make(chunks, AttendMode::kPrefill);
  EXPECT_EQ(p.state_pool, &states);
  ASSERT_EQ(p.chunk, (std::vector<int32_t>{1, 0}));  // b decodes: first
  EXPECT_EQ(p.state_slots, (std::vector<int32_t>{b.state_slot(), a.state_slot()}));
  EXPECT_NE(a.state_slot(), b.state_slot());
  EXPECT_EQ(p.ops.decode.hist_pool, nullptr);  // no history region in bf16
  a.unreserve();
  b.unreserve();
}

}  // namespace
}  // namespace oscar::kv
