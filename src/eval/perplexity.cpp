#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"

namespace oscar::eval {

double PplResult::ppl() const {
  return n_predictions > 0 ? std::exp(nll_sum / static_cast<double>(n_predictions)) : 0.0;
}

double PplResult::ppl_tail() const {
  return n_tail > 0 ? std::exp(nll_tail_sum / static_cast<double>(n_tail)) : 0.0;
}

int64_t available_windows(int64_t n_tokens, int window_tokens) {
  if (window_tokens <= 0 || n_tokens < window_tokens + 1) return 0;
  return (n_tokens - 1) / window_tokens;
}

double token_nll(std::span<const float> logits, int32_t target) {
  OSCAR_CHECK(target >= 0 && static_cast<size_t>(target) < logits.size(),
              "target id %d outside the %zu logits", target, logits.size());
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
  return std::log(sum) + static_cast<double>(mx) - static_cast<double>(logits[target]);
}

Result<PplResult> evaluate_perplexity(engine::Runtime& runtime, std::span<const int32_t> tokens,
                                      const PplOptions& options,
                                      const std::function<void(int, const PplResult&)>& on_window) {
  const int W = options.window_tokens;
  if (W <= 0) return invalid_argument("perplexity: window of %d tokens", W);
  if (options.n_windows < 0) return invalid_argument("perplexity: %d windows", options.n_windows);
  const int64_t avail = available_windows(static_cast<int64_t>(tokens.size()), W);
  if (options.first_window < 0)
    return invalid_argument("perplexity: first window %d < 0", options.first_window);
  if (int64_t{options.first_window} + options.n_windows > avail)
    return invalid_argument(
        "perplexity: windows %d..%d of %d+1 tokens asked for, %zu tokens hold %lld",
        options.first_window, options.first_window + options.n_windows - 1, W, tokens.size(),
        static_cast<long long>(avail));
  const int vocab = runtime.model().config().vocab_size;
  const auto t0 = std::chrono::steady_clock::now();
  PplResult r;
  std::vector<float> logits;
  model::ForwardOptions fwd;
  fwd.attend_mode = options.attend_mode;
  for (int w = 0; w < options.n_windows; ++w) {
    const std::span<const int32_t> win =
        tokens.subspan(static_cast<size_t>(options.first_window + w) * W, W + 1);
    auto cache = runtime.new_cache();
    OSCAR_RETURN_IF_ERROR(
        runtime.model().forward_one(win.first(W), *cache, &logits, /*all_logits=*/true, fwd)
            .with_context(str_format("perplexity window %d", options.first_window + w)));
    OSCAR_CHECK(logits.size() == static_cast<size_t>(W) * vocab);
    double window_sum = 0.0;
    for (int i = 0; i < W; ++i) {
      const double nll = token_nll(
          std::span<const float>(logits.data() + static_cast<size_t>(i) * vocab, vocab), win[i + 1]);
      window_sum += nll;
      if (i >= options.tail_from) {
        r.nll_tail_sum += nll;
        ++r.n_tail;
      }
    }
    r.nll_sum += window_sum;
    r.n_predictions += W;
    r.window_nll.push_back(window_sum / W);
    r.n_windows = w + 1;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_window) on_window(w + 1, r);
  }
  return r;
}

}  // namespace oscar::eval
