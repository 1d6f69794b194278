// The Qwen3 decoder (also Qwen2 and Llama dense layouts, and Qwen3-MoE: routed experts in the
// sparse layers, each FFN one block of model/blocks.h; MoE runs on the CPU backend only for now),
// and the dense Qwen3.5 hybrids (CPU only for now): Gated DeltaNet layers (model/blocks.h, their
// state in the sequence's StatePool slot, kv/state_pool.h) between full-attention layers whose
// q_proj also gives an output gate (attn · sigmoid(gate) before o_proj), with partial RoPE and
// zero-centred norms (stored as 1 + w at load); only the full-attention layers have KV cache
// layers (ModelConfig::kv_layer); and Qwen3-Next (CPU only for now): those hybrid layers with a
// sparse FFN plus a sigmoid-gated shared expert, its fused DeltaNet projections split at load
// into Qwen3.5's layout (model/weights.h).
//
// Weights are loaded from a checkpoint directory (format/weight_table.h). Matrices stay in the
// checkpoint's BF16 and are widened inside the matrix product (kernels/linear.h): a decode step
// reads half the bytes an upcast copy would. Norms and biases are float32, and so are v_proj and
// o_proj once a value rotation is folded into them. Activations are float32.
//
// The step itself is the step runner's (model/step_runner.h), the layer the architecture's
// (model/architecture.h, one file per family in model/arch/); this class owns the weights
// (model/weights.h), loads, packs and folds them, and hands forward() and demote() to the runner.
// A sparse layer's experts are stacked at load time into one [n_experts · out, in] matrix per
// kind. Not thread-safe (one workspace per model).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/device.h"
#include "core/status.h"
#include "format/model_config.h"
#include "kernels/backend.h"
#include "kernels/linear.h"
#include "kv/sequence_cache.h"
#include "kv/step_plan.h"
#include "model/architecture.h"
#include "model/step_runner.h"
#include "model/weights.h"

namespace oscar::model {

class Qwen3Model {
 public:
  // Loads config.json and the safetensors checkpoint of `dir`.
  static Result<std::unique_ptr<Qwen3Model>> load(const std::string& dir);
  // Random weights for a config (like vLLM's dummy load format): speed and memory at real sizes.
  // The values come from kernels::fill_normal_bf16 (the same on every backend); with a device
  // backend they are generated in its memory (seconds for an 8B model, no host copy).
  static Result<std::unique_ptr<Qwen3Model>> load_dummy(const format::ModelConfig& config,
                                                        uint64_t seed,
                                                        kernels::Backend* backend = nullptr);

  const format::ModelConfig& config() const { return w_.config; }
  // The backend whose ops forward() calls (kernels/backend.h); the CPU backend until set. A
  // device backend gets the weights uploaded once (the host copies of the matrices are freed);
  // after that the weights can no longer be edited (fold, set_embedding_row). On the CPU the
  // matrices move into one buffer (pack_cpu_weights): set_embedding_row still works, fold not.
  Status set_backend(kernels::Backend* backend);
  kernels::Backend& backend() const { return runner_->backend(); }
  // Decode steps replayed as graphs where the backend records them (default on; off to compare).
  void set_graphs(bool on) { runner_->set_graphs(on); }
  bool on_device() const { return backend().device() != Device::kCpu; }

  // Folds a value rotation into v_proj and o_proj (OSCAR.md §3), in float64, stored as `stored`:
  // float32 (exact to float rounding; twice the bytes a step reads for these two matrices) or
  // BF16 (rounded like the checkpoint's own weights; what a GPU step wants). A model with an
  // elementwise output gate (Qwen3.5) gets it in v_proj only, and its attention output turned
  // back by R_Vᵀ before the gate at run time (ModelWeights::out_unrotation).
  // v_rotation: [n_kv_layers, n_heads_kv, head_dim, head_dim]. Call at most once, before a device
  // backend is set (dummy weights on a device excepted: their fold is a redraw).
  Status fold_value_rotation(std::span<const float> v_rotation,
                             kernels::DType stored = kernels::DType::kF32);

  // One step from its plan (kv/step_plan.h): the plan's rows through every layer, K/V appended to
  // the pages the plan names, attention of decode rows in one batched call per layer and of
  // prefill rows per chunk; logits of plan.logit_rows: [n_logit_rows, vocab]. Caches are not
  // committed: the caller runs demote() and plan.commit().
  Status forward(const kv::StepPlan& plan, const ForwardOptions& options,
                 std::vector<float>* logits) {
    return runner_->forward(plan, options, logits);
  }
  // The same, leaving the logits in the backend's memory: logits() until the next forward
  // (the scheduler samples them there; only token ids come back).
  Status forward(const kv::StepPlan& plan, const ForwardOptions& options) {
    return runner_->forward(plan, options);
  }
  const float* logits() const { return runner_->logits(); }
  // The demotions the plan lists (kernels/demote_pages.h); status: [n_demote] per page.
  Status demote(const kv::StepPlan& plan, std::vector<int32_t>* status) const {
    return runner_->demote(plan, status);
  }
  // forward -> after_forward -> demote -> commit (StepRunner::step): what the scheduler runs
  // between the plan and sampling.
  Status step(const kv::StepPlan& plan, const ForwardOptions& options,
              std::vector<Status>* per_chunk,
              const std::function<Status()>& after_forward = nullptr) {
    return runner_->step(plan, options, per_chunk, after_forward);
  }

  // Convenience for callers without a scheduler: reserve -> plan -> forward -> demote -> commit
  // over chunks given in any order; each chunk's logits land in its own vector. A failure leaves
  // no tokens staged (a failed demotion leaves that cache unusable: drop it).
  Status forward(std::span<SeqChunk> batch, const ForwardOptions& options = {}) {
    return runner_->run(batch, options);
  }
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
  std::vector<Matrix*> matrices();  // every weight matrix (lm_head too, even when tied)
  Status pack_cpu_weights(kernels::Backend& be);
  Qwen3Model() = default;
  void init_runner();  // once the config and the layers are in place

  ModelWeights w_;
  bool value_rotation_folded_ = false;
  bool dummy_on_device_ = false;  // load_dummy generated the weights in a device backend
  DeviceBuffer cpu_weights_;      // on the CPU backend: every matrix, one buffer (pack_cpu_weights)
  std::unique_ptr<Architecture> arch_;  // reads w_
  std::unique_ptr<StepRunner> runner_;  // reads w_ and arch_
};

}  // namespace oscar::model
