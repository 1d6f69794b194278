// `oscar import-rotations`: converts a K/V pair of the OSCAR release's published rotations
// (RotationZoo `.pt` files) into oscar's rotation file for one model. The work is in
// quant/rotation_zoo.h (format/torch_file.h reads the files without executing anything); this
// file declares the options, checks the written file the way run/eval/serve will load it, and
// prints what was imported.
#include <cstdio>

#include "apps/commands.h"
#include "format/model_config.h"
#include "quant/rotation_file.h"
#include "quant/rotation_zoo.h"

namespace oscar::apps {

namespace {

constexpr const char* kFooter = R"(Where the files live:
  Hugging Face  Zhongzhu/OSCAR-RotationZoo: <Model>/seq<T>_prompt<N>_group<G>/
                (T calibration tokens, N prompts, G the INT2 group size they were fitted for)
  GitHub        FutureMLS-Lab/OSCAR: rotation/<model>/<DATASET>/seq<T>_prompt<N>_group<G>/rotations/

Which file is which (K goes to --k, V to --v; both from the same folder):
  k_rotation_qqt_r_h_pbr.pt / v_rotation_sst_r_h_pbr.pt   V1, one matrix per layer (the usual pair)
  k_rotation_perhead.pt     / v_rotation_perhead.pt       V2, one matrix per KV head (Qwen3-30B-A3B;
                            do not substitute the shared pair next to them: it collapses that model)
  k_rotation_hadamard.pt    / v_rotation_hadamard.pt      V1 Hadamard-only baseline
  <variant>/k_rotation_oscar2_<variant>.pt / v_...        V3: k_mean and orthogonal values import;
                            q_rotation only when it is oscar's key scaling, o_rotation never
The archive's own folder name may differ from the file name (a renamed file); it is not used.

The written file has the release's cache configuration (fixed clips 0.96 / 0.92, group 128,
64 sink + 256 recent BF16 tokens, uniform INT2) unless the flags say otherwise, the model's
config.json sha256, and the sources' paths and sha256 (see `oscar inspect FILE`). Use it with
  oscar run|eval|serve --model DIR --kv-cache oscar --rotations FILE
(its recommended_n_recent applies unless --n-recent is given; --kv-cache auto also takes its
recommended_mode).
)";

}  // namespace

Command add_import_rotations(CLI::App& app) {
  struct Args {
    std::string k, v, model_dir = "models/tiny-qwen3", out;
    quant::ZooImportOptions o;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  app.add_option("--k", a->k, "Release key file (k_rotation_*.pt)")->required();
  app.add_option("--v", a->v, "Release value file (v_rotation_*.pt)")->required();
  app.add_option("-m,--model", a->model_dir,
                 "Model directory the rotations are for (its config.json gives layers, KV heads, "
                 "head_dim and the fingerprint)")
      ->capture_default_str();
  app.add_option("-o,--out", a->out, "oscar rotation file to write (safetensors, OSCAR.md §7)")
      ->required();
  app.add_option("--k-clip", a->o.k_clip, "Key clip quantile stored per head (release: 0.96)")
      ->capture_default_str();
  app.add_option("--v-clip", a->o.v_clip, "Value clip quantile stored per head (release: 0.92)")
      ->capture_default_str();
  app.add_option("--group-size", a->o.group_size, "INT2 group size recorded in the file (release: 128; the runtime's --group-size applies)")
      ->capture_default_str();
  app.add_option("--n-sink", a->o.n_sink,
                 "BF16 sink tokens recorded in the file's import_config (release: 64; the runtime's "
                 "--n-sink, default 64, applies)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--n-recent", a->o.n_recent,
                 "BF16 recent window, written as recommended_n_recent (release: 256)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--quantizer", a->o.quantizer,
                 "uniform (recommended_mode oscar, the release's) or lloyd (oscar-lloyd)")
      ->capture_default_str();
  app.add_flag("-q,--quiet", a->quiet, "No summary");
  app.footer(kFooter);

  return [a]() -> int {
    auto fail = [](const Status& st) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    };
    auto config = format::ModelConfig::load(a->model_dir);
    if (!config.ok()) return fail(config.status());
    const format::ModelConfig& c = config.value();
    // The wanted ids are the model's KV-cache layers: 0..n_layers-1, or a hybrid's full-attention
    // layers (the release's files list only the attention layers of a hybrid).
    const quant::RotationLayers layers = quant::rotation_layers(c);
    const std::vector<int>& ids = layers.model_layers;
    auto k = quant::read_zoo_file(a->k, quant::ZooKind::kKey, ids, c.n_heads_kv, c.head_dim);
    if (!k.ok()) return fail(k.status().with_context("--k"));
    auto v = quant::read_zoo_file(a->v, quant::ZooKind::kValue, ids, c.n_heads_kv, c.head_dim);
    if (!v.ok()) return fail(v.status().with_context("--v"));
    auto set = quant::convert_zoo_pair(k.value(), v.value(), c.n_heads_kv, c.sha256, a->o);
    if (!set.ok()) return fail(set.status());
    set->layers = layers;
    Status st = quant::write_rotation_file(a->out, set.value());
    if (!st.ok()) return fail(st);
    // Read it back exactly as run/eval/serve will (shapes, orthogonality, fingerprint).
    auto back = quant::load_rotation_file(a->out, c);
    if (!back.ok()) return fail(back.status().with_context("checking the written file"));
    if (!a->quiet) {
      for (const quant::ZooFile* z : {&k.value(), &v.value()}) {
        std::fprintf(stderr, "%s  %s\n    sha256 %s, archive '%s', %s\n", z->path.c_str(),
                     z->describe().c_str(), z->sha256.c_str(), z->prefix.c_str(),
                     z->companion.empty()
                         ? str_format("max orthogonality error %.2g", z->orthogonality_error).c_str()
                         : str_format("max identity error %.2g", z->identity_error).c_str());
      }
      const auto& m = set->metadata;
      std::fprintf(stderr, "key scaling: %s\n%s; recommended_mode %s, recommended_n_recent %s\n",
                   m.at("key_scaling").c_str(), m.at("import_config").c_str(),
                   m.at(quant::kRecommendedModeKey).c_str(),
                   m.at(quant::kRecommendedRecentKey).c_str());
      std::fprintf(stderr, "wrote %s (%d layers x %d KV heads, head_dim %d, for config.json sha256 "
                   "%s)\n", a->out.c_str(), c.n_layers, c.n_heads_kv, c.head_dim, c.sha256.c_str());
    }
    return 0;
  };
}

}  // namespace oscar::apps
