// CUDA linear (kernels/linear.h: linear_cuda; forced paths in kernels/cuda/linear_cuda.h) against
// the float64 CPU reference linear_ref, on fresh random inputs per case: n = 1..40 (odd ones
// included, so the streaming kernel's passes of 8 end ragged), out not a multiple of the
// kernel's 4 rows per block, in a multiple of 8 (the kernel's precondition; other values must
// be refused), both weight dtypes, with and without bias; every case runs the automatic choice,
// the forced streaming kernel, the forced GEMM and the forced batch-invariant GEMM. y is 0xFF
// (NaN) before each call, so an unwritten output shows up.
//
// Tolerance per output element, with M = Σ_c |x_c w_c| (+ |bias|):
//   streaming kernel (float x, float FMA accumulation in 4·8 partial sums, then a tree):
//     |err| <= in · u · M with u = 2^-24 (the loose γ_in bound; test_linear.cpp's, doubled):
//     tol_stream = 2 · in · u · M
//   GEMM, BF16 weights: x rounded to BF16 (8 significant bits, unit roundoff 2^-8) moves each
//     product by <= 2^-8 |x_c w_c|, products exact in FP32, FP32 accumulation as above:
//     tol_gemm = 2^-8 · M + 2 · in · u · M   (2^-9 here first; the H200 run of 2026-12-01
//     measured 1.1 · 2^-9 · M at in = 8, within the right bound)
//   batch-invariant GEMM (BF16 weights): x rounded to BF16 and FP32 tensor-core accumulation,
//     as the GEMM: tol_gemm. With F32 weights it is the streaming kernel: tol_stream.
//   GEMM, F32 weights (CUBLAS_COMPUTE_32F, no TF32): tol_stream. A TF32 GEMM (10-bit mantissa)
//     would miss it by ~2^-11 · M / (2 in u) ≈ 100x for in = 64.
// Plus, per case: ||err|| / ||M|| <= 2^-8 (GEMM with BF16 x; relative to y it is unbounded
// where a sum cancels, as with in = 8), or ||err|| / ||y|| <= 1e-5 (float x).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "cuda_test_util.h"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/linear.h"

namespace oscar::kernels {
namespace {

const char* path_name(LinearCudaPath p) {
  return p == LinearCudaPath::kAuto     ? "auto"
         : p == LinearCudaPath::kStream ? "stream"
         : p == LinearCudaPath::kGemm   ? "gemm"
                                        : "invariant";
}

// y_off: y starts y_off floats into its buffer (y needs no alignment; the GEMM's heuristic is
// told the actual one).
void run(DType dtype, int64_t n, int64_t in, int64_t out, bool bias, uint32_t seed,
         int64_t y_off = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n * in), wf(out * in), b(out), y_ref(n * out);
  for (float& v : x) v = normal(rng) + 0.3f;  // a bias, so that sums do not cancel to ~0 only
  for (float& v : wf) v = dtype == DType::kBF16 ? round_to_bf16(normal(rng)) : normal(rng);
  for (float& v : b) v = normal(rng);
  std::vector<bf16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  LinearParams p;
  p.x = x.data();
  p.n = n;
  p.w = WeightView{dtype == DType::kBF16 ? static_cast<const void*>(wb.data()) : wf.data(), dtype,
                   out, in};
  p.bias = bias ? b.data() : nullptr;
  p.y = y_ref.data();
  ASSERT_TRUE(linear_ref(p).ok());

  std::vector<double> mag(n * out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < out; ++r) {
      double m = bias ? std::fabs(b[r]) : 0.0;
      for (int64_t c = 0; c < in; ++c) m += std::fabs(double(x[i * in + c]) * wf[r * in + c]);
      mag[i * out + r] = m;
    }

  const size_t wbytes = static_cast<size_t>(out) * in * dtype_bytes(dtype);
  DevBuf dx(x.size() * 4), dw(wbytes), db(b.size() * 4),
      dy((static_cast<size_t>(n) * out + y_off) * 4);
  ASSERT_TRUE(dx.p && dw.p && db.p && dy.p);
  CUDA_OK(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw.p, dtype == DType::kBF16 ? static_cast<const void*>(wb.data()) : wf.data(),
                     wbytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db.p, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  LinearParams dp = p;
  dp.x = static_cast<const float*>(dx.p);
  dp.w.data = dw.p;
  dp.bias = bias ? static_cast<const float*>(db.p) : nullptr;
  float* y_dev = static_cast<float*>(dy.p) + y_off;
  dp.y = y_dev;

  std::vector<float> got(n * out);
  for (LinearCudaPath path : {LinearCudaPath::kAuto, LinearCudaPath::kStream,
                              LinearCudaPath::kGemm, LinearCudaPath::kInvariant}) {
    const bool gemm = path == LinearCudaPath::kGemm || path == LinearCudaPath::kInvariant ||
                      (path == LinearCudaPath::kAuto && !linear_cuda_streams(n, out, in));
    const bool bf16_x = gemm && dtype == DType::kBF16;
    CUDA_OK(cudaMemset(y_dev, 0xFF, got.size() * 4));
    const Status st = linear_cuda_ex(dp, path, nullptr);
    ASSERT_TRUE(st.ok()) << path_name(path) << ": " << st.to_string();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got.data(), y_dev, got.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0, max_ratio = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < out; ++r) {
        const size_t k = i * out + r;
        const double m = mag[k];
        const double tol = (bf16_x ? m / 256 : 0.0) + 2.0 * in * kU * m + 1e-30;
        const double g = got[k], w = y_ref[k];
        ASSERT_TRUE(std::isfinite(g))
            << path_name(path) << " dtype " << static_cast<int>(dtype) << " n " << n << " in " << in
            << " out " << out << ": non-finite at row " << i << " col " << r;
        const double err = std::fabs(g - w);
        max_ratio = std::max(max_ratio, err / tol);
        ASSERT_LE(err, tol) << path_name(path) << " dtype " << static_cast<int>(dtype) << " n " << n
                            << " in " << in << " out " << out << " bias " << bias
                            << ": first mismatch at row " << i << " col " << r << ": got " << g
                            << " want " << w;
        num += (g - w) * (g - w);
        den += bf16_x ? m * m : w * w;
      }
    const double rel = std::sqrt(num / std::max(den, 1e-300));
    EXPECT_LE(rel, bf16_x ? 1.0 / 256 : 1e-5)
        << path_name(path) << " dtype " << static_cast<int>(dtype) << " n " << n;
    if (n == 1 || n == 9 || n == 40)
      std::printf(
          "  %-6s dtype=%d n=%-3lld in=%-5lld out=%-5lld bias=%d err/tol=%.3g rel_l2=%.3g\n",
          path_name(path), static_cast<int>(dtype), static_cast<long long>(n),
          static_cast<long long>(in), static_cast<long long>(out), bias ? 1 : 0, max_ratio, rel);
  }
}

class LinearCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_F(LinearCuda, MatchesReference) {
  uint32_t seed = 1;
  for (DType dtype : {DType::kBF16, DType::kF32})
    for (auto [in, out] : {std::pair<int64_t, int64_t>{256, 512},
                           {64, 70},
                           {136, 129},
                           {1024, 33},
                           {8, 1},
                           {4104, 5}})
      for (bool bias : {false, true})
        for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17, 23, 33, 40})
          run(dtype, n, in, out, bias, seed++);
}

TEST_F(LinearCuda, ModelShapesFewRows) {
  // Qwen3-8B's q/o projection shape at decode batch sizes (the streaming kernel's main use).
  uint32_t seed = 1000;
  for (int64_t n : {1, 4, 8})
    for (DType dtype : {DType::kBF16, DType::kF32}) run(dtype, n, 4096, 1024, false, seed++);
  run(DType::kBF16, 16, 4096, 512, true, seed++);
}

// linear_group_cuda: q/k/v-like and gate/up-like groups of products of one x give the bits of one
// linear_cuda each (the streaming launch shares x, not arithmetic), for n where the group is one
// launch (1, 2) and where it falls back (3, 9); mixed dtypes fall back too.
TEST_F(LinearCuda, GroupBitIdenticalToSeparateCalls) {
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.f, 1.f);
  struct Case {
    int64_t in;
    std::vector<int64_t> outs;
    bool mixed;
  };
  for (const Case& c : {Case{256, {512, 128, 128}, false}, Case{64, {70, 33}, false},
                        Case{136, {129, 7, 7}, true}, Case{1024, {40, 40, 40, 40}, false}})
    for (int64_t n : {1, 2, 3, 9}) {
      DeviceUploads up;
      std::vector<float> x(n * c.in);
      for (float& v : x) v = normal(rng);
      const float* dx = static_cast<const float*>(up.up(x));
      std::vector<LinearParams> ps;
      std::vector<std::pair<float*, float*>> ys;  // grouped, separate
      std::vector<std::unique_ptr<DevBuf>> owned;
      for (size_t m = 0; m < c.outs.size(); ++m) {
        const int64_t out = c.outs[m];
        const bool f32 = c.mixed && m == 1;
        std::vector<bf16_t> wb(out * c.in);
        std::vector<float> wf(out * c.in), b(out);
        for (size_t i = 0; i < wf.size(); ++i) {
          wf[i] = normal(rng);
          wb[i] = f32_to_bf16(wf[i]);
        }
        for (float& v : b) v = normal(rng);
        LinearParams p;
        p.x = dx;
        p.n = n;
        const void* w = f32 ? static_cast<const void*>(up.up(wf)) : up.up(wb);
        p.w = WeightView{w, f32 ? DType::kF32 : DType::kBF16, out, c.in};
        p.bias = m == 0 ? static_cast<const float*>(up.up(b)) : nullptr;
        owned.push_back(std::make_unique<DevBuf>(n * out * sizeof(float)));
        owned.push_back(std::make_unique<DevBuf>(n * out * sizeof(float)));
        ys.push_back({static_cast<float*>(owned[owned.size() - 2]->p),
                      static_cast<float*>(owned.back()->p)});
        p.y = ys.back().first;
        ps.push_back(p);
      }
      ASSERT_TRUE(linear_group_cuda(ps.data(), static_cast<int>(ps.size()), nullptr).ok());
      for (size_t m = 0; m < ps.size(); ++m) {
        LinearParams p = ps[m];
        p.y = ys[m].second;
        ASSERT_TRUE(linear_cuda(p, nullptr).ok());
      }
      CUDA_OK(cudaDeviceSynchronize());
      for (size_t m = 0; m < ps.size(); ++m) {
        const size_t count = static_cast<size_t>(n * c.outs[m]);
        std::vector<float> a(count), b(count);
        CUDA_OK(cudaMemcpy(a.data(), ys[m].first, count * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(b.data(), ys[m].second, count * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), count * 4))
            << "in " << c.in << " product " << m << " n " << n;
      }
    }
}

// Batch invariance (LinearParams::batch_invariant, README "Deterministic results"): each row of
// a call of n rows is bitwise the row computed alone, for n across the automatic choice's
// switch from the streaming kernel to the GEMM (3, 5, 8, 9, 64, 300), both dtypes, with a bias,
// the lm_head-like wide output, and linear_group_cuda (one launch or one call per product). The
// invariant rows also stay within their path's bound of the float64 reference (run() above
// covers the accuracy; here one spot check per shape): tol_gemm for BF16 weights (the
// tensor-core GEMM, x rounded to BF16), tol_stream for F32 weights (the streaming kernel).
TEST_F(LinearCuda, BatchInvariantRowsEqualTheRowAlone) {
  std::mt19937 rng(4242);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (DType dtype : {DType::kBF16, DType::kF32})
    for (auto [in, out] : {std::pair<int64_t, int64_t>{256, 512}, {1024, 2050}, {64, 70}}) {
      const int64_t n_max = 300;
      std::vector<float> x(n_max * in), wf(out * in), b(out);
      for (float& v : x) v = normal(rng) + 0.3f;
      for (float& v : wf) v = dtype == DType::kBF16 ? round_to_bf16(normal(rng)) : normal(rng);
      for (float& v : b) v = normal(rng);
      std::vector<bf16_t> wb(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
      DeviceUploads up;
      const float* dx = up.up(x);
      const void* dw = dtype == DType::kBF16 ? static_cast<const void*>(up.up(wb)) : up.up(wf);
      const float* db = up.up(b);
      float* dy = up.up(std::vector<float>(n_max * out));
      float* dy2 = up.up(std::vector<float>(n_max * out));
      float* dy3 = up.up(std::vector<float>(n_max * out));
      ASSERT_TRUE(dx && dw && db && dy && dy2 && dy3);
      LinearParams p;
      p.w = WeightView{dw, dtype, out, in};
      p.bias = db;
      p.batch_invariant = true;
      // Row i alone, for every i (the reference bits).
      std::vector<float> alone(n_max * out), got(n_max * out);
      for (int64_t i = 0; i < n_max; ++i) {
        p.x = dx + i * in;
        p.n = 1;
        p.y = dy + i * out;
        ASSERT_TRUE(linear_cuda(p, nullptr).ok());
      }
      CUDA_OK(cudaMemcpy(alone.data(), dy, alone.size() * 4, cudaMemcpyDeviceToHost));
      // Spot check against the float64 reference: row 0 and the last row.
      for (int64_t i : {int64_t{0}, n_max - 1}) {
        std::vector<float> want(out);
        LinearParams h;
        h.x = x.data() + i * in;
        h.n = 1;
        h.w = WeightView{dtype == DType::kBF16 ? static_cast<const void*>(wb.data()) : wf.data(),
                         dtype, out, in};
        h.bias = b.data();
        h.y = want.data();
        ASSERT_TRUE(linear_ref(h).ok());
        for (int64_t r = 0; r < out; ++r) {
          double m = std::fabs(b[r]);
          for (int64_t c = 0; c < in; ++c) m += std::fabs(double(x[i * in + c]) * wf[r * in + c]);
          const double tol =
              (dtype == DType::kBF16 ? m / 256 : 0.0) + 2.0 * in * kU * m + 1e-30;
          ASSERT_LE(std::fabs(double(alone[i * out + r]) - want[r]), tol)
              << "row " << i << " col " << r;
        }
      }
      // Calls of n rows starting at row i0: each row bitwise its lone value.
      for (int64_t n : {3, 5, 8, 9, 64, 300})
        for (int64_t i0 : {int64_t{0}, n_max - n}) {
          CUDA_OK(cudaMemset(dy2, 0xFF, got.size() * 4));
          p.x = dx + i0 * in;
          p.n = n;
          p.y = dy2 + i0 * out;
          ASSERT_TRUE(linear_cuda(p, nullptr).ok());
          CUDA_OK(cudaMemcpy(got.data(), dy2, got.size() * 4, cudaMemcpyDeviceToHost));
          for (int64_t i = i0; i < i0 + n; ++i)
            ASSERT_EQ(0, std::memcmp(&got[i * out], &alone[i * out], out * 4))
                << "dtype " << static_cast<int>(dtype) << " in " << in << " out " << out
                << ": row " << i << " of a call of " << n << " rows from " << i0
                << " differs from the row alone";
          // linear_group_cuda: the product twice in one group (one launch where it fits).
          LinearParams g[2] = {p, p};
          g[1].y = dy3 + i0 * out;
          for (float* y : {dy2, dy3}) CUDA_OK(cudaMemset(y, 0xFF, got.size() * 4));
          ASSERT_TRUE(linear_group_cuda(g, 2, nullptr).ok());
          for (float* y : {dy2, dy3}) {
            CUDA_OK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
            for (int64_t i = i0; i < i0 + n; ++i)
              ASSERT_EQ(0, std::memcmp(&got[i * out], &alone[i * out], out * 4))
                  << "group: row " << i << " of " << n << " from " << i0;
          }
        }
    }
}

// The batch-invariant tensor-core GEMM (linear_invariant.cuh) on model-like shapes, with fresh
// random x and W: every row of a call of n rows (n = 1, 3, 7, 17, 40, 100, 300, 2048: each of
// the tile configurations, for 4096 -> 1024 the narrow decode tiles and for 4096 -> 12288 the
// wide ones, ragged M tiles) is bitwise the row computed alone (n = 1, forced kInvariant with
// batch_invariant off: the same kernel as kAuto with it on), from offsets 0, an odd row and the
// end; 136 -> 129 and 4104 -> 33 add a partial last k-tile (in % 16 == 8) and ragged N tiles.
// linear_group_cuda gives the same bits.
//
// Accuracy, against the float64 product of x rounded to BF16 (x̂, round to nearest even) and W,
// plus the bias, with M = Σ_c |x̂_c w_c| + |bias|: the products of BF16 values are exact in FP32
// (8 + 8 significant bits), so the only error is the FP32 accumulation. Each of the in/16
// mma steps adds 16 products to the accumulator; model each step (the tensor core's internal sum
// with alignment to the largest exponent, possibly truncating) as at most 2^-23 · (|acc| + Σ|p|)
// relative error per addition of 16 terms and of the accumulator, i.e. <= 17 additions of error
// 2^-23 each on terms bounded by M: |err| <= (in/16 + 1) · 17 · 2^-23 · M < in · 2^-22 · M for
// in >= 16 (in = 8: 34 · 2^-23 · M < 2^-17 M), plus the bias add (2^-24 |y| <= 2^-24 M). Used:
// tol = (in + 32) · 2^-22 · M. The bound on the unrounded x is test_linear_cuda's tol_gemm
// (run(): kInvariant), so x is not re-checked here.
TEST_F(LinearCuda, BatchInvariantTensorCoreRows) {
  std::mt19937 rng(9090);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t n_max = 2048;
  for (auto [in, out] : {std::pair<int64_t, int64_t>{4096, 1024},
                         {4096, 12288},
                         {136, 129},
                         {4104, 33}}) {
    std::vector<float> x(n_max * in), b(out);
    std::vector<bf16_t> wb(out * in);
    for (float& v : x) v = normal(rng) + 0.3f;
    for (bf16_t& v : wb) v = f32_to_bf16(normal(rng));
    for (float& v : b) v = normal(rng);
    DeviceUploads up;
    const float* dx = up.up(x);
    const void* dw = up.up(wb);
    const float* db = up.up(b);
    float* dy = up.up(std::vector<float>(n_max * out));
    float* dy2 = up.up(std::vector<float>(n_max * out));
    float* dy3 = up.up(std::vector<float>(n_max * out));
    ASSERT_TRUE(dx && dw && db && dy && dy2 && dy3);
    LinearParams p;
    p.w = WeightView{dw, DType::kBF16, out, in};
    p.bias = db;
    std::vector<float> alone(n_max * out), got(n_max * out);
    CUDA_OK(cudaMemset(dy, 0xFF, alone.size() * 4));
    for (int64_t i = 0; i < n_max; ++i) {
      p.x = dx + i * in;
      p.n = 1;
      p.y = dy + i * out;
      ASSERT_TRUE(linear_cuda_ex(p, LinearCudaPath::kInvariant, nullptr).ok());
    }
    CUDA_OK(cudaMemcpy(alone.data(), dy, alone.size() * 4, cudaMemcpyDeviceToHost));

    // Accuracy of a few lone rows against the float64 product of x̂ and W (tolerance above).
    double max_ratio = 0;
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{1000}, n_max - 1}) {
      std::vector<double> xh(in);
      for (int64_t c = 0; c < in; ++c) xh[c] = round_to_bf16(x[i * in + c]);
      for (int64_t r = 0; r < out; ++r) {
        double s = b[r], m = std::fabs(b[r]);
        const bf16_t* wr = &wb[r * in];
        for (int64_t c = 0; c < in; ++c) {
          const double pr = xh[c] * bf16_to_f32(wr[c]);
          s += pr;
          m += std::fabs(pr);
        }
        const double g = alone[i * out + r];
        const double tol = (in + 32) * 0x1p-22 * m + 1e-30;
        ASSERT_TRUE(std::isfinite(g)) << "in " << in << " out " << out << ": row " << i
                                      << " col " << r << " not written or not finite";
        max_ratio = std::max(max_ratio, std::fabs(g - s) / tol);
        ASSERT_LE(std::fabs(g - s), tol) << "in " << in << " out " << out << ": row " << i
                                         << " col " << r << ": got " << g << " want " << s;
      }
    }
    std::printf("  invariant in=%-5lld out=%-5lld err/tol=%.3g (x rounded to BF16)\n",
                static_cast<long long>(in), static_cast<long long>(out), max_ratio);

    p.batch_invariant = true;
    for (int64_t n : {1, 3, 7, 17, 40, 100, 300, 2048})
      for (int64_t i0 : {int64_t{0}, int64_t{5}, n_max - n}) {
        if (i0 + n > n_max) continue;
        const size_t off = static_cast<size_t>(i0 * out), count = static_cast<size_t>(n * out);
        CUDA_OK(cudaMemset(dy2 + off, 0xFF, count * 4));
        p.x = dx + i0 * in;
        p.n = n;
        p.y = dy2 + i0 * out;
        ASSERT_TRUE(linear_cuda(p, nullptr).ok());
        CUDA_OK(cudaMemcpy(&got[off], dy2 + off, count * 4, cudaMemcpyDeviceToHost));
        for (int64_t i = i0; i < i0 + n; ++i)
          for (int64_t r = 0; r < out; ++r)
            ASSERT_EQ(0, std::memcmp(&got[i * out + r], &alone[i * out + r], 4))
                << "in " << in << " out " << out << ": row " << i << " col " << r
                << " of a call of " << n << " rows from " << i0 << ": " << got[i * out + r]
                << " vs " << alone[i * out + r] << " alone";
        if (n != 17 && n != 300) continue;
        LinearParams g[2] = {p, p};
        g[1].y = dy3 + i0 * out;
        for (float* y : {dy2, dy3}) CUDA_OK(cudaMemset(y + off, 0xFF, count * 4));
        ASSERT_TRUE(linear_group_cuda(g, 2, nullptr).ok());
        for (float* y : {dy2, dy3}) {
          CUDA_OK(cudaMemcpy(&got[off], y + off, count * 4, cudaMemcpyDeviceToHost));
          ASSERT_EQ(0, std::memcmp(&got[off], &alone[off], count * 4))
              << "group: a call of " << n << " rows from " << i0 << " differs from the rows alone";
        }
      }
  }
}

TEST_F(LinearCuda, UnalignedOutput) {
  uint32_t seed = 2000;
  for (DType dtype : {DType::kBF16, DType::kF32})
    for (int64_t n : {3, 17}) run(dtype, n, 64, 70, true, seed++, /*y_off=*/1);
}

TEST_F(LinearCuda, RefusesBadShapes) {
  DevBuf d(1 << 16);
  LinearParams p;
  p.x = static_cast<const float*>(d.p);
  p.y = static_cast<float*>(d.p) + 1024;
  p.n = 2;
  p.w = WeightView{d.p, DType::kBF16, 16, 36};  // in not a multiple of 8
  EXPECT_FALSE(linear_cuda(p, nullptr).ok());
  p.w.cols = 32;
  p.x = static_cast<const float*>(d.p) + 1;  // misaligned
  EXPECT_FALSE(linear_cuda(p, nullptr).ok());
  p.x = static_cast<const float*>(d.p);
  p.w.dtype = static_cast<DType>(7);
  EXPECT_FALSE(linear_cuda(p, nullptr).ok());
  p.w.dtype = DType::kBF16;
  p.w.rows = 0;
  EXPECT_FALSE(linear_cuda(p, nullptr).ok());
  p.w.rows = 16;
  p.n = 0;  // nothing to do
  EXPECT_TRUE(linear_cuda(p, nullptr).ok());
}

}  // namespace
}  // namespace oscar::kernels
