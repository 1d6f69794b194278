// Streaming second-moment accumulators and their eigendecomposition (OSCAR.md §1, §6): the float64
// sums behind C_Q = (1/N) Σ qᵀq, C_S = (1/N) OᵀO and the weighted form Σ w_t v_tᵀv_t / Σ w_t,
// and the step from a covariance to a rotation R = U · H · P_br (quant/rotation.h).
//
// What lives here: the accumulator (rows in, one d×d double sum out, never any activation kept)
// and the symmetric eigensolver wrapper with a deterministic sign convention. What does not: the
// model observer that feeds the accumulators (calib/calibrator.h) and clip search
// (calib/clip_search.h). Thread-safety: an accumulator is single-writer; distinct accumulators may
// be fed from different threads.
#pragma once

#include <cstdint>
#include <vector>

namespace oscar::calib {

// Σ_r w_r x_rᵀ x_r over row vectors x_r ∈ R^d, in float64, and Σ_r w_r (= N when unweighted).
class CovarianceAccumulator {
 public:
  explicit CovarianceAccumulator(int d = 0);

  int dim() const { return d_; }
  double weight_sum() const { return weight_sum_; }
  int64_t n_rows() const { return n_rows_; }

  // Adds n rows. Row r starts at x + r * row_stride (floats) and has d elements.
  // weights: [n] non-negative, or nullptr for weight 1. Precondition: row_stride >= d.
  void add_rows(const float* x, int64_t n, int64_t row_stride, const float* weights = nullptr);
  // Adds another accumulator's sums (same d).
  void merge(const CovarianceAccumulator& other);

  // [d, d] row-major Σ w x xᵀ / Σ w (the normalised covariance; zeros when nothing was added).
  std::vector<double> covariance() const;
  // [d, d] row-major raw sum Σ w x xᵀ.
  std::vector<double> sum() const;
  // [d] Σ w x / Σ w (zeros when nothing was added).
  std::vector<double> mean() const;

 private:
  int d_;
  std::vector<double> sum_;  // [d, d] row-major; only the lower triangle is maintained
  std::vector<double> first_;  // [d] Σ w x
  double weight_sum_ = 0.0;
  int64_t n_rows_ = 0;
};

// Eigen-decomposition of a symmetric matrix, sorted by descending eigenvalue.
struct EigenBasis {
  int d = 0;
  std::vector<double> eigenvalues;   // [d], descending
  std::vector<double> eigenvectors;  // [d, d] row-major, eigenvector j in COLUMN j (U of §1)
};

// C: [d, d] row-major symmetric (float64). Uses Eigen's SelfAdjointEigenSolver in double. Each
// eigenvector's sign is fixed so that its entry of largest magnitude (first on ties) is positive,
// and equal eigenvalues keep the solver's order, so the result is a deterministic function of C.
EigenBasis eigen_decompose(const std::vector<double>& C, int d);

// R = U · H · P_br (OSCAR.md §1) as float [d, d] row-major; d a power of two.
std::vector<float> rotation_from_basis(const EigenBasis& basis);

}  // namespace oscar::calib
