// Mixture-of-experts FFN ops (Qwen3-MoE): the router's top-k selection and the grouped expert
// FFN. The router's logits come from linear() (kernels/linear.h) over the router matrix
// [n_experts, hidden]; the shared expert, load-balancing losses and expert parallelism are not
// here.
//
// Routing (moe_route), for each row of logits l[n_experts]:
//   p = softmax(l) (float32 in the fast path, as transformers computes it);
//   the top_k experts are those of the largest logits, in descending order; equal logits are
//   broken by the lower expert index (torch.topk's choice on our inputs: the softmax is monotonic,
//   so this is the top-k of p, except where float32 rounding maps two different logits to one
//   probability, a tie we resolve by the logit);
//   weight_j = p_j, or p_j / Σ_top p when norm_topk_prob.
// Expert FFN (moe_ffn), for each row t of x with experts e_j and weights w_j from the router:
//   y[t] = Σ_{j = 0 .. top_k-1} w_j · down_e(silu(gate_e · x[t]) ⊙ (up_e · x[t])),  e = e_j,
// summed in slot order j (descending weight) for every row, so a row's result does not depend on
// which other rows share the batch through the sum (the products are the linear() kernels', whose
// own batch invariance is issue #24's). The fast path groups the rows by expert (a stable counting
// sort), runs gate/up, SiLU·mul and down per expert over its rows, and unpermutes with the
// weighted sum above.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/linear.h"

namespace oscar::kernels {

// A layer's experts stacked in one buffer: [n_experts, rows, cols] row-major, one dtype.
struct ExpertWeights {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int32_t n_experts = 0;
  int64_t rows = 0, cols = 0;  // of one expert's matrix: [out, in]
  // Expert e's matrix [rows, cols].
  WeightView expert(int32_t e) const {
    const size_t stride = static_cast<size_t>(rows * cols) * dtype_bytes(dtype);
    return WeightView{static_cast<const uint8_t*>(data) + stride * static_cast<size_t>(e), dtype,
                      rows, cols};
  }
};

struct MoeRouteParams {
  const float* logits = nullptr;  // [n, n_experts] router logits
  int64_t n = 0;
  int32_t n_experts = 0;
  int32_t top_k = 0;  // 1 <= top_k <= n_experts
  bool norm_topk_prob = false;
  int32_t* expert_ids = nullptr;  // out: [n, top_k], descending logit, ties to the lower index
  float* weights = nullptr;       // out: [n, top_k]
};

struct MoeFfnParams {
  const float* x = nullptr;  // [n, hidden]
  int64_t n = 0;
  int32_t top_k = 0;
  const int32_t* expert_ids = nullptr;  // [n, top_k] from moe_route, each in [0, n_experts)
  const float* weights = nullptr;       // [n, top_k]
  ExpertWeights gate, up;               // [n_experts, moe_inter, hidden]
  ExpertWeights down;                   // [n_experts, hidden, moe_inter]
  float* y = nullptr;                   // out: [n, hidden], overwritten; may not alias x
  // Scratch of the fast paths, at least moe_ffn_work_bytes(n, top_k, n_experts, hidden,
  // moe_inter) bytes, 16-byte aligned (the reference needs none). Owned by the caller.
  void* work = nullptr;
  size_t work_bytes = 0;
  bool batch_invariant = false;  // the experts' linear() calls (kernels/linear.h)
};

// The scratch moe_ffn needs: the rows grouped by expert ([n·top_k, hidden] gathered x, then
// the expert outputs in place; [n·top_k, moe_inter] gate and up) and the permutation
// ([n·top_k] positions, [n_experts + 1] offsets): about n·top_k·(hidden + 2·moe_inter) floats,
// 100 KiB a row at Qwen3-30B-A3B's shape.
size_t moe_ffn_work_bytes(int64_t n, int32_t top_k, int32_t n_experts, int64_t hidden,
                          int64_t moe_inter);

// Plain loops, float64 softmax, sums and products: define "correct" (cpu/moe_ref.cpp).
Status moe_route_ref(const MoeRouteParams& p);
Status moe_ffn_ref(const MoeFfnParams& p);
// Fast CPU paths (cpu/moe.cpp). moe_route: float32 softmax, rows over threads; its expert ids are
// those of moe_route_ref (both select on the logits). moe_ffn: rows grouped by expert; each
// expert's gate/up/down through linear() (the CPU kernels, BF16 widened in the product). When every
// expert has few rows (decode: at most 8, linear()'s streaming path) experts run in parallel,
// one thread each; otherwise one expert after another, each product parallel inside. Both
// schedules give the same bits.
Status moe_route(const MoeRouteParams& p);
Status moe_ffn(const MoeFfnParams& p);

}  // namespace oscar::kernels
