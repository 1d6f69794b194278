// The Qwen3 decoder (also Qwen2 and Llama dense layouts).
//
// Weights are loaded from a checkpoint directory (format/weight_table.h). Matrices stay in the
// checkpoint's BF16 and are widened inside the matrix product (kernels/linear.h): a decode step
// reads half the bytes an upcast copy would. Norms and biases are float32, and so are v_proj and
// o_proj once a value rotation is folded into them. Activations are float32.
//
// forward() runs one step from its plan (kv/step_plan.h): the linear layers once over all the
// step's rows, K/V appended through the plan's slots, decode attention for all decode rows in one
// batched call per layer, prefill attention per chunk. Not thread-safe (one workspace per model).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/bf16.h"
#include "format/model_config.h"
#include "kernels/backend.h"
#include "kernels/linear.h"
#include "kv/sequence_cache.h"
#include "kv/step_plan.h"

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
  // A weight matrix [rows, cols] row-major in its stored type: BF16 as the checkpoint has it, or
  // F32 where it was computed at load time (the folded value rotation). Host memory.
  struct Matrix {
    kernels::DType dtype = kernels::DType::kBF16;
    int64_t rows = 0, cols = 0;
    std::vector<bf16_t> bf16;  // [rows, cols] when dtype == kBF16
    std::vector<float> f32;    // [rows, cols] when dtype == kF32
    kernels::WeightView view() const;
    size_t bytes() const { return bf16.size() * sizeof(bf16_t) + f32.size() * sizeof(float); }
    void to_f32();  // converts in place (exact)
  };
  // Loads config.json and the safetensors checkpoint of `dir`.
  static Result<std::unique_ptr<Qwen3Model>> load(const std::string& dir);
  // Random weights for a config (like vLLM's dummy load format): speed and memory at real sizes.
  static Result<std::unique_ptr<Qwen3Model>> load_dummy(const format::ModelConfig& config,
                                                        uint64_t seed);

  const format::ModelConfig& config() const { return config_; }
  // The backend whose ops forward() calls (kernels/backend.h); the CPU backend until set. The
  // weights are host memory: a device backend needs them uploaded first (not yet done here).
  void set_backend(kernels::Backend* backend) { backend_ = backend; }
  kernels::Backend& backend() const { return *backend_; }

  // Folds a value rotation into v_proj and o_proj (OSCAR.md §3), in float64 then float32.
  // v_rotation: [n_layers, n_heads_kv, head_dim, head_dim]. Call at most once.
  Status fold_value_rotation(std::span<const float> v_rotation);

  // One step from its plan (kv/step_plan.h): the plan's rows through every layer, K/V appended to
  // the pages the plan names, attention of decode rows in one batched call per layer and of
  // prefill rows per chunk; logits of plan.logit_rows: [n_logit_rows, vocab]. Caches are not
  // committed: the caller runs demote() and plan.commit().
  Status forward(const kv::StepPlan& plan, const ForwardOptions& options,
                 std::vector<float>* logits);
  // The demotions the plan lists (kernels/demote_pages.h); status: [n_demote] per page.
  Status demote(const kv::StepPlan& plan, std::vector<int32_t>* status) const;

  // Convenience for callers without a scheduler: reserve -> plan -> forward -> demote -> commit
  // over chunks given in any order; each chunk's logits land in its own vector. A failure leaves
  // no tokens staged (a failed demotion leaves that cache unusable: drop it).
  Status forward(std::span<SeqChunk> batch, const ForwardOptions& options = {});
  // Convenience for one sequence: logits of the last token (or all tokens).
  Status forward_one(std::span<const int32_t> tokens, kv::SequenceCache& cache,
                     std::vector<float>* logits, bool all_logits = false,
                     const ForwardOptions& options = {});

  size_t weight_bytes() const;

  // Test seam (fault injection): overwrites token `token`'s embedding row ([hidden] values,
  // rounded to the table's type) as an input embedding only (a tied lm_head is untied first, so
  // logits keep the old row). A NaN row makes every K/V row computed after that token non-finite,
  // which is how the tests reach the per-request failure paths.
  Status set_embedding_row(int32_t token, std::span<const float> row);

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;       // [hidden]
    Matrix wq, wk, wv, wo;                          // [q_dim|kv_dim|hidden, in] row-major
    std::vector<float> bq, bk, bv;                  // [q_dim|kv_dim] (Qwen2) or empty
    std::vector<float> q_norm, k_norm;              // [head_dim] (Qwen3) or empty
    Matrix w_gate, w_up, w_down;                    // [inter, hidden], [inter, hidden], [hidden, inter]
  };

  // Activations of one step, reused across steps (grown, never shrunk).
  struct Workspace {
    std::vector<float> x, h, o;     // [n, hidden]
    std::vector<float> q, q_rot, attn;  // [n, q_dim]
    std::vector<float> k, v;        // [n, kv_dim]
    std::vector<float> gate, up;    // [n, intermediate]
    std::vector<float> cos, sin;    // [n, head_dim / 2] RoPE of each row's position
    void resize(int64_t n, const format::ModelConfig& c);
  };

  Qwen3Model() = default;
  void init_rope();

  format::ModelConfig config_;
  Matrix embed_;     // [vocab, hidden]
  Matrix lm_head_;   // [vocab, hidden]; rows == 0 when tied to embed_
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2], float32 as the reference computes it
  bool value_rotation_folded_ = false;
  Workspace ws_;
  kernels::Backend* backend_ = &kernels::cpu_backend();
};

}  // namespace oscar::model
