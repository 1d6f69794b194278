// Token sampling from logits: greedy when temperature is 0, otherwise temperature, top-k and
// top-p (nucleus) filtering, then a draw from a seeded generator owned by the request.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "core/status.h"

namespace oscar::model {

struct SamplingConfig {
  float temperature = 0.f;  // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = 0;        // 0 = no limit
  float top_p = 1.f;        // 1 = no limit
  uint64_t seed = 0;
};

Status validate_sampling(const SamplingConfig& config);

class Sampler {
 public:
  explicit Sampler(const SamplingConfig& config) : config_(config), rng_(config.seed) {}
  // logits: [vocab]
  int32_t sample(std::span<const float> logits);

 private:
  SamplingConfig config_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace oscar::model
