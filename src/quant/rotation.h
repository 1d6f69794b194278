// OSCAR rotations (OSCAR.md §1, §3): composing R = U · H · P_br from an eigenvector basis, and
// applying R to rows (x' = x R) and undoing it (x = x' Rᵀ). Computing U (covariances,
// eigendecomposition) belongs to calib/; reading and writing rotation files to
// quant/rotation_file.h. All matrices are row-major [d, d]; d is head_dim, a power of two.
#pragma once

#include <vector>

namespace oscar::quant {

// R = U · H · P_br computed in double, returned as float [d, d] row-major.
// U: [d, d] row-major, eigenvectors as COLUMNS, sorted by descending eigenvalue (column 0 is the
// most important direction). Column j of U·H ends up at column bitrev(j) of R (hadamard.h).
std::vector<float> compose_rotation(const double* U, int d);

// The key and query transforms of the query-aware key scaling (OSCAR.md §1 "Key scaling"):
// R = U·H·P_br and a positive w [d] (one per column of U) give
//   key_transform   = U · diag(w)   · H · P_br = R · (H·P_br)ᵀ · diag(w)   · (H·P_br)
//   query_transform = U · diag(1/w) · H · P_br
// so that (q·query_transform)·(k·key_transform)ᵀ = q·kᵀ. Computed in double, returned as float
// [d, d]. inverse = false gives the key transform, true the query transform.
std::vector<float> scaled_rotation(const float* R, const float* w, int d, bool inverse);

// x' = x R for each of n rows. x: [n, d]; R: [d, d]; out: [n, d] (must not alias x).
// Accumulates in double, so the result is the exact product rounded once to float.
void rotate_rows(const float* x, int n, const float* R, int d, float* out);

// x = x' Rᵀ for each of n rows (the inverse of rotate_rows when R is orthogonal).
// x_rot: [n, d]; R: [d, d]; out: [n, d] (must not alias x_rot). Accumulates in double.
void unrotate_rows(const float* x_rot, int n, const float* R, int d, float* out);

// max_ij |(RᵀR − I)_ij| in double. R: [d, d].
double orthogonality_error(const float* R, int d);

}  // namespace oscar::quant
