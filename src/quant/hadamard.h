// Normalised Sylvester Hadamard matrices, the fast Walsh–Hadamard transform and the bit-reversal
// permutation of OSCAR.md §1 (R = U · H · P_br, applied to row vectors as x' = x R).
//
// Definitions, for d = 2^k:
//   H[i][j] = (-1)^popcount(i & j) / sqrt(d)   (Sylvester order; H is symmetric and orthogonal,
//                                               so x H = H x for a vector x)
//   bitrev(j): the k-bit reversal of j (an involution); for d = 128: 1 -> 64, 2 -> 32, 3 -> 96.
//   P_br[j][bitrev(j)] = 1, zero elsewhere. Then (A · P_br)[:, bitrev(j)] = A[:, j]: right
//   multiplication moves column j (the j-th direction) to column bitrev(j). Because bitrev is an
//   involution, P_br is symmetric and P_br = P_brᵀ = P_br⁻¹.
// All matrices are row-major. Eigenvector bases, composition with U and rotating rows live in
// quant/rotation.h.
#pragma once

#include <vector>

namespace oscar::quant {

// True for d = 1, 2, 4, ...
constexpr bool is_power_of_two(int d) { return d > 0 && (d & (d - 1)) == 0; }

// k-bit reversal of j where d = 2^k; precondition: 0 <= j < d, d a power of two (checked).
int bitrev(int j, int d);

// [d, d] row-major normalised Sylvester Hadamard matrix, in double.
std::vector<double> hadamard_matrix(int d);

// In-place normalised fast Walsh–Hadamard transform of x[0..d): x <- x H (= H x), O(d log d).
void fwht_inplace(float* x, int d);
void fwht_inplace(double* x, int d);

// [d, d] row-major permutation matrix P_br (see above), in double.
std::vector<double> bitrev_permutation_matrix(int d);

// [d, d] row-major H · P_br as float: column bitrev(j) of the result is column j of H. This is
// the rotation of the `int2-hadamard` baseline (QuaRot-style) and OSCAR's R with U = I.
std::vector<float> hadamard_bitrev_rotation(int d);

}  // namespace oscar::quant
