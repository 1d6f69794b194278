// ModelConfig: the validated subset of a Hugging Face config.json that oscar runs.
//
// Accepts Qwen3ForCausalLM (and Qwen2ForCausalLM / LlamaForCausalLM dense configs, whose only
// differences here are qkv bias and the absence of q_norm/k_norm). Both spellings found in the wild
// are accepted: top-level `rope_theta` or `rope_parameters.rope_theta`, `torch_dtype` or `dtype`.
// Unknown architectures, rope scaling types, sliding windows and MoE configs are refused by name.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace oscar::format {

enum class Architecture { kQwen3, kQwen2, kLlama };

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

  // Derived by validate().
  int gqa_ratio = 0;  // n_heads_q / n_heads_kv
  int q_dim = 0;      // n_heads_q * head_dim
  int kv_dim = 0;     // n_heads_kv * head_dim

  static Result<ModelConfig> from_json_text(const std::string& text);
  static Result<ModelConfig> load(const std::string& model_dir);  // reads DIR/config.json
  // Checks ranges and divisibility and fills the derived fields. Called by the parsers.
  Status validate();

  int64_t n_params() const;                   // including lm_head if untied
  int64_t kv_bytes_per_token_bf16() const;    // 2 (K,V) * layers * kv_dim * 2 bytes
};

}  // namespace oscar::format
