// The table from Hugging Face tensor names to weight slots with the shapes config.json implies.
// One entry per tensor (with `{layer}` and, for MoE experts, the expert index expanded: the
// per-expert `mlp.experts.{e}.*_proj.weight` names Hugging Face saves). Binding a checkpoint
// reports every missing, mis-shaped, mis-typed or unused tensor in one error. Stacking a layer's
// experts into one [E, out, in] buffer is the loader's job (model/qwen3.cpp).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "format/model_config.h"
#include "format/safetensors.h"

namespace oscar::format {

enum class WeightKind {
  kEmbed, kFinalNorm, kLmHead,
  kInputNorm, kPostAttnNorm, kQProj, kKProj, kVProj, kOProj, kQNorm, kKNorm,
  kQBias, kKBias, kVBias, kGateProj, kUpProj, kDownProj,
  // A sparse layer's FFN (Qwen3-MoE): the router `mlp.gate.weight` [n_experts, hidden] and each
  // expert's `mlp.experts.{e}.{gate,up,down}_proj.weight` ([moe_inter, hidden] twice, [hidden,
  // moe_inter]).
  kRouter, kExpertGate, kExpertUp, kExpertDown,
  // A Qwen3.5 full-attention layer's q_proj is kQProj at [2 · q_dim, hidden] (query and output
  // gate rows per head). A Gated DeltaNet layer (`linear_attn.*`): in_proj_qkv [conv_dim, hidden],
  // in_proj_z [value_dim, hidden], in_proj_b / in_proj_a [heads_v, hidden], conv1d.weight
  // [conv_dim, 1, K], A_log and dt_bias [heads_v], norm.weight [d_v], out_proj [hidden, value_dim].
  kLinQkv, kLinZ, kLinB, kLinA, kLinConv, kLinALog, kLinDtBias, kLinNorm, kLinOut,
  // Qwen3-Next's DeltaNet layer fuses the input projections, interleaved per key-head group (the
  // loader splits them into kLinQkv / kLinZ / kLinB / kLinA's layout, model/weights.h):
  // in_proj_qkvz [2 · key_dim + 2 · value_dim, hidden], in_proj_ba [2 · heads_v, hidden].
  kLinQkvz, kLinBa,
  // Qwen3-Next's sparse layers add a shared expert `mlp.shared_expert.{gate,up,down}_proj.weight`
  // ([shared_inter, hidden] twice, [hidden, shared_inter]) and its gate
  // `mlp.shared_expert_gate.weight` [1, hidden].
  kSharedGate, kSharedUp, kSharedDown, kSharedExpertGate,
};

struct WeightSpec {
  std::string hf_name;          // "model.layers.3.self_attn.q_proj.weight"
  WeightKind kind;
  int layer = -1;               // -1 for global weights
  std::vector<int64_t> shape;   // expected, HF layout ([out, in] for linear layers)
  bool optional = false;        // lm_head when embeddings are tied
  int expert = -1;              // kExpert*: the expert's index in its layer, else -1
};

std::vector<WeightSpec> weight_specs(const ModelConfig& config);

// Tensors of a checkpoint bound to the specs, in spec order (nullptr for an absent optional one).
struct BoundWeights {
  std::vector<WeightSpec> specs;
  std::vector<const TensorView*> tensors;
};
// Weights must be BF16, F16 or F32; any other dtype is refused by name. Tensors a text model never
// reads are skipped, not reported: a multimodal wrapper's `model.visual.*` and the multi-token
// prediction head `mtp.*` (as transformers' Qwen3.5 classes ignore them).
Result<BoundWeights> bind_weights(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace oscar::format
