// A decoder's weights as the loader (model/qwen3.h) fills them, for every architecture oscar runs:
// the embedding, the final norm, the lm_head and one LayerWeights per layer, whose members an
// architecture uses or leaves empty (llama.cpp's llama_layer). The views an architecture hands to
// the blocks (model/blocks.h) are made here, so that every architecture reads a layer one way.
// Not here: loading, packing and folding (model/qwen3.cpp), the step (model/step_runner.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "core/device.h"
#include "format/model_config.h"
#include "kernels/linear.h"
#include "model/blocks.h"

namespace oscar::model {

// A weight matrix [rows, cols] row-major in its stored type: BF16 as the checkpoint has it, or
// F32 where it was computed at load time (the folded value rotation). Host vectors while the
// model loads; Qwen3Model::set_backend moves the bytes to `dev`: into the device's memory, or on
// the CPU into one buffer for all matrices (on huge pages), and the vectors go.
struct Matrix {
  kernels::DType dtype = kernels::DType::kBF16;
  int64_t rows = 0, cols = 0;
  std::vector<bf16_t> bf16;  // [rows, cols] when dtype == kBF16 (host)
  std::vector<float> f32;    // [rows, cols] when dtype == kF32 (host)
  DeviceBuffer dev;          // the same bytes in a backend's memory (on the CPU: a view into
                             // the model's weight buffer, and the vectors are empty)
  kernels::WeightView view() const;
  void* host_bytes() const;  // the bytes where host code can reach them; null on a device
  size_t bytes() const { return static_cast<size_t>(rows * cols) * kernels::dtype_bytes(dtype); }
  void to_f32();   // converts in place (exact); host only
  void to_bf16();  // converts in place (rounds to nearest even); host only
};

// A float vector (norm weights, biases): host, plus a copy on a device backend.
struct Vec {
  std::vector<float> host;
  DeviceBuffer dev;
  Vec& operator=(std::vector<float> v) {
    host = std::move(v);
    return *this;
  }
  const float* data() const { return dev.empty() ? host.data() : dev.as<const float>(); }
  bool empty() const { return host.empty(); }
  size_t size() const { return host.size(); }
};

struct LayerWeights {
  Vec input_norm, post_norm;  // [hidden]
  Matrix wq, wk, wv, wo;      // [q_dim|kv_dim|hidden, in] row-major
  Matrix wq_gate;             // [q_dim, hidden] Qwen3.5's output gate rows of q_proj, else empty
  Vec bq, bk, bv;             // [q_dim|kv_dim] (Qwen2) or empty
  Vec q_norm, k_norm;         // [head_dim] (Qwen3) or empty
  // Dense FFN: [inter, hidden], [inter, hidden], [hidden, inter]; empty in a sparse layer.
  Matrix w_gate, w_up, w_down;
  // Sparse (MoE) FFN, config.moe_layer(l): the router and every expert of the layer stacked
  // into one matrix each ([n_experts, out, in] as [n_experts · out, in] rows); empty otherwise.
  Matrix w_router;              // [n_experts, hidden]
  Matrix w_exp_gate, w_exp_up;  // [n_experts · moe_inter, hidden]
  Matrix w_exp_down;            // [n_experts · hidden, moe_inter]
  // Qwen3-Next's shared expert of a sparse layer (config.has_shared_expert()), else empty.
  Matrix w_shared_gate, w_shared_up;  // [shared_inter, hidden] mlp.shared_expert.{gate,up}_proj
  Matrix w_shared_down;               // [hidden, shared_inter]
  Matrix w_shared_expert_gate;        // [1, hidden] mlp.shared_expert_gate: sigmoid(h · wᵀ)
  bool moe = false;
  // Gated DeltaNet (config.linear(l)): the attention members above are empty; its state is in
  // the StatePool layer kv::layer_groups gives it. Qwen3-Next's fused projections are split into
  // these at load (split_in_proj_qkvz / split_in_proj_ba below).
  Matrix lin_qkv, lin_z, lin_b, lin_a;  // [conv_dim | value_dim | heads_v | heads_v, hidden]
  Matrix lin_out;                       // [hidden, value_dim]
  Vec lin_conv;                         // [conv_dim, K]
  Vec lin_A_log, lin_dt_bias;           // [heads_v]
  Vec lin_norm;                         // [d_v]
};

// Qwen3-Next stores the DeltaNet input projections fused and interleaved per key-head group
// (transformers' Qwen3NextGatedDeltaNet.fix_query_key_value_ordering reads them so). With
// Hk = lin_heads_k key heads of d_k, Hv = lin_heads_v value heads of d_v and r = Hv / Hk value
// heads per key head, the rows of in_proj_qkvz [Hk · (2·d_k + 2·r·d_v), hidden] are, per group g:
//
//   | q_g (d_k) | k_g (d_k) | v_{g·r} .. v_{g·r+r-1} (r·d_v) | z_{g·r} .. z_{g·r+r-1} (r·d_v) |
//
// and those of in_proj_ba [2·Hv, hidden], per group g: | b_{g·r} .. (r) | a_{g·r} .. (r) |.
// The split gives Qwen3.5's separate layout, which the gated_delta_net block reads
// (model/blocks.h), in key-head then value-head order:
//   qkv [2·Hk·d_k + Hv·d_v, hidden] = | q_0 .. q_{Hk-1} | k_0 .. k_{Hk-1} | v_0 .. v_{Hv-1} |,
//   z [Hv·d_v, hidden] = | z_0 .. z_{Hv-1} |, b and a [Hv, hidden]. Value head h reads key head
// h / r in both models, so only rows move; the conv1d weight is already in the split order
// (transformers convolves the concatenated q | k | v). Rows are copied in the stored dtype.
void split_in_proj_qkvz(const Matrix& qkvz, const format::ModelConfig& c, Matrix* qkv, Matrix* z);
void split_in_proj_ba(const Matrix& ba, const format::ModelConfig& c, Matrix* b, Matrix* a);

struct ModelWeights {
  format::ModelConfig config;
  Matrix embed;    // [vocab, hidden]
  Matrix lm_head;  // [vocab, hidden]; rows == 0 when tied to embed
  Vec final_norm;  // [hidden]
  std::vector<LayerWeights> layers;
  // R_Vᵀ per (KV cache layer, KV head), [n_kv_layers, n_heads_kv, head_dim, head_dim]: a model
  // with an elementwise output gate (Qwen3.5) cannot fold the value rotation into o_proj (the
  // gate multiplies the attention output in the unrotated basis), so its attention output is
  // turned back (attn·R_Vᵀ) before the gate; empty: none (o_proj holds R_V, OSCAR.md §3).
  Vec out_unrotation;

  const Matrix& output() const { return lm_head.rows == 0 ? embed : lm_head; }
  // The blocks' views of layer `layer` (model/blocks.h).
  AttentionWeights attention(int layer) const;
  DenseFfnWeights dense_ffn(int layer) const;
  MoeFfnWeights moe_ffn(int layer) const;
  GatedDeltaNetWeights gated_delta_net(int layer) const;
};

}  // namespace oscar::model
