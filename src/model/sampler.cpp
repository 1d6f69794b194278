#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace oscar::model {

Status validate_sampling(const SamplingConfig& c) {
  if (!(c.temperature >= 0.f) || !std::isfinite(c.temperature))
    return invalid_argument("temperature %g must be a finite number >= 0", c.temperature);
  if (c.top_k < 0) return invalid_argument("top_k %d must be >= 0", c.top_k);
  if (!(c.top_p > 0.f && c.top_p <= 1.f))
    return invalid_argument("top_p %g must be in (0, 1]", c.top_p);
  return Status();
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (config_.temperature == 0.f) return argmax(logits);
  const int32_t n = static_cast<int32_t>(logits.size());
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  int32_t keep = n;
  if (config_.top_k > 0 && config_.top_k < n) keep = config_.top_k;
  // Sort the candidates by logit (descending, ties by id) so top-k and top-p are prefixes.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  ids.resize(keep);
  const float inv_t = 1.f / config_.temperature;
  const float top = logits[ids[0]];
  std::vector<double> p(keep);
  double sum = 0;
  for (int32_t i = 0; i < keep; ++i) {
    p[i] = std::exp(static_cast<double>(logits[ids[i]] - top) * inv_t);
    sum += p[i];
  }
  if (config_.top_p < 1.f) {
    double cum = 0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cum += p[i] / sum;
      if (cum >= config_.top_p) {
        cut = i + 1;
        break;
      }
    }
    p.resize(cut);
    sum = std::accumulate(p.begin(), p.end(), 0.0);
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_);
  for (size_t i = 0; i < p.size(); ++i) {
    r -= p[i];
    if (r <= 0) return ids[i];
  }
  return ids[p.size() - 1];
}

}  // namespace oscar::model
