// Building blocks of a decoder layer, written once against kernels::Backend: the dense SwiGLU FFN,
// the routed mixture-of-experts FFN (Qwen3-MoE) and the Gated DeltaNet token mixer of the hybrid
// models (Qwen3.5). llama.cpp's build_ffn / build_moe_ffn shape: an architecture's forward pass
// (model/qwen3.cpp) picks one per layer. Attention and the step's life (staging, graphs,
// demotion) stay in the model for now (review 2026-12-03 §6, change 1).
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

// Gated DeltaNet weights (transformers' Qwen3_5GatedDeltaNet, separate in_proj_qkv/z/b/a).
struct GatedDeltaNetWeights {
  kernels::WeightView in_qkv;        // [conv_dim, hidden]: q, k (heads_k · d_k each), v
  kernels::WeightView in_z;          // [heads_v · d_v, hidden]: the output gate
  kernels::WeightView in_b, in_a;    // [heads_v, hidden]
  const float* conv = nullptr;       // [conv_dim, K] (conv1d.weight [conv_dim, 1, K])
  const float* A_log = nullptr;      // [heads_v]
  const float* dt_bias = nullptr;    // [heads_v]
  const float* norm = nullptr;       // [d_v] the gated RMSNorm's weight (not zero-centred)
  kernels::WeightView out;           // [hidden, heads_v · d_v]
  int32_t heads_k = 0, heads_v = 0, d_k = 0, d_v = 0, conv_kernel = 0;
  float norm_eps = 1e-6f;
};

// The sequences of one call and their state slots (kv/state_pool.h), one layer's arrays.
struct GatedDeltaNetBatch {
  const int32_t* cu_seqlens = nullptr;  // [n_seqs + 1] host: rows of each sequence
  int32_t n_seqs = 0;
  const int32_t* slots = nullptr;       // [n_seqs] host
  float* conv_state = nullptr;          // [n_slots, K-1, conv_dim]
  float* recurrent_state = nullptr;     // [n_slots, heads_v, d_k, d_v]
};

// Scratch of one DeltaNet call over n rows, sized by the caller.
struct GatedDeltaNetScratch {
  float* qkv = nullptr;       // [n, conv_dim] in_proj_qkv's output
  float* conv_out = nullptr;  // [n, conv_dim] its causal conv
  float* z = nullptr;     // [n, heads_v · d_v]
  float* ab = nullptr;    // [4, n, heads_v]: b, a, then beta, g
  float* o = nullptr;     // [n, heads_v · d_v]
};

// out[n, hidden] = the Gated DeltaNet of h[n, hidden]: projections, causal conv (SiLU) with the
// sequences' conv states, gates, the gated delta rule (recurrent for one-row sequences, chunked
// for longer ones) with their recurrent states, the gated RMSNorm with silu(z), out_proj. The
// states advance in place. out may not alias h.
Status gated_delta_net(kernels::Backend& be, const GatedDeltaNetWeights& w, const float* h,
                       int64_t n, const GatedDeltaNetBatch& batch, const GatedDeltaNetScratch& s,
                       float* out);

// out[n, hidden] = the FFN of h[n, hidden]. out may not alias h.
Status dense_ffn(kernels::Backend& be, const DenseFfnWeights& w, const float* h, int64_t n,
                 const FfnScratch& s, float* out);
// Router logits (linear), top-k routing (moe_route), grouped experts (moe_ffn).
Status moe_ffn(kernels::Backend& be, const MoeFfnWeights& w, const float* h, int64_t n,
               const FfnScratch& s, float* out);

}  // namespace oscar::model
