// StepRunner: the life of one step, written once for every architecture (model/architecture.h):
// the plan's arrays staged where the ops read them (one upload on a device), the RoPE tables, the
// embedding, the layers over the pre-norm residual stream (each layer's mixer and FFN from its
// architecture, every residual add fused into the next norm), the final norm, the lm_head over
// the plan's logit rows (left in the backend's memory for sampling), decode steps recorded as
// graphs where the backend can, and the demotions the plan lists. Engine-wide KV parameters come
// from the plan (kv/step_plan.h), never from a sequence's cache.
//
// The step's life: reserve (caller) -> StepPlan::make -> step() (forward -> demote -> commit) ->
// sample (caller, from logits()). run() is the whole of it for callers without a scheduler.
// Not here: the weights and their loading (model/qwen3.h), the blocks (model/blocks.h), choosing
// the chunks and sampling (engine/scheduler.h). Not thread-safe (one workspace per runner).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "kernels/backend.h"
#include "kv/sequence_cache.h"
#include "kv/step_plan.h"
#include "model/architecture.h"
#include "model/weights.h"
#include "model/workspace.h"

namespace oscar::model {

// Sees each layer's attention inputs and outputs during a forward pass (calibration, fidelity).
// `layer` is the KV cache layer (ModelConfig::kv_layer): the model layer itself except in a
// hybrid, whose Gated DeltaNet layers have no attention to observe.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // q: [n, n_heads_q, head_dim], k, v: [n, n_heads_kv, head_dim], after q/k norm and RoPE, before
  // any OSCAR rotation; positions pos0 .. pos0 + n - 1 of sequence `seq` (index in the batch).
  virtual void on_qkv(int seq, int layer, const float* q, const float* k, const float* v, int64_t n,
                      int64_t pos0) {}
  // out: [n, n_heads_q, head_dim] attention output before o_proj.
  virtual void on_attention(int seq, int layer, const float* out, int64_t n, int64_t pos0) {}
  // hidden: [n, hidden_size] after the final norm.
  virtual void on_final_hidden(int seq, const float* hidden, int64_t n, int64_t pos0) {}
};

// One sequence's part of a batch.
struct SeqChunk {
  std::span<const int32_t> tokens;  // new tokens, at positions cache->n_tokens() ...
  kv::SequenceCache* cache = nullptr;
  bool all_logits = false;               // logits for every token (else only the last)
  std::vector<float>* logits = nullptr;  // out: [n or 1, vocab_size]
};

struct ForwardOptions {
  kv::AttendMode attend_mode = kv::AttendMode::kPrefill;
  LayerObserver* observer = nullptr;
};

class StepRunner {
 public:
  // weights and arch must outlive the runner; the CPU backend until set_backend.
  StepRunner(const ModelWeights& weights, const Architecture& arch);

  void set_backend(kernels::Backend* backend) { backend_ = backend; }
  kernels::Backend& backend() const { return *backend_; }
  // Decode steps replayed as graphs where the backend records them (default on; off to compare).
  void set_graphs(bool on) { graphs_enabled_ = on; }

  // One step from its plan: logits of plan.logit_rows left in the backend's memory, logits()
  // ([n_logit_rows, vocab]) until the next forward. Caches are not committed.
  Status forward(const kv::StepPlan& plan, const ForwardOptions& options);
  const float* logits() const { return ws_.logits.as<const float>(); }
  // The same, the logits downloaded: [n_logit_rows, vocab].
  Status forward(const kv::StepPlan& plan, const ForwardOptions& options,
                 std::vector<float>* logits);
  // The demotions the plan lists (kernels/demote_pages.h); status: [n_demote] per page.
  Status demote(const kv::StepPlan& plan, std::vector<int32_t>* status) const;
  // The step between plan and sampling: forward -> after_forward (if any; the scheduler's fault
  // injection, the driver's logits download) -> demote -> commit; the logits stay in logits().
  // A failure of any of the first three is returned with every cache of the plan unreserved. A
  // failed demotion is its chunk's alone: per_chunk[chunk] gets the error (its tokens stay
  // staged; the owner drops the cache) and the other chunks are committed.
  Status step(const kv::StepPlan& plan, const ForwardOptions& options,
              std::vector<Status>* per_chunk,
              const std::function<Status()>& after_forward = nullptr);
  // The whole step for callers without a scheduler: reserve -> plan -> forward -> demote ->
  // commit over chunks given in any order; each chunk's logits land in its own vector. A failure
  // leaves no tokens staged (a failed demotion leaves that cache unusable: drop it).
  Status run(std::span<SeqChunk> batch, const ForwardOptions& options);

 private:
  Status download_logits(const kv::StepPlan& plan, std::vector<float>* logits) const;

  const ModelWeights& w_;
  const Architecture& arch_;
  std::vector<float> inv_freq_;  // [rotary_dim / 2], float32 as the reference computes it
  StepWorkspace ws_;
  mutable DeviceBuffer demote_buf_;  // a device backend's copy of the step's demotion list
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
  bool graphs_enabled_ = true;
  kernels::Backend* backend_ = &kernels::cpu_backend();
};

}  // namespace oscar::model
