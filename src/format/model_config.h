// ModelConfig: the validated subset of a Hugging Face config.json that oscar runs.
//
// Accepts Qwen3ForCausalLM (and Qwen2ForCausalLM / LlamaForCausalLM dense configs, whose only
// differences here are qkv bias and the absence of q_norm/k_norm) and Qwen3MoeForCausalLM (Qwen3
// attention; a routed mixture-of-experts FFN in the sparse layers, a dense one in the others).
// Both spellings found in the wild are accepted: top-level `rope_theta` or
// `rope_parameters.rope_theta`, `torch_dtype` or `dtype`. Unknown architectures, rope scaling
// types, sliding windows, shared experts and expert counts in a dense architecture are refused by
// name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::format {

enum class Architecture { kQwen3, kQwen2, kLlama, kQwen3Moe };

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

  // Mixture of experts (Qwen3MoeForCausalLM; n_experts == 0 in a dense model). Absent fields take
  // transformers' Qwen3MoeConfig defaults (128 experts, top-8, 768, no renormalisation, step 1).
  // Which layers are sparse: moe_layer(). A dense layer's FFN is intermediate_size wide.
  int n_experts = 0;                 // num_experts
  int n_experts_per_tok = 0;         // num_experts_per_tok: the top-k of the router
  int moe_intermediate_size = 0;     // each expert's FFN width
  bool norm_topk_prob = false;       // renormalise the top-k probabilities to sum to 1
  int decoder_sparse_step = 1;       // every step-th layer is sparse (layer + 1) % step == 0
  std::vector<int> mlp_only_layers;  // layers kept dense whatever the step (sorted, unique)

  // Derived by validate().
  int gqa_ratio = 0;  // n_heads_q / n_heads_kv
  int q_dim = 0;      // n_heads_q * head_dim
  int kv_dim = 0;     // n_heads_kv * head_dim
  int n_moe_layers = 0;  // layers with a routed-experts FFN

  static Result<ModelConfig> from_json_text(const std::string& text);
  static Result<ModelConfig> load(const std::string& model_dir);  // reads DIR/config.json
  // Checks ranges and divisibility and fills the derived fields. Called by the parsers.
  Status validate();

  bool is_moe() const { return n_experts > 0; }
  // Whether `layer` has the routed-experts FFN: as transformers' Qwen3MoeDecoderLayer decides,
  // not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0. False in a dense model.
  bool moe_layer(int layer) const;

  int64_t n_params() const;                   // including lm_head if untied
  int64_t n_active_params() const;            // per token: n_params() less the unrouted experts
  int64_t kv_bytes_per_token_bf16() const;    // 2 (K,V) * layers * kv_dim * 2 bytes
};

}  // namespace oscar::format
