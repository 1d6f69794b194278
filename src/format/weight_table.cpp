// The weight table for Qwen3 / Qwen2 / Llama dense decoders, Qwen3-MoE, the Qwen3.5 hybrids
// (Gated DeltaNet or gated-attention layers, under "model." or "model.language_model.") and
// Qwen3-Next (the hybrid layers with fused DeltaNet projections, MoE with a shared expert), and the
// binding of a checkpoint to it. Binding never stops at the first problem: it lists every
// missing, mis-shaped, mis-typed and unused tensor (up to a cap) so that one run shows everything
// wrong with a checkpoint.
#include "format/weight_table.h"

#include <set>
#include <string>

namespace oscar::format {

namespace {

constexpr size_t kMaxListedProblems = 40;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// The attention block's tensors of one layer, through add(suffix, kind, shape).
template <typename Add>
void add_attention(const ModelConfig& config, Add& add) {
  const int64_t hidden = config.hidden_size, q_dim = config.q_dim, kv_dim = config.kv_dim;
  const int64_t head_dim = config.head_dim;
  add("self_attn.q_proj.weight", WeightKind::kQProj,
      {config.attn_output_gate ? 2 * q_dim : q_dim, hidden});
  add("self_attn.k_proj.weight", WeightKind::kKProj, {kv_dim, hidden});
  add("self_attn.v_proj.weight", WeightKind::kVProj, {kv_dim, hidden});
  if (config.attention_bias) {
    add("self_attn.q_proj.bias", WeightKind::kQBias, {q_dim});
    add("self_attn.k_proj.bias", WeightKind::kKBias, {kv_dim});
    add("self_attn.v_proj.bias", WeightKind::kVBias, {kv_dim});
  }
  if (config.qk_norm) {
    add("self_attn.q_norm.weight", WeightKind::kQNorm, {head_dim});
    add("self_attn.k_norm.weight", WeightKind::kKNorm, {head_dim});
  }
  add("self_attn.o_proj.weight", WeightKind::kOProj, {hidden, q_dim});
}

// Tensors no text model reads: the vision tower of a multimodal wrapper, the MTP head.
bool skipped(const std::string& name) {
  return name.rfind("model.visual.", 0) == 0 || name.rfind("mtp.", 0) == 0;
}

}  // namespace

std::vector<WeightSpec> weight_specs(const ModelConfig& config) {
  const int64_t vocab = config.vocab_size, hidden = config.hidden_size;
  const int64_t inter = config.intermediate_size;
  const std::string& root = config.weight_prefix;  // "model." or "model.language_model."
  std::vector<WeightSpec> specs;
  specs.push_back({root + "embed_tokens.weight", WeightKind::kEmbed, -1, {vocab, hidden}, false});
  for (int l = 0; l < config.n_layers; ++l) {
    const std::string p = root + "layers." + std::to_string(l) + ".";
    auto add = [&](const std::string& suffix, WeightKind kind, std::vector<int64_t> shape) {
      specs.push_back({p + suffix, kind, l, std::move(shape), false});
    };
    add("input_layernorm.weight", WeightKind::kInputNorm, {hidden});
    if (config.linear(l)) {
      const int64_t conv = config.lin_conv_dim, value = config.lin_value_dim;
      const int64_t hv = config.lin_heads_v;
      if (config.arch == Architecture::kQwen3Next) {
        add("linear_attn.in_proj_qkvz.weight", WeightKind::kLinQkvz, {conv + value, hidden});
        add("linear_attn.in_proj_ba.weight", WeightKind::kLinBa, {2 * hv, hidden});
      } else {
        add("linear_attn.in_proj_qkv.weight", WeightKind::kLinQkv, {conv, hidden});
        add("linear_attn.in_proj_z.weight", WeightKind::kLinZ, {value, hidden});
        add("linear_attn.in_proj_b.weight", WeightKind::kLinB, {hv, hidden});
        add("linear_attn.in_proj_a.weight", WeightKind::kLinA, {hv, hidden});
      }
      add("linear_attn.conv1d.weight", WeightKind::kLinConv, {conv, 1, config.lin_conv_kernel});
      add("linear_attn.A_log", WeightKind::kLinALog, {hv});
      add("linear_attn.dt_bias", WeightKind::kLinDtBias, {hv});
      add("linear_attn.norm.weight", WeightKind::kLinNorm, {config.lin_head_dim_v});
      add("linear_attn.out_proj.weight", WeightKind::kLinOut, {hidden, value});
    } else {
      add_attention(config, add);
    }
    add("post_attention_layernorm.weight", WeightKind::kPostAttnNorm, {hidden});
    if (!config.moe_layer(l)) {
      add("mlp.gate_proj.weight", WeightKind::kGateProj, {inter, hidden});
      add("mlp.up_proj.weight", WeightKind::kUpProj, {inter, hidden});
      add("mlp.down_proj.weight", WeightKind::kDownProj, {hidden, inter});
      continue;
    }
    const int64_t n_experts = config.n_experts, moe_inter = config.moe_intermediate_size;
    add("mlp.gate.weight", WeightKind::kRouter, {n_experts, hidden});
    for (int e = 0; e < config.n_experts; ++e) {
      const std::string x = "mlp.experts." + std::to_string(e) + ".";
      auto add_expert = [&](const char* suffix, WeightKind kind, std::vector<int64_t> shape) {
        specs.push_back({p + x + suffix, kind, l, std::move(shape), false, e});
      };
      add_expert("gate_proj.weight", WeightKind::kExpertGate, {moe_inter, hidden});
      add_expert("up_proj.weight", WeightKind::kExpertUp, {moe_inter, hidden});
      add_expert("down_proj.weight", WeightKind::kExpertDown, {hidden, moe_inter});
    }
    if (config.has_shared_expert()) {
      const int64_t shared = config.shared_expert_intermediate_size;
      add("mlp.shared_expert.gate_proj.weight", WeightKind::kSharedGate, {shared, hidden});
      add("mlp.shared_expert.up_proj.weight", WeightKind::kSharedUp, {shared, hidden});
      add("mlp.shared_expert.down_proj.weight", WeightKind::kSharedDown, {hidden, shared});
      add("mlp.shared_expert_gate.weight", WeightKind::kSharedExpertGate, {1, hidden});
    }
  }
  specs.push_back({root + "norm.weight", WeightKind::kFinalNorm, -1, {hidden}, false});
  specs.push_back({"lm_head.weight", WeightKind::kLmHead, -1, {vocab, hidden},
                   config.tie_word_embeddings});
  return specs;
}

Result<BoundWeights> bind_weights(const ModelConfig& config, const Checkpoint& checkpoint) {
  BoundWeights bound;
  bound.specs = weight_specs(config);
  bound.tensors.assign(bound.specs.size(), nullptr);

  std::vector<std::string> problems;
  std::set<std::string> expected;
  for (size_t i = 0; i < bound.specs.size(); ++i) {
    const WeightSpec& spec = bound.specs[i];
    expected.insert(spec.hf_name);
    const TensorView* t = checkpoint.find(spec.hf_name);
    if (t == nullptr) {
      if (!spec.optional)
        problems.push_back("missing " + spec.hf_name + " (expected " + shape_str(spec.shape) +
                           ")");
      continue;
    }
    bool ok = true;
    if (t->shape != spec.shape) {
      problems.push_back("wrong shape " + spec.hf_name + ": expected " + shape_str(spec.shape) +
                         ", got " + shape_str(t->shape));
      ok = false;
    }
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32) {
      problems.push_back("wrong dtype " + spec.hf_name + ": " + dtype_name(t->dtype) +
                         " (weights must be BF16, F16 or F32)");
      ok = false;
    }
    if (ok) bound.tensors[i] = t;
  }
  for (const TensorView* t : checkpoint.all()) {
    if (expected.count(t->name) == 0 && !skipped(t->name))
      problems.push_back("unused " + t->name + " " + dtype_name(t->dtype) + " " +
                         shape_str(t->shape));
  }
  if (problems.empty()) return bound;

  std::string msg = "checkpoint does not match " + config.architecture_name + " config (" +
                    std::to_string(config.n_layers) + " layers, hidden " +
                    std::to_string(config.hidden_size) + "): " + std::to_string(problems.size()) +
                    " problem(s):";
  for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i) msg += "\n  " + problems[i];
  if (problems.size() > kMaxListedProblems)
    msg += "\n  ... and " + std::to_string(problems.size() - kMaxListedProblems) + " more";
  return Status(StatusCode::kInvalidArgument, msg);
}

}  // namespace oscar::format
