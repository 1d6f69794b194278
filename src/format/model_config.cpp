// Parsing and validating config.json into ModelConfig. Field names and defaults follow the
// Hugging Face configuration classes (Qwen3Config, Qwen3MoeConfig, Qwen2Config, LlamaConfig,
// Qwen3_5TextConfig, Qwen3NextConfig); anything that would change the math oscar implements (rope
// scaling, sliding windows, experts in a dense architecture, shared experts outside Qwen3-Next,
// another activation) is refused by name rather than ignored.
#include "format/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/mmap_file.h"
#include "format/sha256.h"

namespace oscar::format {

namespace {

using nlohmann::json;

constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxHidden = 1 << 17;
constexpr int kMaxIntermediate = 1 << 20;
constexpr int kMaxCount = 1 << 12;  // layers, heads, head_dim, experts

struct Bounded {
  const char* name;
  int value;
  int max;
};

constexpr const char* kSupported =
    "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM, "
    "Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3NextForCausalLM";

// Reads an integer field that fits int. Absent (or null) -> `fallback` if given, else an error.
Status get_int(const json& j, const char* key, int* out, const int* fallback = nullptr) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback != nullptr) {
      *out = *fallback;
      return Status();
    }
    return invalid_argument("config.json: missing required field \"%s\"", key);
  }
  if (!it->is_number_integer())
    return invalid_argument("config.json: \"%s\" must be an integer, got %s %s", key,
                            it->type_name(), it->dump().substr(0, 40).c_str());
  int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}
                  ? INT64_MAX
                  : it->get<int64_t>();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    return out_of_range("config.json: \"%s\" = %s does not fit a 32-bit int", key,
                        it->dump().c_str());
  *out = static_cast<int>(v);
  return Status();
}

Status get_number(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status();  // keep the default
  if (!it->is_number())
    return invalid_argument("config.json: \"%s\" must be a number, got %s", key, it->type_name());
  *out = it->get<double>();
  return Status();
}

Status get_bool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status();  // keep the default
  if (!it->is_boolean())
    return invalid_argument("config.json: \"%s\" must be true or false, got %s", key,
                            it->type_name());
  *out = it->get<bool>();
  return Status();
}

// A token id field: absent/null -> -1, an int, or (eos) a list whose first element is used.
Status get_token_id(const json& j, const char* key, int* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = -1;
    return Status();
  }
  const json* v = &*it;
  if (v->is_array()) {
    if (v->empty()) {
      *out = -1;
      return Status();
    }
    v = &(*v)[0];
  }
  if (!v->is_number_integer() || v->get<int64_t>() < 0 ||
      v->get<int64_t>() > std::numeric_limits<int>::max())
    return invalid_argument("config.json: \"%s\" must be a token id or a list of them, got %s",
                            key, it->dump().substr(0, 40).c_str());
  *out = static_cast<int>(v->get<int64_t>());
  return Status();
}

// rope_scaling / rope_parameters: only the default (unscaled) RoPE is implemented.
Status check_rope_type(const json& rope, const char* where) {
  if (rope.is_null()) return Status();
  if (!rope.is_object())
    return invalid_argument("config.json: \"%s\" must be an object or null", where);
  for (const char* key : {"rope_type", "type"}) {
    auto it = rope.find(key);
    if (it == rope.end() || it->is_null()) continue;
    if (!it->is_string())
      return invalid_argument("config.json: %s.%s must be a string", where, key);
    const std::string type = it->get<std::string>();
    if (type != "default")
      return unimplemented("config.json: %s type '%s' is not supported (only default RoPE)",
                           where, type.c_str());
  }
  return Status();
}

// The Qwen3MoeConfig / Qwen3NextConfig fields. Absent ones take that class's defaults;
// mlp_only_layers is a list of layer indices (checked against num_hidden_layers by validate()).
Status parse_moe(const json& j, ModelConfig* c) {
  const bool next = c->arch == Architecture::kQwen3Next;
  const int default_experts = next ? 512 : 128, default_top_k = next ? 10 : 8;
  const int default_moe_inter = next ? 512 : 768, default_step = 1;
  OSCAR_RETURN_IF_ERROR(get_int(j, "num_experts", &c->n_experts, &default_experts));
  OSCAR_RETURN_IF_ERROR(get_int(j, "num_experts_per_tok", &c->n_experts_per_tok, &default_top_k));
  OSCAR_RETURN_IF_ERROR(
      get_int(j, "moe_intermediate_size", &c->moe_intermediate_size, &default_moe_inter));
  OSCAR_RETURN_IF_ERROR(get_int(j, "decoder_sparse_step", &c->decoder_sparse_step, &default_step));
  c->norm_topk_prob = next;
  OSCAR_RETURN_IF_ERROR(get_bool(j, "norm_topk_prob", &c->norm_topk_prob));
  c->mlp_only_layers.clear();
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array())
      return invalid_argument("config.json: \"mlp_only_layers\" must be a list of layer indices, "
                              "got %s", it->type_name());
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() > std::numeric_limits<int>::max())
        return invalid_argument("config.json: mlp_only_layers[%zu] = %s is not a layer index", i,
                                v.dump().substr(0, 40).c_str());
      c->mlp_only_layers.push_back(static_cast<int>(v.get<int64_t>()));
    }
    std::sort(c->mlp_only_layers.begin(), c->mlp_only_layers.end());
    c->mlp_only_layers.erase(std::unique(c->mlp_only_layers.begin(), c->mlp_only_layers.end()),
                             c->mlp_only_layers.end());
  }
  // Qwen3-Next's one shared expert with its sigmoid gate (Qwen3NextSparseMoeBlock). Elsewhere
  // shared experts (Qwen2-MoE's, DeepSeek's n_shared_experts) change the math: refused.
  c->shared_expert_intermediate_size = 0;
  if (next) {
    const int default_shared = 512;
    OSCAR_RETURN_IF_ERROR(get_int(j, "shared_expert_intermediate_size",
                                  &c->shared_expert_intermediate_size, &default_shared));
  }
  for (const char* key : {"shared_expert_intermediate_size", "n_shared_experts"}) {
    if (next && std::string(key) == "shared_expert_intermediate_size") continue;
    auto it = j.find(key);
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() > 0)
      return unimplemented("config.json: %s = %lld in a %s config; shared experts are supported "
                           "in Qwen3NextForCausalLM only", key,
                           static_cast<long long>(it->get<int64_t>()),
                           c->architecture_name.c_str());
  }
  return Status();
}

Result<ModelConfig> parse_fields(const json& j, ModelConfig c);

// The Qwen3_5TextConfig / Qwen3NextConfig fields of the hybrid layers. Absent ones take those
// classes' defaults, the same in both (kernel 4, 16 key heads of 128, 32 value heads of 128,
// partial_rotary_factor 0.25 at the top level or in rope_parameters, full_attention_interval 4).
// The layer list is checked against num_hidden_layers by validate().
Status parse_hybrid(const json& j, ModelConfig* c) {
  const int def_kernel = 4, def_k_heads = 16, def_v_heads = 32, def_dim = 128;
  OSCAR_RETURN_IF_ERROR(get_int(j, "linear_conv_kernel_dim", &c->lin_conv_kernel, &def_kernel));
  OSCAR_RETURN_IF_ERROR(get_int(j, "linear_num_key_heads", &c->lin_heads_k, &def_k_heads));
  OSCAR_RETURN_IF_ERROR(get_int(j, "linear_num_value_heads", &c->lin_heads_v, &def_v_heads));
  OSCAR_RETURN_IF_ERROR(get_int(j, "linear_key_head_dim", &c->lin_head_dim_k, &def_dim));
  OSCAR_RETURN_IF_ERROR(get_int(j, "linear_value_head_dim", &c->lin_head_dim_v, &def_dim));
  c->attn_output_gate = true;  // Qwen3_5Attention and Qwen3NextAttention always gate
  c->zero_centred_norms = true;
  double factor = 0.25;
  OSCAR_RETURN_IF_ERROR(get_number(j, "partial_rotary_factor", &factor));
  if (auto rp = j.find("rope_parameters"); rp != j.end() && rp->is_object())
    OSCAR_RETURN_IF_ERROR(get_number(*rp, "partial_rotary_factor", &factor));
  if (!(factor > 0.0 && factor <= 1.0))
    return invalid_argument("config.json: partial_rotary_factor %g must be in (0, 1]", factor);
  c->rotary_dim = static_cast<int>(c->head_dim * factor);  // int() as transformers truncates
  c->linear_layer.assign(static_cast<size_t>(std::max(0, c->n_layers)), false);
  if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c->n_layers)
      return invalid_argument("config.json: layer_types must be a list of num_hidden_layers = %d "
                              "entries, got %s", c->n_layers, lt->dump().substr(0, 60).c_str());
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      const std::string type = t.is_string() ? t.get<std::string>() : "";
      if (type != "linear_attention" && type != "full_attention")
        return invalid_argument("config.json: layer_types[%zu] is %s; expected "
                                "\"linear_attention\" or \"full_attention\"", i,
                                t.dump().substr(0, 40).c_str());
      c->linear_layer[i] = type == "linear_attention";
    }
  } else {
    const int def_interval = 4;
    int interval = 0;
    OSCAR_RETURN_IF_ERROR(get_int(j, "full_attention_interval", &interval, &def_interval));
    if (interval <= 0)
      return invalid_argument("config.json: full_attention_interval %d must be positive",
                              interval);
    for (int l = 0; l < c->n_layers; ++l) c->linear_layer[l] = (l + 1) % interval != 0;
  }
  if (c->attention_bias)
    return unimplemented("config.json: attention_bias true in a %s config is not supported",
                         c->architecture_name.c_str());
  return Status();
}

Result<ModelConfig> parse(const json& j) {
  if (!j.is_object()) return invalid_argument("config.json: must be a JSON object");
  ModelConfig c;

  auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    return invalid_argument("config.json: missing \"architectures\" (supported: %s)", kSupported);
  c.architecture_name = (*archs)[0].get<std::string>();
  if (c.architecture_name == "Qwen3ForCausalLM") {
    c.arch = Architecture::kQwen3;
    c.qk_norm = true;
    c.attention_bias = false;
  } else if (c.architecture_name == "Qwen3MoeForCausalLM") {
    c.arch = Architecture::kQwen3Moe;
    c.qk_norm = true;
    c.attention_bias = false;
  } else if (c.architecture_name == "Qwen2ForCausalLM") {
    c.arch = Architecture::kQwen2;
    c.qk_norm = false;
    c.attention_bias = true;  // Qwen2 always has q/k/v bias; the config has no switch for it
  } else if (c.architecture_name == "LlamaForCausalLM") {
    c.arch = Architecture::kLlama;
    c.qk_norm = false;
    c.attention_bias = false;
  } else if (c.architecture_name == "Qwen3_5ForCausalLM" ||
             c.architecture_name == "Qwen3_5ForConditionalGeneration") {
    c.arch = Architecture::kQwen3_5;
    c.qk_norm = true;
    c.attention_bias = false;
  } else if (c.architecture_name == "Qwen3NextForCausalLM") {
    c.arch = Architecture::kQwen3Next;
    c.qk_norm = true;
    c.attention_bias = false;
  } else if (c.architecture_name.rfind("Qwen3_5Moe", 0) == 0) {
    return unimplemented("config.json: %s is not supported yet: MoE hybrids are not implemented "
                         "(issue #25); the dense Qwen3.5 hybrids are",
                         c.architecture_name.c_str());
  } else {
    return unimplemented("config.json: architecture '%s' is not supported (supported: %s)",
                         c.architecture_name.c_str(), kSupported);
  }

  // The multimodal wrapper keeps the language model's fields in text_config and its weights
  // under model.language_model.; the top level adds the vision tower, which oscar does not run.
  const bool nested = c.architecture_name == "Qwen3_5ForConditionalGeneration";
  if (nested) {
    auto tc = j.find("text_config");
    if (tc == j.end() || !tc->is_object())
      return invalid_argument("config.json: %s needs a \"text_config\" object",
                              c.architecture_name.c_str());
    c.weight_prefix = "model.language_model.";
    Result<ModelConfig> text = parse_fields(*tc, c);
    if (!text.ok()) return text.status().with_context("text_config");
    if (auto tie = j.find("tie_word_embeddings"); tie != j.end() && tie->is_boolean())
      text->tie_word_embeddings = tie->get<bool>();  // the wrapper's own, as transformers reads it
    OSCAR_RETURN_IF_ERROR(text->validate());
    return text;
  }
  OSCAR_ASSIGN_OR_RETURN(c, parse_fields(j, c));
  OSCAR_RETURN_IF_ERROR(c.validate());
  return c;
}

// The language model's fields of j (the config, or a wrapper's text_config) into a copy of c,
// whose architecture is set. Not validated yet.
Result<ModelConfig> parse_fields(const json& j, ModelConfig c) {
  // Qwen3NextConfig gives every size a default (the 80B-A3B shape, intermediate 5632 and 32768
  // positions aside); the other classes' sizes are required here.
  const bool next = c.arch == Architecture::kQwen3Next;
  const int next_vocab = 151936, next_hidden = 2048, next_inter = 5632, next_layers = 48;
  const int next_heads = 16, next_kv_heads = 2, next_positions = 32768, next_head_dim = 256;
  auto dflt = [&](const int& v) { return next ? &v : nullptr; };
  OSCAR_RETURN_IF_ERROR(get_int(j, "vocab_size", &c.vocab_size, dflt(next_vocab)));
  OSCAR_RETURN_IF_ERROR(get_int(j, "hidden_size", &c.hidden_size, dflt(next_hidden)));
  OSCAR_RETURN_IF_ERROR(get_int(j, "intermediate_size", &c.intermediate_size, dflt(next_inter)));
  OSCAR_RETURN_IF_ERROR(get_int(j, "num_hidden_layers", &c.n_layers, dflt(next_layers)));
  OSCAR_RETURN_IF_ERROR(get_int(j, "num_attention_heads", &c.n_heads_q, dflt(next_heads)));
  OSCAR_RETURN_IF_ERROR(
      get_int(j, "num_key_value_heads", &c.n_heads_kv, next ? &next_kv_heads : &c.n_heads_q));
  OSCAR_RETURN_IF_ERROR(
      get_int(j, "max_position_embeddings", &c.max_position_embeddings, dflt(next_positions)));
  if (c.n_heads_q <= 0)
    return invalid_argument("config.json: num_attention_heads %d must be positive", c.n_heads_q);
  const int default_head_dim = next ? next_head_dim : c.hidden_size / c.n_heads_q;
  OSCAR_RETURN_IF_ERROR(get_int(j, "head_dim", &c.head_dim, &default_head_dim));

  double eps = c.rms_norm_eps;
  OSCAR_RETURN_IF_ERROR(get_number(j, "rms_norm_eps", &eps));
  if (!(eps > 0.0 && eps < 1.0))
    return invalid_argument("config.json: rms_norm_eps %g must be in (0, 1)", eps);
  c.rms_norm_eps = static_cast<float>(eps);
  OSCAR_RETURN_IF_ERROR(get_bool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  if (c.arch != Architecture::kQwen2)
    OSCAR_RETURN_IF_ERROR(get_bool(j, "attention_bias", &c.attention_bias));
  OSCAR_RETURN_IF_ERROR(get_token_id(j, "bos_token_id", &c.bos_token_id));
  OSCAR_RETURN_IF_ERROR(get_token_id(j, "eos_token_id", &c.eos_token_id));

  // RoPE: `rope_theta` top-level (transformers 4) or inside `rope_parameters` (transformers 5).
  OSCAR_RETURN_IF_ERROR(get_number(j, "rope_theta", &c.rope_theta));
  if (auto rp = j.find("rope_parameters"); rp != j.end()) {
    OSCAR_RETURN_IF_ERROR(check_rope_type(*rp, "rope_parameters"));
    if (rp->is_object()) OSCAR_RETURN_IF_ERROR(get_number(*rp, "rope_theta", &c.rope_theta));
  }
  if (auto rs = j.find("rope_scaling"); rs != j.end())
    OSCAR_RETURN_IF_ERROR(check_rope_type(*rs, "rope_scaling"));

  // Features that change the math and are not implemented.
  bool sliding = false;
  OSCAR_RETURN_IF_ERROR(get_bool(j, "use_sliding_window", &sliding));
  if (sliding)
    return unimplemented("config.json: use_sliding_window is true; sliding-window attention is "
                         "not supported");
  const bool hybrid = c.arch == Architecture::kQwen3_5 || next;
  if (auto lt = j.find("layer_types"); !hybrid && lt != j.end() && lt->is_array()) {
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        return unimplemented("config.json: layer_types[%zu] is %s; only full_attention is "
                             "supported", i, t.dump().c_str());
    }
  }
  if (auto act = j.find("hidden_act"); act != j.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu")
      return unimplemented("config.json: hidden_act %s is not supported (only silu)",
                           act->dump().c_str());
  }
  if (hybrid) OSCAR_RETURN_IF_ERROR(parse_hybrid(j, &c));
  if (c.arch == Architecture::kQwen3Moe || next) {
    OSCAR_RETURN_IF_ERROR(parse_moe(j, &c));
  } else {
    for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
      auto it = j.find(key);
      if (it != j.end() && it->is_number_integer() && it->get<int64_t>() > 0)
        return unimplemented("config.json: %s = %lld in a %s config; mixture-of-experts models "
                             "are supported as Qwen3MoeForCausalLM and Qwen3NextForCausalLM only",
                             key, static_cast<long long>(it->get<int64_t>()),
                             c.architecture_name.c_str());
    }
  }
  bool mlp_bias = false;
  OSCAR_RETURN_IF_ERROR(get_bool(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return unimplemented("config.json: mlp_bias true is not supported");
  return c;
}

}  // namespace

Result<ModelConfig> ModelConfig::from_json_text(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return invalid_argument("config.json: not valid JSON: %s", e.what());
  }
  Result<ModelConfig> c = [&]() -> Result<ModelConfig> {
    try {
      return parse(j);
    } catch (const json::exception& e) {  // defensive: every access above is type-checked
      return invalid_argument("config.json: %s", e.what());
    }
  }();
  if (!c.ok()) return c;
  c->sha256 = sha256_hex(text);
  return c;
}

Result<ModelConfig> ModelConfig::load(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  OSCAR_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  Result<ModelConfig> c = from_json_text(text);
  if (!c.ok()) return c.status().with_context(model_dir);
  return c;
}

Status ModelConfig::validate() {
  // Each size must be positive and below a limit far above any real dense model; the limits
  // keep every derived size (q_dim, n_params, KV bytes) far from int64 overflow.
  for (const Bounded& p : {Bounded{"vocab_size", vocab_size, kMaxVocab},
                           Bounded{"hidden_size", hidden_size, kMaxHidden},
                           Bounded{"intermediate_size", intermediate_size, kMaxIntermediate},
                           Bounded{"num_hidden_layers", n_layers, kMaxCount},
                           Bounded{"num_attention_heads", n_heads_q, kMaxCount},
                           Bounded{"num_key_value_heads", n_heads_kv, kMaxCount},
                           Bounded{"head_dim", head_dim, kMaxCount},
                           Bounded{"max_position_embeddings", max_position_embeddings,
                                   std::numeric_limits<int>::max()}}) {
    if (p.value <= 0) return invalid_argument("config: %s = %d must be positive", p.name, p.value);
    if (p.value > p.max)
      return out_of_range("config: %s = %d exceeds the supported limit %d", p.name, p.value, p.max);
  }
  if (n_heads_q % n_heads_kv != 0)
    return invalid_argument("config: num_attention_heads %d is not a multiple of "
                            "num_key_value_heads %d", n_heads_q, n_heads_kv);
  if (head_dim % 2 != 0)
    return invalid_argument("config: head_dim %d must be even (RoPE rotates halves)", head_dim);
  if (!(std::isfinite(rms_norm_eps) && rms_norm_eps > 0.0f))
    return invalid_argument("config: rms_norm_eps %g must be positive", double{rms_norm_eps});
  if (!(std::isfinite(rope_theta) && rope_theta > 0.0))
    return invalid_argument("config: rope_theta %g must be positive", rope_theta);
  if (bos_token_id >= vocab_size || eos_token_id >= vocab_size)
    return invalid_argument("config: bos_token_id %d / eos_token_id %d outside vocab_size %d",
                            bos_token_id, eos_token_id, vocab_size);
  n_moe_layers = 0;
  if (arch == Architecture::kQwen3Moe || arch == Architecture::kQwen3Next) {
    for (const Bounded& p :
         {Bounded{"num_experts", n_experts, kMaxCount},
          Bounded{"num_experts_per_tok", n_experts_per_tok, kMaxCount},
          Bounded{"moe_intermediate_size", moe_intermediate_size, kMaxIntermediate},
          Bounded{"decoder_sparse_step", decoder_sparse_step, kMaxCount}}) {
      if (p.value <= 0)
        return invalid_argument("config: %s = %d must be positive", p.name, p.value);
      if (p.value > p.max)
        return out_of_range("config: %s = %d exceeds the supported limit %d", p.name, p.value,
                            p.max);
    }
    if (n_experts_per_tok > n_experts)
      return invalid_argument("config: num_experts_per_tok %d exceeds num_experts %d",
                              n_experts_per_tok, n_experts);
    for (int l : mlp_only_layers)
      if (l < 0 || l >= n_layers)
        return invalid_argument("config: mlp_only_layers names layer %d; the model has %d layers",
                                l, n_layers);
    if (!std::is_sorted(mlp_only_layers.begin(), mlp_only_layers.end()) ||
        std::adjacent_find(mlp_only_layers.begin(), mlp_only_layers.end()) !=
            mlp_only_layers.end())
      return invalid_argument("config: mlp_only_layers must be sorted and unique");
    for (int l = 0; l < n_layers; ++l) n_moe_layers += moe_layer(l) ? 1 : 0;
    if (arch == Architecture::kQwen3Next &&
        (shared_expert_intermediate_size <= 0 ||
         shared_expert_intermediate_size > kMaxIntermediate))
      return invalid_argument("config: shared_expert_intermediate_size = %d must be in (0, %d]",
                              shared_expert_intermediate_size, kMaxIntermediate);
  } else if (n_experts != 0 || n_experts_per_tok != 0 || moe_intermediate_size != 0) {
    return invalid_argument("config: expert fields set in a dense %s config",
                            architecture_name.c_str());
  }
  if (arch != Architecture::kQwen3Next && shared_expert_intermediate_size != 0)
    return invalid_argument("config: a shared expert set in a %s config (Qwen3-Next only)",
                            architecture_name.c_str());
  gqa_ratio = n_heads_q / n_heads_kv;
  q_dim = n_heads_q * head_dim;  // <= 2^24 by the limits above
  kv_dim = n_heads_kv * head_dim;
  if (rotary_dim == 0) rotary_dim = head_dim;
  if (rotary_dim <= 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
    return invalid_argument("config: rotary dims %d (head_dim %d x partial_rotary_factor) must be "
                            "even and in (0, head_dim]", rotary_dim, head_dim);
  return validate_layers();
}

Status ModelConfig::validate_layers() {
  n_linear_layers = 0;
  lin_key_dim = lin_value_dim = lin_conv_dim = 0;
  if (!linear_layer.empty()) {
    if (static_cast<int64_t>(linear_layer.size()) != n_layers)
      return invalid_argument("config: %zu layer types for %d layers", linear_layer.size(),
                              n_layers);
    for (const Bounded& p : {Bounded{"linear_num_key_heads", lin_heads_k, kMaxCount},
                             Bounded{"linear_num_value_heads", lin_heads_v, kMaxCount},
                             Bounded{"linear_key_head_dim", lin_head_dim_k, kMaxCount},
                             Bounded{"linear_value_head_dim", lin_head_dim_v, kMaxCount},
                             Bounded{"linear_conv_kernel_dim", lin_conv_kernel, 64}}) {
      if (p.value <= 0)
        return invalid_argument("config: %s = %d must be positive", p.name, p.value);
      if (p.value > p.max)
        return out_of_range("config: %s = %d exceeds the supported limit %d", p.name, p.value,
                            p.max);
    }
    if (lin_heads_v % lin_heads_k != 0)
      return invalid_argument("config: linear_num_value_heads %d is not a multiple of "
                              "linear_num_key_heads %d", lin_heads_v, lin_heads_k);
    for (bool lin : linear_layer) n_linear_layers += lin ? 1 : 0;
    if (n_linear_layers == n_layers)
      return invalid_argument("config: layer_types has no full_attention layer (oscar's KV cache "
                              "needs at least one)");
    lin_key_dim = lin_heads_k * lin_head_dim_k;
    lin_value_dim = lin_heads_v * lin_head_dim_v;
    lin_conv_dim = 2 * lin_key_dim + lin_value_dim;
  }
  kv_layer.assign(static_cast<size_t>(n_layers), -1);
  n_kv_layers = 0;
  for (int l = 0; l < n_layers; ++l)
    if (!linear(l)) kv_layer[l] = n_kv_layers++;
  return Status();
}

int64_t ModelConfig::conv_state_floats() const {
  return int64_t{lin_conv_kernel - 1} * lin_conv_dim;
}

int64_t ModelConfig::recurrent_state_floats() const {
  return int64_t{lin_heads_v} * lin_head_dim_k * lin_head_dim_v;
}

bool ModelConfig::moe_layer(int layer) const {
  if (n_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::binary_search(mlp_only_layers.begin(), mlp_only_layers.end(), layer)) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::n_params() const {
  const int64_t h = hidden_size, v = vocab_size, inter = intermediate_size;
  int64_t per_layer = int64_t{q_dim} * h * (attn_output_gate ? 3 : 2)  // q_proj (+ gate), o_proj
                      + int64_t{kv_dim} * h * 2;     // k_proj, v_proj
  if (qk_norm) per_layer += 2 * int64_t{head_dim};
  if (attention_bias) per_layer += q_dim + 2 * int64_t{kv_dim};
  // A Gated DeltaNet layer: in_proj_qkv, in_proj_z, in_proj_b/a (Qwen3-Next's fused in_proj_qkvz
  // and in_proj_ba hold the same), the conv, A_log, dt_bias, the gated norm and out_proj.
  const int64_t linear_layer_params =
      int64_t{lin_conv_dim} * h + 2 * int64_t{lin_value_dim} * h + 2 * int64_t{lin_heads_v} * h +
      int64_t{lin_conv_dim} * lin_conv_kernel + 2 * lin_heads_v + lin_head_dim_v;
  int64_t n = v * h + h + 2 * h * n_layers  // the norms around each layer's two blocks
              + per_layer * n_kv_layers + linear_layer_params * n_linear_layers;
  const int64_t dense_ffn = 3 * inter * h;                                   // gate, up, down
  const int64_t moe_ffn = int64_t{n_experts} * h                             // router
                          + int64_t{n_experts} * 3 * moe_intermediate_size * h   // experts
                          + 3 * int64_t{shared_expert_intermediate_size} * h     // shared expert
                          + (has_shared_expert() ? h : 0);                       // and its gate
  n += dense_ffn * (n_layers - n_moe_layers) + moe_ffn * n_moe_layers;
  if (!tie_word_embeddings) n += v * h;
  return n;
}

int64_t ModelConfig::n_active_params() const {
  const int64_t unrouted = int64_t{n_experts - n_experts_per_tok} * 3 * moe_intermediate_size *
                           hidden_size * n_moe_layers;
  return n_params() - unrouted;
}

int64_t ModelConfig::kv_bytes_per_token_bf16() const {
  return 2 * int64_t{n_kv_layers} * kv_dim * 2;
}

}  // namespace oscar::format
