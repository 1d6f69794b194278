// Summary of a benchmark's repeated measurements (bench_model, bench_step): the median, the
// extremes and their ratio, which the tables print beside each median so that a noisy row shows
// as one (docs/results/bench_method.md says why a single run is not a measurement here).
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace oscar::bench {

struct Spread {
  double median = 0, min = 0, max = 0;
  double ratio() const { return min > 0 ? max / min : 0; }  // max / min; 1.00 = no spread
};

// values: one figure per repetition, at least one.
inline Spread spread(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  Spread s;
  if (n == 0) return s;
  s.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  s.min = values.front();
  s.max = values.back();
  return s;
}

// "min-max" with the given printf precision, for a table cell.
inline std::string min_max(const Spread& s, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f-%.*f", decimals, s.min, decimals, s.max);
  return buf;
}

}  // namespace oscar::bench
