// Needle-in-a-haystack accuracy (models/tiny-qwen3/README.md, "NIAH format"): prefill the prompt
// in AttendMode::kPrefill (serving prefill: the prompt reads its own exact K/V), then greedily
// decode n_answer tokens one by one through the cache (so the answer reads sinks and recent
// exact, history INT2). Correct iff the generated ids equal the ids of " " + answer.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "engine/runtime.h"
#include "eval/eval_data.h"
#include "kv/sequence_cache.h"

namespace oscar::eval {

struct NiahLengthResult {
  int target_len = 0;
  int n = 0, correct = 0;
  int token_count_mismatches = 0;  // prompts not tokenizing to n_prompt_tokens (a tokenizer bug)
  double accuracy() const { return n > 0 ? static_cast<double>(correct) / n : 0.0; }
};

// The cache of the longest prompt right after its prefill (for bits-per-element).
struct PrefillSnapshot {
  int64_t n_tokens = 0;
  int64_t hist_tokens = 0;  // tokens in the INT2 history region
  kv::CacheBytes bytes;
};

struct NiahResult {
  std::vector<NiahLengthResult> per_length;  // in the order lengths first appear in the cases
  PrefillSnapshot longest_prefill;
  double seconds = 0.0;
};

// Greedy argmax of logits [vocab] (lowest id on ties).
int32_t argmax(const std::vector<float>& logits);

// Runs every case. `on_case(done)` is called after each (progress display); may be empty.
Result<NiahResult> evaluate_niah(engine::Runtime& runtime, const std::vector<NiahCase>& cases,
                                 const std::function<void(int, const NiahResult&)>& on_case = {});

}  // namespace oscar::eval
