// Weight table and binding on synthetic checkpoints written to a temp dir: a complete checkpoint
// binds (dense, Qwen3-MoE and Qwen3-Next); a broken one reports every missing, mis-shaped,
// mis-typed and unused tensor at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "format/weight_table.h"

namespace oscar::format {
namespace {

#define EXPECT_MSG_HAS(status, text) \
  EXPECT_NE((status).message().find(text), std::string::npos) << (status).to_string()

ModelConfig small_config(const char* arch, bool tied) {
  nlohmann::json j = {{"architectures", {arch}},       {"vocab_size", 32},
                      {"hidden_size", 16},             {"intermediate_size", 24},
                      {"num_hidden_layers", 2},        {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},      {"head_dim", 8},
                      {"max_position_embeddings", 64}, {"tie_word_embeddings", tied}};
  Result<ModelConfig> r = ModelConfig::from_json_text(j.dump());
  OSCAR_CHECK(r.ok(), "%s", r.status().to_string().c_str());
  return r.value();
}

TensorToWrite zeros(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, dtype, shape, std::vector<uint8_t>(static_cast<size_t>(n) * dtype_size(dtype))};
}

// Writes DIR/model.safetensors holding every spec'd tensor (lm_head only if required).
std::vector<TensorToWrite> full_checkpoint(const ModelConfig& c) {
  std::vector<TensorToWrite> out;
  for (const WeightSpec& s : weight_specs(c)) {
    if (!s.optional) out.push_back(zeros(s.hf_name, DType::kBF16, s.shape));
  }
  return out;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int n = 0;
    path = std::filesystem::temp_directory_path() /
           ("oscar_wt_" + std::to_string(getpid()) + "_" + std::to_string(n++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

TEST(WeightTable, SpecsQwen3) {
  ModelConfig c = small_config("Qwen3ForCausalLM", true);
  std::vector<WeightSpec> specs = weight_specs(c);
  ASSERT_EQ(specs.size(), 1u + 2 * 11 + 2);  // embed, 11 per layer, norm, lm_head
  EXPECT_EQ(specs.front().hf_name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.front().shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(specs.back().hf_name, "lm_head.weight");
  EXPECT_TRUE(specs.back().optional);
  int64_t params = 0;
  for (const WeightSpec& s : specs) {
    if (s.optional) continue;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    params += n;
    std::vector<int64_t> want;
    switch (s.kind) {
      case WeightKind::kQProj: want = {32, 16}; break;
      case WeightKind::kKProj: want = {16, 16}; break;
      case WeightKind::kOProj: want = {16, 32}; break;
      case WeightKind::kQNorm: want = {8}; break;
      case WeightKind::kDownProj: want = {16, 24}; break;
      default: want = s.shape;
    }
    EXPECT_EQ(s.shape, want) << s.hf_name;
  }
  EXPECT_EQ(params, c.n_params());  // the table and n_params() agree
  EXPECT_EQ(specs[5].hf_name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(specs[5].layer, 0);

  ModelConfig untied = small_config("Qwen3ForCausalLM", false);
  EXPECT_FALSE(weight_specs(untied).back().optional);
}

TEST(WeightTable, SpecsQwen2HasBiasNoQkNorm) {
  ModelConfig c = small_config("Qwen2ForCausalLM", false);
  int bias = 0, qk_norm = 0;
  int64_t params = 0;
  for (const WeightSpec& s : weight_specs(c)) {
    bias += s.kind == WeightKind::kQBias || s.kind == WeightKind::kKBias ||
            s.kind == WeightKind::kVBias;
    qk_norm += s.kind == WeightKind::kQNorm || s.kind == WeightKind::kKNorm;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    params += n;
    if (s.hf_name == "model.layers.1.self_attn.k_proj.bias") {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{16}));
    }
  }
  EXPECT_EQ(bias, 6);
  EXPECT_EQ(qk_norm, 0);
  EXPECT_EQ(params, c.n_params());
}

// Qwen3-MoE: 3 layers, layer 1 dense (mlp_only_layers), layers 0 and 2 with a router and 4
// experts each, named as Hugging Face saves them.
ModelConfig moe_config() {
  nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
                      {"vocab_size", 32},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"moe_intermediate_size", 12},
                      {"num_experts", 4},
                      {"num_experts_per_tok", 2},
                      {"mlp_only_layers", {1}},
                      {"num_hidden_layers", 3},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 8},
                      {"max_position_embeddings", 64},
                      {"tie_word_embeddings", false}};
  Result<ModelConfig> r = ModelConfig::from_json_text(j.dump());
  OSCAR_CHECK(r.ok(), "%s", r.status().to_string().c_str());
  return r.value();
}

TEST(WeightTable, SpecsQwen3Moe) {
  ModelConfig c = moe_config();
  std::vector<WeightSpec> specs = weight_specs(c);
  // embed, norm, lm_head; per layer 8 attention tensors (norms, q/k/v/o, q/k norm); layer 1 a
  // dense FFN (3), layers 0 and 2 a router and 4 · 3 expert matrices.
  ASSERT_EQ(specs.size(), 3u + 3 * 8 + 3 + 2 * (1 + 4 * 3));
  int64_t params = 0;
  int routers = 0, dense = 0;
  std::vector<int> experts_seen(3 * 4 * 3, 0);  // [layer, expert, kind]
  for (const WeightSpec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    params += n;
    switch (s.kind) {
      case WeightKind::kRouter:
        ++routers;
        EXPECT_EQ(s.shape, (std::vector<int64_t>{4, 16}));
        EXPECT_EQ(s.hf_name, "model.layers." + std::to_string(s.layer) + ".mlp.gate.weight");
        EXPECT_NE(s.layer, 1);
        EXPECT_EQ(s.expert, -1);
        break;
      case WeightKind::kExpertGate:
      case WeightKind::kExpertUp:
      case WeightKind::kExpertDown: {
        const int k = s.kind == WeightKind::kExpertGate ? 0 : s.kind == WeightKind::kExpertUp ? 1 : 2;
        ASSERT_GE(s.expert, 0);
        ASSERT_LT(s.expert, 4);
        ++experts_seen[(s.layer * 4 + s.expert) * 3 + k];
        const char* proj[] = {"gate_proj", "up_proj", "down_proj"};
        EXPECT_EQ(s.hf_name, "model.layers." + std::to_string(s.layer) + ".mlp.experts." +
                                 std::to_string(s.expert) + "." + proj[k] + ".weight");
        EXPECT_EQ(s.shape, k == 2 ? (std::vector<int64_t>{16, 12}) : (std::vector<int64_t>{12, 16}));
        break;
      }
      case WeightKind::kGateProj:
      case WeightKind::kUpProj:
      case WeightKind::kDownProj:
        ++dense;
        EXPECT_EQ(s.layer, 1);
        break;
      default:
        EXPECT_EQ(s.expert, -1) << s.hf_name;
    }
  }
  EXPECT_EQ(routers, 2);
  EXPECT_EQ(dense, 3);
  for (int l = 0; l < 3; ++l)
    for (int i = 0; i < 4 * 3; ++i) EXPECT_EQ(experts_seen[l * 12 + i], l == 1 ? 0 : 1);
  EXPECT_EQ(params, c.n_params());  // the table and n_params() agree
}

TEST(WeightTable, BindQwen3MoeCheckpoint) {
  TempDir dir;
  ModelConfig c = moe_config();
  std::vector<TensorToWrite> t = full_checkpoint(c);
  ASSERT_TRUE(write_safetensors((dir.path / "model.safetensors").string(), t, {}).ok());
  Result<Checkpoint> ck = Checkpoint::open(dir.path.string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  Result<BoundWeights> b = bind_weights(c, ck.value());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  // A missing expert, a mis-shaped one, and transformers 5's fused layout are each reported.
  std::erase_if(t, [](const TensorToWrite& x) {
    return x.name == "model.layers.2.mlp.experts.3.down_proj.weight";
  });
  for (TensorToWrite& x : t)
    if (x.name == "model.layers.0.mlp.experts.1.up_proj.weight") x = zeros(x.name, DType::kBF16, {16, 12});
  t.push_back(zeros("model.layers.0.mlp.experts.gate_up_proj", DType::kBF16, {4, 24, 16}));
  TempDir broken;
  ASSERT_TRUE(write_safetensors((broken.path / "model.safetensors").string(), t, {}).ok());
  Result<Checkpoint> bk = Checkpoint::open(broken.path.string());
  ASSERT_TRUE(bk.ok()) << bk.status().to_string();
  Result<BoundWeights> bb = bind_weights(c, bk.value());
  ASSERT_FALSE(bb.ok());
  EXPECT_MSG_HAS(bb.status(), "3 problem(s)");
  EXPECT_MSG_HAS(bb.status(), "missing model.layers.2.mlp.experts.3.down_proj.weight (expected "
                              "[16, 12])");
  EXPECT_MSG_HAS(bb.status(), "wrong shape model.layers.0.mlp.experts.1.up_proj.weight");
  EXPECT_MSG_HAS(bb.status(), "unused model.layers.0.mlp.experts.gate_up_proj");
}

// A small Qwen3-Next: layers [linear, full], layer 1 sparse with a shared expert, layer 0 dense.
ModelConfig next_config() {
  nlohmann::json j = {{"architectures", {"Qwen3NextForCausalLM"}},
                      {"vocab_size", 32},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"moe_intermediate_size", 12},
                      {"shared_expert_intermediate_size", 20},
                      {"num_experts", 4},
                      {"num_experts_per_tok", 2},
                      {"mlp_only_layers", {0}},
                      {"num_hidden_layers", 2},
                      {"full_attention_interval", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 8},
                      {"linear_num_key_heads", 2},
                      {"linear_num_value_heads", 4},
                      {"linear_key_head_dim", 4},
                      {"linear_value_head_dim", 2},
                      {"max_position_embeddings", 64},
                      {"tie_word_embeddings", false}};
  Result<ModelConfig> r = ModelConfig::from_json_text(j.dump());
  OSCAR_CHECK(r.ok(), "%s", r.status().to_string().c_str());
  return r.value();
}

// Qwen3-Next's names and shapes: the fused DeltaNet projections (no separate in_proj_qkv / z / b
// / a), the shared expert and its gate beside the routed experts; n_params() agrees; a checkpoint
// in Qwen3.5's DeltaNet layout or without the shared expert's gate is reported tensor by tensor.
TEST(WeightTable, SpecsAndBindQwen3Next) {
  const ModelConfig c = next_config();
  std::map<std::string, std::vector<int64_t>> shape;
  int64_t params = 0;
  for (const WeightSpec& s : weight_specs(c)) {
    shape[s.hf_name] = s.shape;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    params += n;
  }
  EXPECT_EQ(params, c.n_params());
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  // key_dim 8, value_dim 8: qkvz rows 2·8 + 2·8; ba rows 2 · 4 value heads.
  EXPECT_EQ(shape[l0 + "linear_attn.in_proj_qkvz.weight"], (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(shape[l0 + "linear_attn.in_proj_ba.weight"], (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(shape[l0 + "linear_attn.conv1d.weight"], (std::vector<int64_t>{24, 1, 4}));
  EXPECT_EQ(shape.count(l0 + "linear_attn.in_proj_qkv.weight"), 0u);
  EXPECT_EQ(shape.count(l0 + "linear_attn.in_proj_b.weight"), 0u);
  EXPECT_EQ(shape[l0 + "mlp.gate_proj.weight"], (std::vector<int64_t>{24, 16}));  // dense layer
  EXPECT_EQ(shape.count(l0 + "mlp.shared_expert_gate.weight"), 0u);
  EXPECT_EQ(shape[l1 + "self_attn.q_proj.weight"], (std::vector<int64_t>{64, 16}));  // + gate
  EXPECT_EQ(shape[l1 + "mlp.gate.weight"], (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(shape[l1 + "mlp.experts.3.down_proj.weight"], (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(shape[l1 + "mlp.shared_expert.gate_proj.weight"], (std::vector<int64_t>{20, 16}));
  EXPECT_EQ(shape[l1 + "mlp.shared_expert.up_proj.weight"], (std::vector<int64_t>{20, 16}));
  EXPECT_EQ(shape[l1 + "mlp.shared_expert.down_proj.weight"], (std::vector<int64_t>{16, 20}));
  EXPECT_EQ(shape[l1 + "mlp.shared_expert_gate.weight"], (std::vector<int64_t>{1, 16}));

  TempDir dir;
  std::vector<TensorToWrite> t = full_checkpoint(c);
  ASSERT_TRUE(write_safetensors((dir.path / "model.safetensors").string(), t, {}).ok());
  Result<Checkpoint> ck = Checkpoint::open(dir.path.string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  ASSERT_TRUE(bind_weights(c, ck.value()).ok());
  std::erase_if(t, [&](const TensorToWrite& x) {
    return x.name == l1 + "mlp.shared_expert_gate.weight" ||
           x.name == l0 + "linear_attn.in_proj_qkvz.weight";
  });
  for (TensorToWrite& x : t)
    if (x.name == l0 + "linear_attn.in_proj_ba.weight") x = zeros(x.name, DType::kBF16, {4, 16});
  t.push_back(zeros(l0 + "linear_attn.in_proj_qkv.weight", DType::kBF16, {24, 16}));
  TempDir broken;
  ASSERT_TRUE(write_safetensors((broken.path / "model.safetensors").string(), t, {}).ok());
  Result<Checkpoint> bk = Checkpoint::open(broken.path.string());
  ASSERT_TRUE(bk.ok()) << bk.status().to_string();
  const Result<BoundWeights> bb = bind_weights(c, bk.value());
  ASSERT_FALSE(bb.ok());
  EXPECT_MSG_HAS(bb.status(), "4 problem(s)");
  EXPECT_MSG_HAS(bb.status(), "missing model.layers.1.mlp.shared_expert_gate.weight (expected "
                              "[1, 16])");
  EXPECT_MSG_HAS(bb.status(), "missing model.layers.0.linear_attn.in_proj_qkvz.weight (expected "
                              "[32, 16])");
  EXPECT_MSG_HAS(bb.status(), "wrong shape model.layers.0.linear_attn.in_proj_ba.weight: "
                              "expected [8, 16], got [4, 16]");
  EXPECT_MSG_HAS(bb.status(), "unused model.layers.0.linear_attn.in_proj_qkv.weight");
}

TEST(WeightTable, BindCompleteCheckpoint) {
  TempDir dir;
  ModelConfig c = small_config("Qwen3ForCausalLM", true);
  ASSERT_TRUE(write_safetensors((dir.path / "model.safetensors").string(), full_checkpoint(c), {})
                  .ok());
  Result<Checkpoint> ck = Checkpoint::open(dir.path.string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  Result<BoundWeights> b = bind_weights(c, ck.value());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(b->tensors.size(), b->specs.size());
  EXPECT_EQ(b->tensors.back(), nullptr);  // tied: no lm_head
  for (size_t i = 0; i + 1 < b->tensors.size(); ++i) {
    ASSERT_NE(b->tensors[i], nullptr);
    EXPECT_EQ(b->tensors[i]->name, b->specs[i].hf_name);
  }
}

TEST(WeightTable, BindReportsEveryProblem) {
  TempDir dir;
  ModelConfig c = small_config("Qwen3ForCausalLM", false);  // untied: lm_head required
  std::vector<TensorToWrite> t = full_checkpoint(c);
  // Remove lm_head and one layer norm, reshape q_proj, retype k_proj, add two extras.
  std::erase_if(t, [](const TensorToWrite& x) {
    return x.name == "lm_head.weight" || x.name == "model.layers.1.input_layernorm.weight";
  });
  for (TensorToWrite& x : t) {
    if (x.name == "model.layers.0.self_attn.q_proj.weight") x = zeros(x.name, DType::kBF16, {16, 32});
    if (x.name == "model.layers.1.self_attn.k_proj.weight") x = zeros(x.name, DType::kI32, {16, 16});
  }
  t.push_back(zeros("model.layers.2.mlp.up_proj.weight", DType::kBF16, {24, 16}));
  t.push_back(zeros("model.rotary_emb.inv_freq", DType::kF32, {4}));
  ASSERT_TRUE(write_safetensors((dir.path / "model.safetensors").string(), t, {}).ok());
  Result<Checkpoint> ck = Checkpoint::open(dir.path.string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  Result<BoundWeights> b = bind_weights(c, ck.value());
  ASSERT_FALSE(b.ok());
  const Status& st = b.status();
  EXPECT_MSG_HAS(st, "6 problem(s)");
  EXPECT_MSG_HAS(st, "missing lm_head.weight (expected [32, 16])");
  EXPECT_MSG_HAS(st, "missing model.layers.1.input_layernorm.weight");
  EXPECT_MSG_HAS(st, "wrong shape model.layers.0.self_attn.q_proj.weight: expected [32, 16], got "
                     "[16, 32]");
  EXPECT_MSG_HAS(st, "wrong dtype model.layers.1.self_attn.k_proj.weight: I32");
  EXPECT_MSG_HAS(st, "unused model.layers.2.mlp.up_proj.weight");
  EXPECT_MSG_HAS(st, "unused model.rotary_emb.inv_freq");
}

}  // namespace
}  // namespace oscar::format
