// sample (kernels/sample.h): the selecting fast path gives exactly the ids of the full-sort
// reference for the same (seed, step), over random logits and every filter combination; greedy
// is the argmax with the lowest id on ties; non-finite rows are flagged; draws follow the
// softmax (frequencies within 5 standard deviations); a batch equals its rows one by one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/sample.h"

namespace oscar::kernels {
namespace {

std::vector<int32_t> run(bool fast, const std::vector<float>& logits, int32_t vocab,
                         const std::vector<SamplingConfig>& cfg, const std::vector<uint64_t>& step) {
  std::vector<int32_t> ids(cfg.size(), -2);
  SampleParams p;
  p.logits = logits.data();
  p.n_rows = static_cast<int32_t>(cfg.size());
  p.vocab = vocab;
  p.config = cfg.data();
  p.step = step.data();
  p.ids = ids.data();
  const Status st = fast ? sample(p) : sample_ref(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return ids;
}

TEST(Sample, FastEqualsReferenceBatch) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 3.f);
  const int32_t V = 5000;
  std::vector<SamplingConfig> cfg;
  std::vector<uint64_t> step;
  for (float t : {0.f, 0.3f, 1.f, 2.f})
    for (int k : {0, 1, 5, 100})
      for (float tp : {1.f, 0.9f, 0.5f, 0.01f})
        for (uint64_t st = 0; st < 3; ++st) {
          cfg.push_back({t, k, tp, 1234 + st});
          step.push_back(st * 7);
        }
  std::vector<float> logits(cfg.size() * V);
  for (float& x : logits) x = normal(rng);
  logits[V + 17] = logits[V + 18] = 100.f;  // a tie: greedy takes the lower id
  const auto a = run(true, logits, V, cfg, step), b = run(false, logits, V, cfg, step);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a[1], cfg[1].temperature == 0.f ? 17 : a[1]);
  for (size_t r = 0; r < cfg.size(); ++r) {
    // One row alone gives what it gave in the batch.
    std::vector<float> one(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    EXPECT_EQ(run(true, one, V, {cfg[r]}, {step[r]})[0], a[r]) << "row " << r;
  }
}

TEST(Sample, GreedyTopK1AndNonFinite) {
  std::vector<float> l = {0.f, 2.f, 2.f, -1.f, 1.f, std::numeric_limits<float>::quiet_NaN()};
  const int32_t V = 3;  // rows of 3: [0 2 2] [-1 1 NaN]
  EXPECT_EQ(run(true, l, V, {{0.f, 0, 1.f, 0}, {0.f, 0, 1.f, 0}}, {0, 0}),
            (std::vector<int32_t>{1, kSampleNonFinite}));
  EXPECT_EQ(run(true, l, V, {{1.f, 1, 1.f, 9}, {1.f, 1, 1.f, 9}}, {0, 0}),
            (std::vector<int32_t>{1, kSampleNonFinite}));
}

TEST(Sample, DrawsFollowTheSoftmax) {
  const std::vector<float> l = {0.f, 1.f, 2.f, -1.f};
  double z = 0;
  for (float x : l) z += std::exp(x);
  for (SamplingConfig c : {SamplingConfig{1.f, 0, 1.f, 42}, SamplingConfig{1.f, 4, 1.f, 42}}) {
    const int n = 20000;
    std::vector<int> count(4, 0);
    for (int s = 0; s < n; ++s) count[run(true, l, 4, {c}, {static_cast<uint64_t>(s)})[0]] += 1;
    for (int t = 0; t < 4; ++t) {
      const double pt = std::exp(l[t]) / z, sd = std::sqrt(n * pt * (1 - pt));
      EXPECT_NEAR(count[t], n * pt, 5 * sd) << "token " << t << " top_k " << c.top_k;
    }
  }
}

TEST(Sample, TopPKeepsTheNucleus) {
  // p ∝ e^{3, 2, 0, -5}: 0.705, 0.259, 0.035, 0.0002. top_p 0.9 keeps tokens 0 and 1 only.
  const std::vector<float> l = {3.f, 2.f, 0.f, -5.f};
  for (int s = 0; s < 2000; ++s) {
    const int32_t id = run(true, l, 4, {{1.f, 0, 0.9f, 5}}, {static_cast<uint64_t>(s)})[0];
    ASSERT_TRUE(id == 0 || id == 1) << id;
  }
}

TEST(Sample, RefusesBadConfigs) {
  std::vector<float> l = {0.f};
  SampleParams p;
  SamplingConfig c{-1.f, 0, 1.f, 0};
  uint64_t st = 0;
  int32_t id;
  p.logits = l.data();
  p.n_rows = 1;
  p.vocab = 1;
  p.config = &c;
  p.step = &st;
  p.ids = &id;
  EXPECT_NE(sample(p).to_string().find("temperature"), std::string::npos);
  c = {1.f, 0, 0.f, 0};
  EXPECT_NE(sample(p).to_string().find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace oscar::kernels
