// `oscar inspect DIR`: the validated config, the tensor table (bound to the checkpoint when one
// is present) and the memory the model and its KV cache need. `oscar inspect FILE.safetensors`
// (a rotation file) and `oscar inspect FILE.pt` (a release rotation file) show a rotation file's
// provenance instead (apps/inspect_rotations.h).
#include <cstdio>
#include <filesystem>

#include "apps/commands.h"
#include "apps/inspect_rotations.h"
#include "core/mmap_file.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "format/weight_table.h"
#include "kernels/kv_layout.h"
#include "quant/int2_layout.h"

namespace oscar::apps {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return str_format("%.2f %s", b, units[u]);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto tensors = std::make_shared<bool>(true);
  app.add_option("dir", *dir,
                 "Model directory, a config.json, a rotation file (.safetensors: its provenance) or "
                 "a release rotation file (.pt)")
      ->required();
  app.add_flag("!--no-tensors", *tensors, "Skip the tensor table");
  return [=]() -> int {
    std::string model_dir = *dir;
    const std::string ext = std::filesystem::path(model_dir).extension().string();
    if (std::filesystem::is_regular_file(model_dir) && ext == ".safetensors")
      return inspect_rotation_file(model_dir);
    if (std::filesystem::is_regular_file(model_dir) && ext == ".pt")
      return inspect_torch_file(model_dir);
    Result<format::ModelConfig> config = invalid_argument("unread");
    if (std::filesystem::is_regular_file(model_dir)) {  // a bare config.json (no weights)
      model_dir = std::filesystem::path(model_dir).parent_path().string();
      auto text = read_text_file(*dir);
      config = text.ok() ? format::ModelConfig::from_json_text(text.value())
                         : Result<format::ModelConfig>(text.status());
    } else {
      config = format::ModelConfig::load(*dir);
    }
    if (!config.ok()) {
      std::fprintf(stderr, "error: %s\n", config.status().message().c_str());
      return 1;
    }
    const format::ModelConfig& c = config.value();
    std::printf("architecture        %s\n", c.architecture_name.c_str());
    std::printf("layers              %d\n", c.n_layers);
    std::printf("hidden / inter      %d / %d\n", c.hidden_size, c.intermediate_size);
    if (c.is_moe())
      std::printf("experts             %d, top-%d%s, width %d; %d of %d layers sparse\n",
                  c.n_experts, c.n_experts_per_tok, c.norm_topk_prob ? " renormalised" : "",
                  c.moe_intermediate_size, c.n_moe_layers, c.n_layers);
    if (c.has_shared_expert())
      std::printf("shared expert       width %d, sigmoid-gated, in every sparse layer\n",
                  c.shared_expert_intermediate_size);
    if (c.is_hybrid())
      std::printf("layer types         %d full attention (KV cache), %d Gated DeltaNet (%d / %d "
                  "heads of %d / %d, conv %d)\n",
                  c.n_kv_layers, c.n_linear_layers, c.lin_heads_k, c.lin_heads_v,
                  c.lin_head_dim_k, c.lin_head_dim_v, c.lin_conv_kernel);
    std::printf("heads q / kv        %d / %d (gqa %d), head_dim %d\n", c.n_heads_q, c.n_heads_kv,
                c.gqa_ratio, c.head_dim);
    if (c.rotary_dim != c.head_dim)
      std::printf("rotary dims         %d of %d\n", c.rotary_dim, c.head_dim);
    std::printf("vocab               %d\n", c.vocab_size);
    std::printf("rope theta          %g\n", c.rope_theta);
    std::printf("context             %d\n", c.max_position_embeddings);
    std::printf("tied embeddings     %s\n", c.tie_word_embeddings ? "yes" : "no");
    std::printf("parameters          %lld\n", static_cast<long long>(c.n_params()));
    if (c.is_moe())
      std::printf("active per token    %lld\n", static_cast<long long>(c.n_active_params()));
    std::printf("config sha256       %s\n", c.sha256.c_str());
    print_default_rotations_line(model_dir);

    const double params = static_cast<double>(c.n_params());
    std::printf("\nmemory\n");
    std::printf("  weights bf16      %s\n", human_bytes(params * 2).c_str());
    std::printf("  weights f32 (CPU) %s\n", human_bytes(params * 4).c_str());
    const double bf16_tok = static_cast<double>(c.kv_bytes_per_token_bf16());
    const double int2_tok =
        2.0 * c.n_kv_layers * c.n_heads_kv *
        quant::int2_row_bytes(c.head_dim, 128 <= c.head_dim ? 128 : c.head_dim);
    std::printf("  KV per token      bf16 %s, int2 (group 128) %s\n", human_bytes(bf16_tok).c_str(),
                human_bytes(int2_tok).c_str());
    if (c.is_hybrid())
      std::printf("  DeltaNet state    %s per sequence (float32, any length)\n",
                  human_bytes(4.0 * c.n_linear_layers *
                              static_cast<double>(c.conv_state_floats() +
                                                  c.recurrent_state_floats()))
                      .c_str());
    for (long ctx : {4096L, 32768L, 131072L}) {
      const double windows = std::min<double>(ctx, 64 + 256);
      const double oscar = windows * bf16_tok + (ctx - windows) * int2_tok;
      std::printf("  KV at %6ld tok   bf16 %s, oscar %s (%.2f bits/element)\n", ctx,
                  human_bytes(bf16_tok * ctx).c_str(), human_bytes(oscar).c_str(),
                  oscar * 8 / (2.0 * ctx * c.n_kv_layers * c.kv_dim));
    }

    if (!*tensors) return 0;
    auto ckpt = format::Checkpoint::open(model_dir);
    std::vector<format::WeightSpec> specs = format::weight_specs(c);
    if (!ckpt.ok()) {
      std::printf("\nno checkpoint (%s); expected tensors:\n", ckpt.status().message().c_str());
      for (const auto& s : specs) std::printf("  %-52s %s\n", s.hf_name.c_str(), shape_str(s.shape).c_str());
      return 0;
    }
    std::printf("\ntensors (%s on disk)\n", human_bytes(static_cast<double>(ckpt->total_bytes())).c_str());
    for (const format::TensorView* t : ckpt->all())
      std::printf("  %-52s %-5s %s\n", t->name.c_str(), format::dtype_name(t->dtype),
                  shape_str(t->shape).c_str());
    auto bound = format::bind_weights(c, ckpt.value());
    if (!bound.ok()) {
      std::fprintf(stderr, "error: %s\n", bound.status().message().c_str());
      return 1;
    }
    std::printf("all %zu tensors match the config\n", specs.size());
    return 0;
  };
}

}  // namespace oscar::apps
