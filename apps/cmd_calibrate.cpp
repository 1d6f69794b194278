// `oscar calibrate`: OSCAR calibration (OSCAR.md §6) of a model on a text file, writing the
// rotation file of §7. The work is in calib/calibrator.h; this file declares the options, prints
// a summary and writes the file.
#include <omp.h>

#include <cstdio>

#include "apps/commands.h"
#include "calib/calibrator.h"
#include "quant/rotation_file.h"

namespace oscar::apps {

Command add_calibrate(CLI::App& app) {
  struct Args {
    std::string model_dir = "models/tiny-qwen3";
    std::string data;
    std::string out;
    std::string value_objective = "full";
    std::string clip = "fixed";
    std::string k_objective = "kl";
    std::string quantizer = "uniform";
    std::string key_scaling = "full";
    int threads = 0;
    bool quiet = false;
    std::string device = "auto";
    calib::CalibrationOptions o;
  };
  auto a = std::make_shared<Args>();
  calib::CalibrationOptions& o = a->o;
  app.add_option("-m,--model", a->model_dir, "Model directory (config.json, safetensors, tokenizer.json)")
      ->capture_default_str();
  app.add_option("--data", a->data, "Calibration text file (tokenized whole, special tokens recognised)")
      ->required();
  app.add_option("-o,--out", a->out, "Rotation file to write (safetensors, OSCAR.md §7)")->required();
  app.add_option("--windows", o.n_windows,
                 "Consecutive non-overlapping windows to run (fewer if the data is shorter)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--window-tokens", o.window_tokens, "Tokens per window (fresh exact cache each)")
      ->capture_default_str()->check(CLI::Range(2, 1 << 20));
  app.add_option("--prefill-chunk", o.prefill_chunk, "Tokens per forward call within a window")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--value-objective", a->value_objective,
                 "Value covariance: full (C_S = OᵀO of the attention outputs) or diag "
                 "(Σ w_t v_tᵀv_t / Σ w_t, w_t = Σ_i s_it²)")
      ->capture_default_str();
  app.add_option("--key-scaling", a->key_scaling,
                 "Key transform beyond R = U·H·P_br: none, centre (subtract the keys' mean) or "
                 "full (centre, then scale each C_Q eigendirection by (λ_j/κ_j)^(1/4) and the "
                 "queries by the inverse: same logits, less INT2 logit error)")
      ->capture_default_str();
  app.add_option("--key-scale-power", o.key_scale_power,
                 "--key-scaling full: w_j = (λ_j/κ_j)^power (0.25 minimises the expected logit error)")
      ->capture_default_str();
  app.add_option("--bit-plan-pairs", o.bit_plan_pairs,
                 "Mixed precision at the same bytes: give this many (layer, KV head) key planes 3 "
                 "bits (those with the largest expected INT2 logit error) and as many value "
                 "planes 1 bit (smallest tr C_S); 0 = uniform INT2")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--diag-query-stride", o.diag_query_stride,
                 "diag objective: use the query rows at every stride-th position for w_t")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--clip", a->clip,
                 "Clip ratios: search (per layer and KV head, on a calibration sample) or fixed "
                 "(--k-clip / --v-clip, default the release's 0.96 / 0.92)")
      ->capture_default_str();
  app.add_option("--k-clip", o.fixed_k_clip, "Key clip quantile for --clip fixed")
      ->capture_default_str();
  app.add_option("--v-clip", o.fixed_v_clip, "Value clip quantile for --clip fixed")
      ->capture_default_str();
  app.add_option("--k-objective", a->k_objective,
                 "Key clip objective: kl (KL of quantized from exact attention), prob (squared "
                 "error of attention probabilities), weighted-logit (logit error weighted by "
                 "attention probability), logit (unweighted logit error)")
      ->capture_default_str();
  app.add_option("--clip-min", o.clip.grid.min, "Smallest clip ratio searched")->capture_default_str();
  app.add_option("--clip-max", o.clip.grid.max, "Largest clip ratio searched (1 = no clip)")
      ->capture_default_str();
  app.add_option("--clip-step", o.clip.grid.step, "Clip ratio grid step")->capture_default_str();
  app.add_option("--clip-windows", o.clip_windows,
                 "Windows kept in memory for the clip search (spread over the data)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--clip-queries", o.clip_queries,
                 "Query positions per clip window (every query head of the group at each)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--n-sink", o.clip.n_sink,
                 "Clip search: leading tokens the cache keeps exact (not quantized)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--n-recent", o.clip.n_recent,
                 "Recent tokens before each query the cache keeps exact: used by the clip search "
                 "and written as recommended_n_recent, which --kv-cache auto applies")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--group-size", o.clip.group_size, "Values per INT2 scale/min group (32, 64, 128)")
      ->capture_default_str();
  app.add_option("--quantizer", a->quantizer, "Quantizer: used by the clip search and written as recommended_mode (uniform: oscar, "
                 "lloyd: oscar-lloyd), which --kv-cache auto applies")
      ->capture_default_str();
  app.add_option("--threads", a->threads, "Worker threads (0 = OpenMP default)")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_flag("-q,--quiet", a->quiet, "No progress bar or summary");
  app.add_option("--device", a->device,
                 "Backend of the forward passes: cpu (exact f32 cache), cuda (BF16 cache: the "
                 "GPU has no f32 pages), auto = cuda when built and a GPU is visible")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  return [a]() -> int {
    calib::CalibrationOptions o = a->o;
    auto fail = [](const Status& st) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 2;
    };
    auto vo = calib::parse_value_objective(a->value_objective);
    if (!vo.ok()) return fail(vo.status());
    o.value_objective = vo.value();
    auto cm = calib::parse_clip_mode(a->clip);
    if (!cm.ok()) return fail(cm.status());
    o.clip_mode = cm.value();
    auto ko = calib::parse_key_clip_objective(a->k_objective);
    if (!ko.ok()) return fail(ko.status());
    o.clip.key_objective = ko.value();
    auto qz = calib::parse_quantizer(a->quantizer);
    if (!qz.ok()) return fail(qz.status());
    o.clip.quantizer = qz.value();
    auto ks = calib::parse_key_scaling(a->key_scaling);
    if (!ks.ok()) return fail(ks.status());
    o.key_scaling = ks.value();
    if (a->threads > 0) omp_set_num_threads(a->threads);

    auto result = calib::calibrate_model_dir(a->model_dir, a->data, o, !a->quiet, a->device);
    if (!result.ok()) {
      std::fprintf(stderr, "error: %s\n", result.status().message().c_str());
      return 1;
    }
    const calib::CalibrationResult& r = result.value();
    Status st = quant::write_rotation_file(a->out, r.rotations);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
    if (!a->quiet) {
      const quant::RotationSet& s = r.rotations;
      std::fprintf(stderr,
                   "calibrated on %d windows x %d tokens (%lld of %lld tokens): forward %.1f s, "
                   "decompose %.2f s, clip search %.1f s\n",
                   r.n_windows, o.window_tokens, static_cast<long long>(r.n_tokens),
                   static_cast<long long>(r.n_data_tokens), r.forward_s, r.decompose_s, r.clip_s);
      std::fprintf(stderr, "layer head  rho_K  rho_V  top eig C_Q  top eig C_S  key error ratio  key logit err  "
                   "tr C_S  bits K/V\n");
      for (int l = 0; l < s.n_layers; ++l)
        for (int h = 0; h < s.n_heads_kv; ++h) {
          const size_t i = static_cast<size_t>(l) * s.n_heads_kv + h;
          // The decoder layer (a hybrid's entries are its full-attention layers).
          const int layer = s.layers.model_layers.empty() ? l : s.layers.model_layers[l];
          std::fprintf(stderr, "%5d %4d  %.3f  %.3f  %11.5g  %11.5g  %15.3f  %13.4g  %6.3g  %d/%d\n",
                       layer, h, s.k_clip[i], s.v_clip[i], s.k_eig[i * s.head_dim],
                       s.v_eig[i * s.head_dim], r.key_error_ratio[i], r.key_logit_error[i],
                       r.value_energy[i], s.has_bit_plan() ? s.k_bits[i] : 2,
                       s.has_bit_plan() ? s.v_bits[i] : 2);
        }
      std::fprintf(stderr, "wrote %s\n", a->out.c_str());
    }
    return 0;
  };
}

}  // namespace oscar::apps
