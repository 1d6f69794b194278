#include "engine/runtime.h"

#include <cstdlib>
#include <filesystem>

#include "core/log.h"
#include "kv/admission.h"
#include "kv/layer_groups.h"
#include "quant/hadamard.h"
#include "quant/int2_layout.h"
#include "quant/rotation_file.h"

namespace oscar::engine {

namespace {

// The release's fixed clip quantiles (OSCAR.md §1), used when a file carries none.
constexpr float kReleaseClipK = 0.96f;
constexpr float kReleaseClipV = 0.92f;

using quant::kRecommendedModeKey;
using quant::kRecommendedRecentKey;

std::string default_rotations(const RuntimeOptions& o) {
  return o.rotations.empty() ? (std::filesystem::path(o.model_dir) / kDefaultRotationFile).string()
                             : o.rotations;
}

// `auto`: bf16 without a rotation file. With one: the mode its `recommended_mode` metadata names
// (written by `oscar calibrate`: the quantizer its clips were chosen for), else "oscar" (files
// written before that key existed). Sets o.cache_mode. A file that fails to load fails here, as
// it would for oscar.
Status apply_auto_mode(const format::ModelConfig& config, RuntimeOptions& o) {
  const std::string path = default_rotations(o);
  if (!std::filesystem::exists(path)) {
    o.cache_mode = "bf16";
    return Status();
  }
  // A hybrid's file holds its full-attention layers only (quant::rotation_layers).
  OSCAR_ASSIGN_OR_RETURN(quant::RotationSet rot, quant::load_rotation_file(path, config));
  o.cache_mode = "oscar";
  if (const auto it = rot.metadata.find(kRecommendedModeKey); it != rot.metadata.end()) {
    OSCAR_ASSIGN_OR_RETURN(quant::CacheMode mode, quant::parse_cache_mode(it->second));
    if (mode != quant::CacheMode::kOscar && mode != quant::CacheMode::kOscarLloyd)
      return invalid_argument("rotation file %s: %s '%s' is not an oscar mode (oscar, oscar-lloyd)",
                              path.c_str(), kRecommendedModeKey, it->second.c_str());
    o.cache_mode = it->second;
  }
  return Status();
}

// The recent window a rotation file recommends (`recommended_n_recent`), if it names one.
Result<int> recommended_recent(const quant::RotationSet& rot, const std::string& path) {
  const auto it = rot.metadata.find(kRecommendedRecentKey);
  if (it == rot.metadata.end()) return kDefaultRecentTokens;
  char* end = nullptr;
  const long n = std::strtol(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || n < 0 || n > (1 << 24))
    return invalid_argument("rotation file %s: %s '%s' is not a token count", path.c_str(),
                            kRecommendedRecentKey, it->second.c_str());
  return static_cast<int>(n);
}

}  // namespace

Result<kv::KvCacheSpec> make_cache_spec(const format::ModelConfig& config,
                                        const RuntimeOptions& o, quant::CacheMode mode) {
  kv::KvCacheSpec spec;
  // The cache holds the full-attention group only (every layer but a hybrid's DeltaNet layers).
  spec.n_layers = kv::layer_groups(config).n_layers(kv::LayerCache::kFullAttention);
  spec.n_heads_kv = config.n_heads_kv;
  spec.head_dim = config.head_dim;
  spec.group_size = o.group_size;
  spec.regions.n_sink = o.n_sink;
  spec.regions.n_recent = o.n_recent >= 0 ? o.n_recent : kDefaultRecentTokens;
  spec.regions.page_size = o.page_size > 0 ? o.page_size
                           : mode == quant::CacheMode::kKivi2 ? 32
                                                              : kDefaultPageSize;
  spec.mode = mode;
  if (o.kv_bits != 0.0 && mode != quant::CacheMode::kOscar)
    return invalid_argument(
        "--kv-bits %g plans the widths of the oscar cache; cache mode %s has "
        "its own (use --kv-cache oscar)",
        o.kv_bits, quant::cache_mode_name(mode));
  if (o.kv_bits != 0.0 && quant::int2_valid_group(config.head_dim, o.group_size)) {
    // The range first: a bad value fails before any file is read
    const double lo = kv::uniform_plan_bits(2, config.head_dim, o.group_size);
    const double hi = kv::uniform_plan_bits(4, config.head_dim, o.group_size);
    if (!(o.kv_bits >= lo && o.kv_bits <= hi))
      return invalid_argument(
          "--kv-bits %g: expected %g..%g history bits per element (every row "
          "at 2 bits .. every row at 4, metadata included, group size %d)",
          o.kv_bits, lo, hi, o.group_size);
  }
  const size_t heads = static_cast<size_t>(spec.n_layers) * config.n_heads_kv;
  const size_t dd = static_cast<size_t>(config.head_dim) * config.head_dim;

  if (mode == quant::CacheMode::kInt2Hadamard) {
    if (!quant::is_power_of_two(config.head_dim))
      return invalid_argument("int2-hadamard needs a power-of-two head_dim, model has %d",
                              config.head_dim);
    std::vector<float> hb = quant::hadamard_bitrev_rotation(config.head_dim);
    spec.k_rotation.resize(heads * dd);
    for (size_t i = 0; i < heads; ++i) std::copy(hb.begin(), hb.end(), spec.k_rotation.begin() + i * dd);
    spec.v_rotation = spec.k_rotation;
  } else if (quant::cache_mode_is_oscar(mode)) {
    const std::string path = default_rotations(o);
    if (!std::filesystem::exists(path))
      return not_found("cache mode %s needs a rotation file, and %s does not exist: write one with "
                       "`oscar calibrate -m %s --data TEXT -o FILE` (a hybrid's covers its "
                       "full-attention layers) and pass it with --rotations",
                       quant::cache_mode_name(mode), path.c_str(), o.model_dir.c_str());
    // Entry l of the file is cache layer l (a hybrid's l-th full-attention layer).
    OSCAR_ASSIGN_OR_RETURN(quant::RotationSet rot, quant::load_rotation_file(path, config));
    if (o.n_recent < 0) {
      OSCAR_ASSIGN_OR_RETURN(spec.regions.n_recent, recommended_recent(rot, path));
    }
    if (rot.has_key_scaling()) {  // OSCAR.md §1 "Key scaling"
      spec.k_rotation.resize(heads * dd);
      spec.q_rotation.resize(heads * dd);
      for (int l = 0; l < spec.n_layers; ++l)
        for (int h = 0; h < config.n_heads_kv; ++h) {
          const size_t at = (static_cast<size_t>(l) * config.n_heads_kv + h) * dd;
          const std::vector<float> mk = rot.key_transform(l, h), mq = rot.query_transform(l, h);
          std::copy(mk.begin(), mk.end(), spec.k_rotation.begin() + at);
          std::copy(mq.begin(), mq.end(), spec.q_rotation.begin() + at);
        }
      spec.k_mean = std::move(rot.k_mean);
    } else {
      spec.k_rotation = std::move(rot.k_rot);
    }
    spec.v_rotation = std::move(rot.v_rot);
    spec.k_clip = rot.k_clip;
    spec.v_clip = rot.v_clip;
    if (spec.k_clip.empty()) spec.k_clip.assign(heads, kReleaseClipK);
    if (spec.v_clip.empty()) spec.v_clip.assign(heads, kReleaseClipV);
    // Clip overrides belong to the oscar modes; the baselines stay as OSCAR.md §8 defines them.
    if (o.k_clip > 0) spec.k_clip.assign(heads, o.k_clip);
    if (o.v_clip > 0) spec.v_clip.assign(heads, o.v_clip);
    Result<std::shared_ptr<const kv::BitPlan>> plan = std::shared_ptr<const kv::BitPlan>();
    // oscar3 spends its 3.25 bits per element as a plan from the file's statistics, like
    // --kv-bits 3.25, when the file has them (version 4) and the bit plan is on: at the same
    // bytes that plan beat every row at 3 bits on the held-out text (perplexity +0.14% vs
    // +0.49% over bf16, NIAH 8K 88 vs 84 of 100; docs/results/precision_ladder.md). Uniform
    // 3-bit rows with --no-bit-plan or an older file.
    const int fixed = quant::cache_mode_fixed_bits(mode);
    double plan_bits = o.kv_bits;  // --kv-bits: mode is oscar (checked above)
    if (mode == quant::CacheMode::kOscar3 && o.bit_plan && rot.has_logit_error())
      plan_bits = kv::uniform_plan_bits(3, config.head_dim, spec.group_size);
    if (fixed != 0 && plan_bits == 0.0) {
      plan = kv::BitPlan::uniform(spec.n_layers, config.n_heads_kv, config.head_dim,
                                  spec.group_size, fixed);
    } else if (plan_bits != 0.0) {
      if (!rot.has_logit_error())
        return invalid_argument(
            "--kv-bits %g: rotation file %s has no layers.*.k.logit_error "
            "(written before version 4); re-run `oscar calibrate` to plan "
            "widths from it",
            plan_bits, path.c_str());
      kv::PlanStatistics stats;
      stats.key_logit_error.assign(rot.k_logit_error.begin(), rot.k_logit_error.end());
      stats.value_energy = rot.value_energy();
      stats.k_clip = spec.k_clip;
      stats.v_clip = spec.v_clip;
      plan = kv::plan_for_bits(spec.n_layers, config.n_heads_kv, config.head_dim, spec.group_size,
                               plan_bits, stats);
    } else if (rot.has_bit_plan() && o.bit_plan && mode == quant::CacheMode::kOscar) {
      plan = kv::BitPlan::create(spec.n_layers, config.n_heads_kv, config.head_dim,
                                 spec.group_size, rot.k_bits, rot.v_bits);
    }
    if (!plan.ok()) return plan.status().with_context("rotation file " + path);
    spec.bit_plan = std::move(plan).value();
    // oscar4 / oscar3 and --kv-bits plans do not clip their 3- and 4-bit rows: the file's clips
    // are INT2's and cost more than they save at 3-4 bits (measured: oscar4 +1.25% perplexity
    // over bf16 with them, +0.07% without; docs/results/precision_ladder.md). --k-clip /
    // --v-clip still set every row's. The file's own plan keeps the clips it was chosen with.
    if (fixed != 0 || plan_bits != 0.0) {
      for (int l = 0; l < spec.n_layers; ++l)
        for (int h = 0; h < config.n_heads_kv; ++h) {
          const size_t i = static_cast<size_t>(l) * config.n_heads_kv + h;
          if (o.k_clip <= 0 && spec.bit_plan->bits(l, 0, h) >= 3) spec.k_clip[i] = 1.0f;
          if (o.v_clip <= 0 && spec.bit_plan->bits(l, 1, h) >= 3) spec.v_clip[i] = 1.0f;
        }
    }
  }
  OSCAR_RETURN_IF_ERROR(spec.validate());
  return spec;
}

Result<std::unique_ptr<Runtime>> Runtime::create(const RuntimeOptions& options) {
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->options_ = options;
  RuntimeOptions& o = rt->options_;
  if (o.folded_weights != "auto" && o.folded_weights != "f32" && o.folded_weights != "bf16")
    return invalid_argument("folded weights '%s': auto, f32 or bf16", o.folded_weights.c_str());
  // MoE and hybrid models run on the CPU only for now (kernels/moe.h and gated_delta.h have no
  // CUDA version): `auto` picks the CPU for them, an explicit device is refused here rather than
  // at the first step.
  if (o.device != "cpu") {
    Result<format::ModelConfig> config = format::ModelConfig::load(o.model_dir);
    if (config.ok() && (config->is_moe() || config->is_hybrid())) {
      if (o.device != "auto")
        return unimplemented("%s: %s not implemented on %s yet; use --device cpu",
                             config->architecture_name.c_str(),
                             config->is_moe() ? "MoE" : "the hybrid (Gated DeltaNet) model",
                             o.device.c_str());
      o.device = "cpu";
    }
  }
  if (o.deterministic) {
    // The Gated DeltaNet's chunked recurrence follows the prefill's chunking: not invariant yet.
    Result<format::ModelConfig> config = format::ModelConfig::load(o.model_dir);
    if (config.ok() && config->is_hybrid())
      return unimplemented(
          "--enable-deterministic-inference: not for hybrid (Gated DeltaNet) models yet: their "
          "linear-attention layers' prefill depends on how the prompt is chunked");
  }
  OSCAR_ASSIGN_OR_RETURN(rt->backend_, kernels::make_backend(o.device));
  OSCAR_RETURN_IF_ERROR(rt->backend_->set_batch_invariant(o.deterministic));

  if (o.dummy_weights) {
    OSCAR_ASSIGN_OR_RETURN(format::ModelConfig config, format::ModelConfig::load(o.model_dir));
    // Generated in the backend's memory (no host copy of a large model).
    OSCAR_ASSIGN_OR_RETURN(rt->model_,
                           model::Qwen3Model::load_dummy(config, 1234, rt->backend_.get()));
  } else {
    OSCAR_ASSIGN_OR_RETURN(rt->model_, model::Qwen3Model::load(o.model_dir));
  }
  OSCAR_ASSIGN_OR_RETURN(tok::Tokenizer tokenizer, tok::Tokenizer::load(o.model_dir));
  rt->tokenizer_ = std::make_unique<tok::Tokenizer>(std::move(tokenizer));
  const format::ModelConfig& config = rt->model_->config();

  if (o.cache_mode == "auto") OSCAR_RETURN_IF_ERROR(apply_auto_mode(config, o));
  OSCAR_ASSIGN_OR_RETURN(quant::CacheMode mode, quant::parse_cache_mode(o.cache_mode));
  if (rt->backend_->device() != Device::kCpu &&
      (mode == quant::CacheMode::kF32 || mode == quant::CacheMode::kKivi2 ||
       mode == quant::CacheMode::kOscarLloyd))
    return unimplemented(
        "cache mode %s runs on the CPU only (the CUDA kernels read BF16 exact "
        "pages and uniform INT2 / bit-plan history rows: bf16, int2-naive, "
        "int2-hadamard, oscar, oscar4, oscar3); use --device cpu",
        o.cache_mode.c_str());
  OSCAR_ASSIGN_OR_RETURN(rt->spec_, make_cache_spec(config, o, mode));
  if (!rt->spec_.v_rotation.empty()) {
    const bool bf16 = o.folded_weights == "bf16" ||
                      (o.folded_weights == "auto" && rt->backend_->device() != Device::kCpu);
    OSCAR_RETURN_IF_ERROR(rt->model_->fold_value_rotation(
        rt->spec_.v_rotation, bf16 ? kernels::DType::kBF16 : kernels::DType::kF32));
  }

  // Split the budget so that both pools run out together for sequences of split_tokens tokens.
  const kernels::KvPageLayout layout = rt->spec_.layout();
  size_t exact_budget = o.kv_budget_bytes, int2_budget = 0;
  if (rt->spec_.quantized()) {
    const kv::PageNeed need = kv::peak_pages_for_length(rt->spec_.regions, std::max<int64_t>(1, o.split_tokens));
    const double exact_bytes = static_cast<double>(need.bf16_pages() * layout.exact_page_bytes());
    const double int2_bytes = static_cast<double>(need.int2_pages() * layout.int2_page_bytes());
    const double exact_share = exact_bytes / (exact_bytes + int2_bytes);
    exact_budget = static_cast<size_t>(static_cast<double>(o.kv_budget_bytes) * exact_share);
    int2_budget = o.kv_budget_bytes - exact_budget;
  }
  // Weights and the cache's tensors (rotations, clips, bit plan) into the backend's memory.
  OSCAR_RETURN_IF_ERROR(rt->model_->set_backend(rt->backend_.get()));
  OSCAR_RETURN_IF_ERROR(rt->spec_.upload_to(*rt->backend_));
  // Page storage: one buffer per pool in the backend's memory; the pools keep only ids.
  const int64_t n_exact = kv::PagePool::pages_for_budget(exact_budget, layout.exact_page_bytes());
  OSCAR_ASSIGN_OR_RETURN(rt->exact_storage_,
                         rt->backend_->alloc(n_exact * layout.exact_page_bytes(), "exact KV pages"));
  rt->exact_pool_ = std::make_unique<kv::PagePool>(
      mode == quant::CacheMode::kF32 ? "f32" : "bf16", n_exact, layout.exact_page_bytes(),
      rt->exact_storage_.as<uint8_t>());
  if (rt->spec_.quantized()) {
    const int64_t n_hist = kv::PagePool::pages_for_budget(int2_budget, layout.int2_page_bytes());
    OSCAR_ASSIGN_OR_RETURN(rt->int2_storage_,
                           rt->backend_->alloc(n_hist * layout.int2_page_bytes(),
                                               "history KV pages"));
    rt->int2_pool_ = std::make_unique<kv::PagePool>("int2", n_hist, layout.int2_page_bytes(),
                                                    rt->int2_storage_.as<uint8_t>());
  }
  // The linear-state group's layers keep their state in the StatePool (a hybrid).
  const int32_t n_state_layers = kv::layer_groups(config).n_layers(kv::LayerCache::kLinearState);
  if (n_state_layers > 0)
    rt->state_pool_ = std::make_unique<kv::StatePool>(n_state_layers, config.conv_state_floats(),
                                                      config.recurrent_state_floats());
  OSCAR_LOG_INFO("runtime: %s", rt->describe().c_str());
  return rt;
}

std::string Runtime::describe() const {
  const format::ModelConfig& c = model_->config();
  std::string s = str_format(
      "device=%s model=%s layers=%d heads=%d/%d head_dim=%d vocab=%d weights_bytes=%zu %s "
      "exact_pool_pages=%lld exact_page_bytes=%zu",
      device_name(backend_->device()), options_.model_dir.c_str(), c.n_layers, c.n_heads_q, c.n_heads_kv, c.head_dim,
      c.vocab_size, model_->weight_bytes(), spec_.describe().c_str(),
      static_cast<long long>(exact_pool_->n_pages()), exact_pool_->page_bytes());
  if (int2_pool_)
    s += str_format(" int2_pool_pages=%lld int2_page_bytes=%zu",
                    static_cast<long long>(int2_pool_->n_pages()), int2_pool_->page_bytes());
  if (state_pool_)
    s += str_format(" linear_layers=%d kv_layers=%d state_bytes_per_seq=%lld", c.n_linear_layers,
                    c.n_kv_layers, static_cast<long long>(state_pool_->bytes_per_slot()));
  if (options_.deterministic) s += " deterministic=1";
  return s;
}

std::unique_ptr<kv::SequenceCache> Runtime::new_cache() {
  return std::make_unique<kv::SequenceCache>(&spec_, exact_pool_.get(), int2_pool_.get(),
                                             state_pool_.get());
}

}  // namespace oscar::engine
