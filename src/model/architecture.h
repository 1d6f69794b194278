// Architecture: what differs between the decoder families oscar runs, per layer: the token mixer
// (full attention, or a Gated DeltaNet) and the FFN (dense, or routed experts), each one block of
// model/blocks.h. One file per family in model/arch/ (llama.cpp's src/models/): dense.cpp (Qwen3,
// Qwen2, Llama), qwen3_moe.cpp, qwen3_5.cpp (the Qwen3.5 / 3.6 hybrids), qwen3_next.cpp (the
// hybrid layers with MoE and a shared expert). Everything else of a
// step (plan staging, embedding, the pre-norm residual stream, final norm, logits, graphs,
// demotion) is the step runner's, written once (model/step_runner.h).
// Not thread-safe: a LayerStep is one step's.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "kernels/backend.h"
#include "kv/layer_groups.h"
#include "kv/state_pool.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace oscar::model {

// One step's blocks and scratch, filled by the step runner once per step; every pointer is in
// the backend's memory.
struct LayerStep {
  kernels::Backend* be = nullptr;
  int64_t n = 0;            // the step's rows
  AttentionStep attention;  // full-attention layers
  FfnScratch ffn;
  GatedDeltaNetBatch delta_net;  // DeltaNet layers: the sequences and their slots
  GatedDeltaNetScratch delta_net_scratch;
  kv::StatePool* state_pool = nullptr;  // the DeltaNet states (a hybrid), else null
};

class Architecture {
 public:
  // w must outlive the architecture.
  explicit Architecture(const ModelWeights& w) : w_(w), groups_(kv::layer_groups(w.config)) {}
  virtual ~Architecture() = default;
  // out[n, hidden] = layer `layer`'s token mixer of h[n, hidden] (its input norm applied).
  virtual Status mixer(int layer, LayerStep& step, const float* h, float* out) const = 0;
  // out[n, hidden] = layer `layer`'s FFN of h[n, hidden] (its post-attention norm applied).
  virtual Status ffn(int layer, LayerStep& step, const float* h, float* out) const = 0;

 protected:
  // Full attention over the layer's cache layer (its index in the full-attention group).
  Status full_attention(int layer, LayerStep& step, const float* h, float* out) const;
  // A hybrid's mixer (Qwen3.5, Qwen3-Next): full attention, or the Gated DeltaNet over the
  // layer's StatePool layer (its index in the linear-state group).
  Status hybrid_mixer(int layer, LayerStep& step, const float* h, float* out) const;

  const ModelWeights& w_;
  const kv::LayerGroups groups_;
};

// The architecture of w.config.arch.
std::unique_ptr<Architecture> make_architecture(const ModelWeights& w);
std::unique_ptr<Architecture> make_dense(const ModelWeights& w);
std::unique_ptr<Architecture> make_qwen3_moe(const ModelWeights& w);
std::unique_ptr<Architecture> make_qwen3_5(const ModelWeights& w);
std::unique_ptr<Architecture> make_qwen3_next(const ModelWeights& w);

}  // namespace oscar::model
