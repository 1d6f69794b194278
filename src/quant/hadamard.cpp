// Sylvester Hadamard, FWHT and bit-reversal (see hadamard.h).
#include "quant/hadamard.h"

#include <cmath>

#include "core/check.h"

namespace oscar::quant {
namespace {

template <typename T>
void fwht_impl(T* x, int d) {
  OSCAR_CHECK(x != nullptr && is_power_of_two(d), "fwht: d %d must be a power of two", d);
  for (int h = 1; h < d; h *= 2) {
    for (int i = 0; i < d; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const T a = x[j];
        const T b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int i = 0; i < d; ++i) x[i] *= norm;
}

}  // namespace

int bitrev(int j, int d) {
  OSCAR_CHECK(is_power_of_two(d) && j >= 0 && j < d, "bitrev(%d, %d)", j, d);
  int r = 0;
  for (int bit = 1; bit < d; bit <<= 1) {
    r = (r << 1) | ((j & bit) != 0 ? 1 : 0);
  }
  return r;
}

std::vector<double> hadamard_matrix(int d) {
  OSCAR_CHECK(is_power_of_two(d), "hadamard: d %d must be a power of two", d);
  const double norm = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> h(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      h[static_cast<size_t>(i) * d + j] = (__builtin_popcount(static_cast<unsigned>(i & j)) & 1)
                                              ? -norm
                                              : norm;
    }
  }
  return h;
}

void fwht_inplace(float* x, int d) { fwht_impl(x, d); }
void fwht_inplace(double* x, int d) { fwht_impl(x, d); }

std::vector<double> bitrev_permutation_matrix(int d) {
  std::vector<double> p(static_cast<size_t>(d) * d, 0.0);
  for (int j = 0; j < d; ++j) p[static_cast<size_t>(j) * d + bitrev(j, d)] = 1.0;
  return p;
}

std::vector<float> hadamard_bitrev_rotation(int d) {
  const std::vector<double> h = hadamard_matrix(d);
  std::vector<float> r(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      r[static_cast<size_t>(i) * d + bitrev(j, d)] = static_cast<float>(h[static_cast<size_t>(i) * d + j]);
    }
  }
  return r;
}

}  // namespace oscar::quant
