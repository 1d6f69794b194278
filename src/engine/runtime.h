// Runtime: what `oscar run`, `oscar eval` and `oscar serve` share: the model, its tokenizer and
// one KV-cache configuration (mode, windows, rotations), with the page pools it allocates from.
//
// Cache modes (OSCAR.md §8): bf16, f32 (exact reference), int2-naive, int2-hadamard, kivi2,
// oscar, oscar-lloyd. `auto` uses the rotation file's recommendation (`recommended_mode` and
// `recommended_n_recent`, written by `oscar calibrate`; oscar with a 384-token window for the
// shipped tiny-qwen3 file) when DIR/oscar_rotations.safetensors exists, bf16 otherwise. oscar
// modes read the rotation file; its value rotation is folded into the model's v_proj/o_proj here
// (OSCAR.md §3), so one Runtime serves exactly one mode. oscar also takes the file's bit plan,
// if any (3-bit keys / 1-bit values for a few heads at the same bytes; kv/bit_plan.h), or, with
// `kv_bits`, a plan for that average chosen from the file's statistics (kv::plan_for_bits).
// oscar4: the same rotations and key scaling with every history row at 4 bits, not clipped (the
// file's clips are INT2's and cost more than they save at 3-4 bits; the same for the 3-/4-bit
// planes of a kv_bits plan; the precision ladder, docs/results/precision_ladder.md). oscar3: 3.25
// bits per element planned from the file's statistics (as kv_bits 3.25) when the file has them,
// every row at 3 bits without them or with bit_plan off.
#pragma once

#include <memory>
#include <string>

#include "core/device.h"
#include "core/status.h"
#include "kernels/backend.h"
#include "kv/page_pool.h"
#include "kv/sequence_cache.h"
#include "model/qwen3.h"
#include "tokenizer/tokenizer.h"

namespace oscar::engine {

inline constexpr const char* kDefaultRotationFile = "oscar_rotations.safetensors";
inline constexpr int kDefaultRecentTokens = 256;  // OSCAR.md §4
inline constexpr int kDefaultPageSize = 16;

struct RuntimeOptions {
  std::string model_dir;
  std::string cache_mode = "auto";  // see above
  std::string rotations;            // rotation file; default DIR/oscar_rotations.safetensors
  int n_sink = 64;
  // < 0: the rotation file's recommended_n_recent for oscar modes, else kDefaultRecentTokens.
  int n_recent = -1;
  // <= 0: kDefaultPageSize (32 for kivi2, whose key blocks span 32 tokens).
  int page_size = 0;
  int group_size = 128;
  // Clip quantiles for oscar modes: < 0 means "use the rotation file's searched values".
  float k_clip = -1.f;
  float v_clip = -1.f;
  // oscar mode: use the rotation file's mixed-precision bit plan (kv/bit_plan.h) when it has
  // one; false = every history row INT2 (the ablation baseline). oscar-lloyd never uses one.
  bool bit_plan = true;
  // > 0: history bits per element on average (2.25..4.25 at group 128) for the oscar mode, with
  // widths 1..4 planned from the rotation file's statistics (kv::plan_for_bits; needs a version
  // 4 file). Replaces the file's own plan. 0 = unset.
  double kv_bits = 0.0;
  size_t kv_budget_bytes = size_t{1} << 30;  // split between the two pools, see split_tokens
  // The budget is split so that both pools run out together for sequences of this many tokens
  // (sinks + recent window in BF16 pages, the rest in INT2 pages).
  int64_t split_tokens = 4096;
  bool dummy_weights = false;  // random weights from config.json (speed at real sizes)
  // The backend (kernels/backend.h): cpu, cuda, or auto (cuda when built and a GPU is visible).
  // The commands default to auto (apps/runtime_options.h); the library to cpu, so that tests
  // and tools name the device they mean.
  std::string device = "cpu";
  // How v_proj / o_proj are stored after the value rotation is folded into them (oscar modes):
  // "f32", "bf16" (rounded like the checkpoint's weights: half the bytes a step reads for the two
  // matrices), or "auto" = bf16 on a device backend, f32 on the CPU.
  std::string folded_weights = "auto";
  // Batch-invariant kernels (Backend::set_batch_invariant): a request's tokens and logprobs do
  // not depend on what runs beside it. CPU only; prefill is slower (docs/results/determinism.md).
  bool deterministic = false;
};

class Runtime {
 public:
  static Result<std::unique_ptr<Runtime>> create(const RuntimeOptions& options);

  model::Qwen3Model& model() { return *model_; }
  kernels::Backend& backend() { return *backend_; }
  const tok::Tokenizer& tokenizer() const { return *tokenizer_; }
  const kv::KvCacheSpec& spec() const { return spec_; }
  kv::PagePool& exact_pool() { return *exact_pool_; }
  kv::PagePool* int2_pool() { return int2_pool_.get(); }
  // The DeltaNet state slots of a hybrid model (kv/state_pool.h); null otherwise.
  kv::StatePool* state_pool() { return state_pool_.get(); }
  const RuntimeOptions& options() const { return options_; }
  std::string describe() const;

  // A fresh, empty cache for one sequence (pages come from this runtime's pools).
  std::unique_ptr<kv::SequenceCache> new_cache();

 private:
  RuntimeOptions options_;
  std::unique_ptr<model::Qwen3Model> model_;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
  kv::KvCacheSpec spec_;
  // The backend owns the page bytes (one buffer per pool); the pools hand out ids into them.
  // Declared before the pools, so the pools go first.
  std::unique_ptr<kernels::Backend> backend_;
  DeviceBuffer exact_storage_, int2_storage_;
  std::unique_ptr<kv::PagePool> exact_pool_;
  std::unique_ptr<kv::PagePool> int2_pool_;
  std::unique_ptr<kv::StatePool> state_pool_;  // outlives the caches it serves (runtime-owned)
};

// Builds the cache spec of a mode for a model (rotations loaded or constructed as the mode says).
Result<kv::KvCacheSpec> make_cache_spec(const format::ModelConfig& config,
                                        const RuntimeOptions& options, quant::CacheMode mode);

}  // namespace oscar::engine
