#include "eval/niah.h"

#include <algorithm>
#include <chrono>

#include "core/log.h"

namespace oscar::eval {

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Result<NiahResult> evaluate_niah(engine::Runtime& runtime, const std::vector<NiahCase>& cases,
                                 const std::function<void(int, const NiahResult&)>& on_case) {
  const auto t0 = std::chrono::steady_clock::now();
  const tok::Tokenizer& tok = runtime.tokenizer();
  NiahResult r;
  std::vector<float> logits;
  model::ForwardOptions prefill;
  prefill.attend_mode = kv::AttendMode::kPrefill;
  for (size_t i = 0; i < cases.size(); ++i) {
    const NiahCase& c = cases[i];
    auto it = std::find_if(r.per_length.begin(), r.per_length.end(),
                           [&](const NiahLengthResult& x) { return x.target_len == c.target_len; });
    if (it == r.per_length.end()) {
      r.per_length.push_back({});
      it = r.per_length.end() - 1;
      it->target_len = c.target_len;
    }
    const std::vector<int32_t> ids = tok.encode(c.prompt);
    if (static_cast<int>(ids.size()) != c.n_prompt_tokens) {
      ++it->token_count_mismatches;
      OSCAR_LOG_WARN("niah: case=%s tokens=%zu expected=%d", c.id.c_str(), ids.size(),
                     c.n_prompt_tokens);
    }
    const std::vector<int32_t> expected = tok.encode(" " + c.answer);
    auto cache = runtime.new_cache();
    OSCAR_RETURN_IF_ERROR(runtime.model()
                              .forward_one(ids, *cache, &logits, /*all_logits=*/false, prefill)
                              .with_context("niah " + c.id));
    if (static_cast<int64_t>(ids.size()) >= r.longest_prefill.n_tokens) {
      r.longest_prefill.n_tokens = cache->n_tokens();
      r.longest_prefill.hist_tokens =
          std::max<int64_t>(0, cache->hist_end() - cache->spec().regions.n_sink);
      if (!cache->spec().quantized()) r.longest_prefill.hist_tokens = 0;
      r.longest_prefill.bytes = cache->bytes();
    }
    bool correct = true;
    for (size_t k = 0; k < expected.size(); ++k) {
      const int32_t next = argmax(logits);
      if (next != expected[k]) {
        correct = false;
        break;  // the rest cannot match any more
      }
      if (k + 1 < expected.size())
        OSCAR_RETURN_IF_ERROR(runtime.model().forward_one(std::span<const int32_t>(&next, 1),
                                                          *cache, &logits));
    }
    ++it->n;
    if (correct) ++it->correct;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_case) on_case(static_cast<int>(i + 1), r);
  }
  return r;
}

}  // namespace oscar::eval
