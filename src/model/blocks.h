// Building blocks of a decoder layer, written once against kernels::Backend: full attention over
// the OSCAR cache (q/k/v, norms and RoPE, append, decode and prefill attention, Qwen3.5's output
// gate, o_proj), the dense SwiGLU FFN, the routed mixture-of-experts FFN (Qwen3-MoE; with
// Qwen3-Next's sigmoid-gated shared expert where the weights have one) and the Gated DeltaNet
// token mixer of the hybrid models (Qwen3.5, Qwen3-Next). llama.cpp's build_attn / build_ffn /
// build_moe_ffn shape: an architecture (model/architecture.h) picks one mixer and one FFN per
// layer. The step's life (plan staging, residuals and norms, logits, graphs, demotion) is the
// step runner's (model/step_runner.h).
//
// Every pointer is in the backend's memory. Not thread-safe: the scratch is the caller's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/backend.h"
#include "kernels/decode_attn.h"
#include "kernels/elementwise.h"
#include "kernels/kv_append.h"
#include "kernels/linear.h"
#include "kernels/moe.h"
#include "kernels/prefill_attn.h"

namespace oscar::model {

// One full-attention layer's weights.
struct AttentionWeights {
  kernels::WeightView wq, wk, wv;  // [q_dim | kv_dim | kv_dim, hidden]
  kernels::WeightView wq_gate;     // [q_dim, hidden] Qwen3.5's output gate; rows == 0: none
  kernels::WeightView wo;          // [hidden, q_dim]
  const float* bq = nullptr;       // [q_dim] (Qwen2) or null; bk, bv: [kv_dim] or null
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;   // [head_dim] (Qwen3) or null, fused into RoPE
  const float* k_norm = nullptr;
  // [n_kv_layers, n_heads_kv, head_dim, head_dim] R_Vᵀ applied to the attention output before
  // the output gate (ModelWeights::out_unrotation), or null.
  const float* out_unrotation = nullptr;
};

// Sees what the attention block computes (the step runner turns it into LayerObserver calls).
class AttentionTap {
 public:
  virtual ~AttentionTap() = default;
  // q: [n, q_dim], k, v: [n, kv_dim] after norms and RoPE, before any OSCAR rotation.
  virtual Status on_qkv(int kv_layer, const float* q, const float* k, const float* v) = 0;
  // attn: [n, q_dim] before the output gate and o_proj.
  virtual Status on_attention(int kv_layer, const float* attn) = 0;
};

// The attention ops of one step, filled once by the step runner (rows, heads, RoPE tables, the
// plan's slots and page tables, the engine-wide KV params); the block sets the layer.
struct AttentionStep {
  kernels::RopeParams rope;              // over q and k below
  kernels::KvAppendParams append;        // k and v below into the plan's slots
  kernels::RotateQueriesParams rotate;   // q into q_rot (decode.q, prefill.q)
  kernels::DecodeAttnParams decode;      // the decode rows; n_seqs == 0: none
  kernels::PrefillAttnParams prefill;    // the prefill chunks; n_seqs == 0: none
  float* q = nullptr;                    // [n, q_dim]
  float* k = nullptr;                    // [n, kv_dim]
  float* v = nullptr;                    // [n, kv_dim]
  float* attn = nullptr;                 // [n, q_dim] decode.out, prefill.out
  float* gate = nullptr;                 // [n, q_dim] the output gate (models that have one)
  AttentionTap* tap = nullptr;           // null: nobody looks
};

// out[n, hidden] = the attention of h[n, hidden] (its input norm applied), K/V appended to cache
// layer kv_layer. out may not alias h.
Status attention(kernels::Backend& be, const AttentionWeights& w, int kv_layer, int64_t n,
                 AttentionStep& s, const float* h, float* out);

// Dense FFN weights: y = down(silu(gate · h) ⊙ (up · h)).
struct DenseFfnWeights {
  kernels::WeightView gate, up;  // [inter, hidden]
  kernels::WeightView down;      // [hidden, inter]
};

// MoE FFN weights (kernels/moe.h): the router, then top_k of the stacked experts per row; and
// Qwen3-Next's shared expert, run on every row and scaled by sigmoid(h · shared_expert_gateᵀ).
struct MoeFfnWeights {
  kernels::WeightView router;       // [n_experts, hidden]
  kernels::ExpertWeights gate, up;  // [n_experts, moe_inter, hidden]
  kernels::ExpertWeights down;      // [n_experts, hidden, moe_inter]
  int32_t top_k = 0;
  bool norm_topk_prob = false;
  kernels::WeightView shared_gate, shared_up;  // [shared_inter, hidden]; rows == 0: none
  kernels::WeightView shared_down;             // [hidden, shared_inter]
  kernels::WeightView shared_expert_gate;      // [1, hidden]
};

// Scratch of one FFN call over n rows, sized by the caller (the step runner's workspace).
struct FfnScratch {
  float* gate = nullptr;            // dense: [n, inter]
  float* up = nullptr;              // dense: [n, inter]
  float* router_logits = nullptr;   // MoE: [n, n_experts]
  int32_t* expert_ids = nullptr;    // MoE: [n, top_k]
  float* expert_weights = nullptr;  // MoE: [n, top_k]
  void* moe_work = nullptr;         // MoE: kernels::moe_ffn_work_bytes(n, ...) bytes
  size_t moe_work_bytes = 0;
  float* shared_gate = nullptr;     // shared expert: [n, shared_inter]
  float* shared_up = nullptr;       // shared expert: [n, shared_inter]
  float* shared_out = nullptr;      // shared expert: [n, hidden]
  float* shared_score = nullptr;    // shared expert: [n] h · shared_expert_gateᵀ
};

// Gated DeltaNet weights (transformers' Qwen3_5GatedDeltaNet, separate in_proj_qkv/z/b/a;
// Qwen3-Next's fused ones are split into this layout at load, model/weights.h).
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
// Router logits (linear), top-k routing (moe_route), grouped experts (moe_ffn); with a shared
// expert (w.shared_gate.rows > 0, Qwen3NextSparseMoeBlock) out += sigmoid(h · w_sgᵀ) ·
// down(silu(gate · h) ⊙ (up · h)) of its matrices, its projections in one linear_group with the
// router's. Without one, the routed path alone (no extra op).
Status moe_ffn(kernels::Backend& be, const MoeFfnWeights& w, const float* h, int64_t n,
               const FfnScratch& s, float* out);

}  // namespace oscar::model
