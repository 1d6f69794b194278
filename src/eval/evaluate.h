// `oscar eval` as a library: every requested cache mode on the same data in one run, so the
// comparison is side by side (OSCAR.md §8). Per mode: perplexity (perplexity.h), attention
// fidelity against bf16 (fidelity.h), NIAH accuracy (niah.h) and the measured bits per element
// of the cache after the longest NIAH prefill (cache_bits.h).
//
// One engine::Runtime per mode (a mode may fold its value rotation into the weights), created,
// used and destroyed in turn, so memory holds one model at a time. A mode whose Runtime cannot be
// created (e.g. kivi2, which the cache does not support yet, or oscar without a rotation file) is
// reported as unsupported with the reason, and the run goes on. Rendering (table, JSON, SVG) is in
// report.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "engine/runtime.h"
#include "eval/cache_bits.h"
#include "eval/fidelity.h"
#include "eval/niah.h"
#include "eval/perplexity.h"

namespace oscar::eval {

struct EvalConfig {
  engine::RuntimeOptions runtime;  // model, windows, clips; cache_mode is set per mode
  std::vector<std::string> modes = {"bf16", "int2-naive", "int2-hadamard", "oscar"};
  std::string dev_text;   // default: <model>/data/dev_eval.txt
  std::string niah_file;  // default: <model>/data/niah_dev.jsonl
  PplOptions ppl;
  FidelityOptions fidelity;  // n_windows 0 = skip; window_tokens follows ppl.window_tokens
  std::vector<int> niah_lengths = {1024, 2048, 4096, 8192};
  int niah_per_length = 100;  // 0 = skip NIAH (bits are then measured on a dev-text prefill)
  int niah_skip = 0;          // skip this many cases of each length first (for shards)
  bool progress = true;       // progress bars on stderr
};

// Where and how the run happened (filled by the caller; written into the JSON and the report).
struct RunInfo {
  std::string command_line, date, machine, git_commit;
  std::vector<std::string> merged_from;  // merged reports (merge.h): each one's line and origin
};

struct ModeReport {
  std::string mode;
  bool supported = true;
  std::string error;     // why not, when !supported
  std::string describe;  // the runtime's one-line description
  std::optional<PplResult> ppl;
  std::optional<FidelityResult> fidelity;
  std::optional<NiahResult> niah;
  std::optional<CacheBits> bits;
  double seconds = 0.0;
};

struct EvalReport {
  EvalConfig config;
  RunInfo info;
  int64_t n_dev_tokens = 0;
  double tokenize_seconds = 0.0;
  double reference_seconds = 0.0;  // bf16 fidelity reference pass
  std::vector<ModeReport> modes;
  double seconds = 0.0;
};

// Checks the configuration before any work (check_fidelity_device included), then runs it.
Result<EvalReport> run_evaluation(const EvalConfig& config);

// Attention fidelity reads cache rows back with the CPU kernels (SequenceCache::read_row, host
// caches only), so it runs on the CPU backend alone: InvalidArgument saying so, and what to pass
// instead, when fidelity windows are asked of another device. `oscar eval` sets the windows'
// default to 0 off the CPU (with a note) and keeps this error for an explicit request.
Status check_fidelity_device(const EvalConfig& config, Device device);

// A mode label is a cache mode optionally followed by ':'-separated overrides, so variants of one
// mode run side by side: "oscar-lloyd:k=1:v=1", "oscar:rot=/tmp/r.safetensors:k=0.98".
//   k=RHO, v=RHO  key / value clip quantile (oscar modes; 0 < RHO <= 1.5, >= 1 = no clip)
//   rot=FILE      rotation file;   sink=N, recent=N  BF16 windows (tokens)
//   plan=0|1      oscar: ignore / use the rotation file's bit plan (kv/bit_plan.h)
// Returns `base` with cache_mode and the overrides set; InvalidArgument names a bad item.
Result<engine::RuntimeOptions> apply_mode_variant(const std::string& label,
                                                  const engine::RuntimeOptions& base);

}  // namespace oscar::eval
