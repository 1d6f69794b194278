// Query-aware key scaling (OSCAR.md §1 "Key scaling", beyond): the diagonal W and key mean μ_K
// that turn the key rotation R = U·H·P_br into
//   keys    k' = (k − μ_K) · U · W   · H · P_br
//   queries q' =  q        · U · W⁻¹ · H · P_br
// so that q'·k'ᵀ = q·kᵀ − q·μ_Kᵀ: exact logits up to a per-query constant, which softmax ignores.
//
// Why: after H the INT2 noise is white, of variance proportional to the per-element energy of
// what is quantized. In the eigenbasis U of C_Q (query eigenvalues λ_j), with key second moments
// κ_j = u_jᵀ C_K u_j along the same directions, the expected logit error is proportional to
//   (Σ_j w_j² κ_j) · (Σ_j λ_j / w_j²),
// which W = I leaves at (Σ κ_j)(Σ λ_j) and w_j² ∝ sqrt(λ_j / κ_j) minimises to (Σ_j sqrt(λ_j κ_j))²
// (Cauchy–Schwarz): directions that queries read get finer steps, directions they ignore coarser
// ones, at the same bits. Subtracting μ_K removes the part of κ that no query can distinguish.
#pragma once

#include <vector>

#include "calib/covariance.h"

namespace oscar::calib {

struct KeyScaling {
  std::vector<double> scale;  // [d] w_j for column j of U (descending λ); geometric mean 1
  std::vector<double> mean;   // [d] μ_K in the key's own basis; zeros when not centred
  // Expected logit error (model above) with this scaling and centring, relative to plain
  // R = U·H·P_br on uncentred keys (1 = no gain).
  double predicted_error_ratio = 1.0;
  // The same model's absolute expected squared logit error per unit of quantization noise:
  // (1/d²)·(Σ_j w_j² κ_j)·(Σ_j λ_j / w_j²). Comparable across heads of one model (the noise per
  // unit energy is the quantizer's, the same everywhere), so it ranks which heads' keys gain most
  // from finer steps (calib/bit_plan.h).
  double logit_error = 0.0;
};

// q_basis: eigenbasis of C_Q. key_second_moment: [d, d] (1/N) Σ kᵀk; key_mean: [d] (1/N) Σ k.
// centre: subtract μ_K; scale: compute W (else W = I). floor: λ_j and κ_j are clamped below at
// floor × their mean, so directions seen too rarely to estimate get bounded weights.
// power: w_j = (λ_j/κ_j)^power; 1/4 is the optimum of the model above, 0 means W = I.
inline constexpr double kKeyScalePower = 0.25;
KeyScaling key_scaling(const EigenBasis& q_basis, const std::vector<double>& key_second_moment,
                       const std::vector<double>& key_mean, bool centre, bool scale,
                       double power = kKeyScalePower, double floor = 1e-3);

}  // namespace oscar::calib
