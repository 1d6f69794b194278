// Evaluation inputs of the embedded model (models/tiny-qwen3/README.md): the held-out text for
// perplexity and the NIAH prompt file. Reading and validating only; scoring lives in
// perplexity.h and niah.h.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::eval {

// The whole file as bytes. NotFound / InvalidArgument naming the path on failure.
Result<std::string> read_text_file(const std::string& path);

// One line of niah_dev.jsonl (fields the harness uses; the rest are informational).
struct NiahCase {
  std::string id;
  int target_len = 0;       // prompt + answer tokens (1024, 2048, 4096, 8192)
  int n_prompt_tokens = 0;  // what the prompt must tokenize to (target_len - 8)
  std::string prompt;       // haystack, needles, and the query line "# the secret {key} is"
  std::string answer;       // the 7 digits; the expected continuation is " " + answer
  std::string key;
};

// Parses a JSON-lines NIAH file; every line must carry the fields above with the right types.
// Errors name the file and the 1-based line.
Result<std::vector<NiahCase>> load_niah(const std::string& path);

// `per_length` cases of each requested target length, in file order after skipping the first
// `skip` of that length (for shards), grouped by length in the order of `lengths`.
// InvalidArgument when a length has fewer cases than asked for.
Result<std::vector<NiahCase>> select_niah(const std::vector<NiahCase>& cases,
                                          std::span<const int> lengths, int per_length,
                                          int skip = 0);

}  // namespace oscar::eval
