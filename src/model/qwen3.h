// The Qwen3 decoder (also Qwen2 and Llama dense layouts, and Qwen3-MoE: routed experts in the
// sparse layers, each FFN one block of model/blocks.h; MoE runs on the CPU backend only for now),
// and the dense Qwen3.5 hybrids (CPU only for now): Gated DeltaNet layers (model/blocks.h, their
// state in the sequence's StatePool slot, kv/state_pool.h) between full-attention layers whose
// q_proj also gives an output gate (attn · sigmoid(gate) before o_proj), with partial RoPE and
// zero-centred norms (stored as 1 + w at load); only the full-attention layers have KV cache
// layers (ModelConfig::kv_layer).
//
// Weights are loaded from a checkpoint directory (format/weight_table.h). Matrices stay in the
// checkpoint's BF16 and are widened inside the matrix product (kernels/linear.h): a decode step
// reads half the bytes an upcast copy would. Norms and biases are float32, and so are v_proj and
// o_proj once a value rotation is folded into them. Activations are float32.
//
// forward() runs one step from its plan (kv/step_plan.h): the linear layers once over all the
// step's rows, K/V appended through the plan's slots, decode attention for all decode rows in one
// batched call per layer, prefill attention per chunk. A sparse layer's experts are stacked at
// load time into one [n_experts · out, in] matrix per kind. Not thread-safe (one workspace per
// model).
#pragma once

#include <cstdint>
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
#include "model/blocks.h"

namespace oscar::model {

// Sees each layer's attention inputs and outputs during a forward pass (calibration, fidelity).
// `layer` is the KV cache layer (ModelConfig::kv_layer): the model layer itself except in a
// hybrid, whose Gated DeltaNet layers have no attention to observe.
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
  // F32 where it was computed at load time (the folded value rotation). Host vectors while the
  // model loads; set_backend moves the bytes to `dev`: into the device's memory, or on the CPU
  // into one buffer for all matrices (on huge pages), and the vectors go.
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
    void to_f32();  // converts in place (exact); host only
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
  // Loads config.json and the safetensors checkpoint of `dir`.
  static Result<std::unique_ptr<Qwen3Model>> load(const std::string& dir);
  // Random weights for a config (like vLLM's dummy load format): speed and memory at real sizes.
  // The values come from kernels::fill_normal_bf16 (the same on every backend); with a device
  // backend they are generated in its memory (seconds for an 8B model, no host copy).
  static Result<std::unique_ptr<Qwen3Model>> load_dummy(const format::ModelConfig& config,
                                                        uint64_t seed,
                                                        kernels::Backend* backend = nullptr);

  const format::ModelConfig& config() const { return config_; }
  // The backend whose ops forward() calls (kernels/backend.h); the CPU backend until set. A
  // device backend gets the weights uploaded once (the host copies of the matrices are freed);
  // after that the weights can no longer be edited (fold, set_embedding_row). On the CPU the
  // matrices move into one buffer (pack_cpu_weights): set_embedding_row still works, fold not.
  Status set_backend(kernels::Backend* backend);
  kernels::Backend& backend() const { return *backend_; }
  // Decode steps replayed as graphs where the backend records them (default on; off to compare).
  void set_graphs(bool on) { graphs_enabled_ = on; }
  bool on_device() const { return backend_->device() != Device::kCpu; }

  // Folds a value rotation into v_proj and o_proj (OSCAR.md §3), in float64, stored as `stored`:
  // float32 (exact to float rounding; twice the bytes a step reads for these two matrices) or
  // BF16 (rounded like the checkpoint's own weights; what a GPU step wants).
  // v_rotation: [n_layers, n_heads_kv, head_dim, head_dim]. Call at most once, before a device
  // backend is set (dummy weights on a device excepted: their fold is a redraw).
  Status fold_value_rotation(std::span<const float> v_rotation,
                             kernels::DType stored = kernels::DType::kF32);

  // One step from its plan (kv/step_plan.h): the plan's rows through every layer, K/V appended to
  // the pages the plan names, attention of decode rows in one batched call per layer and of
  // prefill rows per chunk; logits of plan.logit_rows: [n_logit_rows, vocab]. Caches are not
  // committed: the caller runs demote() and plan.commit().
  Status forward(const kv::StepPlan& plan, const ForwardOptions& options,
                 std::vector<float>* logits);
  // The same, leaving the logits in the backend's memory: logits() until the next forward
  // (the scheduler samples them there; only token ids come back).
  Status forward(const kv::StepPlan& plan, const ForwardOptions& options);
  const float* logits() const { return ws_.logits.as<const float>(); }
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
  std::vector<Matrix*> matrices();  // every weight matrix (lm_head_ too, even when tied)
  Status pack_cpu_weights(kernels::Backend& be);
  struct Layer {
    Vec input_norm, post_norm;                      // [hidden]
    Matrix wq, wk, wv, wo;                          // [q_dim|kv_dim|hidden, in] row-major
    Matrix wq_gate;  // [q_dim, hidden] Qwen3.5's output gate rows of q_proj, else empty
    Vec bq, bk, bv;                                 // [q_dim|kv_dim] (Qwen2) or empty
    Vec q_norm, k_norm;                             // [head_dim] (Qwen3) or empty
    // Dense FFN: [inter, hidden], [inter, hidden], [hidden, inter]; empty in a sparse layer.
    Matrix w_gate, w_up, w_down;
    // Sparse (MoE) FFN, config.moe_layer(l): the router and every expert of the layer stacked
    // into one matrix each ([n_experts, out, in] as [n_experts · out, in] rows); empty otherwise.
    Matrix w_router;              // [n_experts, hidden]
    Matrix w_exp_gate, w_exp_up;  // [n_experts · moe_inter, hidden]
    Matrix w_exp_down;            // [n_experts · hidden, moe_inter]
    bool moe = false;
    // Gated DeltaNet (config.linear(l)): the attention members above are empty.
    int32_t state_layer = -1;              // its index in the StatePool, else -1
    Matrix lin_qkv, lin_z, lin_b, lin_a;   // [conv_dim | value_dim | heads_v | heads_v, hidden]
    Matrix lin_out;                        // [hidden, value_dim]
    Vec lin_conv;                          // [conv_dim, K]
    Vec lin_A_log, lin_dt_bias;            // [heads_v]
    Vec lin_norm;                          // [d_v]
  };
  GatedDeltaNetWeights gdn_weights(const Layer& L) const;
  // The FFN block weights of a layer (model/blocks.h).
  DenseFfnWeights dense_weights(const Layer& L) const;
  MoeFfnWeights moe_weights(const Layer& L) const;

  // Activations of one step in the backend's memory, reused across steps (grown, never shrunk),
  // and the plan's arrays where the ops read them (kernels take them from `plan` on a device).
  struct Workspace {
    int64_t rows = 0, logit_rows = 0;
    DeviceBuffer x, h, o;          // [n, hidden]
    DeviceBuffer q, q_rot, attn;   // [n, q_dim]
    DeviceBuffer k, v;             // [n, kv_dim]
    DeviceBuffer gate, up;         // [n, intermediate] (a model with a dense FFN)
    DeviceBuffer router_logits;    // [n, n_experts] (a model with sparse layers)
    DeviceBuffer expert_ids;       // [n, top_k] int32
    DeviceBuffer expert_weights;   // [n, top_k]
    DeviceBuffer moe_work;         // kernels::moe_ffn_work_bytes(n, ...) bytes
    DeviceBuffer logits;           // [n_logit_rows, vocab]
    DeviceBuffer attn_gate;        // [n, q_dim] (Qwen3.5's gated attention)
    DeviceBuffer lin_qkv, lin_conv;  // [n, conv_dim] (Gated DeltaNet layers)
    DeviceBuffer lin_z, lin_o;     // [n, value_dim]
    DeviceBuffer lin_ab;           // [4, n, heads_v]
    std::vector<int32_t> state_slots;  // [n_seqs] each plan sequence's StatePool slot (host)
    std::vector<float> cos, sin;   // [n, rotary_dim / 2] RoPE of each row's position (host)
    std::vector<uint8_t> staging;  // host bytes of the plan's arrays, uploaded in one copy
    DeviceBuffer plan;             // their device copy
    std::vector<float> host;       // observer copies on a device backend
    Status reserve(kernels::Backend& be, int64_t n, int64_t n_logits, const format::ModelConfig& c);
  };

  Qwen3Model() = default;
  void init_rope();

  format::ModelConfig config_;
  Matrix embed_;     // [vocab, hidden]
  Matrix lm_head_;   // [vocab, hidden]; rows == 0 when tied to embed_
  Vec final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [rotary_dim / 2], float32 as the reference computes it
  bool value_rotation_folded_ = false;
  bool dummy_on_device_ = false;  // load_dummy generated the weights in a device backend
  Workspace ws_;
  mutable DeviceBuffer demote_buf_;
  DeviceBuffer cpu_weights_;  // on the CPU backend: every matrix, one buffer (pack_cpu_weights)
  // Recorded decode steps, by batch size (a device backend that supports capture).
  static constexpr int64_t kMaxGraphRows = 64;
  struct StepGraph {
    bool warm = false;  // one direct step at this size ran (the kernels' workspaces are sized)
    uint64_t epoch = 0;
    std::unique_ptr<kernels::Backend::Graph> graph;
  };
  std::vector<StepGraph> graphs_;
  uint64_t graph_epoch_ = 0;         // bumped whenever a buffer a recording points into moves
  size_t table_cap_[3] = {0, 0, 0};  // room for the decode page tables' page ids
  bool graphs_enabled_ = true;       // a device backend's copy of the step's demotion list
  kernels::Backend* backend_ = &kernels::cpu_backend();
};

}  // namespace oscar::model
