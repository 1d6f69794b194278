// Command-line options shared by run, eval and serve: model, cache mode, windows, rotations.
#pragma once

#include <CLI/CLI.hpp>

#include "engine/runtime.h"

namespace oscar::apps {

inline void add_runtime_options(CLI::App& app, engine::RuntimeOptions& o) {
  o.model_dir = "models/tiny-qwen3";
  o.device = "auto";
  app.add_option("-m,--model", o.model_dir, "Model directory (config.json, safetensors, tokenizer.json)")
      ->capture_default_str();
  app.add_option("--kv-cache", o.cache_mode,
                 "KV cache: auto (what DIR/oscar_rotations.safetensors recommends, else bf16), "
                 "bf16, f32, int2-naive, int2-hadamard, kivi2, oscar, oscar-lloyd, oscar4 (4-bit "
                 "history, 4.25 bits), oscar3 (3.25 bits, planned like --kv-bits 3.25)")
      ->capture_default_str();
  app.add_option("--rotations", o.rotations,
                 "Rotation file for oscar modes (default DIR/oscar_rotations.safetensors)");
  app.add_option("--n-sink", o.n_sink, "BF16 attention-sink tokens")->capture_default_str();
  app.add_option("--n-recent", o.n_recent,
                 "BF16 recent-window tokens (default: the rotation file's recommendation for oscar "
                 "modes, else 256)");
  app.add_option("--page-size", o.page_size, "Tokens per KV page (default 16; 32 for kivi2)");
  app.add_option("--group-size", o.group_size, "Values per INT2 scale/min group")
      ->capture_default_str();
  app.add_option("--k-clip", o.k_clip, "Override the key clip quantile (oscar modes)");
  app.add_option("--v-clip", o.v_clip, "Override the value clip quantile (oscar modes)");
  app.add_flag("!--no-bit-plan", o.bit_plan,
               "oscar: ignore the rotation file's mixed-precision bit plan (every history row "
               "INT2); oscar3: every history row at 3 bits");
  app.add_option("--kv-bits", o.kv_bits,
                 "oscar: history bits per element on average, 2.25..4.25 (group 128); widths "
                 "1-4 bits spent where the rotation file's calibration statistics say they "
                 "matter (kv/bit_plan.h). Replaces the file's own bit plan");
  app.add_flag("--dummy-weights", o.dummy_weights,
               "Random weights from DIR/config.json (speed tests at real sizes)");
  app.add_option("--folded-weights", o.folded_weights,
                 "oscar modes: v_proj/o_proj with the value rotation folded in, stored as f32 or "
                 "bf16; auto = bf16 on a GPU, f32 on the CPU")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  app.add_option("--device", o.device,
                 "Backend: cpu; cuda (a build with -DOSCAR_CUDA=ON and a visible GPU); auto = "
                 "cuda when both hold, else cpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("--enable-deterministic-inference", o.deterministic,
               "Batch-invariant kernels (as SGLang's flag): a request's tokens and logprobs at "
               "temperature 0 or with a seed do not depend on what runs beside it; CPU and "
               "CUDA, prefill slower (docs/results/determinism.md)");
}

}  // namespace oscar::apps
