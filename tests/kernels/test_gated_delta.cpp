// Gated DeltaNet ops (kernels/gated_delta.h): the fast CPU conv, gates, delta rule (recurrent and
// chunked) and norms against their float64 references; the chunked form against the recurrence
// (float64: the algebra; float32: the fast path); a prefill in pieces and decode steps after a
// prefill against one prefill; head repetition; edge gates; the transformers golden when present.
//
// Tolerances (u = 2^-24, float32's unit roundoff; γ_n = n·u):
// - Conv: y = act(b + Σ_j w_j u_j) in float32 is off by at most γ_{K+1} Σ|terms| before the
//   activation; SiLU moves that by at most 1.1× (|silu'| <= 1.1) and adds ~4 roundings of |y|.
//   Allowed: 2 · (1.1 γ_{K+1} Σ|terms| + γ_4 |y|). The state is copied: bit-equal.
// - Gates: g = -e^A · softplus(a + dt): the sum's rounding moves softplus by at most u|x|
//   (softplus' <= 1) and exp/log1p/products add ~6 roundings: allowed 2(8 + |x|/softplus(x))·u·|g|
//   relative... bounded more simply by 2 (8 u |g| + u |x| e^A). beta: ~4 roundings: 8 u β.
// - Delta rule: with |k̂| = 1 and β ∈ [0, 1], each step S ← (I - β k̂k̂ᵀ) e^g S + β k̂ vᵀ is
//   non-expansive on every column of S, so the rounding added at each step (at most
//   3 γ_{d_k+8} M per column, M = the largest column norm ||S_:j|| or |v_j| along the run) is never
//   amplified: after T steps a column is off by <= 3 T γ M and o = q̂ᵀS by <= |q̂| (3T + 1) γ M.
//   The chunked form solves a 64-row triangular system per chunk; we charge it γ_{d_k + 64 + 8}.
//   Allowed: 2 |q̂| (3T + 1) γ_{d_k + 72} M (and the same per state element, without |q̂|). M comes
//   from the float64 trajectory. A cosine similarity >= 1 - 1e-6 is checked too.
// - The float64 chunked form against the float64 recurrence: both round to float32 at the end, so
//   they agree to 2u relative plus float64 noise (1e-12 of the scale).
// - Norms: the float32 sum of squares is off by γ_dim relative, the rsqrt by γ_{dim/2+2}, then ~6
//   roundings (w, SiLU, products): allowed 2 γ_{dim/2 + 10} |y|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "kernels/gated_delta.h"

namespace oscar::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

using Vec = std::vector<float>;

Vec randn(size_t n, std::mt19937& rng, float std = 1.f, float mean = 0.f) {
  std::normal_distribution<float> d(mean, std);
  Vec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> cu_of(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

// Max |got - want| / tol over elements; the first element over 1 is reported.
void expect_within(const Vec& got, const Vec& want, const std::vector<double>& tol,
                   const std::string& what, double* worst_ratio = nullptr,
                   double* worst_abs = nullptr) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double ratio = 0, abs_err = 0, dot = 0, ng = 0, nw = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << what << " NaN at " << i;
    if (std::isnan(want[i])) continue;
    const double e = std::fabs(double(got[i]) - want[i]);
    abs_err = std::max(abs_err, e);
    const double r = e / std::max(tol[i], 1e-37);
    if (r > 1.0) {
      FAIL() << what << ": element " << i << " got " << got[i] << " want " << want[i] << " err "
             << e << " > tol " << tol[i];
    }
    ratio = std::max(ratio, r);
    dot += double(got[i]) * want[i];
    ng += double(got[i]) * got[i];
    nw += double(want[i]) * want[i];
  }
  if (ng > 0 && nw > 0) {
    EXPECT_GE(dot / std::sqrt(ng * nw), 1.0 - 1e-6) << what << " cosine";
  }
  if (worst_ratio) *worst_ratio = std::max(*worst_ratio, ratio);
  if (worst_abs) *worst_abs = std::max(*worst_abs, abs_err);
}

// ----------------------------------------------------------------------------------------------
// Conv

struct ConvCase {
  int64_t C;
  int32_t K;
  std::vector<int32_t> lens, cu, slots;
  Vec x, w, bias, state;
  bool use_bias, silu;
};

ConvCase make_conv(int64_t C, int32_t K, std::vector<int32_t> lens, bool bias, bool silu,
                   std::mt19937& rng) {
  ConvCase c;
  c.C = C;
  c.K = K;
  c.lens = lens;
  c.cu = cu_of(lens);
  const int32_t n = static_cast<int32_t>(lens.size());
  c.slots.resize(static_cast<size_t>(n));
  std::iota(c.slots.begin(), c.slots.end(), 0);
  std::shuffle(c.slots.begin(), c.slots.end(), rng);
  for (int32_t& s : c.slots) s += 1;  // slot 0 unused: must stay untouched
  c.x = randn(static_cast<size_t>(c.cu.back() * C), rng);
  c.w = randn(static_cast<size_t>(C * K), rng, 0.5f);
  c.bias = randn(static_cast<size_t>(C), rng, 0.3f);
  c.state = randn(static_cast<size_t>((n + 1) * (K - 1) * C), rng);
  c.use_bias = bias;
  c.silu = silu;
  return c;
}

CausalConv1dParams conv_params(const ConvCase& c, Vec& state, Vec& y) {
  CausalConv1dParams p;
  p.x = c.x.data();
  p.cu_seqlens = c.cu.data();
  p.n_seqs = static_cast<int32_t>(c.lens.size());
  p.channels = c.C;
  p.kernel_size = c.K;
  p.w = c.w.data();
  p.bias = c.use_bias ? c.bias.data() : nullptr;
  p.silu = c.silu;
  p.state = state.data();
  p.slots = c.slots.data();
  y.assign(c.x.size(), NAN);
  p.y = y.data();
  return p;
}

// The conv's bound per output (header of this file), from the inputs in float64.
std::vector<double> conv_tol(const ConvCase& c, const Vec& ref_y) {
  std::vector<double> tol(ref_y.size());
  const int64_t C = c.C, H = c.K - 1;
  for (size_t s = 0; s < c.lens.size(); ++s) {
    const float* st = c.state.data() + int64_t{c.slots[s]} * H * C;
    for (int64_t t = 0; t < c.lens[s]; ++t)
      for (int64_t ch = 0; ch < C; ++ch) {
        double sum = c.use_bias ? std::fabs(c.bias[ch]) : 0.0;
        for (int64_t j = 0; j < c.K; ++j) {
          const int64_t i = t + j;
          const double u = i < H ? st[i * C + ch] : c.x[(c.cu[s] + i - H) * C + ch];
          sum += std::fabs(c.w[ch * c.K + j] * u);
        }
        const size_t o = static_cast<size_t>((c.cu[s] + t) * C + ch);
        tol[o] = 2.0 * (1.1 * (c.K + 1) * kU * sum + 4 * kU * std::fabs(ref_y[o]));
      }
  }
  return tol;
}

TEST(CausalConv1d, FastMatchesReference) {
  std::mt19937 rng(11);
  double worst = 0, worst_abs = 0;
  for (int64_t C : {5, 300, 1030})
    for (int32_t K : {4, 1, 2})
      for (bool bias : {false, true})
        for (bool silu : {true, false}) {
          ConvCase c = make_conv(C, K, {1, 7, 0, 70, 2}, bias, silu, rng);
          Vec s_ref = c.state, s_fast = c.state, y_ref, y_fast;
          ASSERT_TRUE(causal_conv1d_ref(conv_params(c, s_ref, y_ref)).ok());
          ASSERT_TRUE(causal_conv1d(conv_params(c, s_fast, y_fast)).ok());
          expect_within(y_fast, y_ref, conv_tol(c, y_ref),
                        "conv C " + std::to_string(C) + " K " + std::to_string(K), &worst,
                        &worst_abs);
          EXPECT_EQ(s_fast, s_ref) << "state C " << C << " K " << K;
          // Slot 0 untouched.
          for (int64_t i = 0; i < (K - 1) * C; ++i) ASSERT_EQ(s_fast[i], c.state[i]);
        }
  std::printf("conv: worst err/tol %.3g, max abs err %.3g\n", worst, worst_abs);
}

TEST(CausalConv1d, HandChecked) {
  // One channel, K = 3, w = [1, 2, 3], state [10, 20], x = [1, 2], no activation:
  // y0 = 10 + 40 + 3 = 53, y1 = 20 + 2 + 6 = 28; state after = [1, 2].
  const Vec x = {1, 2}, w = {1, 2, 3};
  Vec state = {10, 20}, y(2);
  const std::vector<int32_t> cu = {0, 2};
  CausalConv1dParams p;
  p.x = x.data();
  p.cu_seqlens = cu.data();
  p.n_seqs = 1;
  p.channels = 1;
  p.kernel_size = 3;
  p.w = w.data();
  p.silu = false;
  p.state = state.data();
  p.y = y.data();
  for (bool ref : {true, false}) {
    state = {10, 20};
    ASSERT_TRUE((ref ? causal_conv1d_ref(p) : causal_conv1d(p)).ok());
    EXPECT_EQ(y, (Vec{53, 28}));
    EXPECT_EQ(state, (Vec{1, 2}));
  }
}

// A prefill in pieces, and decode steps, equal one prefill bit for bit (the fast path computes
// each output from the same floats, whether they come from the state or from x).
TEST(CausalConv1d, PiecesEqualOnePrefill) {
  std::mt19937 rng(12);
  for (int32_t K : {4, 2}) {
    ConvCase whole = make_conv(130, K, {23}, true, true, rng);
    Vec s_whole = whole.state, y_whole;
    ASSERT_TRUE(causal_conv1d(conv_params(whole, s_whole, y_whole)).ok());
    for (std::vector<int32_t> split :
         {std::vector<int32_t>{1, 2, 20}, {10, 13}, {5, 1, 1, 1, 15}}) {
      Vec state = whole.state, y_all;
      int32_t t0 = 0;
      for (int32_t len : split) {
        ConvCase piece = whole;
        piece.lens = {len};
        piece.cu = {0, len};
        piece.x.assign(whole.x.begin() + t0 * whole.C, whole.x.begin() + (t0 + len) * whole.C);
        Vec y;
        ASSERT_TRUE(causal_conv1d(conv_params(piece, state, y)).ok());
        y_all.insert(y_all.end(), y.begin(), y.end());
        t0 += len;
      }
      EXPECT_EQ(y_all, y_whole) << "K " << K;
      EXPECT_EQ(state, s_whole) << "K " << K;
    }
  }
}

TEST(CausalConv1d, Refusals) {
  ConvCase c;
  std::mt19937 rng(1);
  c = make_conv(4, 4, {2, 1}, false, true, rng);
  Vec s = c.state, y;
  CausalConv1dParams p = conv_params(c, s, y);
  std::vector<int32_t> dup = {1, 1};
  p.slots = dup.data();
  EXPECT_FALSE(causal_conv1d(p).ok());
  p = conv_params(c, s, y);
  p.y = const_cast<float*>(p.x);
  EXPECT_FALSE(causal_conv1d(p).ok());
  p = conv_params(c, s, y);
  std::vector<int32_t> bad_cu = {0, 2, 1};
  p.cu_seqlens = bad_cu.data();
  EXPECT_FALSE(causal_conv1d_ref(p).ok());
}

// ----------------------------------------------------------------------------------------------
// Gates

TEST(GdnGates, FastMatchesReference) {
  std::mt19937 rng(21);
  const int64_t n = 300;
  const int32_t H = 32;
  Vec a = randn(n * H, rng, 4.f), b = randn(n * H, rng, 4.f);
  Vec A_log = randn(H, rng, 1.f), dt = randn(H, rng, 1.f);
  a[0] = 30.f;  // softplus's linear branch
  a[1] = -40.f;
  Vec g_ref(n * H), b_ref(n * H), g_fast(n * H), b_fast(n * H);
  GdnGatesParams p;
  p.a = a.data();
  p.b = b.data();
  p.A_log = A_log.data();
  p.dt_bias = dt.data();
  p.n_tokens = n;
  p.n_heads_v = H;
  p.g = g_ref.data();
  p.beta = b_ref.data();
  ASSERT_TRUE(gdn_gates_ref(p).ok());
  p.g = g_fast.data();
  p.beta = b_fast.data();
  ASSERT_TRUE(gdn_gates(p).ok());
  std::vector<double> tg(n * H), tb(n * H);
  for (int64_t i = 0; i < n * H; ++i) {
    const double x = double(a[i]) + dt[i % H];
    tg[i] = 2 * (8 * kU * std::fabs(g_ref[i]) + kU * std::fabs(x) * std::exp(double(A_log[i % H])));
    tb[i] = 8 * kU * b_ref[i];
    ASSERT_LE(g_ref[i], 0.f);
  }
  expect_within(g_fast, g_ref, tg, "g");
  expect_within(b_fast, b_ref, tb, "beta");
}

// ----------------------------------------------------------------------------------------------
// Delta rule

struct DeltaCase {
  int32_t hk, hv, dk, dv;
  std::vector<int32_t> lens, cu, slots;
  Vec q, k, v, g, beta, state;  // state: [n_seqs + 1 slots, hv, dk, dv]; slot 0 unused
  bool l2norm = true;
  int64_t rows() const { return cu.back(); }
};

DeltaCase make_delta(int32_t hk, int32_t hv, int32_t dk, int32_t dv, std::vector<int32_t> lens,
                     std::mt19937& rng, float state_std = 0.5f) {
  DeltaCase c;
  c.hk = hk;
  c.hv = hv;
  c.dk = dk;
  c.dv = dv;
  c.lens = lens;
  c.cu = cu_of(lens);
  const int32_t n = static_cast<int32_t>(lens.size());
  c.slots.resize(static_cast<size_t>(n));
  std::iota(c.slots.begin(), c.slots.end(), 1);
  std::shuffle(c.slots.begin(), c.slots.end(), rng);
  const size_t T = static_cast<size_t>(c.rows());
  c.q = randn(T * hk * dk, rng);
  c.k = randn(T * hk * dk, rng);
  c.v = randn(T * hv * dv, rng);
  // Gates as the models make them: g = -e^A softplus(a + dt), β = sigmoid(b).
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  std::normal_distribution<float> nd(0.f, 2.f);
  c.g.resize(T * hv);
  c.beta.resize(T * hv);
  for (size_t i = 0; i < T * hv; ++i) {
    const double x = nd(rng) - 2.0;
    c.g[i] = static_cast<float>(-0.5 * std::log1p(std::exp(x)));
    c.beta[i] = uni(rng);
  }
  c.state = randn(static_cast<size_t>(n + 1) * hv * dk * dv, rng, state_std);
  return c;
}

GatedDeltaParams delta_params(const DeltaCase& c, Vec& state, Vec& o,
                              GatedDeltaMode mode = GatedDeltaMode::kAuto) {
  GatedDeltaParams p;
  p.q = c.q.data();
  p.k = c.k.data();
  p.v = c.v.data();
  p.g = c.g.data();
  p.beta = c.beta.data();
  p.cu_seqlens = c.cu.data();
  p.n_seqs = static_cast<int32_t>(c.lens.size());
  p.n_heads_k = c.hk;
  p.n_heads_v = c.hv;
  p.d_k = c.dk;
  p.d_v = c.dv;
  p.l2norm_qk = c.l2norm;
  p.state = state.data();
  p.slots = c.slots.data();
  o.assign(static_cast<size_t>(c.rows()) * c.hv * c.dv, NAN);
  p.o = o.data();
  p.mode = mode;
  return p;
}

// The delta rule's bounds (header of this file) for outputs and the final states, from the
// float64 trajectory: the reference run token by token, M per (sequence, head).
struct DeltaTol {
  std::vector<double> o, state;
};

DeltaTol delta_tol(const DeltaCase& c, double slack = 1.0) {
  const int64_t hv = c.hv, dk = c.dk, dv = c.dv;
  DeltaTol t;
  t.o.assign(static_cast<size_t>(c.rows() * hv * dv), 0);
  t.state.assign(c.state.size(), 0);
  const double gamma = (dk + kGatedDeltaChunk + 8) * kU;
  Vec state = c.state;
  for (size_t s = 0; s < c.lens.size(); ++s) {
    std::vector<double> M(static_cast<size_t>(hv), 0.0), qn(static_cast<size_t>(hv), 0.0);
    auto col_norms = [&]() {
      for (int64_t h = 0; h < hv; ++h) {
        const float* S = state.data() + (int64_t{c.slots[s]} * hv + h) * dk * dv;
        for (int64_t j = 0; j < dv; ++j) {
          double n2 = 0;
          for (int64_t i = 0; i < dk; ++i) n2 += double(S[i * dv + j]) * S[i * dv + j];
          M[h] = std::max(M[h], std::sqrt(n2));
        }
      }
    };
    col_norms();
    for (int32_t t0 = c.cu[s]; t0 < c.cu[s + 1]; ++t0) {
      DeltaCase one = c;
      one.cu = {0, 1};
      one.lens = {1};
      one.slots = {c.slots[s]};
      one.q.assign(c.q.begin() + t0 * c.hk * dk, c.q.begin() + (t0 + 1) * c.hk * dk);
      one.k.assign(c.k.begin() + t0 * c.hk * dk, c.k.begin() + (t0 + 1) * c.hk * dk);
      one.v.assign(c.v.begin() + t0 * hv * dv, c.v.begin() + (t0 + 1) * hv * dv);
      one.g.assign(c.g.begin() + t0 * hv, c.g.begin() + (t0 + 1) * hv);
      one.beta.assign(c.beta.begin() + t0 * hv, c.beta.begin() + (t0 + 1) * hv);
      Vec o;
      EXPECT_TRUE(gated_delta_rule_ref(delta_params(one, state, o)).ok());
      col_norms();
      for (int64_t h = 0; h < hv; ++h) {
        for (int64_t j = 0; j < dv; ++j)
          M[h] = std::max(M[h], std::fabs(double(one.v[h * dv + j])));
        double n2 = 0;
        const float* qt = one.q.data() + (h / (hv / c.hk)) * dk;
        for (int64_t i = 0; i < dk; ++i) n2 += double(qt[i]) * qt[i];
        qn[h] = std::max(qn[h], c.l2norm ? 1.0 / std::sqrt(dk) : std::sqrt(n2 / dk));
      }
    }
    const double T = c.lens[s];
    for (int64_t h = 0; h < hv; ++h) {
      const double bound = 2.0 * slack * (3 * T + 1) * gamma * M[h];
      for (int64_t r = c.cu[s]; r < c.cu[s + 1]; ++r)
        for (int64_t j = 0; j < dv; ++j) t.o[(r * hv + h) * dv + j] = bound * qn[h];
      const int64_t base = (int64_t{c.slots[s]} * hv + h) * dk * dv;
      for (int64_t i = 0; i < dk * dv; ++i) t.state[base + i] = bound;
    }
  }
  return t;
}

const char* mode_name(GatedDeltaMode m) {
  return m == GatedDeltaMode::kAuto        ? "auto"
         : m == GatedDeltaMode::kRecurrent ? "recurrent"
                                           : "chunked";
}

// Runs the fast path in `mode` and the reference, and checks outputs and states within the bound.
void check_fast(const DeltaCase& c, GatedDeltaMode mode, const std::string& what, double* worst,
                double* worst_abs) {
  Vec s_ref = c.state, s_fast = c.state, o_ref, o_fast;
  ASSERT_TRUE(gated_delta_rule_ref(delta_params(c, s_ref, o_ref)).ok());
  ASSERT_TRUE(gated_delta_rule(delta_params(c, s_fast, o_fast, mode)).ok());
  const DeltaTol tol = delta_tol(c);
  expect_within(o_fast, o_ref, tol.o, what + " " + mode_name(mode) + " o", worst, worst_abs);
  // Unused slots (0, and slot tolerances of 0) must be bit-equal: their bound is 0.
  expect_within(s_fast, s_ref, tol.state, what + " " + mode_name(mode) + " state", worst, nullptr);
}

TEST(GatedDelta, FastMatchesReference) {
  std::mt19937 rng(31);
  struct Shape {
    int32_t hk, hv, dk, dv;
  };
  double worst[3] = {0, 0, 0}, worst_abs[3] = {0, 0, 0};
  for (Shape sh : {Shape{1, 1, 16, 8}, Shape{2, 4, 32, 16}, Shape{2, 4, 128, 128}})
    for (std::vector<int32_t> lens :
         {std::vector<int32_t>{1, 5, 63, 64, 65, 0, 130}, std::vector<int32_t>{1, 1, 1}}) {
      if (sh.dk == 128 && lens.size() > 3) lens = {1, 65, 7};
      for (bool l2 : {true, false}) {
        DeltaCase c = make_delta(sh.hk, sh.hv, sh.dk, sh.dv, lens, rng);
        c.l2norm = l2;
        if (!l2)  // unnormalised keys: scale them so the step stays non-expansive (|k| <= 1)
          for (float& x : c.k) x /= 2.f * std::sqrt(float(sh.dk));
        const std::string what = "hk " + std::to_string(sh.hk) + " hv " + std::to_string(sh.hv) +
                                 " dk " + std::to_string(sh.dk) + (l2 ? "" : " raw");
        for (int mi = 0; mi < 3; ++mi)
          check_fast(c, GatedDeltaMode(mi), what, &worst[mi], &worst_abs[mi]);
        // The two forms are different arithmetic: they must not agree bit for bit (both ran).
        Vec s1 = c.state, s2 = c.state, o1, o2;
        ASSERT_TRUE(gated_delta_rule(delta_params(c, s1, o1, GatedDeltaMode::kRecurrent)).ok());
        ASSERT_TRUE(gated_delta_rule(delta_params(c, s2, o2, GatedDeltaMode::kChunked)).ok());
        EXPECT_NE(o1, o2) << what;
      }
    }
  for (int m = 0; m < 3; ++m)
    std::printf("delta %s: worst err/tol %.3g, max abs err in o %.3g\n",
                mode_name(GatedDeltaMode(m)), worst[m], worst_abs[m]);
}

// The chunked algebra in float64 equals the recurrence: both end in one float32 rounding.
TEST(GatedDelta, ChunkedF64EqualsRecurrence) {
  std::mt19937 rng(32);
  double worst = 0;
  for (std::vector<int32_t> lens :
       {std::vector<int32_t>{1}, {40}, {64}, {64 + 64 + 17}, {3, 200}}) {
    DeltaCase c = make_delta(2, 4, 32, 24, lens, rng);
    Vec s_ref = c.state, s_chk = c.state, o_ref, o_chk;
    ASSERT_TRUE(gated_delta_rule_ref(delta_params(c, s_ref, o_ref)).ok());
    ASSERT_TRUE(gated_delta_rule_chunked_f64(delta_params(c, s_chk, o_chk)).ok());
    auto tol_of = [](const Vec& ref) {
      double scale = 0;
      for (float x : ref) scale = std::max(scale, double(std::fabs(x)));
      std::vector<double> t(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) t[i] = 2 * kU * std::fabs(ref[i]) + 1e-12 * scale;
      return t;
    };
    expect_within(o_chk, o_ref, tol_of(o_ref), "chunked f64 o T " + std::to_string(lens.back()),
                  &worst);
    expect_within(s_chk, s_ref, tol_of(s_ref), "chunked f64 state", &worst);
  }
  std::printf("chunked f64 vs recurrence: worst err/tol %.3g\n", worst);
}

// A prefill in two pieces (the state carried), and decode steps after a prefill, against the
// reference's one prefill of the whole.
TEST(GatedDelta, PiecesAndDecodeEqualOnePrefill) {
  std::mt19937 rng(33);
  const int32_t T = 150;
  DeltaCase whole = make_delta(2, 4, 64, 32, {T}, rng);
  Vec s_ref = whole.state, o_ref;
  ASSERT_TRUE(gated_delta_rule_ref(delta_params(whole, s_ref, o_ref)).ok());
  const DeltaTol tol = delta_tol(whole);
  auto slice = [&](int32_t t0, int32_t n) {
    DeltaCase c = whole;
    c.lens = {n};
    c.cu = {0, n};
    const int64_t qk = int64_t{whole.hk} * whole.dk, vv = int64_t{whole.hv} * whole.dv;
    c.q.assign(whole.q.begin() + t0 * qk, whole.q.begin() + (t0 + n) * qk);
    c.k.assign(whole.k.begin() + t0 * qk, whole.k.begin() + (t0 + n) * qk);
    c.v.assign(whole.v.begin() + t0 * vv, whole.v.begin() + (t0 + n) * vv);
    c.g.assign(whole.g.begin() + t0 * whole.hv, whole.g.begin() + (t0 + n) * whole.hv);
    c.beta.assign(whole.beta.begin() + t0 * whole.hv, whole.beta.begin() + (t0 + n) * whole.hv);
    return c;
  };
  double worst = 0;
  // Two pieces (cut inside a chunk, at a chunk edge), then prefill + decode steps.
  for (std::vector<int32_t> split : {std::vector<int32_t>{37, 113},
                                     {64, 86},
                                     {140, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                     {1, 1, 1, 147}}) {
    Vec state = whole.state, o_all;
    int32_t t0 = 0;
    for (int32_t n : split) {
      DeltaCase c = slice(t0, n);
      Vec o;
      ASSERT_TRUE(gated_delta_rule(delta_params(c, state, o)).ok());
      o_all.insert(o_all.end(), o.begin(), o.end());
      t0 += n;
    }
    expect_within(o_all, o_ref, tol.o, "split " + std::to_string(split[0]), &worst);
    expect_within(state, s_ref, tol.state, "split state " + std::to_string(split[0]), &worst);
  }
  std::printf("pieces/decode vs one prefill: worst err/tol %.3g\n", worst);
}

// n_heads_v > n_heads_k: value head h reads key head h / ratio. Equal to the reference on q and k
// repeated explicitly (repeat_interleave), bit for bit in the reference.
TEST(GatedDelta, HeadRepetition) {
  std::mt19937 rng(34);
  DeltaCase gqa = make_delta(2, 6, 16, 8, {5, 70}, rng);
  DeltaCase rep = gqa;
  rep.hk = rep.hv;
  const int32_t ratio = gqa.hv / gqa.hk;
  const int64_t T = gqa.rows(), dk = gqa.dk;
  rep.q.resize(static_cast<size_t>(T * rep.hk * dk));
  rep.k.resize(rep.q.size());
  for (int64_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < rep.hv; ++h)
      for (int64_t i = 0; i < dk; ++i) {
        rep.q[(t * rep.hv + h) * dk + i] = gqa.q[(t * gqa.hk + h / ratio) * dk + i];
        rep.k[(t * rep.hv + h) * dk + i] = gqa.k[(t * gqa.hk + h / ratio) * dk + i];
      }
  Vec s1 = gqa.state, s2 = gqa.state, o1, o2;
  ASSERT_TRUE(gated_delta_rule_ref(delta_params(gqa, s1, o1)).ok());
  ASSERT_TRUE(gated_delta_rule_ref(delta_params(rep, s2, o2)).ok());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(s1, s2);
  double worst = 0, worst_abs = 0;
  check_fast(gqa, GatedDeltaMode::kAuto, "gqa", &worst, &worst_abs);
  // q, k, v as views into one mixed row [q | k | v] (the conv output's layout).
  const int64_t qw = int64_t{gqa.hk} * dk, vw = int64_t{gqa.hv} * gqa.dv, row = 2 * qw + vw;
  Vec mixed(static_cast<size_t>(T * row));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(gqa.q.begin() + t * qw, qw, mixed.begin() + t * row);
    std::copy_n(gqa.k.begin() + t * qw, qw, mixed.begin() + t * row + qw);
    std::copy_n(gqa.v.begin() + t * vw, vw, mixed.begin() + t * row + 2 * qw);
  }
  Vec s3 = gqa.state, o3;
  GatedDeltaParams p = delta_params(gqa, s3, o3);
  p.q = mixed.data();
  p.k = mixed.data() + qw;
  p.v = mixed.data() + 2 * qw;
  p.q_stride = p.k_stride = p.v_stride = row;
  ASSERT_TRUE(gated_delta_rule_ref(p).ok());
  EXPECT_EQ(o3, o1);
  EXPECT_EQ(s3, s1);
}

// Edge gates: g very negative (e^g = 0 in float: only the current token counts), g = 0 and
// β = 0 (the state carried unchanged), β = 1.
TEST(GatedDelta, EdgeGates) {
  std::mt19937 rng(35);
  double worst = 0, worst_abs = 0;
  for (int edge = 0; edge < 4; ++edge) {
    DeltaCase c = make_delta(1, 2, 32, 16, {1, 9, 80}, rng);
    for (size_t i = 0; i < c.g.size(); ++i) {
      if (edge == 0) c.g[i] = -1e4f;
      if (edge == 1) c.g[i] = (i % 3 == 0) ? -200.f : -60.f;
      if (edge == 2) {
        c.g[i] = 0.f;
        c.beta[i] = 0.f;
      }
      if (edge == 3) c.beta[i] = 1.f;
    }
    for (GatedDeltaMode mode : {GatedDeltaMode::kRecurrent, GatedDeltaMode::kChunked})
      check_fast(c, mode, "edge " + std::to_string(edge), &worst, &worst_abs);
    Vec s = c.state, o;
    ASSERT_TRUE(gated_delta_rule(delta_params(c, s, o, GatedDeltaMode::kChunked)).ok());
    if (edge == 0) {
      // S = β k̂ vᵀ of the last token: o_t = β (q̂·k̂) v_t.
      for (int64_t t = 0; t < c.rows(); ++t)
        for (int32_t h = 0; h < c.hv; ++h) {
          double qk = 0, qq = 0, kk = 0;
          for (int32_t i = 0; i < c.dk; ++i) {
            qk += double(c.q[t * c.dk + i]) * c.k[t * c.dk + i];
            qq += double(c.q[t * c.dk + i]) * c.q[t * c.dk + i];
            kk += double(c.k[t * c.dk + i]) * c.k[t * c.dk + i];
          }
          const double f = c.beta[t * c.hv + h] * qk / std::sqrt((qq + 1e-6) * (kk + 1e-6)) /
                           std::sqrt(double(c.dk));
          for (int32_t j = 0; j < c.dv; ++j) {
            ASSERT_NEAR(o[(t * c.hv + h) * c.dv + j], f * c.v[(t * c.hv + h) * c.dv + j], 1e-5);
          }
        }
    }
    if (edge == 2) {
      for (size_t i = 0; i < s.size(); ++i) ASSERT_NEAR(s[i], c.state[i], 1e-5);
    }
  }
  std::printf("edge gates: worst err/tol %.3g, max abs err %.3g\n", worst, worst_abs);
}

TEST(GatedDelta, Refusals) {
  std::mt19937 rng(36);
  DeltaCase c = make_delta(2, 3, 8, 8, {2}, rng);  // 3 % 2 != 0
  Vec s = c.state, o;
  EXPECT_FALSE(gated_delta_rule(delta_params(c, s, o)).ok());
  EXPECT_FALSE(gated_delta_rule_ref(delta_params(c, s, o)).ok());
  DeltaCase d = make_delta(1, 1, 8, 8, {2, 3}, rng);
  d.slots = {1, 1};
  Vec s2 = d.state, o2;
  EXPECT_FALSE(gated_delta_rule(delta_params(d, s2, o2)).ok());
}

// ----------------------------------------------------------------------------------------------
// Norms

TEST(GdnNorms, FastMatchesReference) {
  std::mt19937 rng(41);
  double worst = 0;
  for (int64_t dim : {8, 128, 2048}) {
    const int64_t rows = 37;
    Vec x = randn(rows * dim, rng, 2.f), z = randn(rows * dim, rng, 2.f);
    Vec w = randn(dim, rng, 0.3f, 1.f), wz = randn(dim, rng, 0.1f);
    Vec y_ref(rows * dim), y_fast(rows * dim);
    RmsNormGatedParams p;
    p.x = x.data();
    p.z = z.data();
    p.w = w.data();
    p.rows = rows;
    p.dim = dim;
    p.y = y_ref.data();
    ASSERT_TRUE(rms_norm_gated_ref(p).ok());
    p.y = y_fast.data();
    ASSERT_TRUE(rms_norm_gated(p).ok());
    std::vector<double> tol(y_ref.size());
    for (size_t i = 0; i < tol.size(); ++i)
      tol[i] = 2 * (dim / 2 + 10) * kU * std::fabs(y_ref[i]) + 1e-30;
    expect_within(y_fast, y_ref, tol, "gated norm dim " + std::to_string(dim), &worst);
    // In place.
    Vec xi = x;
    p.x = xi.data();
    p.y = xi.data();
    ASSERT_TRUE(rms_norm_gated(p).ok());
    EXPECT_EQ(xi, y_fast);
    ASSERT_TRUE(rms_norm_zc_ref(x.data(), rows, dim, wz.data(), 1e-6f, y_ref.data()).ok());
    ASSERT_TRUE(rms_norm_zc(x.data(), rows, dim, wz.data(), 1e-6f, y_fast.data()).ok());
    for (size_t i = 0; i < tol.size(); ++i)
      tol[i] = 2 * (dim / 2 + 10) * kU * std::fabs(y_ref[i]) + 1e-30;
    expect_within(y_fast, y_ref, tol, "zc norm dim " + std::to_string(dim), &worst);
  }
  // Hand-checked: x = [3, 4] (mean square 12.5), w = 0 (zc: weight 1), eps 0.
  const Vec x = {3, 4}, w0 = {0, 0};
  Vec y(2);
  ASSERT_TRUE(rms_norm_zc_ref(x.data(), 1, 2, w0.data(), 0.f, y.data()).ok());
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-7);
  EXPECT_NEAR(y[1], 4 / std::sqrt(12.5), 1e-7);
  std::printf("norms: worst err/tol %.3g\n", worst);
}

// ----------------------------------------------------------------------------------------------
// The transformers golden (scripts/goldens/gated_delta_golden.py; layouts in its docstring).
// The reference and the golden are both within their bounds of the exact result, so the
// fast path may be off from torch by twice its bound, the float64 reference by once.

TEST(GatedDeltaGolden, Transformers) {
  const std::string path =
      std::string(OSCAR_SOURCE_DIR) + "/tests/data/golden/gated_delta.safetensors";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << path << " absent: generate it with scripts/goldens/gated_delta_golden.py "
                 << "(torch + transformers >= 5)";
  auto file = format::SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto get = [&](const std::string& name) {
    const format::TensorView* t = file->find(name);
    EXPECT_NE(t, nullptr) << name;
    return t ? t->to_f32() : Vec();
  };
  auto dims = [&](const std::string& name) {
    const format::TensorView* t = file->find(name);
    return t ? t->shape : std::vector<int64_t>();
  };
  // Conv: x [B, T, C], w [C, K], state_in/out [B, K-1, C], y [B, T, C].
  {
    const auto sh = dims("conv.x");
    ASSERT_EQ(sh.size(), 3u);
    const int32_t B = static_cast<int32_t>(sh[0]), T = static_cast<int32_t>(sh[1]);
    ConvCase c;
    c.C = sh[2];
    c.K = static_cast<int32_t>(dims("conv.w")[1]);
    c.lens.assign(B, T);
    c.cu = cu_of(c.lens);
    c.slots.resize(B);
    std::iota(c.slots.begin(), c.slots.end(), 0);
    c.x = get("conv.x");
    c.w = get("conv.w");
    c.state = get("conv.state_in");
    c.use_bias = false;
    c.silu = true;
    const Vec want = get("conv.y"), want_state = get("conv.state_out");
    for (bool ref : {true, false}) {
      Vec s = c.state, y;
      CausalConv1dParams p = conv_params(c, s, y);
      ASSERT_TRUE((ref ? causal_conv1d_ref(p) : causal_conv1d(p)).ok());
      std::vector<double> tol = conv_tol(c, want);
      for (double& t : tol) t *= ref ? 1 : 2;
      expect_within(y, want, tol, ref ? "golden conv ref" : "golden conv fast");
      EXPECT_EQ(s, want_state);
    }
    // Zero state: the prefill path (conv1d with left padding).
    Vec zero(c.state.size(), 0.f), y;
    CausalConv1dParams p = conv_params(c, zero, y);
    ASSERT_TRUE(causal_conv1d(p).ok());
    ConvCase cz = c;
    cz.state.assign(c.state.size(), 0.f);
    std::vector<double> tol = conv_tol(cz, y);
    for (double& t : tol) t *= 2;
    expect_within(y, get("conv.y_prefill"), tol, "golden conv prefill");
  }
  // Gates: a, b [B, T, Hv], A_log, dt_bias [Hv] -> g, beta.
  {
    const Vec a = get("gates.a"), b = get("gates.b"), A_log = get("gates.A_log"),
              dt = get("gates.dt_bias");
    const int32_t hv = static_cast<int32_t>(A_log.size());
    Vec g(a.size()), beta(a.size());
    GdnGatesParams p;
    p.a = a.data();
    p.b = b.data();
    p.A_log = A_log.data();
    p.dt_bias = dt.data();
    p.n_tokens = static_cast<int64_t>(a.size()) / hv;
    p.n_heads_v = hv;
    p.g = g.data();
    p.beta = beta.data();
    ASSERT_TRUE(gdn_gates(p).ok());
    const Vec wg = get("gates.g"), wb = get("gates.beta");
    std::vector<double> tg(g.size()), tb(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double x = double(a[i]) + dt[i % hv];
      tg[i] = 4 * (8 * kU * std::fabs(wg[i]) + kU * std::fabs(x) * std::exp(double(A_log[i % hv])));
      tb[i] = 16 * kU * wb[i];
    }
    expect_within(g, wg, tg, "golden g");
    expect_within(beta, wb, tb, "golden beta");
  }
  // Delta rule: q, k [B, T, Hk, dk] (before repeat_interleave), v [B, T, Hv, dv], g, beta
  // [B, T, Hv] (= gates.g, gates.beta), state_in [B, Hv, dk, dv]; outputs of the chunked and the
  // recurrent torch functions: {chunk,recurrent}.o [B, T, Hv, dv], .state [B, Hv, dk, dv].
  {
    const auto qs = dims("delta.q"), vs = dims("delta.v");
    ASSERT_EQ(qs.size(), 4u);
    DeltaCase c;
    const int32_t B = static_cast<int32_t>(qs[0]), T = static_cast<int32_t>(qs[1]);
    c.hk = static_cast<int32_t>(qs[2]);
    c.dk = static_cast<int32_t>(qs[3]);
    c.hv = static_cast<int32_t>(vs[2]);
    c.dv = static_cast<int32_t>(vs[3]);
    c.lens.assign(B, T);
    c.cu = cu_of(c.lens);
    c.slots.resize(B);
    std::iota(c.slots.begin(), c.slots.end(), 0);
    c.q = get("delta.q");
    c.k = get("delta.k");
    c.v = get("delta.v");
    c.g = get("gates.g");
    c.beta = get("gates.beta");
    c.state = get("delta.state_in");
    const DeltaTol tol = delta_tol(c);
    DeltaTol tol2 = tol;
    for (double& t : tol2.o) t *= 2;
    for (double& t : tol2.state) t *= 2;
    for (const char* form : {"chunk", "recurrent"}) {
      const std::string f(form);
      const Vec want_o = get("delta." + f + ".o"), want_s = get("delta." + f + ".state");
      Vec s = c.state, o;
      ASSERT_TRUE(gated_delta_rule_ref(delta_params(c, s, o)).ok());
      expect_within(o, want_o, tol.o, "golden " + f + " ref o");
      expect_within(s, want_s, tol.state, "golden " + f + " ref state");
      for (GatedDeltaMode mode : {GatedDeltaMode::kRecurrent, GatedDeltaMode::kChunked}) {
        s = c.state;
        ASSERT_TRUE(gated_delta_rule(delta_params(c, s, o, mode)).ok());
        expect_within(o, want_o, tol2.o, "golden " + f + " fast " + mode_name(mode) + " o");
        expect_within(s, want_s, tol2.state, "golden " + f + " fast state");
      }
    }
  }
  // Norms: gated x, z [R, dv], w [dv] -> y; zero-centred x [R, D], w [D] -> y.
  {
    const Vec x = get("norm_gated.x"), z = get("norm_gated.z"), w = get("norm_gated.w");
    const int64_t dim = static_cast<int64_t>(w.size()), rows = static_cast<int64_t>(x.size()) / dim;
    Vec y(x.size());
    RmsNormGatedParams p;
    p.x = x.data();
    p.z = z.data();
    p.w = w.data();
    p.rows = rows;
    p.dim = dim;
    p.eps = 1e-6f;
    p.y = y.data();
    ASSERT_TRUE(rms_norm_gated(p).ok());
    const Vec want = get("norm_gated.y");
    std::vector<double> tol(want.size());
    for (size_t i = 0; i < tol.size(); ++i)
      tol[i] = 4 * (dim / 2 + 10) * kU * std::fabs(want[i]) + 1e-30;
    expect_within(y, want, tol, "golden gated norm");
    const Vec xz = get("norm_zc.x"), wz = get("norm_zc.w"), wantz = get("norm_zc.y");
    const int64_t dz = static_cast<int64_t>(wz.size());
    Vec yz(xz.size());
    ASSERT_TRUE(rms_norm_zc(xz.data(), static_cast<int64_t>(xz.size()) / dz, dz, wz.data(), 1e-6f,
                            yz.data())
                    .ok());
    tol.assign(wantz.size(), 0);
    for (size_t i = 0; i < tol.size(); ++i)
      tol[i] = 4 * (dz / 2 + 10) * kU * std::fabs(wantz[i]) + 1e-30;
    expect_within(yz, wantz, tol, "golden zc norm");
  }
}

}  // namespace
}  // namespace oscar::kernels
