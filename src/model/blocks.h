// Building blocks of a decoder layer, written once against kernels::Backend: the dense SwiGLU FFN
// and the routed mixture-of-experts FFN (Qwen3-MoE). llama.cpp's build_ffn / build_moe_ffn shape:
// an architecture's forward pass (model/qwen3.cpp) picks one per layer. Attention and the step's
// life (staging, graphs, demotion) stay in the model for now (review 2026-12-03 §6, change 1).
//
// Every pointer is in the backend's memory. Not thread-safe: the scratch is the caller's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/backend.h"
#include "kernels/linear.h"
#include "kernels/moe.h"

namespace oscar::model {

// Dense FFN weights: y = down(silu(gate · h) ⊙ (up · h)).
struct DenseFfnWeights {
  kernels::WeightView gate, up;  // [inter, hidden]
  kernels::WeightView down;      // [hidden, inter]
};

// MoE FFN weights (kernels/moe.h): the router, then top_k of the stacked experts per row.
struct MoeFfnWeights {
  kernels::WeightView router;       // [n_experts, hidden]
  kernels::ExpertWeights gate, up;  // [n_experts, moe_inter, hidden]
  kernels::ExpertWeights down;      // [n_experts, hidden, moe_inter]
  int32_t top_k = 0;
  bool norm_topk_prob = false;
};

// Scratch of one FFN call over n rows, sized by the caller (Qwen3Model's workspace).
struct FfnScratch {
  float* gate = nullptr;            // dense: [n, inter]
  float* up = nullptr;              // dense: [n, inter]
  float* router_logits = nullptr;   // MoE: [n, n_experts]
  int32_t* expert_ids = nullptr;    // MoE: [n, top_k]
  float* expert_weights = nullptr;  // MoE: [n, top_k]
  void* moe_work = nullptr;         // MoE: kernels::moe_ffn_work_bytes(n, ...) bytes
  size_t moe_work_bytes = 0;
};

// out[n, hidden] = the FFN of h[n, hidden]. out may not alias h.
Status dense_ffn(kernels::Backend& be, const DenseFfnWeights& w, const float* h, int64_t n,
                 const FfnScratch& s, float* out);
// Router logits (linear), top-k routing (moe_route), grouped experts (moe_ffn).
Status moe_ffn(kernels::Backend& be, const MoeFfnWeights& w, const float* h, int64_t n,
               const FfnScratch& s, float* out);

}  // namespace oscar::model
