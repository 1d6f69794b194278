// Tests of chunk attention (kernels/chunk_attn.h): the fast path (Eigen products, OpenMP) against
// the float64 reference on seeded random inputs, with several deq_end patterns: no dequantized
// zone, one fixed boundary (serving prefill), a boundary advancing per query by pages
// (decode-equivalent), and a boundary jumping past the chunk's own positions.
//
// Tolerance per (query, head), u = 2^-24: the reference is float64 with one final rounding, so
// it stands for the exact result. The fast path computes scores in float (error ≈ d·u·S with
// S = scale·max_j Σ_c |q_c k_jc|, relative weight error ≤ 2·that + a few u), and sums up to L
// weighted values in float (≤ 2·L·u·Vmax):  tol = Vmax·u·(2·(d + 2)·S + 2·L + 64).
// Plus cosine similarity >= 1 − 1e-6 per row. The batch-invariant path (fixed-order loops) has the
// same arithmetic shape (float dots, float sums of L terms), so the same bound; it is also checked
// bit for bit against itself with the queries cut into chunks of other sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/chunk_attn.h"

namespace oscar::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Case {
  int n_queries, n_heads_q, n_heads_kv, head_dim, pos0, n_sink;
  std::string pattern;  // "none", "fixed", "advance", "jump"
  uint32_t seed;
};

// Seeded inputs of a case: q, the exact K/V and their dequantized copies, deq_end.
struct Inputs {
  int64_t ld = 0;
  std::vector<float> q, k_ex, v_ex, k_dq, v_dq;
  std::vector<int32_t> deq_end;

  ChunkAttnParams params(const Case& c) const {
    ChunkAttnParams p;
    p.n_queries = c.n_queries;
    p.n_heads_q = c.n_heads_q;
    p.n_heads_kv = c.n_heads_kv;
    p.head_dim = c.head_dim;
    p.pos0 = c.pos0;
    p.n_sink = c.n_sink;
    p.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    p.q = q.data();
    p.k_exact = k_ex.data();
    p.v_exact = v_ex.data();
    p.k_deq = k_dq.data();
    p.v_deq = v_dq.data();
    p.ld_keys = ld;
    p.deq_end = deq_end.data();
    return p;
  }
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  const int d = c.head_dim;
  const int64_t n_keys = static_cast<int64_t>(c.pos0) + c.n_queries;
  in.ld = n_keys + 3;  // padding rows between heads
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n, float gain) {
    std::vector<float> x(n);
    for (float& e : x) e = gain * normal(rng);
    return x;
  };
  const size_t kv_n = static_cast<size_t>(c.n_heads_kv) * in.ld * d;
  in.q = fill(static_cast<size_t>(c.n_queries) * c.n_heads_q * d, 1.5f);
  in.k_ex = fill(kv_n, 1.f);
  in.v_ex = fill(kv_n, 1.f);
  // Dequantized copies: the exact ones plus a perturbation, so reading the wrong copy shows.
  in.k_dq = in.k_ex;
  in.v_dq = in.v_ex;
  for (float& e : in.k_dq) e += 0.3f * normal(rng);
  for (float& e : in.v_dq) e += 0.3f * normal(rng);
  in.deq_end.resize(c.n_queries);
  const int page = 16;
  for (int i = 0; i < c.n_queries; ++i) {
    int64_t b = c.n_sink;
    if (c.pattern == "fixed") b = std::max<int64_t>(c.n_sink, c.pos0 / 2 / page * page);
    if (c.pattern == "advance")
      b = std::max<int64_t>(c.n_sink, (c.pos0 + i - 40) / page * page);
    if (c.pattern == "jump") b = std::max<int64_t>(c.n_sink, i < c.n_queries / 2 ? c.pos0 / 3 : n_keys + 5);
    in.deq_end[i] = static_cast<int32_t>(b);
  }
  return in;
}

void run_case(const Case& c, bool batch_invariant) {
  SCOPED_TRACE(c.pattern + (batch_invariant ? " invariant" : "") + " nq=" + std::to_string(c.n_queries) +
               " hq=" + std::to_string(c.n_heads_q) + " hkv=" + std::to_string(c.n_heads_kv) +
               " d=" + std::to_string(c.head_dim) + " pos0=" + std::to_string(c.pos0) +
               " sink=" + std::to_string(c.n_sink));
  const int d = c.head_dim;
  const Inputs in = make_inputs(c);
  const int64_t ld = in.ld;
  const std::vector<float>&q = in.q, &k_ex = in.k_ex, &v_ex = in.v_ex, &k_dq = in.k_dq,
                           &v_dq = in.v_dq;
  const std::vector<int32_t>& deq_end = in.deq_end;
  ChunkAttnParams p = in.params(c);
  p.batch_invariant = batch_invariant;
  std::vector<float> want(q.size(), -9.f), got(q.size(), -9.f);
  p.out = want.data();
  ASSERT_TRUE(chunk_attn_ref(p).ok());
  p.out = got.data();
  ASSERT_TRUE(chunk_attn(p).ok());

  const int gqa = c.n_heads_q / c.n_heads_kv;
  double worst = 0;
  for (int i = 0; i < c.n_queries; ++i) {
    const int64_t t = static_cast<int64_t>(c.pos0) + i;
    for (int h = 0; h < c.n_heads_q; ++h) {
      const int g = h / gqa;
      const float* qr = q.data() + (static_cast<size_t>(i) * c.n_heads_q + h) * d;
      double S = 0, vmax = 0;
      for (int64_t j = 0; j <= t; ++j) {
        const bool dq = j >= c.n_sink && j < deq_end[i];
        const float* kr = (dq ? k_dq : k_ex).data() + (static_cast<size_t>(g) * ld + j) * d;
        const float* vr = (dq ? v_dq : v_ex).data() + (static_cast<size_t>(g) * ld + j) * d;
        double a = 0;
        for (int e = 0; e < d; ++e) {
          a += std::fabs(static_cast<double>(qr[e]) * kr[e]);
          vmax = std::max(vmax, std::fabs(static_cast<double>(vr[e])));
        }
        S = std::max(S, a * p.scale);
      }
      const double tol = vmax * kU * (2.0 * (d + 2) * S + 2.0 * (t + 1) + 64);
      const size_t base = (static_cast<size_t>(i) * c.n_heads_q + h) * d;
      double dotp = 0, ng = 0, nw = 0;
      for (int e = 0; e < d; ++e) {
        const double gv = got[base + e], wv = want[base + e];
        const double err = std::fabs(gv - wv);
        worst = std::max(worst, err / tol);
        ASSERT_LE(err, tol) << "first mismatch at query " << i << " head " << h << " dim " << e
                            << ": got " << gv << " want " << wv;
        dotp += gv * wv;
        ng += gv * gv;
        nw += wv * wv;
      }
      ASSERT_GE(dotp / std::sqrt(ng * nw), 1.0 - 1e-6) << "query " << i << " head " << h;
    }
  }
  std::printf("chunk_attn %-7s%s nq=%3d pos0=%4d: max err / bound = %.3g\n", c.pattern.c_str(),
              batch_invariant ? " (invariant)" : "", c.n_queries, c.pos0, worst);
}

TEST(ChunkAttn, FastMatchesReferenceAcrossDeqEndPatterns) {
  for (bool invariant : {false, true}) {
    uint32_t seed = 1;
    for (const char* pattern : {"none", "fixed", "advance", "jump"}) {
      run_case({1, 4, 2, 128, 300, 32, pattern, seed++}, invariant);   // one query (decode-like)
      run_case({37, 4, 2, 128, 200, 32, pattern, seed++}, invariant);  // partial query block
      run_case({70, 8, 2, 64, 130, 16, pattern, seed++}, invariant);   // two query blocks, gqa 4
      run_case({64, 8, 1, 64, 0, 0, pattern, seed++}, invariant);      // from empty, no sinks
      run_case({20, 2, 2, 128, 500, 64, pattern, seed++}, invariant);  // gqa 1
      run_case({8, 4, 2, 128, 0, 64, pattern, seed++}, invariant);     // prompt inside the sinks
      run_case({20, 4, 2, 64, 10, 32, pattern, seed++}, invariant);    // keys end inside the sinks
      run_case({30, 4, 2, 64, 20, 32, pattern, seed++}, invariant);    // crosses the sink edge
    }
  }
}

// Batch invariance: the queries of one call cut into chunks of other sizes (each chunk a call with
// its own pos0, as a prompt prefilled in pieces) give bitwise the same outputs.
TEST(ChunkAttn, InvariantPathGivesTheSameBitsWhateverTheChunks) {
  uint32_t seed = 100;
  for (const char* pattern : {"none", "fixed", "advance", "jump"}) {
    const Case c{150, 4, 2, 128, 90, 32, pattern, seed++};
    SCOPED_TRACE(c.pattern);
    const Inputs in = make_inputs(c);
    ChunkAttnParams whole = in.params(c);
    whole.batch_invariant = true;
    std::vector<float> want(in.q.size(), -9.f);
    whole.out = want.data();
    ASSERT_TRUE(chunk_attn(whole).ok());
    const int64_t row = static_cast<int64_t>(c.n_heads_q) * c.head_dim;
    for (int chunk : {1, 7, 63, 64, 65, 149}) {
      std::vector<float> got(in.q.size(), -9.f);
      for (int i0 = 0; i0 < c.n_queries; i0 += chunk) {
        ChunkAttnParams part = whole;
        part.n_queries = std::min(chunk, c.n_queries - i0);
        part.pos0 = c.pos0 + i0;
        part.q = in.q.data() + i0 * row;
        part.deq_end = in.deq_end.data() + i0;
        part.out = got.data() + i0 * row;
        ASSERT_TRUE(chunk_attn(part).ok());
      }
      for (size_t e = 0; e < want.size(); ++e)
        ASSERT_EQ(got[e], want[e]) << "chunks of " << chunk << ": first mismatch at query "
                                   << e / row << " element " << e % row;
    }
  }
}

TEST(ChunkAttn, RejectsBadDeqEnd) {
  std::vector<float> x(4 * 8 * 64, 0.f), out(2 * 64);
  std::vector<int32_t> deq = {10, 5};  // decreasing
  ChunkAttnParams p;
  p.n_queries = 2;
  p.n_heads_q = 1;
  p.n_heads_kv = 1;
  p.head_dim = 64;
  p.pos0 = 6;
  p.scale = 0.125f;
  p.q = p.k_exact = p.v_exact = p.k_deq = p.v_deq = x.data();
  p.ld_keys = 8;
  p.deq_end = deq.data();
  p.out = out.data();
  EXPECT_FALSE(chunk_attn(p).ok());
  EXPECT_FALSE(chunk_attn_ref(p).ok());
}

}  // namespace
}  // namespace oscar::kernels
