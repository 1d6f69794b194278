#include "engine/prefill_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace oscar::engine {

namespace {
constexpr double kSmoothing = 0.2;  // weight of the newest step in the averages
double smooth(double avg, double x) { return avg == 0 ? x : avg + kSmoothing * (x - avg); }
}  // namespace

PrefillBudget::PrefillBudget(const format::ModelConfig& c, double itl_factor)
    : w_token_(2.0 * static_cast<double>(c.n_active_params())),
      w_pair_(4.0 * c.head_dim * c.n_heads_q * c.n_kv_layers),
      factor_(itl_factor) {}

double PrefillBudget::cost(int64_t n, int64_t depth) const {
  const double nd = static_cast<double>(n);
  return nd * w_token_ + nd * (static_cast<double>(depth) + nd / 2) * w_pair_;
}

int64_t PrefillBudget::fit(double flops, int64_t depth, int64_t want, int64_t floor) const {
  if (want <= 0) return 0;
  const int64_t least = std::min(want, std::max<int64_t>(floor, 1));
  if (!std::isfinite(flops)) return want;
  if (flops <= cost(least, depth)) return least;
  // Largest n with (w_pair / 2) n² + (w_token + depth · w_pair) n <= flops.
  const double a = w_pair_ / 2, b = w_token_ + static_cast<double>(depth) * w_pair_;
  const double n = a > 0 ? (-b + std::sqrt(b * b + 4 * a * flops)) / (2 * a) : flops / b;
  return std::clamp<int64_t>(static_cast<int64_t>(n), least, want);
}

double PrefillBudget::budget(bool decoding) const {
  if (!enabled() || !decoding || t_decode_ <= 0 || rate_ <= 0)
    return std::numeric_limits<double>::infinity();
  return (factor_ - 1) * t_decode_ * rate_;
}

void PrefillBudget::record(int n_decode, double prefill_flops, double seconds) {
  if (!enabled() || seconds <= 0) return;
  if (prefill_flops <= 0) {
    if (n_decode > 0) t_decode_ = smooth(t_decode_, seconds);
    return;
  }
  // The prefill's share of a mixed step: what the decode rows alone would not have taken.
  const double decode = n_decode > 0 ? t_decode_ : 0;
  rate_ = smooth(rate_, prefill_flops / std::max(seconds - decode, 0.25 * seconds));
}

}  // namespace oscar::engine
