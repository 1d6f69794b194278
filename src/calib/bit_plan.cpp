#include "calib/bit_plan.h"

#include <algorithm>
#include <numeric>

namespace oscar::calib {

Result<BitPlanChoice> choose_bit_plan(const std::vector<double>& key_logit_error,
                                      const std::vector<double>& value_energy, int pairs) {
  const size_t n = key_logit_error.size();
  if (value_energy.size() != n || n == 0)
    return invalid_argument("bit plan: %zu key and %zu value statistics", n, value_energy.size());
  if (pairs < 0 || static_cast<size_t>(pairs) > n)
    return invalid_argument("bit plan: %d pairs of planes, expected 0..%zu (KV heads x layers)",
                            pairs, n);
  BitPlanChoice c;
  c.k_bits.assign(n, 2);
  c.v_bits.assign(n, 2);
  std::vector<size_t> by_key(n), by_value(n);
  std::iota(by_key.begin(), by_key.end(), size_t{0});
  std::iota(by_value.begin(), by_value.end(), size_t{0});
  std::stable_sort(by_key.begin(), by_key.end(), [&](size_t a, size_t b) {
    return key_logit_error[a] > key_logit_error[b];
  });
  std::stable_sort(by_value.begin(), by_value.end(), [&](size_t a, size_t b) {
    return value_energy[a] < value_energy[b];
  });
  for (int i = 0; i < pairs; ++i) {
    c.k_bits[by_key[i]] = 3;
    c.v_bits[by_value[i]] = 1;
  }
  return c;
}

}  // namespace oscar::calib
