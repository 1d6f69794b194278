// CPU references of the Gated DeltaNet ops (kernels/gated_delta.h): plain loops in float64. They
// define "correct" for the fast CPU path (cpu/gated_delta.cpp) and any device version; the delta
// rule's is the recurrence, token by token. The shared params checks live here too.
#include <cmath>
#include <set>
#include <vector>

#include "kernels/cpu/gated_delta_common.h"
#include "kernels/gated_delta.h"

namespace oscar::kernels {

namespace gdn_detail {

namespace {

Status check_batch(const char* op, const int32_t* cu, int32_t n_seqs, const int32_t* slots) {
  if (n_seqs < 0) return invalid_argument("%s: n_seqs %d < 0", op, n_seqs);
  if (n_seqs == 0) return Status();
  if (cu == nullptr) return invalid_argument("%s: null cu_seqlens", op);
  if (cu[0] != 0) return invalid_argument("%s: cu_seqlens[0] = %d, not 0", op, cu[0]);
  for (int32_t s = 0; s < n_seqs; ++s)
    if (cu[s + 1] < cu[s])
      return invalid_argument("%s: cu_seqlens not ascending at sequence %d (%d > %d)", op, s, cu[s],
                              cu[s + 1]);
  if (slots != nullptr) {
    std::set<int32_t> seen;
    for (int32_t s = 0; s < n_seqs; ++s) {
      if (slots[s] < 0) return invalid_argument("%s: sequence %d has slot %d", op, s, slots[s]);
      if (!seen.insert(slots[s]).second)
        return invalid_argument("%s: slot %d named twice (sequence %d)", op, slots[s], s);
    }
  }
  return Status();
}

}  // namespace

Status check_conv(const CausalConv1dParams& p) {
  if (p.channels <= 0 || p.kernel_size < 1)
    return invalid_argument("causal_conv1d: bad shape (channels %lld, kernel %d)",
                            static_cast<long long>(p.channels), p.kernel_size);
  OSCAR_RETURN_IF_ERROR(check_batch("causal_conv1d", p.cu_seqlens, p.n_seqs, p.slots));
  if (p.n_seqs > 0 && (p.w == nullptr || (p.kernel_size > 1 && p.state == nullptr)))
    return invalid_argument("causal_conv1d: null weight or state");
  if (p.n_seqs > 0 && p.cu_seqlens[p.n_seqs] > 0 && (p.x == nullptr || p.y == nullptr))
    return invalid_argument("causal_conv1d: null x or y");
  if (p.x != nullptr && p.x == p.y) return invalid_argument("causal_conv1d: y aliases x");
  return Status();
}

Status check_gates(const GdnGatesParams& p) {
  if (p.n_tokens < 0 || p.n_heads_v <= 0)
    return invalid_argument("gdn_gates: bad shape (n_tokens %lld, heads %d)",
                            static_cast<long long>(p.n_tokens), p.n_heads_v);
  if (p.n_tokens > 0 && (p.a == nullptr || p.b == nullptr || p.A_log == nullptr ||
                         p.dt_bias == nullptr || p.g == nullptr || p.beta == nullptr))
    return invalid_argument("gdn_gates: null pointer");
  return Status();
}

Status check_delta(const GatedDeltaParams& p, const char* op) {
  if (p.n_heads_k <= 0 || p.n_heads_v <= 0 || p.d_k <= 0 || p.d_v <= 0 ||
      p.n_heads_v % p.n_heads_k != 0)
    return invalid_argument("%s: bad shape (heads k %d v %d, d_k %d, d_v %d)", op, p.n_heads_k,
                            p.n_heads_v, p.d_k, p.d_v);
  if (p.q_stride < 0 || p.k_stride < 0 || p.v_stride < 0 ||
      (p.q_stride && p.q_stride < int64_t{p.n_heads_k} * p.d_k) ||
      (p.k_stride && p.k_stride < int64_t{p.n_heads_k} * p.d_k) ||
      (p.v_stride && p.v_stride < int64_t{p.n_heads_v} * p.d_v))
    return invalid_argument("%s: row strides q %lld k %lld v %lld shorter than a row", op,
                            static_cast<long long>(p.q_stride), static_cast<long long>(p.k_stride),
                            static_cast<long long>(p.v_stride));
  OSCAR_RETURN_IF_ERROR(check_batch(op, p.cu_seqlens, p.n_seqs, p.slots));
  if (p.n_seqs > 0 && p.state == nullptr) return invalid_argument("%s: null state", op);
  if (p.n_seqs > 0 && p.cu_seqlens[p.n_seqs] > 0 &&
      (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.g == nullptr || p.beta == nullptr ||
       p.o == nullptr))
    return invalid_argument("%s: null q, k, v, g, beta or o", op);
  return Status();
}

Status check_norm(const RmsNormGatedParams& p, const char* op) {
  if (p.rows < 0 || p.dim <= 0)
    return invalid_argument("%s: bad shape (rows %lld, dim %lld)", op,
                            static_cast<long long>(p.rows), static_cast<long long>(p.dim));
  if (p.rows > 0 && (p.x == nullptr || p.w == nullptr || p.y == nullptr))
    return invalid_argument("%s: null x, w or y", op);
  return Status();
}

}  // namespace gdn_detail

using gdn_detail::slot_of;
using gdn_detail::stride_or;

namespace {
double silu(double x) { return x / (1.0 + std::exp(-x)); }
}  // namespace

Status causal_conv1d_ref(const CausalConv1dParams& p) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_conv(p));
  const int64_t C = p.channels, K = p.kernel_size, H = K - 1;
  for (int32_t s = 0; s < p.n_seqs; ++s) {
    const int64_t t0 = p.cu_seqlens[s], T = p.cu_seqlens[s + 1] - t0;
    float* st = H > 0 ? p.state + static_cast<int64_t>(slot_of(p.slots, s)) * H * C : nullptr;
    // u = cat(state, x): u[i] for i in [0, H + T).
    auto u = [&](int64_t i, int64_t c) -> double {
      return i < H ? st[i * C + c] : p.x[(t0 + i - H) * C + c];
    };
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double acc = p.bias ? p.bias[c] : 0.0;
        for (int64_t j = 0; j < K; ++j) acc += double(p.w[c * K + j]) * u(t + j, c);
        p.y[(t0 + t) * C + c] = static_cast<float>(p.silu ? silu(acc) : acc);
      }
    // The new state: the last H entries of u (read before any is overwritten).
    std::vector<float> next(static_cast<size_t>(H * C));
    for (int64_t r = 0; r < H; ++r)
      for (int64_t c = 0; c < C; ++c) next[r * C + c] = static_cast<float>(u(T + r, c));
    for (int64_t i = 0; i < H * C; ++i) st[i] = next[i];
  }
  return Status();
}

Status gdn_gates_ref(const GdnGatesParams& p) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_gates(p));
  for (int64_t t = 0; t < p.n_tokens; ++t)
    for (int32_t h = 0; h < p.n_heads_v; ++h) {
      const int64_t i = t * p.n_heads_v + h;
      const double x = double(p.a[i]) + p.dt_bias[h];
      const double sp = x > 20.0 ? x : std::log1p(std::exp(x));
      p.g[i] = static_cast<float>(-std::exp(double(p.A_log[h])) * sp);
      p.beta[i] = static_cast<float>(1.0 / (1.0 + std::exp(-double(p.b[i]))));
    }
  return Status();
}

Status gated_delta_rule_ref(const GatedDeltaParams& p) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_delta(p, "gated_delta_rule_ref"));
  const int64_t dk = p.d_k, dv = p.d_v, hv = p.n_heads_v, ratio = p.n_heads_v / p.n_heads_k;
  const int64_t qs = stride_or(p.q_stride, p.n_heads_k * dk),
                ks = stride_or(p.k_stride, p.n_heads_k * dk), vs = stride_or(p.v_stride, hv * dv);
  const double scale = 1.0 / std::sqrt(double(dk));
  std::vector<double> S(static_cast<size_t>(dk * dv)), q(dk), k(dk), m(dv);
  for (int32_t s = 0; s < p.n_seqs; ++s) {
    const int64_t t0 = p.cu_seqlens[s], t1 = p.cu_seqlens[s + 1];
    for (int64_t h = 0; h < hv; ++h) {
      float* st = p.state + (static_cast<int64_t>(slot_of(p.slots, s)) * hv + h) * dk * dv;
      for (int64_t i = 0; i < dk * dv; ++i) S[i] = st[i];
      const int64_t hk = h / ratio;
      for (int64_t t = t0; t < t1; ++t) {
        const float* qt = p.q + t * qs + hk * dk;
        const float* kt = p.k + t * ks + hk * dk;
        const float* vt = p.v + t * vs + h * dv;
        double qn = 0, kn = 0;
        for (int64_t i = 0; i < dk; ++i) {
          q[i] = qt[i];
          k[i] = kt[i];
          qn += q[i] * q[i];
          kn += k[i] * k[i];
        }
        const double qf = (p.l2norm_qk ? 1.0 / std::sqrt(qn + kGdnL2NormEps) : 1.0) * scale;
        const double kf = p.l2norm_qk ? 1.0 / std::sqrt(kn + kGdnL2NormEps) : 1.0;
        for (int64_t i = 0; i < dk; ++i) {
          q[i] *= qf;
          k[i] *= kf;
        }
        const double decay = std::exp(double(p.g[t * hv + h])), beta = p.beta[t * hv + h];
        for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < dk; ++i) acc += k[i] * S[i * dv + j];
          m[j] = (double(vt[j]) - acc) * beta;  // δ
        }
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[i] * m[j];
        float* ot = p.o + (t * hv + h) * dv;
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < dk; ++i) acc += q[i] * S[i * dv + j];
          ot[j] = static_cast<float>(acc);
        }
      }
      for (int64_t i = 0; i < dk * dv; ++i) st[i] = static_cast<float>(S[i]);
    }
  }
  return Status();
}

Status rms_norm_gated_ref(const RmsNormGatedParams& p) {
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_norm(p, "rms_norm_gated_ref"));
  if (p.rows > 0 && p.z == nullptr) return invalid_argument("rms_norm_gated_ref: null z");
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.dim;
    const float* z = p.z + r * p.dim;
    double ss = 0;
    for (int64_t i = 0; i < p.dim; ++i) ss += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / double(p.dim) + p.eps);
    for (int64_t i = 0; i < p.dim; ++i)
      p.y[r * p.dim + i] = static_cast<float>(double(x[i]) * inv * p.w[i] * silu(z[i]));
  }
  return Status();
}

Status rms_norm_zc_ref(const float* x, int64_t rows, int64_t dim, const float* w, float eps,
                       float* y) {
  RmsNormGatedParams chk;
  chk.x = x;
  chk.w = w;
  chk.y = y;
  chk.rows = rows;
  chk.dim = dim;
  OSCAR_RETURN_IF_ERROR(gdn_detail::check_norm(chk, "rms_norm_zc_ref"));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = static_cast<float>(double(x[r * dim + i]) * inv * (1.0 + double(w[i])));
  }
  return Status();
}

}  // namespace oscar::kernels
