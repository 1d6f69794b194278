// ModelConfig parsing: the tiny model, the six real Qwen3 shape configs and Qwen3-30B-A3B
// (tests/data/configs), both RoPE spellings, tied/untied embeddings, eos lists, the MoE fields
// (sparse layers, defaults), the Qwen3.5 hybrids (Qwen3.6-27B's nested config, layer types from
// the list or the interval, partial rotary), and the refusals (unknown architecture, rope scaling,
// sliding window, missing or mistyped fields, inconsistent head counts, bad expert fields,
// MoE hybrids, bad layer types), and Qwen3-Next (the 80B-A3B config, its class's defaults, the
// shared expert accepted there only).
// Also SHA-256 against the FIPS 180-2 test vectors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mmap_file.h"
#include "format/model_config.h"
#include "format/sha256.h"

namespace oscar::format {
namespace {

#define EXPECT_MSG_HAS(status, text) \
  EXPECT_NE((status).message().find(text), std::string::npos) << (status).to_string()

// A minimal transformers-4 style Qwen3 config; tests edit it.
nlohmann::json base_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "rope_scaling": null, "tie_word_embeddings": true,
    "attention_bias": false, "hidden_act": "silu", "use_sliding_window": false,
    "sliding_window": null, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"
  })");
}

Result<ModelConfig> parse(const nlohmann::json& j) { return ModelConfig::from_json_text(j.dump()); }

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // 55, 56 and 64 bytes exercise the one- and two-block padding paths.
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(ModelConfig, TinyQwen3) {
  Result<ModelConfig> r = ModelConfig::load("models/tiny-qwen3");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = r.value();
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_EQ(c.architecture_name, "Qwen3ForCausalLM");
  EXPECT_EQ(c.vocab_size, 8192);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.intermediate_size, 768);
  EXPECT_EQ(c.n_layers, 8);
  EXPECT_EQ(c.n_heads_q, 4);
  EXPECT_EQ(c.n_heads_kv, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.gqa_ratio, 2);
  EXPECT_EQ(c.q_dim, 512);
  EXPECT_EQ(c.kv_dim, 256);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // from rope_parameters (transformers 5 spelling)
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 8189);
  EXPECT_EQ(c.eos_token_id, 8189);
  EXPECT_EQ(c.n_params(), 9967872);
  EXPECT_EQ(c.kv_bytes_per_token_bf16(), 2 * 8 * 256 * 2);
  // The fingerprint the reference rotation file records (sha256sum of config.json).
  EXPECT_EQ(c.sha256, "ca6b491d81b8f474c5559c14a031ce7bbd9c3c7227ee713c085355b354b02f0c");
}

TEST(ModelConfig, RealQwen3Shapes) {
  struct Expect {
    const char* file;
    int layers, heads_q, heads_kv, hidden, inter;
    bool tied;
  };
  // Shapes from the published Qwen3 dense configs.
  const Expect cases[] = {
      {"qwen3-0.6b.json", 28, 16, 8, 1024, 3072, true},
      {"qwen3-1.7b.json", 28, 16, 8, 2048, 6144, true},
      {"qwen3-4b.json", 36, 32, 8, 2560, 9728, true},
      {"qwen3-8b.json", 36, 32, 8, 4096, 12288, false},
      {"qwen3-14b.json", 40, 40, 8, 5120, 17408, false},
      {"qwen3-32b.json", 64, 64, 8, 5120, 25600, false},
  };
  for (const Expect& e : cases) {
    SCOPED_TRACE(e.file);
    Result<std::string> text = read_text_file(std::string("tests/data/configs/") + e.file);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    Result<ModelConfig> r = ModelConfig::from_json_text(text.value());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->n_layers, e.layers);
    EXPECT_EQ(r->n_heads_q, e.heads_q);
    EXPECT_EQ(r->n_heads_kv, e.heads_kv);
    EXPECT_EQ(r->hidden_size, e.hidden);
    EXPECT_EQ(r->intermediate_size, e.inter);
    EXPECT_EQ(r->tie_word_embeddings, e.tied);
    EXPECT_EQ(r->head_dim, 128);
    EXPECT_EQ(r->vocab_size, 151936);
    EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);  // top-level spelling
    EXPECT_EQ(r->eos_token_id, 151645);
    EXPECT_EQ(r->sha256, sha256_hex(text.value()));
  }
  // The README's worked example: Qwen3-8B, 147 456 bytes of BF16 KV per token.
  Result<std::string> text = read_text_file("tests/data/configs/qwen3-8b.json");
  ASSERT_TRUE(text.ok());
  Result<ModelConfig> c8 = ModelConfig::from_json_text(text.value());
  ASSERT_TRUE(c8.ok());
  EXPECT_EQ(c8->kv_bytes_per_token_bf16(), 147456);
  EXPECT_EQ(c8->gqa_ratio, 4);
  // Qwen3-8B: 8.19 B parameters with the untied lm_head.
  EXPECT_EQ(c8->n_params(), 8190735360);
}

TEST(ModelConfig, RopeSpellings) {
  nlohmann::json j = base_config();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_theta", 5e5}, {"rope_type", "default"}};
  Result<ModelConfig> a = parse(j);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_DOUBLE_EQ(a->rope_theta, 5e5);

  nlohmann::json k = base_config();
  k["rope_theta"] = 250000.0;
  Result<ModelConfig> b = parse(k);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_DOUBLE_EQ(b->rope_theta, 250000.0);

  k["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_TRUE(parse(k).ok());
}

TEST(ModelConfig, RopeScalingRefused) {
  for (const char* type : {"yarn", "linear", "dynamic", "llama3"}) {
    nlohmann::json j = base_config();
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    Result<ModelConfig> r = parse(j);
    ASSERT_FALSE(r.ok()) << type;
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
    EXPECT_MSG_HAS(r.status(), type);
  }
  nlohmann::json old = base_config();
  old["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};  // pre-4.45 spelling
  EXPECT_FALSE(parse(old).ok());
  nlohmann::json v5 = base_config();
  v5["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "yarn"}};
  EXPECT_EQ(parse(v5).status().code(), StatusCode::kUnimplemented);
}

TEST(ModelConfig, TiedAndUntied) {
  nlohmann::json j = base_config();
  j["tie_word_embeddings"] = false;
  Result<ModelConfig> untied = parse(j);
  ASSERT_TRUE(untied.ok());
  j["tie_word_embeddings"] = true;
  Result<ModelConfig> tied = parse(j);
  ASSERT_TRUE(tied.ok());
  EXPECT_FALSE(untied->tie_word_embeddings);
  EXPECT_EQ(untied->n_params() - tied->n_params(), 1000 * 64);
  j.erase("tie_word_embeddings");  // HF default for Qwen3 is untied
  EXPECT_FALSE(parse(j)->tie_word_embeddings);
}

TEST(ModelConfig, DefaultsAndTokenIds) {
  nlohmann::json j = base_config();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j["eos_token_id"] = {7, 2};
  j["bos_token_id"] = nullptr;
  Result<ModelConfig> r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->head_dim, 16);   // hidden_size / num_attention_heads
  EXPECT_EQ(r->n_heads_kv, 4);  // defaults to num_attention_heads (MHA)
  EXPECT_EQ(r->eos_token_id, 7);
  EXPECT_EQ(r->bos_token_id, -1);
}

TEST(ModelConfig, OtherArchitectures) {
  nlohmann::json q2 = base_config();
  q2["architectures"] = {"Qwen2ForCausalLM"};
  q2.erase("head_dim");
  Result<ModelConfig> a = parse(q2);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->arch, Architecture::kQwen2);
  EXPECT_TRUE(a->attention_bias);
  EXPECT_FALSE(a->qk_norm);

  nlohmann::json llama = base_config();
  llama["architectures"] = {"LlamaForCausalLM"};
  llama["attention_bias"] = true;
  Result<ModelConfig> b = parse(llama);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->arch, Architecture::kLlama);
  EXPECT_TRUE(b->attention_bias);
  EXPECT_FALSE(b->qk_norm);
}

TEST(ModelConfig, UnknownArchitecture) {
  nlohmann::json j = base_config();
  j["architectures"] = {"MixtralForCausalLM"};
  Result<ModelConfig> r = parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_MSG_HAS(r.status(), "MixtralForCausalLM");
  EXPECT_MSG_HAS(r.status(),
                 "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM");
  j.erase("architectures");
  EXPECT_MSG_HAS(parse(j).status(), "architectures");
}

TEST(ModelConfig, RefusedFeatures) {
  nlohmann::json j = base_config();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  EXPECT_MSG_HAS(parse(j).status(), "sliding");
  nlohmann::json k = base_config();
  k["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_MSG_HAS(parse(k).status(), "layer_types[1]");
  nlohmann::json a = base_config();
  a["hidden_act"] = "gelu";
  EXPECT_MSG_HAS(parse(a).status(), "gelu");
  nlohmann::json m = base_config();
  m["num_experts"] = 128;
  EXPECT_MSG_HAS(parse(m).status(), "num_experts");
  EXPECT_MSG_HAS(parse(m).status(), "supported as Qwen3MoeForCausalLM and");
}

// A small Qwen3-MoE config; tests edit it.
nlohmann::json moe_config() {
  nlohmann::json j = base_config();
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j["num_hidden_layers"] = 6;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = nlohmann::json::array();
  return j;
}

std::vector<int> sparse_layers(const ModelConfig& c) {
  std::vector<int> out;
  for (int l = 0; l < c.n_layers; ++l)
    if (c.moe_layer(l)) out.push_back(l);
  return out;
}

// Qwen3-30B-A3B as published: 48 sparse layers of 128 experts, top-8, 30.5 B parameters of which
// 3.3 B are active per token.
TEST(ModelConfig, Qwen3MoeRealShape) {
  Result<std::string> text = read_text_file("tests/data/configs/qwen3-30b-a3b.json");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  Result<ModelConfig> r = ModelConfig::from_json_text(text.value());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->arch, Architecture::kQwen3Moe);
  EXPECT_TRUE(r->is_moe());
  EXPECT_TRUE(r->qk_norm);
  EXPECT_FALSE(r->attention_bias);
  EXPECT_EQ(r->n_layers, 48);
  EXPECT_EQ(r->n_heads_q, 32);
  EXPECT_EQ(r->n_heads_kv, 4);
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_EQ(r->n_experts, 128);
  EXPECT_EQ(r->n_experts_per_tok, 8);
  EXPECT_EQ(r->moe_intermediate_size, 768);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_EQ(r->n_moe_layers, 48);
  EXPECT_TRUE(r->moe_layer(0));
  EXPECT_TRUE(r->moe_layer(47));
  // Embeddings and lm_head 2 · 151936 · 2048; per layer attention 18.9 M, router 0.26 M and
  // experts 128 · 3 · 768 · 2048.
  EXPECT_EQ(r->n_params(), 30532122624);
  EXPECT_EQ(r->n_active_params(), 3353032704);
}

TEST(ModelConfig, Qwen3MoeSparseLayers) {
  Result<ModelConfig> all = parse(moe_config());
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(sparse_layers(*all), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  nlohmann::json j = moe_config();
  j["decoder_sparse_step"] = 2;  // (layer + 1) % 2 == 0: layers 1, 3, 5
  j["mlp_only_layers"] = {3};
  Result<ModelConfig> r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(sparse_layers(*r), (std::vector<int>{1, 5}));
  EXPECT_EQ(r->n_moe_layers, 2);
  nlohmann::json k = moe_config();
  k["mlp_only_layers"] = {5, 0, 5};  // sorted and made unique
  Result<ModelConfig> rk = parse(k);
  ASSERT_TRUE(rk.ok()) << rk.status().to_string();
  EXPECT_EQ(rk->mlp_only_layers, (std::vector<int>{0, 5}));
  EXPECT_EQ(sparse_layers(*rk), (std::vector<int>{1, 2, 3, 4}));
  // n_params: 4 sparse layers (router 8·64, experts 8·3·32·64) and 2 dense (3·128·64).
  Result<ModelConfig> dense_only = parse(base_config());
  ASSERT_TRUE(dense_only.ok());
  const int64_t dense_layer_ffn = 3 * 128 * 64, sparse_layer_ffn = 8 * 64 + 8 * 3 * 32 * 64;
  const int64_t per_layer_rest = (dense_only->n_params() - (1000 * 64 + 64)) / 2 - dense_layer_ffn;
  EXPECT_EQ(rk->n_params(),
            1000 * 64 + 64 + 6 * per_layer_rest + 2 * dense_layer_ffn + 4 * sparse_layer_ffn);
  EXPECT_EQ(rk->n_active_params(), rk->n_params() - 4 * (8 - 2) * 3 * 32 * 64);
  // A dense model has no sparse layer.
  EXPECT_TRUE(sparse_layers(*dense_only).empty());
  EXPECT_FALSE(dense_only->is_moe());
}

TEST(ModelConfig, Qwen3MoeDefaults) {
  nlohmann::json j = moe_config();
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                          "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"})
    j.erase(key);
  Result<ModelConfig> r = parse(j);  // transformers' Qwen3MoeConfig defaults
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_experts, 128);
  EXPECT_EQ(r->n_experts_per_tok, 8);
  EXPECT_EQ(r->moe_intermediate_size, 768);
  EXPECT_FALSE(r->norm_topk_prob);
  EXPECT_EQ(r->decoder_sparse_step, 1);
  EXPECT_TRUE(r->mlp_only_layers.empty());
}

TEST(ModelConfig, Qwen3MoeRefusals) {
  auto status_of = [](const char* key, nlohmann::json value) {
    nlohmann::json j = moe_config();
    j[key] = std::move(value);
    return parse(j).status();
  };
  EXPECT_MSG_HAS(status_of("num_experts", 0), "num_experts = 0 must be positive");
  EXPECT_MSG_HAS(status_of("num_experts_per_tok", 9), "num_experts_per_tok 9 exceeds num_experts 8");
  EXPECT_MSG_HAS(status_of("num_experts_per_tok", 0), "num_experts_per_tok = 0");
  EXPECT_MSG_HAS(status_of("moe_intermediate_size", -1), "moe_intermediate_size = -1");
  EXPECT_MSG_HAS(status_of("decoder_sparse_step", 0), "decoder_sparse_step = 0");
  EXPECT_MSG_HAS(status_of("mlp_only_layers", {1, 6}), "mlp_only_layers names layer 6");
  EXPECT_MSG_HAS(status_of("mlp_only_layers", {-1}), "mlp_only_layers[0] = -1");
  EXPECT_MSG_HAS(status_of("mlp_only_layers", 3), "list of layer indices");
  EXPECT_MSG_HAS(status_of("num_experts", "8"), "num_experts");
  EXPECT_MSG_HAS(status_of("norm_topk_prob", 1), "norm_topk_prob");
  EXPECT_MSG_HAS(status_of("shared_expert_intermediate_size", 512), "shared experts");
  EXPECT_EQ(status_of("num_experts", 1 << 20).code(), StatusCode::kOutOfRange);
  // validate() on a config built in code checks the same.
  Result<ModelConfig> r = parse(moe_config());
  ASSERT_TRUE(r.ok());
  ModelConfig c = r.value();
  c.mlp_only_layers = {3, 1};
  EXPECT_MSG_HAS(c.validate(), "sorted and unique");
  ModelConfig d = parse(base_config()).value();
  d.n_experts = 4;
  EXPECT_MSG_HAS(d.validate(), "expert fields set in a dense");
}

TEST(ModelConfig, MissingAndBadFields) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings"}) {
    nlohmann::json j = base_config();
    j.erase(key);
    Result<ModelConfig> r = parse(j);
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_MSG_HAS(r.status(), key);
  }
  nlohmann::json s = base_config();
  s["hidden_size"] = "64";
  EXPECT_MSG_HAS(parse(s).status(), "hidden_size");
  nlohmann::json f = base_config();
  f["num_hidden_layers"] = 2.5;
  EXPECT_MSG_HAS(parse(f).status(), "num_hidden_layers");
  nlohmann::json big = base_config();
  big["vocab_size"] = 1ll << 40;
  EXPECT_MSG_HAS(parse(big).status(), "vocab_size");
  EXPECT_MSG_HAS(ModelConfig::from_json_text("{not json").status(), "not valid JSON");
  EXPECT_FALSE(ModelConfig::from_json_text("[1]").ok());
  EXPECT_EQ(ModelConfig::load("/nonexistent-dir").status().code(), StatusCode::kNotFound);
}

TEST(ModelConfig, ValidateRanges) {
  nlohmann::json j = base_config();
  j["num_key_value_heads"] = 3;  // 4 % 3 != 0
  EXPECT_MSG_HAS(parse(j).status(), "not a multiple");
  nlohmann::json h = base_config();
  h["head_dim"] = 33;
  EXPECT_MSG_HAS(parse(h).status(), "even");
  nlohmann::json z = base_config();
  z["num_hidden_layers"] = 0;
  EXPECT_MSG_HAS(parse(z).status(), "num_hidden_layers = 0");
  nlohmann::json e = base_config();
  e["eos_token_id"] = 5000;  // beyond vocab_size 1000
  EXPECT_MSG_HAS(parse(e).status(), "eos_token_id");
  nlohmann::json huge = base_config();
  huge["hidden_size"] = 1 << 20;
  EXPECT_EQ(parse(huge).status().code(), StatusCode::kOutOfRange);
  EXPECT_MSG_HAS(parse(huge).status(), "hidden_size = 1048576 exceeds");
  nlohmann::json eps = base_config();
  eps["rms_norm_eps"] = 1e300;
  EXPECT_MSG_HAS(parse(eps).status(), "rms_norm_eps");
  nlohmann::json n = base_config();
  n["num_attention_heads"] = 0;
  EXPECT_FALSE(parse(n).ok());  // no division by zero computing the default head_dim
}

// Qwen3.6-27B as published (tests/data/configs/qwen3.6-27b.json, from ../shared/configs): the
// multimodal wrapper, its text_config read; 48 Gated DeltaNet layers and 16 full-attention layers
// (every fourth), 24 / 4 heads of 256 with 64 rotated dims, 16 / 48 DeltaNet heads of 128.
TEST(ModelConfig, Qwen3_6RealShape) {
  Result<std::string> text = read_text_file("tests/data/configs/qwen3.6-27b.json");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  Result<ModelConfig> r = ModelConfig::from_json_text(text.value());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = r.value();
  EXPECT_EQ(c.arch, Architecture::kQwen3_5);
  EXPECT_EQ(c.architecture_name, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_EQ(c.n_layers, 64);
  EXPECT_EQ(c.n_linear_layers, 48);
  EXPECT_EQ(c.n_kv_layers, 16);
  EXPECT_EQ(c.kv_layer[3], 0);
  EXPECT_EQ(c.kv_layer[63], 15);
  EXPECT_EQ(c.kv_layer[62], -1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.n_heads_q, 24);
  EXPECT_EQ(c.n_heads_kv, 4);
  EXPECT_EQ(c.lin_heads_k, 16);
  EXPECT_EQ(c.lin_heads_v, 48);
  EXPECT_EQ(c.lin_conv_dim, 2 * 16 * 128 + 48 * 128);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.zero_centred_norms);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.kv_bytes_per_token_bf16(), 65536);  // 16 × 2 × 4 × 256 × 2, as the README says
  // The text model's parameters (no vision tower, no MTP head): 26.9 B.
  EXPECT_EQ(c.n_params(), 26895998464);
  // Per sequence: 48 layers × (3 × 10240 conv + 48 × 128 × 128 recurrent) floats.
  EXPECT_EQ(c.conv_state_floats(), 3 * 10240);
  EXPECT_EQ(c.recurrent_state_floats(), 48 * 128 * 128);
}

// Qwen3-Next-80B-A3B as published (tests/data/configs/qwen3-next-80b-a3b.json, from
// ../shared/configs): 36 Gated DeltaNet layers and 12 full-attention layers
// (full_attention_interval 4, no layer_types), 16 / 2 heads of 256 with 64 rotated dims (top-level partial_rotary_factor),
// 16 / 32 DeltaNet heads of 128, every layer sparse: 512 experts of 512, top-10 renormalised, a
// shared expert of 512. 79.7 B parameters, 3.9 B active per token (embedding and lm_head
// included; the "A3B" of the name counts without them: 3.25 B).
TEST(ModelConfig, Qwen3NextRealShape) {
  Result<std::string> text = read_text_file("tests/data/configs/qwen3-next-80b-a3b.json");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  const Result<ModelConfig> r = ModelConfig::from_json_text(text.value());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = r.value();
  EXPECT_EQ(c.arch, Architecture::kQwen3Next);
  EXPECT_EQ(c.architecture_name, "Qwen3NextForCausalLM");
  EXPECT_EQ(c.weight_prefix, "model.");
  EXPECT_EQ(c.n_layers, 48);
  EXPECT_EQ(c.n_linear_layers, 36);
  EXPECT_EQ(c.n_kv_layers, 12);
  EXPECT_EQ(c.kv_layer[3], 0);
  EXPECT_EQ(c.kv_layer[47], 11);
  EXPECT_EQ(c.kv_layer[46], -1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.n_heads_q, 16);
  EXPECT_EQ(c.n_heads_kv, 2);
  EXPECT_EQ(c.lin_heads_k, 16);
  EXPECT_EQ(c.lin_heads_v, 32);
  EXPECT_EQ(c.lin_head_dim_k, 128);
  EXPECT_EQ(c.lin_head_dim_v, 128);
  EXPECT_EQ(c.lin_conv_dim, 2 * 16 * 128 + 32 * 128);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.zero_centred_norms);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.n_experts, 512);
  EXPECT_EQ(c.n_experts_per_tok, 10);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.n_moe_layers, 48);
  EXPECT_TRUE(c.has_shared_expert());
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.kv_bytes_per_token_bf16(), 12 * 2 * 2 * 256 * 2);
  EXPECT_EQ(c.n_params(), 79674391296);
  EXPECT_EQ(c.n_active_params(), 3874929408);
  EXPECT_EQ(c.conv_state_floats(), 3 * 8192);
  EXPECT_EQ(c.recurrent_state_floats(), 32 * 128 * 128);
}

// Keys a Qwen3-Next config leaves out take Qwen3NextConfig's defaults (its class, not Qwen3's or
// Qwen3MoeConfig's); the shared expert is accepted there only.
TEST(ModelConfig, Qwen3NextDefaultsAndRefusals) {
  const nlohmann::json bare = {{"architectures", {"Qwen3NextForCausalLM"}},
                               {"model_type", "qwen3_next"}};
  Result<ModelConfig> r = parse(bare);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->vocab_size, 151936);
  EXPECT_EQ(r->hidden_size, 2048);
  EXPECT_EQ(r->intermediate_size, 5632);
  EXPECT_EQ(r->n_layers, 48);
  EXPECT_EQ(r->n_heads_q, 16);
  EXPECT_EQ(r->n_heads_kv, 2);
  EXPECT_EQ(r->head_dim, 256);
  EXPECT_EQ(r->max_position_embeddings, 32768);
  EXPECT_EQ(r->rotary_dim, 64);
  EXPECT_EQ(r->n_kv_layers, 12);
  EXPECT_EQ(r->lin_heads_k, 16);
  EXPECT_EQ(r->lin_heads_v, 32);
  EXPECT_EQ(r->lin_conv_kernel, 4);
  EXPECT_EQ(r->n_experts, 512);
  EXPECT_EQ(r->n_experts_per_tok, 10);
  EXPECT_EQ(r->moe_intermediate_size, 512);
  EXPECT_EQ(r->shared_expert_intermediate_size, 512);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_EQ(r->decoder_sparse_step, 1);
  EXPECT_FALSE(r->tie_word_embeddings);
  // A layer kept dense by mlp_only_layers, an explicit layer list.
  nlohmann::json j = bare;
  j["num_hidden_layers"] = 4;
  j["mlp_only_layers"] = {1};
  j["layer_types"] = {"linear_attention", "full_attention", "linear_attention", "full_attention"};
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_moe_layers, 3);
  EXPECT_FALSE(r->moe_layer(1));
  EXPECT_EQ(r->kv_layer, (std::vector<int>{-1, 0, -1, 1}));
  j = bare;
  j["shared_expert_intermediate_size"] = 0;
  EXPECT_MSG_HAS(parse(j).status(), "shared_expert_intermediate_size = 0 must be in");
  j = bare;
  j["n_shared_experts"] = 2;
  EXPECT_MSG_HAS(parse(j).status(), "n_shared_experts = 2");
  j = bare;
  j["attention_bias"] = true;
  EXPECT_MSG_HAS(parse(j).status(), "attention_bias true in a Qwen3NextForCausalLM config");
  // Shared experts stay refused where oscar does not run them (a Qwen3-MoE config; Qwen2-MoE's
  // architecture is refused as unknown), in config.json and in a config built in code.
  nlohmann::json moe = moe_config();
  moe["shared_expert_intermediate_size"] = 512;
  EXPECT_MSG_HAS(parse(moe).status(), "shared experts are supported in Qwen3NextForCausalLM only");
  moe["architectures"] = {"Qwen2MoeForCausalLM"};
  EXPECT_EQ(parse(moe).status().code(), StatusCode::kUnimplemented);
  Result<ModelConfig> m = parse(moe_config());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ModelConfig c = m.value();
  c.shared_expert_intermediate_size = 64;
  EXPECT_MSG_HAS(c.validate(), "a shared expert set in a Qwen3MoeForCausalLM config");
}

// A small Qwen3_5ForCausalLM config; tests edit it.
nlohmann::json hybrid_config() {
  nlohmann::json j = base_config();
  j["architectures"] = {"Qwen3_5ForCausalLM"};
  j["model_type"] = "qwen3_5_text";
  j["num_hidden_layers"] = 8;
  j["head_dim"] = 64;
  j["partial_rotary_factor"] = 0.25;
  j["linear_num_key_heads"] = 2;
  j["linear_num_value_heads"] = 4;
  j["linear_key_head_dim"] = 16;
  j["linear_value_head_dim"] = 8;
  return j;
}

TEST(ModelConfig, HybridLayerTypes) {
  // No layer_types: full_attention_interval (default 4) makes layers 3 and 7 full attention.
  Result<ModelConfig> r = parse(hybrid_config());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kv_layer, (std::vector<int>{-1, -1, -1, 0, -1, -1, -1, 1}));
  EXPECT_EQ(r->rotary_dim, 16);
  EXPECT_EQ(r->lin_conv_kernel, 4);
  nlohmann::json j = hybrid_config();
  j["full_attention_interval"] = 2;
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_kv_layers, 4);
  EXPECT_TRUE(r->linear(0));
  EXPECT_FALSE(r->linear(1));
  // An explicit list wins; partial_rotary_factor inside rope_parameters (transformers 5).
  j = hybrid_config();
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "linear_attention",
                      "linear_attention", "full_attention", "linear_attention", "linear_attention"};
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7},
                          {"partial_rotary_factor", 0.5}, {"mrope_section", {11, 11, 10}}};
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kv_layer, (std::vector<int>{0, -1, -1, -1, -1, 1, -1, -1}));
  EXPECT_EQ(r->rotary_dim, 32);
}

TEST(ModelConfig, HybridRefusals) {
  nlohmann::json j = hybrid_config();
  j["layer_types"] = {"linear_attention", "full_attention"};
  EXPECT_MSG_HAS(parse(j).status(), "layer_types must be a list of num_hidden_layers = 8");
  j["layer_types"] = std::vector<std::string>(8, "linear_attention");
  EXPECT_MSG_HAS(parse(j).status(), "no full_attention layer");
  j["layer_types"][3] = "sliding_attention";
  EXPECT_MSG_HAS(parse(j).status(), "layer_types[3]");
  j = hybrid_config();
  j["linear_num_value_heads"] = 3;
  EXPECT_MSG_HAS(parse(j).status(), "not a multiple of linear_num_key_heads");
  j = hybrid_config();
  j["partial_rotary_factor"] = 0.3;  // 64 · 0.3 = 19 dims: odd
  EXPECT_MSG_HAS(parse(j).status(), "must be even");
  j = hybrid_config();
  j["full_attention_interval"] = 0;
  EXPECT_MSG_HAS(parse(j).status(), "full_attention_interval 0");
  j = hybrid_config();
  j["architectures"] = {"Qwen3_5MoeForCausalLM"};
  EXPECT_MSG_HAS(parse(j).status(), "MoE hybrids are not implemented");
  j = hybrid_config();
  j["num_experts"] = 8;
  EXPECT_MSG_HAS(parse(j).status(), "num_experts");
  nlohmann::json wrapper = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                            {"model_type", "qwen3_5"}};
  EXPECT_MSG_HAS(parse(wrapper).status(), "needs a \"text_config\" object");
  wrapper["text_config"] = hybrid_config();
  wrapper["text_config"].erase("vocab_size");
  const Status st = parse(wrapper).status();
  EXPECT_MSG_HAS(st, "text_config");
  EXPECT_MSG_HAS(st, "vocab_size");
}

}  // namespace
}  // namespace oscar::format
