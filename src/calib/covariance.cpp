#include "calib/covariance.h"

#include <Eigen/Dense>
#include <cmath>

#include "core/check.h"
#include "quant/rotation.h"

namespace oscar::calib {

namespace {
using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Rows per block converted to double before a rank update (bounds the scratch at 256 KiB·d/128).
constexpr int64_t kBlockRows = 256;
}  // namespace

CovarianceAccumulator::CovarianceAccumulator(int d)
    : d_(d), sum_(static_cast<size_t>(d) * static_cast<size_t>(d), 0.0),
      first_(static_cast<size_t>(d), 0.0) {
  OSCAR_CHECK(d >= 0, "CovarianceAccumulator: d %d", d);
}

void CovarianceAccumulator::add_rows(const float* x, int64_t n, int64_t row_stride,
                                     const float* weights) {
  OSCAR_CHECK(n >= 0 && row_stride >= d_, "add_rows: n %lld, row_stride %lld, d %d",
              static_cast<long long>(n), static_cast<long long>(row_stride), d_);
  if (n == 0) return;
  OSCAR_CHECK(x != nullptr);
  Eigen::Map<MatD> S(sum_.data(), d_, d_);
  MatD block(std::min(n, kBlockRows), d_);
  for (int64_t r0 = 0; r0 < n; r0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, n - r0);
    if (block.rows() != rows) block.resize(rows, d_);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = x + (r0 + r) * row_stride;
      double scale = 1.0;
      if (weights != nullptr) {
        const double w = weights[r0 + r];
        OSCAR_CHECK(w >= 0.0 && std::isfinite(w), "add_rows: weight %g of row %lld", w,
                    static_cast<long long>(r0 + r));
        scale = std::sqrt(w);
        weight_sum_ += w;
      } else {
        weight_sum_ += 1.0;
      }
      for (int j = 0; j < d_; ++j) {
        block(r, j) = scale * static_cast<double>(src[j]);
        first_[j] += scale * block(r, j);
      }
    }
    // Lower triangle of S += blockᵀ block (a symmetric rank-k update, half the work of a GEMM).
    S.selfadjointView<Eigen::Lower>().rankUpdate(block.transpose());
  }
  n_rows_ += n;
}

void CovarianceAccumulator::merge(const CovarianceAccumulator& other) {
  OSCAR_CHECK(other.d_ == d_, "merge: d %d != %d", other.d_, d_);
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += other.sum_[i];
  for (size_t i = 0; i < first_.size(); ++i) first_[i] += other.first_[i];
  weight_sum_ += other.weight_sum_;
  n_rows_ += other.n_rows_;
}

std::vector<double> CovarianceAccumulator::sum() const {
  std::vector<double> full(sum_.size());
  for (int i = 0; i < d_; ++i)
    for (int j = 0; j <= i; ++j) {
      const double v = sum_[static_cast<size_t>(i) * d_ + j];
      full[static_cast<size_t>(i) * d_ + j] = v;
      full[static_cast<size_t>(j) * d_ + i] = v;
    }
  return full;
}

std::vector<double> CovarianceAccumulator::covariance() const {
  std::vector<double> c = sum();
  if (weight_sum_ > 0)
    for (double& v : c) v /= weight_sum_;
  return c;
}

std::vector<double> CovarianceAccumulator::mean() const {
  std::vector<double> m = first_;
  if (weight_sum_ > 0)
    for (double& v : m) v /= weight_sum_;
  return m;
}

EigenBasis eigen_decompose(const std::vector<double>& C, int d) {
  OSCAR_CHECK(d > 0 && C.size() == static_cast<size_t>(d) * static_cast<size_t>(d),
              "eigen_decompose: %zu values for d %d", C.size(), d);
  Eigen::Map<const MatD> M(C.data(), d, d);
  const Eigen::MatrixXd A = M;  // column-major copy for the solver
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(A, Eigen::ComputeEigenvectors);
  OSCAR_CHECK(solver.info() == Eigen::Success, "eigen_decompose: solver failed (d %d)", d);
  EigenBasis out;
  out.d = d;
  out.eigenvalues.resize(d);
  out.eigenvectors.resize(static_cast<size_t>(d) * d);
  // Eigen returns ascending eigenvalues; column j of U is the (d-1-j)-th solver column.
  for (int j = 0; j < d; ++j) {
    const int src = d - 1 - j;
    out.eigenvalues[j] = solver.eigenvalues()(src);
    int arg = 0;
    for (int i = 1; i < d; ++i)
      if (std::abs(solver.eigenvectors()(i, src)) > std::abs(solver.eigenvectors()(arg, src)))
        arg = i;
    const double sign = solver.eigenvectors()(arg, src) < 0 ? -1.0 : 1.0;
    for (int i = 0; i < d; ++i)
      out.eigenvectors[static_cast<size_t>(i) * d + j] = sign * solver.eigenvectors()(i, src);
  }
  return out;
}

std::vector<float> rotation_from_basis(const EigenBasis& basis) {
  return quant::compose_rotation(basis.eigenvectors.data(), basis.d);
}

}  // namespace oscar::calib
