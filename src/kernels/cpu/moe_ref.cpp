// CPU references of the MoE ops (kernels/moe.h): plain loops, float64 softmax, products and sums.
// They define "correct" for the fast CPU path (cpu/moe.cpp) and any device version. Shared
// checks and the expert order (select_top_k) live here too, so that every path selects alike.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/moe_common.h"
#include "kernels/moe.h"

namespace oscar::kernels {

namespace moe_detail {

Status check_route(const MoeRouteParams& p) {
  if (p.n < 0 || p.n_experts <= 0 || p.top_k <= 0 || p.top_k > p.n_experts)
    return invalid_argument("moe_route: bad shape (n %lld, %d experts, top %d)",
                            static_cast<long long>(p.n), p.n_experts, p.top_k);
  if (p.n > 0 && (p.logits == nullptr || p.expert_ids == nullptr || p.weights == nullptr))
    return invalid_argument("moe_route: null logits, expert_ids or weights");
  return Status();
}

Status check_ffn(const MoeFfnParams& p) {
  const ExpertWeights &g = p.gate, &u = p.up, &d = p.down;
  const int64_t hidden = g.cols, inter = g.rows;
  if (p.n < 0 || p.top_k <= 0 || g.n_experts <= 0 || hidden <= 0 || inter <= 0 ||
      p.top_k > g.n_experts)
    return invalid_argument("moe_ffn: bad shape (n %lld, top %d, %d experts, gate %lld x %lld)",
                            static_cast<long long>(p.n), p.top_k, g.n_experts,
                            static_cast<long long>(inter), static_cast<long long>(hidden));
  if (u.n_experts != g.n_experts || d.n_experts != g.n_experts || u.rows != inter ||
      u.cols != hidden || d.rows != hidden || d.cols != inter)
    return invalid_argument(
        "moe_ffn: expert shapes disagree (gate %d x [%lld, %lld], up %d x [%lld, %lld], down %d x "
        "[%lld, %lld])",
        g.n_experts, static_cast<long long>(g.rows), static_cast<long long>(g.cols), u.n_experts,
        static_cast<long long>(u.rows), static_cast<long long>(u.cols), d.n_experts,
        static_cast<long long>(d.rows), static_cast<long long>(d.cols));
  for (const ExpertWeights* w : {&g, &u, &d})
    if (w->dtype != DType::kF32 && w->dtype != DType::kBF16)
      return invalid_argument("moe_ffn: unknown weight dtype %d", static_cast<int>(w->dtype));
  if (p.n > 0 &&
      (p.x == nullptr || p.y == nullptr || p.expert_ids == nullptr || p.weights == nullptr ||
       g.data == nullptr || u.data == nullptr || d.data == nullptr))
    return invalid_argument("moe_ffn: null x, y, routing or weights");
  const int64_t slots = p.n * p.top_k;
  for (int64_t s = 0; s < slots; ++s)
    if (p.expert_ids[s] < 0 || p.expert_ids[s] >= g.n_experts)
      return invalid_argument("moe_ffn: row %lld slot %lld names expert %d of %d",
                              static_cast<long long>(s / p.top_k),
                              static_cast<long long>(s % p.top_k), p.expert_ids[s], g.n_experts);
  return Status();
}

void select_top_k(const float* logits, int32_t n_experts, int32_t top_k, int32_t* ids) {
  // NaN ranks below every number (a NaN row still names valid experts; its weights are NaN).
  auto key = [&](int32_t e) {
    const float v = logits[e];
    return std::isnan(v) ? -INFINITY : v;
  };
  auto before = [&](int32_t a, int32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  };
  // Insertion into a sorted list of top_k: top_k is small (8 of 128 in Qwen3-30B-A3B).
  int32_t count = 0;
  for (int32_t e = 0; e < n_experts; ++e) {
    if (count == top_k && !before(e, ids[top_k - 1])) continue;
    int32_t i = count < top_k ? count++ : top_k - 1;
    while (i > 0 && before(e, ids[i - 1])) {
      ids[i] = ids[i - 1];
      --i;
    }
    ids[i] = e;
  }
}

}  // namespace moe_detail

namespace {

double weight_at(const WeightView& w, int64_t r, int64_t c) {
  if (w.dtype == DType::kF32) return static_cast<const float*>(w.data)[r * w.cols + c];
  return bf16_to_f32(static_cast<const bf16_t*>(w.data)[r * w.cols + c]);
}

}  // namespace

Status moe_route_ref(const MoeRouteParams& p) {
  OSCAR_RETURN_IF_ERROR(moe_detail::check_route(p));
  const int32_t E = p.n_experts, K = p.top_k;
  for (int64_t t = 0; t < p.n; ++t) {
    const float* l = p.logits + t * E;
    int32_t* ids = p.expert_ids + t * K;
    float* w = p.weights + t * K;
    moe_detail::select_top_k(l, E, K, ids);
    double m = -INFINITY;
    for (int32_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(l[e]));
    // p = softmax(l) over every expert (a NaN logit makes the row's weights NaN), then the
    // selected p renormalised if asked, as transformers computes them.
    double all = 0, top = 0;
    for (int32_t e = 0; e < E; ++e) all += std::exp(static_cast<double>(l[e]) - m);
    std::vector<double> pj(static_cast<size_t>(K));
    for (int32_t j = 0; j < K; ++j) {
      pj[j] = std::exp(static_cast<double>(l[ids[j]]) - m) / all;
      top += pj[j];
    }
    for (int32_t j = 0; j < K; ++j)
      w[j] = static_cast<float>(p.norm_topk_prob ? pj[j] / top : pj[j]);
  }
  return Status();
}

Status moe_ffn_ref(const MoeFfnParams& p) {
  OSCAR_RETURN_IF_ERROR(moe_detail::check_ffn(p));
  const int64_t hidden = p.gate.cols, inter = p.gate.rows;
  std::vector<double> act(static_cast<size_t>(inter)), acc(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < p.n; ++t) {
    const float* x = p.x + t * hidden;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int32_t j = 0; j < p.top_k; ++j) {
      const int32_t e = p.expert_ids[t * p.top_k + j];
      const double wj = p.weights[t * p.top_k + j];
      const WeightView g = p.gate.expert(e), u = p.up.expert(e), d = p.down.expert(e);
      for (int64_t i = 0; i < inter; ++i) {
        double gi = 0, ui = 0;
        for (int64_t c = 0; c < hidden; ++c) {
          gi += static_cast<double>(x[c]) * weight_at(g, i, c);
          ui += static_cast<double>(x[c]) * weight_at(u, i, c);
        }
        act[i] = gi / (1.0 + std::exp(-gi)) * ui;  // silu(gate) * up
      }
      for (int64_t h = 0; h < hidden; ++h) {
        double o = 0;
        for (int64_t i = 0; i < inter; ++i) o += act[i] * weight_at(d, h, i);
        acc[h] += wj * o;
      }
    }
    for (int64_t h = 0; h < hidden; ++h) p.y[t * hidden + h] = static_cast<float>(acc[h]);
  }
  return Status();
}

}  // namespace oscar::kernels
