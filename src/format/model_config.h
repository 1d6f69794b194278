// ModelConfig: the validated subset of a Hugging Face config.json that oscar runs.
//
// Accepts Qwen3ForCausalLM (and Qwen2ForCausalLM / LlamaForCausalLM dense configs, whose only
// differences here are qkv bias and the absence of q_norm/k_norm), Qwen3MoeForCausalLM (Qwen3
// attention; a routed mixture-of-experts FFN in the sparse layers, a dense one in the others) and
// the dense Qwen3.5 / 3.6 hybrids: Qwen3_5ForCausalLM, or the multimodal wrapper
// Qwen3_5ForConditionalGeneration whose nested text_config is read (the vision tower is not), and
// Qwen3NextForCausalLM (model_type qwen3_next: the hybrid layers of Qwen3.5 with a routed MoE FFN
// plus a sigmoid-gated shared expert; its fused in_proj_qkvz / in_proj_ba are the loader's
// business). The Qwen3.5 MoE hybrids are refused by name.
// Both spellings found in the wild are accepted: top-level `rope_theta` or
// `rope_parameters.rope_theta`, `torch_dtype` or `dtype`. Unknown architectures, rope scaling
// types, sliding windows, shared experts outside Qwen3-Next (Qwen2-MoE's) and expert counts in a
// dense architecture are refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::format {

enum class Architecture { kQwen3, kQwen2, kLlama, kQwen3Moe, kQwen3_5, kQwen3Next };

struct ModelConfig {
  Architecture arch = Architecture::kQwen3;
  std::string architecture_name;  // "Qwen3ForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int n_layers = 0;
  int n_heads_q = 0;
  int n_heads_kv = 0;
  int head_dim = 0;  // independent of hidden_size / n_heads_q in Qwen3
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (Qwen2)
  bool qk_norm = true;          // per-head q_norm/k_norm (Qwen3)
  int bos_token_id = -1;
  int eos_token_id = -1;        // first eos id if config gives a list
  std::string sha256;           // of the config.json bytes: the rotation file's fingerprint

  // Mixture of experts (Qwen3MoeForCausalLM, Qwen3NextForCausalLM; n_experts == 0 in a dense
  // model). Absent fields take transformers' Qwen3MoeConfig defaults (128 experts, top-8, 768, no
  // renormalisation, step 1), or Qwen3NextConfig's (512 experts, top-10, 512, renormalised, step
  // 1, a shared expert of 512). Which layers are sparse: moe_layer(). A dense layer's FFN is
  // intermediate_size wide.
  int n_experts = 0;                 // num_experts
  int n_experts_per_tok = 0;         // num_experts_per_tok: the top-k of the router
  int moe_intermediate_size = 0;     // each expert's FFN width
  bool norm_topk_prob = false;       // renormalise the top-k probabilities to sum to 1
  int decoder_sparse_step = 1;       // every step-th layer is sparse (layer + 1) % step == 0
  std::vector<int> mlp_only_layers;  // layers kept dense whatever the step (sorted, unique)
  // Qwen3-Next: every sparse layer also runs one shared expert (a SwiGLU FFN this wide) on every
  // row, scaled by sigmoid(x · shared_expert_gateᵀ) and added to the routed experts' sum; 0: none.
  int shared_expert_intermediate_size = 0;

  // Hybrid (Qwen3.5 and Qwen3-Next, transformers' Qwen3_5TextConfig / Qwen3NextConfig; the same
  // fields, the same defaults). Each layer is full attention or a Gated
  // DeltaNet ("linear_attention"): layer_types, else every full_attention_interval-th layer (4)
  // is full attention. Full-attention layers: q_proj gives query and output gate per head, the
  // output is multiplied by sigmoid(gate) before o_proj, and RoPE turns the first rotary_dim dims
  // of each head. Every RMSNorm of the model except the DeltaNet's gated one is zero-centred
  // (x·(1 + w)). Weights of the text model sit under weight_prefix.
  std::vector<bool> linear_layer;  // [n_layers] true for a Gated DeltaNet layer; empty = none
  int lin_heads_k = 0;             // linear_num_key_heads (q and k heads)
  int lin_heads_v = 0;             // linear_num_value_heads, a multiple of lin_heads_k
  int lin_head_dim_k = 0;          // linear_key_head_dim
  int lin_head_dim_v = 0;          // linear_value_head_dim
  int lin_conv_kernel = 0;         // linear_conv_kernel_dim
  bool attn_output_gate = false;   // q_proj [2 · q_dim, hidden]: per head query then gate rows
  bool zero_centred_norms = false; // input/post/final/q/k norms multiply by (1 + w)
  int rotary_dim = 0;              // head_dim · partial_rotary_factor (head_dim when absent)
  std::string weight_prefix = "model.";  // "model.language_model." in the multimodal wrapper

  // Derived by validate().
  int gqa_ratio = 0;  // n_heads_q / n_heads_kv
  int q_dim = 0;      // n_heads_q * head_dim
  int kv_dim = 0;     // n_heads_kv * head_dim
  int n_moe_layers = 0;  // layers with a routed-experts FFN
  // Layers with a KV cache (full attention): the cache's layer index of each model layer, -1 for
  // a Gated DeltaNet layer; n_kv_layers of them (n_layers in a model without linear layers).
  std::vector<int> kv_layer;  // [n_layers]
  int n_kv_layers = 0;
  int n_linear_layers = 0;
  int lin_key_dim = 0;    // lin_heads_k · lin_head_dim_k
  int lin_value_dim = 0;  // lin_heads_v · lin_head_dim_v
  int lin_conv_dim = 0;   // 2 · lin_key_dim + lin_value_dim: the conv's channels (q, k, v)

  static Result<ModelConfig> from_json_text(const std::string& text);
  static Result<ModelConfig> load(const std::string& model_dir);  // reads DIR/config.json
  // Checks ranges and divisibility and fills the derived fields. Called by the parsers.
  Status validate();

  bool is_moe() const { return n_experts > 0; }
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  bool is_hybrid() const { return n_linear_layers > 0; }
  bool linear(int layer) const { return !linear_layer.empty() && linear_layer[layer]; }
  // Floats of one sequence's state per Gated DeltaNet layer: the conv's last K-1 inputs and the
  // delta rule's [heads_v, d_k, d_v] matrix (kernels/gated_delta.h).
  int64_t conv_state_floats() const;
  int64_t recurrent_state_floats() const;
  // Whether `layer` has the routed-experts FFN: as transformers' Qwen3MoeDecoderLayer decides,
  // not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0. False in a dense model.
  bool moe_layer(int layer) const;

  int64_t n_params() const;                   // including lm_head if untied
  int64_t n_active_params() const;            // per token: n_params() less the unrouted experts
  int64_t kv_bytes_per_token_bf16() const;    // 2 (K,V) * n_kv_layers * kv_dim * 2 bytes

 private:
  Status validate_layers();  // layer types, the DeltaNet sizes, kv_layer
};

}  // namespace oscar::format
