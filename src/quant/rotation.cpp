// R = U·H·P_br and row rotations (see rotation.h).
#include "quant/rotation.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "quant/hadamard.h"

namespace oscar::quant {

std::vector<float> compose_rotation(const double* U, int d) {
  OSCAR_CHECK(U != nullptr && is_power_of_two(d), "compose_rotation: d %d", d);
  std::vector<double> row(static_cast<size_t>(d));
  std::vector<float> R(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i) {
    // Row i of U·H = (row i of U)·H = FWHT of that row (H is symmetric).
    std::copy(U + static_cast<size_t>(i) * d, U + static_cast<size_t>(i + 1) * d, row.begin());
    fwht_inplace(row.data(), d);
    // · P_br: column j moves to column bitrev(j).
    for (int j = 0; j < d; ++j) {
      R[static_cast<size_t>(i) * d + bitrev(j, d)] = static_cast<float>(row[j]);
    }
  }
  return R;
}

std::vector<float> scaled_rotation(const float* R, const float* w, int d, bool inverse) {
  OSCAR_CHECK(R != nullptr && w != nullptr && is_power_of_two(d), "scaled_rotation: d %d", d);
  for (int j = 0; j < d; ++j)
    OSCAR_CHECK(w[j] > 0 && std::isfinite(w[j]), "scaled_rotation: w[%d] = %g", j,
                static_cast<double>(w[j]));
  // B = H·P_br: column bitrev(j) of B is column j of H.
  const std::vector<double> H = hadamard_matrix(d);
  std::vector<double> B(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) B[static_cast<size_t>(i) * d + bitrev(j, d)] = H[static_cast<size_t>(i) * d + j];
  // U = R·Bᵀ (B orthogonal); then U·diag(s)·B.
  std::vector<double> U(static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int k = 0; k < d; ++k) {
      const double r = R[static_cast<size_t>(i) * d + k];
      for (int j = 0; j < d; ++j) U[static_cast<size_t>(i) * d + j] += r * B[static_cast<size_t>(j) * d + k];
    }
  std::vector<float> out(static_cast<size_t>(d) * d);
  std::vector<double> row(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int j = 0; j < d; ++j) {
      const double s = inverse ? 1.0 / w[j] : static_cast<double>(w[j]);
      const double u = U[static_cast<size_t>(i) * d + j] * s;
      for (int c = 0; c < d; ++c) row[c] += u * B[static_cast<size_t>(j) * d + c];
    }
    for (int c = 0; c < d; ++c) out[static_cast<size_t>(i) * d + c] = static_cast<float>(row[c]);
  }
  return out;
}

void rotate_rows(const float* x, int n, const float* R, int d, float* out) {
  OSCAR_CHECK(x != nullptr && R != nullptr && out != nullptr && n >= 0 && d > 0, "n %d, d %d", n, d);
  OSCAR_CHECK(x != out, "rotate_rows: out must not alias x");
  std::vector<double> acc(static_cast<size_t>(d));
  for (int r = 0; r < n; ++r) {
    const float* xr = x + static_cast<size_t>(r) * d;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int k = 0; k < d; ++k) {
      const double xk = xr[k];
      const float* Rk = R + static_cast<size_t>(k) * d;
      for (int c = 0; c < d; ++c) acc[c] += xk * Rk[c];
    }
    float* o = out + static_cast<size_t>(r) * d;
    for (int c = 0; c < d; ++c) o[c] = static_cast<float>(acc[c]);
  }
}

void unrotate_rows(const float* x_rot, int n, const float* R, int d, float* out) {
  OSCAR_CHECK(x_rot != nullptr && R != nullptr && out != nullptr && n >= 0 && d > 0, "n %d, d %d", n, d);
  OSCAR_CHECK(x_rot != out, "unrotate_rows: out must not alias x_rot");
  for (int r = 0; r < n; ++r) {
    const float* xr = x_rot + static_cast<size_t>(r) * d;
    float* o = out + static_cast<size_t>(r) * d;
    for (int k = 0; k < d; ++k) {
      const float* Rk = R + static_cast<size_t>(k) * d;
      double acc = 0.0;
      for (int c = 0; c < d; ++c) acc += static_cast<double>(xr[c]) * Rk[c];
      o[k] = static_cast<float>(acc);
    }
  }
}

double orthogonality_error(const float* R, int d) {
  OSCAR_CHECK(R != nullptr && d > 0, "d %d", d);
  double worst = 0.0;
  for (int i = 0; i < d; ++i) {
    for (int j = i; j < d; ++j) {
      double dot = 0.0;
      for (int k = 0; k < d; ++k) {
        dot += static_cast<double>(R[static_cast<size_t>(k) * d + i]) *
               R[static_cast<size_t>(k) * d + j];
      }
      worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

}  // namespace oscar::quant
