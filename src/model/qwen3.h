// The Qwen3 decoder (also Qwen2 and Llama dense layouts) on the CPU.
//
// Weights are loaded from a checkpoint directory (format/weight_table.h) and upcast once from
// BF16 to float32 (an exact, explicit conversion: matrix products then run through OpenBLAS
// sgemm). Activations are float32. Attention reads and writes the per-sequence KV cache
// (kv/sequence_cache.h), which decides what is exact and what is INT2.
//
// forward() takes a batch of chunks, one per sequence: the linear layers run once over all the
// batch's tokens; attention runs per sequence. Not thread-safe (one workspace per model).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/model_config.h"
#include "kv/sequence_cache.h"

namespace oscar::model {

// Sees each layer's attention inputs and outputs during a forward pass (calibration, fidelity).
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // q: [n, n_heads_q, head_dim], k, v: [n, n_heads_kv, head_dim], after q/k norm and RoPE, before
  // any OSCAR rotation; positions pos0 .. pos0 + n - 1 of sequence `seq` (index in the batch).
  virtual void on_qkv(int seq, int layer, const float* q, const float* k, const float* v,
                      int64_t n, int64_t pos0) {}
  // out: [n, n_heads_q, head_dim] attention output before o_proj.
  virtual void on_attention(int seq, int layer, const float* out, int64_t n, int64_t pos0) {}
  // hidden: [n, hidden_size] after the final norm.
  virtual void on_final_hidden(int seq, const float* hidden, int64_t n, int64_t pos0) {}
};

// One sequence's part of a batch.
struct SeqChunk {
  std::span<const int32_t> tokens;   // new tokens, at positions cache->n_tokens() ...
  kv::SequenceCache* cache = nullptr;
  bool all_logits = false;           // logits for every token (else only the last)
  std::vector<float>* logits = nullptr;  // out: [n or 1, vocab_size]
};

struct ForwardOptions {
  kv::AttendMode attend_mode = kv::AttendMode::kPrefill;
  LayerObserver* observer = nullptr;
};

class Qwen3Model {
 public:
  // Loads config.json and the safetensors checkpoint of `dir`.
  static Result<std::unique_ptr<Qwen3Model>> load(const std::string& dir);
  // Random weights for a config (like vLLM's dummy load format): speed and memory at real sizes.
  static Result<std::unique_ptr<Qwen3Model>> load_dummy(const format::ModelConfig& config,
                                                        uint64_t seed);

  const format::ModelConfig& config() const { return config_; }

  // Folds a value rotation into v_proj and o_proj (OSCAR.md §3), in float64 then float32.
  // v_rotation: [n_layers, n_heads_kv, head_dim, head_dim]. Call at most once.
  Status fold_value_rotation(std::span<const float> v_rotation);

  Status forward(std::span<SeqChunk> batch, const ForwardOptions& options = {});
  // Convenience for one sequence: logits of the last token (or all tokens).
  Status forward_one(std::span<const int32_t> tokens, kv::SequenceCache& cache,
                     std::vector<float>* logits, bool all_logits = false,
                     const ForwardOptions& options = {});

  size_t weight_bytes() const;

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;       // [hidden]
    std::vector<float> wq, wk, wv, wo;              // [q_dim|kv_dim|hidden, in] row-major
    std::vector<float> bq, bk, bv;                  // [q_dim|kv_dim] (Qwen2) or empty
    std::vector<float> q_norm, k_norm;              // [head_dim] (Qwen3) or empty
    std::vector<float> w_gate, w_up, w_down;        // [inter, hidden], [inter, hidden], [hidden, inter]
  };

  Qwen3Model() = default;
  void init_rope();

  format::ModelConfig config_;
  std::vector<float> embed_;     // [vocab, hidden]
  std::vector<float> lm_head_;   // [vocab, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2], float32 as the reference computes it
  bool value_rotation_folded_ = false;
};

}  // namespace oscar::model
