// MoE ops (kernels/moe.h): the fast CPU router and grouped expert FFN against the float64
// references, hand-checked routing (ties, NaN, renormalisation), the rows of a batch against the
// same rows alone, and the refusals.
//
// Tolerances.
// - Routing: expert ids bit-equal (both paths select on the logits). Weights: the float32 softmax
//   carries at most ~(n_experts + top_k + 4) roundings of relative size u = 2^-24 (the sum of the
//   exponentials, one exp each, the divisions); we allow 2 · (n_experts + top_k + 4) · u relative.
// - Expert FFN: float32 products of length hidden (gate, up) and moe_inter (down), the SiLU·mul,
//   and the weighted sum of top_k slots. With G_i = Σ_c |x_c Wg_ic|, U_i likewise, g_i, u_i the
//   exact gate and up, a_i = silu(g_i) u_i and A_i = 1.1 G_i |u_i| + |silu(g_i)| U_i + |a_i|
//   (|silu'|
//   <= 1.1 bounds how the gate error moves a_i), every output element is off by at most
//   (hidden + moe_inter + top_k + 8) · u · Σ_j |w_j| Σ_i |Wd_hi| A_i to first order; the test
//   allows twice that.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/moe.h"

namespace oscar::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

#define EXPECT_MSG_HAS(status, text) \
  EXPECT_NE((status).message().find(text), std::string::npos) << (status).to_string()

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(bool ref, const std::vector<float>& logits, int64_t n, int32_t E, int32_t K,
             bool norm) {
  Routed r;
  r.ids.assign(static_cast<size_t>(n * K), -1);
  r.weights.assign(static_cast<size_t>(n * K), -1.f);
  MoeRouteParams p;
  p.logits = logits.data();
  p.n = n;
  p.n_experts = E;
  p.top_k = K;
  p.norm_topk_prob = norm;
  p.expert_ids = r.ids.data();
  p.weights = r.weights.data();
  const Status st = ref ? moe_route_ref(p) : moe_route(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return r;
}

TEST(MoeRoute, HandChecked) {
  // Logits 1, 3, 3, 2: top-2 are experts 1 and 2 (equal: the lower index first).
  const std::vector<float> l = {1.f, 3.f, 3.f, 2.f};
  for (bool ref : {true, false}) {
    Routed r = route(ref, l, 1, 4, 2, /*norm=*/true);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
    EXPECT_NEAR(r.weights[0], 0.5, 1e-7);
    EXPECT_NEAR(r.weights[1], 0.5, 1e-7);
    Routed u = route(ref, l, 1, 4, 3, /*norm=*/false);
    EXPECT_EQ(u.ids, (std::vector<int32_t>{1, 2, 3}));
    const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
    EXPECT_NEAR(u.weights[0], std::exp(3.0) / z, 1e-7);
    EXPECT_NEAR(u.weights[2], std::exp(2.0) / z, 1e-7);
    // All equal: experts 0..k-1. One NaN logit ranks last; the row's weights are NaN.
    Routed eq = route(ref, std::vector<float>(6, 0.25f), 1, 6, 3, true);
    EXPECT_EQ(eq.ids, (std::vector<int32_t>{0, 1, 2}));
    Routed nan = route(ref, {NAN, -5.f, 7.f}, 1, 3, 2, true);
    EXPECT_EQ(nan.ids, (std::vector<int32_t>{2, 1}));
    EXPECT_TRUE(std::isnan(nan.weights[0]));
    // top_k == n_experts with renormalisation: the full softmax.
    Routed all = route(ref, {0.f, 0.f}, 1, 2, 2, true);
    EXPECT_EQ(all.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_NEAR(all.weights[0], 0.5, 1e-7);
  }
}

TEST(MoeRoute, FastMatchesReference) {
  std::mt19937 rng(7);
  for (auto [E, K] : {std::pair<int32_t, int32_t>{8, 2}, {128, 8}, {4, 1}, {5, 5}, {64, 6}})
    for (int64_t n : {1, 3, 70})
      for (bool norm : {false, true}) {
        std::normal_distribution<float> normal(0.f, 3.f);
        std::vector<float> l(static_cast<size_t>(n * E));
        for (float& v : l) v = normal(rng);
        // Plant exact ties in some rows: they must resolve to the lower index in both paths.
        for (int64_t t = 0; t < n; t += 2) l[t * E + E - 1] = l[t * E];
        Routed a = route(true, l, n, E, K, norm), b = route(false, l, n, E, K, norm);
        ASSERT_EQ(a.ids, b.ids) << "E " << E << " K " << K << " n " << n;
        const double tol = 2.0 * (E + K + 4) * kU;
        for (size_t i = 0; i < a.weights.size(); ++i)
          ASSERT_LE(std::fabs(double(b.weights[i]) - a.weights[i]), tol * std::fabs(a.weights[i]))
              << "E " << E << " K " << K << " n " << n << " slot " << i;
        // Descending logits per row, ties by index.
        for (int64_t t = 0; t < n; ++t)
          for (int32_t j = 1; j < K; ++j) {
            const float prev = l[t * E + a.ids[t * K + j - 1]], cur = l[t * E + a.ids[t * K + j]];
            ASSERT_TRUE(prev > cur || (prev == cur && a.ids[t * K + j - 1] < a.ids[t * K + j]));
          }
      }
}

// A layer's experts and routing, random and seeded.
struct Case {
  int64_t n, hidden, inter;
  int32_t E, K;
  DType dtype;
  std::vector<float> x, weights;
  std::vector<int32_t> ids;
  std::vector<float> wf[3];  // gate, up, down as float (BF16-representable when kBF16)
  std::vector<bf16_t> wb[3];
  ExpertWeights view(int m) const {
    ExpertWeights w;
    w.data = dtype == DType::kBF16 ? static_cast<const void*>(wb[m].data()) : wf[m].data();
    w.dtype = dtype;
    w.n_experts = E;
    w.rows = m == 2 ? hidden : inter;
    w.cols = m == 2 ? inter : hidden;
    return w;
  }
  MoeFfnParams params(float* y) const {
    MoeFfnParams p;
    p.x = x.data();
    p.n = n;
    p.top_k = K;
    p.expert_ids = ids.data();
    p.weights = weights.data();
    p.gate = view(0);
    p.up = view(1);
    p.down = view(2);
    p.y = y;
    return p;
  }
};

// skew: every row's first slot goes to expert 0 (a group of n rows: the many-rows path).
Case make_case(int64_t n, int64_t hidden, int64_t inter, int32_t E, int32_t K, DType dtype,
               bool skew, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Case c{n, hidden, inter, E, K, dtype, {}, {}, {}, {}, {}};
  c.x.resize(static_cast<size_t>(n * hidden));
  for (float& v : c.x) v = normal(rng);
  for (int m = 0; m < 3; ++m) {
    const float scale = 1.f / std::sqrt(static_cast<float>(m == 2 ? inter : hidden));
    c.wf[m].resize(static_cast<size_t>(E * hidden * inter));
    for (float& v : c.wf[m]) v = round_to_bf16(scale * normal(rng));
    c.wb[m].resize(c.wf[m].size());
    for (size_t i = 0; i < c.wf[m].size(); ++i) c.wb[m][i] = f32_to_bf16(c.wf[m][i]);
  }
  // Routing from random logits through the reference router (distinct experts per row).
  std::vector<float> logits(static_cast<size_t>(n * E));
  for (float& v : logits) v = normal(rng);
  if (skew)
    for (int64_t t = 0; t < n; ++t) logits[t * E] = 100.f;
  c.ids.resize(static_cast<size_t>(n * K));
  c.weights.resize(c.ids.size());
  MoeRouteParams r;
  r.logits = logits.data();
  r.n = n;
  r.n_experts = E;
  r.top_k = K;
  r.norm_topk_prob = true;
  r.expert_ids = c.ids.data();
  r.weights = c.weights.data();
  EXPECT_TRUE(moe_route_ref(r).ok());
  return c;
}

// The bound in the header comment, per output element [n, hidden].
std::vector<double> ffn_bound(const Case& c) {
  std::vector<double> bound(static_cast<size_t>(c.n * c.hidden), 0.0);
  std::vector<double> A(static_cast<size_t>(c.inter));
  for (int64_t t = 0; t < c.n; ++t)
    for (int32_t j = 0; j < c.K; ++j) {
      const int64_t e = c.ids[t * c.K + j];
      const float* g = c.wf[0].data() + e * c.inter * c.hidden;
      const float* u = c.wf[1].data() + e * c.inter * c.hidden;
      const float* d = c.wf[2].data() + e * c.hidden * c.inter;
      for (int64_t i = 0; i < c.inter; ++i) {
        double gi = 0, ui = 0, G = 0, U = 0;
        for (int64_t k = 0; k < c.hidden; ++k) {
          const double xv = c.x[t * c.hidden + k];
          gi += xv * g[i * c.hidden + k];
          ui += xv * u[i * c.hidden + k];
          G += std::fabs(xv * g[i * c.hidden + k]);
          U += std::fabs(xv * u[i * c.hidden + k]);
        }
        const double silu = gi / (1.0 + std::exp(-gi));
        A[i] = 1.1 * G * std::fabs(ui) + std::fabs(silu) * U + std::fabs(silu * ui);
      }
      const double wj = std::fabs(c.weights[t * c.K + j]);
      for (int64_t h = 0; h < c.hidden; ++h) {
        double m = 0;
        for (int64_t i = 0; i < c.inter; ++i) m += std::fabs(d[h * c.inter + i]) * A[i];
        bound[t * c.hidden + h] += wj * m;
      }
    }
  const double k = 2.0 * (c.hidden + c.inter + c.K + 8) * kU;
  for (double& b : bound) b = k * b + 1e-30;
  return bound;
}

std::vector<float> run_fast(const Case& c) {
  std::vector<float> y(static_cast<size_t>(c.n * c.hidden), -7.f);
  MoeFfnParams p = c.params(y.data());
  std::vector<float> work((moe_ffn_work_bytes(c.n, c.K, c.E, c.hidden, c.inter) + 3) / 4);
  p.work = work.data();
  p.work_bytes = work.size() * sizeof(float);
  const Status st = moe_ffn(p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return y;
}

TEST(MoeFfn, FastMatchesReference) {
  uint32_t seed = 1;
  struct Shape {
    int64_t hidden, inter;
    int32_t E, K;
  };
  for (DType dtype : {DType::kBF16, DType::kF32})
    for (Shape s :
         {Shape{64, 32, 8, 2}, Shape{128, 48, 16, 4}, Shape{40, 24, 4, 1}, Shape{64, 32, 3, 3}})
      for (int64_t n : {1, 2, 5, 9, 40})
        for (bool skew : {false, true}) {
          const Case c = make_case(n, s.hidden, s.inter, s.E, s.K, dtype, skew, seed++);
          std::vector<float> want(static_cast<size_t>(n * s.hidden), -7.f);
          ASSERT_TRUE(moe_ffn_ref(c.params(want.data())).ok());
          const std::vector<float> got = run_fast(c);
          const std::vector<double> bound = ffn_bound(c);
          double dot = 0, ng = 0, nw = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const double err = std::fabs(double(got[i]) - want[i]);
            ASSERT_LE(err, bound[i])
                << "dtype " << int(dtype) << " n " << n << " hidden " << s.hidden << " E " << s.E
                << " K " << s.K << " skew " << skew << ": first mismatch at row " << i / s.hidden
                << " col " << i % s.hidden << ": got " << got[i] << " want " << want[i];
            dot += double(got[i]) * want[i];
            ng += double(got[i]) * got[i];
            nw += double(want[i]) * want[i];
          }
          EXPECT_GT(dot / std::sqrt(ng * nw), 1 - 1e-6);
        }
}

// A row's output does not depend on the rows beside it while every expert has at most 8 rows
// (linear()'s streaming path computes a row alike for any row count; the unpermute sums in slot
// order): each row of a batch equals the same row run alone, bit for bit.
TEST(MoeFfn, DecodeRowsIndependentOfBatch) {
  const Case c = make_case(6, 64, 32, 8, 2, DType::kBF16, false, 99);
  const std::vector<float> batch = run_fast(c);
  for (int64_t t = 0; t < c.n; ++t) {
    Case one = c;
    one.n = 1;
    one.x.assign(c.x.begin() + t * c.hidden, c.x.begin() + (t + 1) * c.hidden);
    one.ids.assign(c.ids.begin() + t * c.K, c.ids.begin() + (t + 1) * c.K);
    one.weights.assign(c.weights.begin() + t * c.K, c.weights.begin() + (t + 1) * c.K);
    const std::vector<float> alone = run_fast(one);
    ASSERT_EQ(std::memcmp(alone.data(), batch.data() + t * c.hidden, alone.size() * sizeof(float)),
              0)
        << "row " << t;
  }
}

TEST(MoeFfn, Refusals) {
  Case c = make_case(3, 64, 32, 8, 2, DType::kBF16, false, 5);
  std::vector<float> y(static_cast<size_t>(c.n * c.hidden));
  MoeFfnParams p = c.params(y.data());
  EXPECT_MSG_HAS(moe_ffn(p), "moe_ffn: work 0 bytes");  // no scratch
  std::vector<float> work(moe_ffn_work_bytes(c.n, c.K, c.E, c.hidden, c.inter) / 4);
  p.work = work.data();
  p.work_bytes = work.size() * 4 - 4;
  EXPECT_MSG_HAS(moe_ffn(p), "need");
  p.work_bytes = work.size() * 4;
  EXPECT_TRUE(moe_ffn(p).ok());
  c.ids[4] = 8;  // out of range
  MoeFfnParams bad = c.params(y.data());
  bad.work = p.work;
  bad.work_bytes = p.work_bytes;
  EXPECT_MSG_HAS(moe_ffn(bad), "row 2 slot 0 names expert 8 of 8");
  EXPECT_MSG_HAS(moe_ffn_ref(bad), "names expert 8");
  MoeFfnParams shapes = c.params(y.data());
  shapes.down.rows = 32;
  EXPECT_MSG_HAS(moe_ffn_ref(shapes), "expert shapes disagree");
  MoeRouteParams r;
  r.n = 1;
  r.n_experts = 4;
  r.top_k = 5;
  EXPECT_MSG_HAS(moe_route(r), "bad shape");
  EXPECT_MSG_HAS(moe_route_ref(r), "top 5");
}

}  // namespace
}  // namespace oscar::kernels
