// Fast CPU Gated DeltaNet ops (kernels/gated_delta.h), float32: the conv with channels in vector
// lanes, the delta rule by (sequence, value head) over threads (decode recurrent, prefill
// chunked with Eigen products per chunk), gates and norms as simple loops. Tested against the
// float64 references of cpu/gated_delta_ref.cpp (tests/kernels/test_gated_delta.cpp).
#include "kernels/gated_delta.h"

#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gated_delta_common.h"

namespace oscar::kernels {

using gdn_detail::slot_of;
using gdn_detail::stride_or;

namespace {

inline float silu_f(float x) { return x / (1.f + std::exp(-x)); }

constexpr int64_t kConvBlock = 256;  // channels per work item of the conv

}  // namespace

Status causal_conv1d(const CausalConv1dParams& p) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_conv(p));
  const int64_t C = p.channels, K = p.kernel_size, H = K - 1;
  // w transposed to [K, C] so that every tap is a contiguous row over the channels.
  std::vector<float> wt(static_cast<size_t>(K * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) wt[j * C + c] = p.w[c * K + j];
  const int64_t blocks = (C + kConvBlock - 1) / kConvBlock;
  const int64_t items = int64_t{p.n_seqs} * blocks;
  const int64_t rows = p.n_seqs > 0 ? p.cu_seqlens[p.n_seqs] : 0;
#pragma omp parallel for schedule(dynamic, 1) if (rows * C * K >= (int64_t{1} << 16))
  for (int64_t it = 0; it < items; ++it) {
    const int32_t s = static_cast<int32_t>(it / blocks);
    const int64_t c0 = (it % blocks) * kConvBlock, c1 = std::min(C, c0 + kConvBlock);
    const int64_t t0 = p.cu_seqlens[s], T = p.cu_seqlens[s + 1] - t0;
    float* st = H > 0 ? p.state + static_cast<int64_t>(slot_of(p.slots, s)) * H * C : nullptr;
    for (int64_t t = 0; t < T; ++t) {
      float* y = p.y + (t0 + t) * C;
      for (int64_t c = c0; c < c1; ++c) y[c] = p.bias ? p.bias[c] : 0.f;
      // Tap j reads u[t + j] = cat(state, x)[t + j].
      for (int64_t j = 0; j < K; ++j) {
        const int64_t i = t + j;
        const float* u = i < H ? st + i * C : p.x + (t0 + i - H) * C;
        const float* w = wt.data() + j * C;
        for (int64_t c = c0; c < c1; ++c) y[c] += w[c] * u[c];
      }
      if (p.silu)
        for (int64_t c = c0; c < c1; ++c) y[c] = silu_f(y[c]);
    }
    // New state row r = u[T + r]: old rows move forward (r ascending reads r + T > r first).
    for (int64_t r = 0; r < H; ++r) {
      const int64_t i = T + r;
      const float* u = i < H ? st + i * C : p.x + (t0 + i - H) * C;
      std::copy(u + c0, u + c1, st + r * C + c0);
    }
  }
  return Status();
}

Status gdn_gates(const GdnGatesParams& p) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_gates(p));
  for (int64_t t = 0; t < p.n_tokens; ++t)
    for (int32_t h = 0; h < p.n_heads_v; ++h) {
      const int64_t i = t * p.n_heads_v + h;
      const float x = p.a[i] + p.dt_bias[h];
      const float sp = x > 20.f ? x : std::log1p(std::exp(x));
      p.g[i] = -std::exp(p.A_log[h]) * sp;
      p.beta[i] = 1.f / (1.f + std::exp(-p.b[i]));
    }
  return Status();
}

namespace {

template <typename R>
using RowMat = Eigen::Matrix<R, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename R>
using Vec = Eigen::Matrix<R, Eigen::Dynamic, 1>;

// One thread's scratch for the delta rule (sized on first use, reused across items).
template <typename R>
struct DeltaScratch {
  RowMat<R> S;            // [d_k, d_v] the state
  RowMat<R> Q, K, V;      // [n, d_k], [n, d_k], [n, d_v] one chunk's rows (q̂, k̂, v)
  RowMat<R> Gam, L, A;    // [n, n] decays, the system, the intra-chunk scores
  RowMat<R> X;            // [n, d_v + d_k] right-hand sides, then [U | W]
  RowMat<R> Vn, O;        // [n, d_v]
  std::vector<double> G;  // [n] cumulative log decay within the chunk
  Vec<R> beta, eG, eGl;   // [n]
  Vec<R> m;               // [d_v] recurrence scratch
};

struct HeadRows {
  int64_t qs, ks, vs;  // row strides
  int64_t hk;          // key head of this value head
};

// q̂ and k̂ of row t into q[0..dk) and k[0..dk).
template <typename R>
inline void load_qk(const GatedDeltaParams& p, const HeadRows& hr, int64_t t, R* q, R* k) {
  const int64_t dk = p.d_k;
  const float* qt = p.q + t * hr.qs + hr.hk * dk;
  const float* kt = p.k + t * hr.ks + hr.hk * dk;
  R qn = 0, kn = 0;
  for (int64_t i = 0; i < dk; ++i) {
    qn += R(qt[i]) * R(qt[i]);
    kn += R(kt[i]) * R(kt[i]);
  }
  const R scale = R(1) / std::sqrt(R(dk));
  const R qf = (p.l2norm_qk ? R(1) / std::sqrt(qn + R(kGdnL2NormEps)) : R(1)) * scale;
  const R kf = p.l2norm_qk ? R(1) / std::sqrt(kn + R(kGdnL2NormEps)) : R(1);
  for (int64_t i = 0; i < dk; ++i) {
    q[i] = R(qt[i]) * qf;
    k[i] = R(kt[i]) * kf;
  }
}

// Rows [t0, t1) of value head h by the recurrence, state in w.S.
template <typename R>
void recurrent_rows(const GatedDeltaParams& p, const HeadRows& hr, int64_t h, int64_t t0,
                    int64_t t1, DeltaScratch<R>& w) {
  const int64_t dk = p.d_k, dv = p.d_v, hv = p.n_heads_v;
  w.Q.resize(1, dk);
  w.K.resize(1, dk);
  w.m.resize(dv);
  R* q = w.Q.data();
  R* k = w.K.data();
  R* m = w.m.data();
  R* S = w.S.data();
  for (int64_t t = t0; t < t1; ++t) {
    load_qk(p, hr, t, q, k);
    const float* vt = p.v + t * hr.vs + h * dv;
    const R decay = std::exp(R(p.g[t * hv + h])), beta = R(p.beta[t * hv + h]);
    // S ← S·e^g and m = k̂ᵀS in one pass over S.
    std::fill(m, m + dv, R(0));
    for (int64_t i = 0; i < dk; ++i) {
      R* row = S + i * dv;
      const R ki = k[i];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] *= decay;
        m[j] += ki * row[j];
      }
    }
    for (int64_t j = 0; j < dv; ++j) m[j] = (R(vt[j]) - m[j]) * beta;  // δ
    // S ← S + k̂ ⊗ δ and o = q̂ᵀS in one pass.
    float* ot = p.o + (t * hv + h) * dv;
    Vec<R>& acc = w.beta;  // [d_v] borrowed
    acc.setZero(dv);
    R* a = acc.data();
    for (int64_t i = 0; i < dk; ++i) {
      R* row = S + i * dv;
      const R ki = k[i], qi = q[i];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] += ki * m[j];
        a[j] += qi * row[j];
      }
    }
    for (int64_t j = 0; j < dv; ++j) ot[j] = static_cast<float>(a[j]);
  }
}

// Rows [t0, t1) of value head h by the chunked form (kernels/gated_delta.h), state in w.S.
template <typename R>
void chunked_rows(const GatedDeltaParams& p, const HeadRows& hr, int64_t h, int64_t t0, int64_t t1,
                  DeltaScratch<R>& w) {
  const int64_t dk = p.d_k, dv = p.d_v, hv = p.n_heads_v;
  for (int64_t c0 = t0; c0 < t1; c0 += kGatedDeltaChunk) {
    const int64_t n = std::min<int64_t>(kGatedDeltaChunk, t1 - c0);
    w.Q.resize(n, dk);
    w.K.resize(n, dk);
    w.V.resize(n, dv);
    w.G.resize(static_cast<size_t>(n));
    w.beta.resize(n);
    w.eG.resize(n);
    w.eGl.resize(n);
    double G = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = c0 + i;
      load_qk(p, hr, t, &w.Q(i, 0), &w.K(i, 0));
      const float* vt = p.v + t * hr.vs + h * dv;
      for (int64_t j = 0; j < dv; ++j) w.V(i, j) = R(vt[j]);
      G += double(p.g[t * hv + h]);
      w.G[i] = G;
      w.beta[i] = R(p.beta[t * hv + h]);
      w.eG[i] = R(std::exp(G));
    }
    const double Gl = w.G[n - 1];
    for (int64_t i = 0; i < n; ++i) w.eGl[i] = R(std::exp(Gl - w.G[i]));
    // Γ_ij = exp(G_i - G_j) for i >= j, else 0 (differences of float64 sums: accurate when the
    // sums are large).
    w.Gam.setZero(n, n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) w.Gam(i, j) = R(std::exp(w.G[i] - w.G[j]));
    // L = strictly-lower(diag(β) K Kᵀ ∘ Γ); the unit-lower solve ignores its diagonal.
    w.L.noalias() = w.K * w.K.transpose();
    w.L = (w.beta.asDiagonal() * w.L).cwiseProduct(w.Gam);
    // [U | W] = (I + L)⁻¹ [diag(β) V | diag(β e^G) K].
    w.X.resize(n, dv + dk);
    w.X.leftCols(dv) = w.beta.asDiagonal() * w.V;
    w.X.rightCols(dk) = (w.beta.cwiseProduct(w.eG)).asDiagonal() * w.K;
    w.L.template triangularView<Eigen::UnitLower>().solveInPlace(w.X);
    // V' = U - W S;  O = (Q ∘ e^G) S + lower(Q Kᵀ ∘ Γ) V'.
    w.Vn = w.X.leftCols(dv);
    w.Vn.noalias() -= w.X.rightCols(dk) * w.S;
    w.A.noalias() = w.Q * w.K.transpose();
    w.A = w.A.cwiseProduct(w.Gam);
    w.O.noalias() = (w.eG.asDiagonal() * w.Q) * w.S;
    w.O.noalias() += w.A.template triangularView<Eigen::Lower>() * w.Vn;
    for (int64_t i = 0; i < n; ++i) {
      float* ot = p.o + ((c0 + i) * hv + h) * dv;
      for (int64_t j = 0; j < dv; ++j) ot[j] = static_cast<float>(w.O(i, j));
    }
    // S ← e^{G_n} S + (K ∘ e^{G_n - G})ᵀ V'.
    w.S *= R(std::exp(Gl));
    w.S.noalias() += (w.eGl.asDiagonal() * w.K).transpose() * w.Vn;
  }
}

template <typename R>
Status run_delta(const GatedDeltaParams& p, GatedDeltaMode mode, const char* op) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_delta(p, op));
  const int64_t dk = p.d_k, dv = p.d_v, hv = p.n_heads_v;
  const int64_t items = int64_t{p.n_seqs} * hv;
  const int64_t rows = p.n_seqs > 0 ? p.cu_seqlens[p.n_seqs] : 0;
  const bool parallel = (rows + p.n_seqs) * hv * dk * dv >= (int64_t{1} << 16);
#pragma omp parallel if (parallel)
  {
    DeltaScratch<R> w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int32_t s = static_cast<int32_t>(it / hv);
      const int64_t h = it % hv;
      const int64_t t0 = p.cu_seqlens[s], t1 = p.cu_seqlens[s + 1];
      HeadRows hr;
      hr.qs = stride_or(p.q_stride, int64_t{p.n_heads_k} * dk);
      hr.ks = stride_or(p.k_stride, int64_t{p.n_heads_k} * dk);
      hr.vs = stride_or(p.v_stride, hv * dv);
      hr.hk = h / (hv / p.n_heads_k);
      float* st = p.state + (static_cast<int64_t>(slot_of(p.slots, s)) * hv + h) * dk * dv;
      w.S = Eigen::Map<const RowMat<float>>(st, dk, dv).template cast<R>();
      const bool chunked =
          mode == GatedDeltaMode::kChunked || (mode == GatedDeltaMode::kAuto && t1 - t0 > 1);
      if (chunked)
        chunked_rows(p, hr, h, t0, t1, w);
      else
        recurrent_rows(p, hr, h, t0, t1, w);
      Eigen::Map<RowMat<float>>(st, dk, dv) = w.S.template cast<float>();
    }
  }
  return Status();
}

}  // namespace

Status gated_delta_rule(const GatedDeltaParams& p) {
  return run_delta<float>(p, p.mode, "gated_delta_rule");
}

Status gated_delta_rule_chunked_f64(const GatedDeltaParams& p) {
  return run_delta<double>(p, GatedDeltaMode::kChunked, "gated_delta_rule_chunked_f64");
}

Status rms_norm_gated(const RmsNormGatedParams& p) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_norm(p, "rms_norm_gated"));
  if (p.rows > 0 && p.z == nullptr) return invalid_argument("rms_norm_gated: null z");
#pragma omp parallel for schedule(static) if (p.rows * p.dim >= (int64_t{1} << 16))
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.dim;
    const float* z = p.z + r * p.dim;
    float ss = 0;
    for (int64_t i = 0; i < p.dim; ++i) ss += x[i] * x[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(p.dim) + p.eps);
    float* y = p.y + r * p.dim;
    for (int64_t i = 0; i < p.dim; ++i) y[i] = x[i] * inv * p.w[i] * silu_f(z[i]);
  }
  return Status();
}

Status rms_norm_zc(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y) {
  RmsNormGatedParams chk;
  chk.x = x;
  chk.w = w;
  chk.y = y;
  chk.rows = rows;
  chk.dim = dim;
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_norm(chk, "rms_norm_zc"));
#pragma omp parallel for schedule(static) if (rows * dim >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
    float* yr = y + r * dim;
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * (1.f + w[i]);
  }
  return Status();
}

}  // namespace oscar::kernels
