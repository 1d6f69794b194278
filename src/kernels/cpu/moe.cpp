// Fast CPU MoE ops (kernels/moe.h): float32 routing, and the expert FFN grouped by expert over the
// CPU linear() kernels (cpu/linear.cpp). Tested against cpu/moe_ref.cpp
// (tests/kernels/test_moe.cpp).
#include "kernels/moe.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/moe_common.h"
#include "kernels/elementwise.h"

namespace oscar::kernels {

namespace {

constexpr int64_t kFewRows = 8;  // linear()'s streaming (decode) path takes up to this many rows

size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// The scratch of moe_ffn, carved from MoeFfnParams::work in this order.
struct FfnWork {
  float* xs;         // [slots, hidden] x rows grouped by expert; then their expert outputs
                     // (an expert's down product overwrites its own rows, read by then)
  float* gate;       // [slots, inter]
  float* up;         // [slots, inter]
  int32_t* pos;      // [slots] grouped position of slot t·top_k + j
  int32_t* offsets;  // [n_experts + 1] first grouped row of each expert
  int32_t* cursor;   // [n_experts]
  int32_t* active;   // [n_experts] the experts with rows, ascending
};

size_t layout(int64_t slots, int32_t n_experts, int64_t hidden, int64_t inter, uint8_t* base,
              FfnWork* w) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    uint8_t* p = base == nullptr ? nullptr : base + off;
    off += align64(bytes);
    return p;
  };
  const size_t s = static_cast<size_t>(slots), e = static_cast<size_t>(n_experts);
  FfnWork v;
  v.xs = reinterpret_cast<float*>(take(s * hidden * sizeof(float)));
  v.gate = reinterpret_cast<float*>(take(s * inter * sizeof(float)));
  v.up = reinterpret_cast<float*>(take(s * inter * sizeof(float)));
  v.pos = reinterpret_cast<int32_t*>(take(s * sizeof(int32_t)));
  v.offsets = reinterpret_cast<int32_t*>(take((e + 1) * sizeof(int32_t)));
  v.cursor = reinterpret_cast<int32_t*>(take(e * sizeof(int32_t)));
  v.active = reinterpret_cast<int32_t*>(take(e * sizeof(int32_t)));
  if (w != nullptr) *w = v;
  return off;
}

// One expert over its grouped rows [r0, r0 + rows): gate/up, SiLU·mul, down.
Status run_expert(const MoeFfnParams& p, const FfnWork& w, int32_t e, int64_t r0, int64_t rows) {
  const int64_t hidden = p.gate.cols, inter = p.gate.rows;
  LinearParams g;
  g.x = w.xs + r0 * hidden;
  g.n = rows;
  g.w = p.gate.expert(e);
  g.y = w.gate + r0 * inter;
  g.batch_invariant = p.batch_invariant;  // an expert's row count depends on the batch
  LinearParams u = g;
  u.w = p.up.expert(e);
  u.y = w.up + r0 * inter;
  OSCAR_RETURN_IF_ERROR(linear(g));
  OSCAR_RETURN_IF_ERROR(linear(u));
  OSCAR_RETURN_IF_ERROR(silu_mul(g.y, u.y, rows * inter));
  LinearParams d;
  d.x = g.y;
  d.n = rows;
  d.w = p.down.expert(e);
  d.y = w.xs + r0 * hidden;  // gate/up have read these rows
  d.batch_invariant = p.batch_invariant;
  return linear(d);
}

}  // namespace

size_t moe_ffn_work_bytes(int64_t n, int32_t top_k, int32_t n_experts, int64_t hidden,
                          int64_t moe_inter) {
  return layout(n * top_k, n_experts, hidden, moe_inter, nullptr, nullptr);
}

Status moe_route(const MoeRouteParams& p) {
  OSCAR_RETURN_IF_ERROR(moe_detail::check_route(p));
  const int32_t E = p.n_experts, K = p.top_k;
#pragma omp parallel for schedule(static) if (p.n * E >= 4096)
  for (int64_t t = 0; t < p.n; ++t) {
    const float* l = p.logits + t * E;
    int32_t* ids = p.expert_ids + t * K;
    float* w = p.weights + t * K;
    moe_detail::select_top_k(l, E, K, ids);
    // softmax in float32 as torch computes it: max-subtracted exponentials over their sum.
    float m = -INFINITY;
    for (int32_t e = 0; e < E; ++e) m = std::max(m, l[e]);
    float all = 0.f;
    for (int32_t e = 0; e < E; ++e) all += std::exp(l[e] - m);
    float top = 0.f;
    for (int32_t j = 0; j < K; ++j) {
      w[j] = std::exp(l[ids[j]] - m) / all;
      top += w[j];
    }
    if (p.norm_topk_prob)
      for (int32_t j = 0; j < K; ++j) w[j] /= top;
  }
  return Status();
}

Status moe_ffn(const MoeFfnParams& p) {
  OSCAR_RETURN_IF_ERROR(moe_detail::check_ffn(p));
  if (p.n == 0) return Status();
  const int64_t hidden = p.gate.cols, inter = p.gate.rows, slots = p.n * p.top_k;
  const int32_t E = p.gate.n_experts;
  const size_t need = moe_ffn_work_bytes(p.n, p.top_k, E, hidden, inter);
  if (p.work == nullptr || p.work_bytes < need || reinterpret_cast<uintptr_t>(p.work) % 16 != 0)
    return invalid_argument("moe_ffn: work %zu bytes at %p, need %zu bytes 16-byte aligned",
                            p.work_bytes, p.work, need);
  FfnWork w;
  layout(slots, E, hidden, inter, static_cast<uint8_t*>(p.work), &w);

  // Group the slots by expert: a stable counting sort, so each expert's rows keep slot order.
  std::fill(w.offsets, w.offsets + E + 1, 0);
  for (int64_t s = 0; s < slots; ++s) ++w.offsets[p.expert_ids[s] + 1];
  int32_t n_active = 0;
  int64_t most = 0;
  for (int32_t e = 0; e < E; ++e) {
    const int32_t rows = w.offsets[e + 1];
    if (rows > 0) w.active[n_active++] = e;
    most = std::max<int64_t>(most, rows);
    w.offsets[e + 1] += w.offsets[e];
  }
  std::copy(w.offsets, w.offsets + E, w.cursor);
  for (int64_t s = 0; s < slots; ++s) w.pos[s] = w.cursor[p.expert_ids[s]]++;
#pragma omp parallel for schedule(static) if (slots * hidden >= (int64_t{1} << 15))
  for (int64_t s = 0; s < slots; ++s)
    std::memcpy(w.xs + static_cast<int64_t>(w.pos[s]) * hidden, p.x + (s / p.top_k) * hidden,
                static_cast<size_t>(hidden) * sizeof(float));

  // The experts. Few rows each (decode): one expert per thread, linear() single-threaded inside
  // (a nested parallel region runs on one thread); else one expert after another, each product
  // parallel inside. linear() computes a row the same way on any number of threads.
  if (most <= kFewRows && n_active > 1) {
    Status failed;
#pragma omp parallel for schedule(dynamic, 1)
    for (int32_t a = 0; a < n_active; ++a) {
      const int32_t e = w.active[a];
      const Status st = run_expert(p, w, e, w.offsets[e], w.offsets[e + 1] - w.offsets[e]);
      if (!st.ok()) {
#pragma omp critical(oscar_moe_ffn_status)
        failed = st;
      }
    }
    OSCAR_RETURN_IF_ERROR(failed);
  } else {
    for (int32_t a = 0; a < n_active; ++a) {
      const int32_t e = w.active[a];
      OSCAR_RETURN_IF_ERROR(run_expert(p, w, e, w.offsets[e], w.offsets[e + 1] - w.offsets[e]));
    }
  }

  // Unpermute: each row sums its slots' outputs in slot order, weighted.
#pragma omp parallel for schedule(static) if (p.n * hidden >= (int64_t{1} << 15))
  for (int64_t t = 0; t < p.n; ++t) {
    float* y = p.y + t * hidden;
    for (int32_t j = 0; j < p.top_k; ++j) {
      const float wj = p.weights[t * p.top_k + j];
      const float* o = w.xs + static_cast<int64_t>(w.pos[t * p.top_k + j]) * hidden;
      if (j == 0)
        for (int64_t h = 0; h < hidden; ++h) y[h] = wj * o[h];
      else
        for (int64_t h = 0; h < hidden; ++h) y[h] += wj * o[h];
    }
  }
  return Status();
}

}  // namespace oscar::kernels
