// kernels/logits.h: the penalties follow their formulas (repetition divides positive logits and
// multiplies negative ones, on prompt and output tokens; frequency and presence subtract on
// output tokens), the mask leaves only allowed tokens drawable (greedy and sampled), logprobs are
// the float64 log-softmax with the top alternatives in order, and Backend's default
// implementations (download, CPU reference, upload: what a device backend without kernels uses)
// give the CPU backend's results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/logits.h"
#include "kernels/sample.h"

namespace oscar::kernels {
namespace {

std::vector<float> random_logits(int rows, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> l(static_cast<size_t>(rows) * vocab);
  for (float& x : l) x = d(rng);
  return l;
}

TEST(ProcessLogits, PenaltiesFollowTheirFormulas) {
  const int V = 8;
  std::vector<float> l = {2.f, -2.f, 1.f, -1.f, 0.5f, 3.f, -3.f, 0.f};
  const std::vector<float> orig = l;
  // Token 0: prompt only; 1: prompt and output twice; 2: output once; 3: untouched.
  const int32_t ids[] = {0, 1, 2};
  const int32_t counts[] = {0, 2, 1};
  LogitsRowEdit e;
  e.row = 0;
  e.repetition_penalty = 2.f;
  e.presence_penalty = 0.5f;
  e.frequency_penalty = 0.25f;
  e.token_ids = ids;
  e.output_counts = counts;
  e.n_tokens = 3;
  LogitsProcessParams p{l.data(), 1, V, &e, 1};
  ASSERT_TRUE(process_logits_ref(p).ok());
  EXPECT_FLOAT_EQ(l[0], 2.f / 2.f);                      // repetition only (prompt)
  EXPECT_FLOAT_EQ(l[1], -2.f * 2.f - 0.25f * 2 - 0.5f);  // negative: multiplied
  EXPECT_FLOAT_EQ(l[2], 1.f / 2.f - 0.25f * 1 - 0.5f);
  for (int t = 3; t < V; ++t) EXPECT_EQ(l[t], orig[t]) << t;
}

TEST(ProcessLogits, RefusesBadInput) {
  std::vector<float> l(4, 0.f);
  LogitsRowEdit e;
  e.repetition_penalty = 0.f;
  LogitsProcessParams p{l.data(), 1, 4, &e, 1};
  EXPECT_FALSE(process_logits_ref(p).ok());
  e.repetition_penalty = 1.f;
  const int32_t bad[] = {4};
  const int32_t c[] = {1};
  e.token_ids = bad;
  e.output_counts = c;
  e.n_tokens = 1;
  EXPECT_FALSE(process_logits_ref(p).ok());
  e.n_tokens = 0;
  e.row = 1;
  EXPECT_FALSE(process_logits_ref(p).ok());
}

TEST(ProcessLogits, MaskLeavesOnlyAllowedTokens) {
  const int V = 1000;
  for (float temperature : {0.f, 0.7f, 2.f}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      std::vector<float> l = random_logits(1, V, seed);
      std::vector<uint8_t> allowed(V, 0);
      allowed[seed * 37 % V] = 1;
      allowed[(seed * 91 + 5) % V] = 1;
      LogitsRowEdit e;
      e.allowed = allowed.data();
      LogitsProcessParams p{l.data(), 1, V, &e, 1};
      ASSERT_TRUE(process_logits_ref(p).ok());
      SamplingConfig c{temperature, 0, 1.f, seed};
      const int32_t id = sample_one(l.data(), V, c, seed);
      ASSERT_GE(id, 0);
      EXPECT_TRUE(allowed[id]) << "drew masked token " << id << " at T=" << temperature;
      SamplingConfig top{temperature, 5, 0.9f, seed};
      EXPECT_TRUE(allowed[sample_one(l.data(), V, top, seed)]);
    }
  }
}

TEST(Logprobs, LogSoftmaxAndTopInOrder) {
  const int rows = 3, V = 500, K = 20;
  std::vector<float> l = random_logits(rows, V, 7);
  l[1 * V + 10] = l[1 * V + 11] = 50.f;  // a tie: the lower id first
  const int32_t want_rows[] = {2, 1};
  const int32_t tokens[] = {3, 11};
  std::vector<float> lp(2), top_lp(2 * K);
  std::vector<int32_t> top_ids(2 * K);
  LogprobsParams p;
  p.logits = l.data();
  p.n_rows = rows;
  p.vocab = V;
  p.n = 2;
  p.rows = want_rows;
  p.tokens = tokens;
  p.top_k = K;
  p.token_logprob = lp.data();
  p.top_ids = top_ids.data();
  p.top_logprobs = top_lp.data();
  ASSERT_TRUE(logprobs_ref(p).ok());
  for (int i = 0; i < 2; ++i) {
    const float* row = l.data() + static_cast<size_t>(want_rows[i]) * V;
    double sum = 0;
    for (int t = 0; t < V; ++t) sum += std::exp(static_cast<double>(row[t]));
    EXPECT_NEAR(lp[i], row[tokens[i]] - std::log(sum), 1e-4);
    for (int k = 0; k < K; ++k) {
      EXPECT_NEAR(top_lp[i * K + k], row[top_ids[i * K + k]] - std::log(sum), 1e-4);
      if (k > 0) {
        EXPECT_GE(top_lp[i * K + k - 1], top_lp[i * K + k]);
      }
    }
    double mass = 0;
    for (int k = 0; k < K; ++k) mass += std::exp(top_lp[i * K + k]);
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  EXPECT_EQ(top_ids[K + 0], 10);
  EXPECT_EQ(top_ids[K + 1], 11);
  p.top_k = K + 1;
  EXPECT_FALSE(logprobs_ref(p).ok());
}

// A backend that overrides none of the optional ops: its memory is host memory, reached only
// through upload/download, so the defaults of Backend run as on a device.
class StagingBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  Result<DeviceBuffer> alloc(size_t bytes, const char* what) override {
    return cpu_backend().alloc(bytes, what);
  }
  Status upload(const void* host, size_t bytes, void* dst) override {
    ++uploads;
    std::memcpy(dst, host, bytes);
    return Status();
  }
  Status download(const void* src, size_t bytes, void* host) override {
    ++downloads;
    std::memcpy(host, src, bytes);
    return Status();
  }
  Status synchronize() override { return Status(); }
  Status embed(const WeightView&, const int32_t*, int64_t, float*) override { return no(); }
  Status rms_norm(const float*, int64_t, int64_t, const float*, float, float*) override {
    return no();
  }
  Status linear(const LinearParams&) override { return no(); }
  Status rope(const RopeParams&) override { return no(); }
  Status kv_append(const KvAppendParams&) override { return no(); }
  Status rotate_queries(const RotateQueriesParams&) override { return no(); }
  Status decode_attn(const DecodeAttnParams&) override { return no(); }
  Status prefill_attn(const PrefillAttnParams&) override { return no(); }
  Status silu_mul(float*, const float*, int64_t) override { return no(); }
  Status add(float*, const float*, int64_t) override { return no(); }
  Status gather_rows(const float*, const int32_t*, int64_t, int64_t, float*) override {
    return no();
  }
  Status demote_pages(const DemotePagesParams&) override { return no(); }
  Status sample(const SampleParams&) override { return no(); }
  Status fill_normal_bf16(bf16_t*, int64_t, float, uint64_t) override { return no(); }
  int uploads = 0, downloads = 0;

 private:
  static Status no() { return unimplemented("not in this test"); }
};

TEST(Logprobs, BackendDefaultsEqualTheCpuBackend) {
  const int rows = 4, V = 300, K = 5;
  std::vector<float> a = random_logits(rows, V, 3), b = a;
  const int32_t ids[] = {1, 7, 9};
  const int32_t counts[] = {0, 3, 1};
  std::vector<uint8_t> allowed(V, 1);
  allowed[5] = allowed[6] = 0;
  LogitsRowEdit edits[2];
  edits[0].row = 3;
  edits[0].repetition_penalty = 1.3f;
  edits[0].frequency_penalty = -0.5f;
  edits[0].token_ids = ids;
  edits[0].output_counts = counts;
  edits[0].n_tokens = 3;
  edits[1].row = 1;
  edits[1].allowed = allowed.data();
  StagingBackend staging;
  ASSERT_TRUE(cpu_backend().process_logits({a.data(), rows, V, edits, 2}).ok());
  ASSERT_TRUE(staging.process_logits({b.data(), rows, V, edits, 2}).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(staging.downloads, 2);  // one row per edit
  EXPECT_EQ(staging.uploads, 2);

  const int32_t want_rows[] = {3, 0};
  const int32_t tokens[] = {7, 2};
  std::vector<float> lp_a(2), lp_b(2), tl_a(2 * K), tl_b(2 * K);
  std::vector<int32_t> ti_a(2 * K), ti_b(2 * K);
  LogprobsParams p;
  p.logits = a.data();
  p.n_rows = rows;
  p.vocab = V;
  p.n = 2;
  p.rows = want_rows;
  p.tokens = tokens;
  p.top_k = K;
  p.token_logprob = lp_a.data();
  p.top_ids = ti_a.data();
  p.top_logprobs = tl_a.data();
  ASSERT_TRUE(cpu_backend().logprobs(p).ok());
  p.token_logprob = lp_b.data();
  p.top_ids = ti_b.data();
  p.top_logprobs = tl_b.data();
  ASSERT_TRUE(staging.logprobs(p).ok());
  EXPECT_EQ(lp_a, lp_b);
  EXPECT_EQ(ti_a, ti_b);
  EXPECT_EQ(tl_a, tl_b);

  std::vector<float> c(V, 0.f);
  ASSERT_TRUE(staging.copy(a.data(), V * sizeof(float), c.data()).ok());
  EXPECT_TRUE(std::equal(c.begin(), c.end(), a.begin()));
}

}  // namespace
}  // namespace oscar::kernels
