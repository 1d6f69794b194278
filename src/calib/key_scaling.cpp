#include "calib/key_scaling.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace oscar::calib {

KeyScaling key_scaling(const EigenBasis& q_basis, const std::vector<double>& key_second_moment,
                       const std::vector<double>& key_mean, bool centre, bool scale,
                       double power, double floor) {
  const int d = q_basis.d;
  OSCAR_CHECK(d > 0 && key_second_moment.size() == static_cast<size_t>(d) * d &&
                  key_mean.size() == static_cast<size_t>(d) && floor >= 0,
              "key_scaling: d %d, %zu / %zu values", d, key_second_moment.size(), key_mean.size());
  // κ_j = u_jᵀ C u_j, uncentred (the baseline) and as used (centred or not).
  std::vector<double> kappa0(d), kappa(d), lambda(d);
  for (int j = 0; j < d; ++j) {
    double quad = 0, proj = 0;
    for (int a = 0; a < d; ++a) {
      const double ua = q_basis.eigenvectors[static_cast<size_t>(a) * d + j];
      proj += ua * key_mean[a];
      double row = 0;
      for (int b = 0; b < d; ++b)
        row += key_second_moment[static_cast<size_t>(a) * d + b] *
               q_basis.eigenvectors[static_cast<size_t>(b) * d + j];
      quad += ua * row;
    }
    kappa0[j] = std::max(quad, 0.0);
    kappa[j] = centre ? std::max(quad - proj * proj, 0.0) : kappa0[j];
    lambda[j] = std::max(q_basis.eigenvalues[j], 0.0);
  }
  double lam_mean = 0, kap_mean = 0;
  for (int j = 0; j < d; ++j) {
    lam_mean += lambda[j] / d;
    kap_mean += kappa[j] / d;
  }
  KeyScaling out;
  out.scale.assign(d, 1.0);
  out.mean.assign(d, 0.0);
  if (centre) out.mean = key_mean;
  if (scale && lam_mean > 0 && kap_mean > 0) {
    double log_sum = 0;
    for (int j = 0; j < d; ++j) {
      const double l = std::max(lambda[j], floor * lam_mean);
      const double k = std::max(kappa[j], floor * kap_mean);
      out.scale[j] = std::pow(l / k, power);
      log_sum += std::log(out.scale[j]);
    }
    const double g = std::exp(log_sum / d);
    for (double& w : out.scale) w /= g;
  }
  double num_k = 0, num_q = 0, den_k = 0, den_q = 0;
  for (int j = 0; j < d; ++j) {
    const double w2 = out.scale[j] * out.scale[j];
    num_k += w2 * kappa[j];
    num_q += lambda[j] / w2;
    den_k += kappa0[j];
    den_q += lambda[j];
  }
  out.logit_error = num_k * num_q / (static_cast<double>(d) * d);
  if (den_k > 0 && den_q > 0) out.predicted_error_ratio = (num_k * num_q) / (den_k * den_q);
  return out;
}

}  // namespace oscar::calib
