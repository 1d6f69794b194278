// The small CUDA backend ops (kernels/cuda/elementwise.cu, kv_append.cu, sample.cu) against the
// CPU ops of kernels/cpu on the same params, filled once with host and once with device pointers.
// Fresh seeded random inputs (never zeros), several shapes including odd sizes (unaligned, scalar
// paths), page slots shuffled across pages, every untouched pool byte 0xFF (NaN in bf16), so a
// wrong address shows up. Skipped when no GPU is visible. u = 2^-24 (float unit roundoff).
//
// Tolerances, derived from the arithmetic of each kernel (its file says which operations it
// performs):
//   embed, gather_rows, add, fill_normal_bf16, rotate_queries(null = copy), kv_append values and
//     un-rotated keys: bit-identical (copies, one widening, one correctly rounded add, centring
//     by one correctly rounded subtract, integer hash + one multiply, the same bf16 rounding).
//   rms_norm: x² and the later multiplies are the same ops; only ss is summed in another order
//     (CPU: sequential fma; GPU: per-thread strided fma, then a tree). For positive terms the
//     relative error of either sum is, with overwhelming probability, below 2·sqrt(n)·u
//     (probabilistic bound, Higham & Mary 2019, λ ≈ 2), so the two ss differ by < 4·sqrt(n)·u
//     relative; y ∝ ss^-1/2 halves that; the sqrt, the divide and the two multiplies can each
//     round the other way once (≤ 2u each): |Δy| ≤ (2·sqrt(dim) + 8)·u·|y|.
//   rope: the CPU (GCC, -ffp-contract=fast on an FMA target) computes fma(a, c, −(b·s)) and
//     fma(b, c, a·s), as the kernel does, so the bits match; any other contraction choice is two
//     roundings from exact, each ≤ u·E with E = |a·c| + |b·s|: |Δ| ≤ 4u·E is allowed.
//   silu_mul: CUDA's expf is within 2 ulp (4u relative), glibc's within 1 ulp (2u): e = exp(−g)
//     differs by ≤ 6u relative; 1 + e then ≤ 6u + 2u; the divide and the multiply round once
//     each (2u + 2u): |Δ| ≤ 16u·|ref| (12u derived, rounded up).
//   kv_append rotated keys, rotate_queries: out[c] = Σ_r x_r·R[r, c] with one fma per term in r
//     order on both sides (the CPU's rotate_row contracts to fma on an FMA target), so the bits
//     match; a CPU build without FMA rounds each product: both sums are within γ_d·A of exact,
//     A = Σ_r |x_r·R[r, c]|, γ_d ≈ d·u, so float outputs may differ by 2(d + 1)·u·A, bf16 ones by
//     one bf16 ulp where that moves a rounding boundary: allowed on ≤ 1% of key elements.
//   sample greedy / non-finite / routed-to-host rows: exact. sample with temperature: the GPU
//     sums p in a different float64 order (segments + tree) and CUDA's exp(double) is within
//     1 ulp of glibc's, so u·S may land on the other side of a prefix-sum boundary only when it
//     lies within ~V·2^-53·S of it: ≥ 99% of rows must match the CPU exactly, and each mismatch
//     must be a neighbour in the cumulative distribution (|P(≤ a) − u·S| ≤ 1e-9·S, a the lower
//     of the two ids, with no mass above 1e-9·S strictly between them).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "cuda_test_util.h"
#include "kernels/elementwise.h"
#include "kernels/kv_append.h"
#include "kernels/sample.h"

namespace oscar::kernels {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible"

// A device array of n T, optionally a copy of a host vector. Owns the allocation.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

std::vector<float> normal(size_t n, std::mt19937& rng, float mean = 0.f, float std = 1.f) {
  std::normal_distribution<float> d(mean, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Index of the first element whose bits differ, or -1.
int64_t first_bit_mismatch(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) return static_cast<int64_t>(i);
  return -1;
}

// ---- elementwise -------------------------------------------------------------------------------

TEST(OpsCuda, EmbedBitIdentical) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const int64_t vocab = 500;
  for (DType dt : {DType::kBF16, DType::kF32})
    for (int64_t cols : {256, 4096, 37})
      for (int64_t n : {1, 7, 37}) {
        const std::vector<float> tf = normal(vocab * cols, rng, 0.f, 0.5f);
        std::vector<bf16_t> tb(tf.size());
        for (size_t i = 0; i < tf.size(); ++i) tb[i] = f32_to_bf16(tf[i]);
        std::vector<int32_t> ids(n);
        for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
        Dev<float> dtf(tf);
        Dev<bf16_t> dtb(tb);
        Dev<int32_t> dids(ids);
        Dev<float> dx(n * cols);
        WeightView ht{dt == DType::kF32 ? static_cast<const void*>(tf.data()) : tb.data(), dt,
                      vocab, cols};
        WeightView dtv{dt == DType::kF32 ? static_cast<const void*>(dtf.p) : dtb.p, dt, vocab,
                       cols};
        std::vector<float> ref(n * cols);
        ASSERT_TRUE(embed(ht, ids.data(), n, ref.data()).ok());
        ASSERT_TRUE(embed_cuda(dtv, dids.p, n, dx.p, nullptr).ok());
        CUDA_OK(cudaDeviceSynchronize());
        const int64_t bad = first_bit_mismatch(ref, dx.get());
        EXPECT_EQ(bad, -1) << "dtype " << static_cast<int>(dt) << " cols " << cols << " n " << n
                           << " first mismatch at row " << bad / cols << " col " << bad % cols;
      }
}

TEST(OpsCuda, EmbedOutOfRangeIdGivesNaNRow) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  const std::vector<float> t = normal(10 * 64, rng);
  Dev<float> dt(t);
  Dev<int32_t> dids(std::vector<int32_t>{3, 10, -1});
  Dev<float> dx(3 * 64);
  ASSERT_TRUE(embed_cuda(WeightView{dt.p, DType::kF32, 10, 64}, dids.p, 3, dx.p, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> x = dx.get();
  for (int c = 0; c < 64; ++c) {
    EXPECT_EQ(x[c], t[3 * 64 + c]);
    EXPECT_TRUE(std::isnan(x[64 + c]) && std::isnan(x[128 + c])) << c;
  }
}

TEST(OpsCuda, RmsNormWithinDerivedBound) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (int64_t dim : {64, 128, 256, 1000, 4096, 5000})
    for (int64_t rows : {1, 7, 37})
      for (bool alias : {false, true}) {
        std::vector<float> x = normal(rows * dim, rng, 0.1f, 2.f);
        for (int64_t i = 0; i < rows * dim; i += 97) x[i] *= 30.f;  // outlier channels
        const std::vector<float> w = normal(dim, rng, 1.f, 0.2f);
        const float eps = 1e-6f;
        std::vector<float> ref(rows * dim);
        ASSERT_TRUE(rms_norm(x.data(), rows, dim, w.data(), eps, ref.data()).ok());
        Dev<float> dx(x), dw(w), dy(rows * dim);
        ASSERT_TRUE(rms_norm_cuda(dx.p, rows, dim, dw.p, eps, alias ? dx.p : dy.p, nullptr).ok());
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> y = alias ? dx.get() : dy.get();
        const double tol = (2.0 * std::sqrt(static_cast<double>(dim)) + 8.0) * kU;
        double max_rel = 0;
        int64_t first_bad = -1;
        for (int64_t i = 0; i < rows * dim; ++i) {
          const double err = std::fabs(static_cast<double>(y[i]) - ref[i]);
          const double rel = err / std::max(std::fabs(static_cast<double>(ref[i])), 1e-30);
          max_rel = std::max(max_rel, rel);
          if (!(err <= tol * std::fabs(ref[i]) + 1e-37) && first_bad < 0) first_bad = i;
        }
        EXPECT_EQ(first_bad, -1) << "dim " << dim << " rows " << rows << " alias " << alias
                                 << ": max rel err " << max_rel << " > tol " << tol
                                 << ", first at row " << first_bad / dim << " col "
                                 << first_bad % dim;
      }
}

TEST(OpsCuda, RopeWithinContractionBound) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  struct Shape {
    int hq, hkv, d;
  };
  int64_t exact = 0, total = 0;
  for (Shape s : {Shape{8, 2, 128}, Shape{16, 4, 64}, Shape{4, 4, 128}, Shape{6, 3, 64}})
    for (int64_t rows : {1, 5, 37}) {
      const int half = s.d / 2;
      std::vector<int32_t> pos(rows);
      for (int32_t& p : pos) p = static_cast<int32_t>(rng() % 32768);
      std::vector<float> inv_freq(half);
      for (int i = 0; i < half; ++i)
        inv_freq[i] = static_cast<float>(std::pow(1e6, -2.0 * i / s.d));
      std::vector<float> cs(rows * half), sn(rows * half);
      rope_tables(pos.data(), rows, inv_freq.data(), half, cs.data(), sn.data());
      const std::vector<float> q0 = normal(rows * s.hq * s.d, rng);
      const std::vector<float> k0 = normal(rows * s.hkv * s.d, rng, 0.5f, 3.f);
      std::vector<float> q = q0, k = k0;
      RopeParams hp{rows, s.hq, s.hkv, s.d, cs.data(), sn.data(), q.data(), k.data()};
      ASSERT_TRUE(rope(hp).ok());
      Dev<float> dcs(cs), dsn(sn), dq(q0), dk(k0);
      RopeParams dp{rows, s.hq, s.hkv, s.d, dcs.p, dsn.p, dq.p, dk.p};
      ASSERT_TRUE(rope_cuda(dp, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> gq = dq.get(), gk = dk.get();
      auto check = [&](const std::vector<float>& x0, const std::vector<float>& ref,
                       const std::vector<float>& got, int heads, const char* what) {
        for (int64_t r = 0; r < rows; ++r)
          for (int h = 0; h < heads; ++h)
            for (int i = 0; i < s.d; ++i) {
              const int64_t base = (r * heads + h) * s.d;
              const int j = i % half;
              const double a = x0[base + j], b = x0[base + j + half];
              const double E = std::fabs(a * cs[r * half + j]) + std::fabs(b * sn[r * half + j]);
              const double err = std::fabs(static_cast<double>(got[base + i]) - ref[base + i]);
              ++total;
              exact += bits(got[base + i]) == bits(ref[base + i]);
              ASSERT_LE(err, 4 * kU * E + 1e-37)
                  << what << " hq " << s.hq << " hkv " << s.hkv << " d " << s.d << " rows " << rows
                  << " at row " << r << " head " << h << " i " << i;
            }
      };
      check(q0, q, gq, s.hq, "q");
      check(k0, k, gk, s.hkv, "k");
    }
  std::printf("rope: %lld of %lld values bit-identical to the CPU\n", static_cast<long long>(exact),
              static_cast<long long>(total));
}

// The fused ops give the bits of the device sequence they replace: add_rms_norm_cuda = add_cuda
// then rms_norm_cuda; rope_cuda with q/k norms = rms_norm_cuda on q and k, then rope_cuda.
TEST(OpsCuda, FusedAddRmsNormBitIdenticalToAddThenNorm) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  for (int64_t dim : {64, 256, 1000, 4096, 5000})
    for (int64_t rows : {1, 3, 37}) {
      const std::vector<float> x = normal(rows * dim, rng, 0.1f, 2.f);
      const std::vector<float> y = normal(rows * dim, rng, -0.2f, 1.5f);
      const std::vector<float> w = normal(dim, rng, 1.f, 0.2f);
      Dev<float> x1(x), x2(x), dy(y), dw(w), h1(rows * dim), h2(rows * dim);
      ASSERT_TRUE(add_cuda(x1.p, dy.p, rows * dim, nullptr).ok());
      ASSERT_TRUE(rms_norm_cuda(x1.p, rows, dim, dw.p, 1e-6f, h1.p, nullptr).ok());
      ASSERT_TRUE(add_rms_norm_cuda(x2.p, dy.p, rows, dim, dw.p, 1e-6f, h2.p, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(first_bit_mismatch(x1.get(), x2.get()), -1) << "x, dim " << dim << " rows " << rows;
      EXPECT_EQ(first_bit_mismatch(h1.get(), h2.get()), -1) << "h, dim " << dim << " rows " << rows;
    }
}

TEST(OpsCuda, FusedQkNormRopeBitIdenticalToNormsThenRope) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  struct Shape {
    int hq, hkv, d;
  };
  for (Shape s : {Shape{32, 8, 128}, Shape{16, 4, 64}, Shape{4, 2, 256}, Shape{6, 3, 96}})
    for (int64_t rows : {1, 5, 37}) {
      const int half = s.d / 2;
      std::vector<int32_t> pos(rows);
      for (int32_t& p : pos) p = static_cast<int32_t>(rng() % 32768);
      std::vector<float> inv_freq(half);
      for (int i = 0; i < half; ++i)
        inv_freq[i] = static_cast<float>(std::pow(1e6, -2.0 * i / s.d));
      std::vector<float> cs(rows * half), sn(rows * half);
      rope_tables(pos.data(), rows, inv_freq.data(), half, cs.data(), sn.data());
      const std::vector<float> q0 = normal(rows * s.hq * s.d, rng, 0.3f, 2.f);
      const std::vector<float> k0 = normal(rows * s.hkv * s.d, rng, 0.5f, 3.f);
      const std::vector<float> wq = normal(s.d, rng, 1.f, 0.3f), wk = normal(s.d, rng, 1.f, 0.3f);
      Dev<float> dcs(cs), dsn(sn), dwq(wq), dwk(wk), q1(q0), k1(k0), q2(q0), k2(k0);
      const float eps = 1e-6f;
      ASSERT_TRUE(rms_norm_cuda(q1.p, rows * s.hq, s.d, dwq.p, eps, q1.p, nullptr).ok());
      ASSERT_TRUE(rms_norm_cuda(k1.p, rows * s.hkv, s.d, dwk.p, eps, k1.p, nullptr).ok());
      RopeParams plain{rows, s.hq, s.hkv, s.d, dcs.p, dsn.p, q1.p, k1.p};
      ASSERT_TRUE(rope_cuda(plain, nullptr).ok());
      RopeParams fused{rows, s.hq, s.hkv, s.d, dcs.p, dsn.p, q2.p, k2.p, dwq.p, dwk.p, eps};
      ASSERT_TRUE(rope_cuda(fused, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(first_bit_mismatch(q1.get(), q2.get()), -1) << "q, d " << s.d << " rows " << rows;
      EXPECT_EQ(first_bit_mismatch(k1.get(), k2.get()), -1) << "k, d " << s.d << " rows " << rows;
      // And the CPU op with the norms equals the CPU norms then the CPU rotation.
      std::vector<float> cq1 = q0, ck1 = k0, cq2 = q0, ck2 = k0;
      ASSERT_TRUE(rms_norm(cq1.data(), rows * s.hq, s.d, wq.data(), eps, cq1.data()).ok());
      ASSERT_TRUE(rms_norm(ck1.data(), rows * s.hkv, s.d, wk.data(), eps, ck1.data()).ok());
      RopeParams hp{rows, s.hq, s.hkv, s.d, cs.data(), sn.data(), cq1.data(), ck1.data()};
      ASSERT_TRUE(rope(hp).ok());
      RopeParams hf{rows,       s.hq,       s.hkv,     s.d,       cs.data(), sn.data(),
                    cq2.data(), ck2.data(), wq.data(), wk.data(), eps};
      ASSERT_TRUE(rope(hf).ok());
      EXPECT_EQ(first_bit_mismatch(cq1, cq2), -1);
      EXPECT_EQ(first_bit_mismatch(ck1, ck2), -1);
    }
}

TEST(OpsCuda, SiluMulAddGather) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{4097}, (int64_t{1} << 20) + 3})
    for (int64_t off : {0, 1}) {  // off 1: unaligned pointers, the scalar path
      const std::vector<float> g = normal(n + off, rng, 0.f, 3.f);
      const std::vector<float> u = normal(n + off, rng);
      // silu_mul
      std::vector<float> ref = g;
      ASSERT_TRUE(silu_mul(ref.data() + off, u.data() + off, n).ok());
      Dev<float> dg(g), du(u);
      ASSERT_TRUE(silu_mul_cuda(dg.p + off, du.p + off, n, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> got = dg.get();
      for (int64_t i = off; i < n + off; ++i)
        ASSERT_LE(std::fabs(static_cast<double>(got[i]) - ref[i]),
                  16 * kU * std::fabs(ref[i]) + 1e-37)
            << "silu_mul n " << n << " off " << off << " at " << i - off << " g " << g[i];
      // add: bit-identical
      std::vector<float> xs = g;
      ASSERT_TRUE(add(xs.data() + off, u.data() + off, n).ok());
      Dev<float> dx(g);
      ASSERT_TRUE(add_cuda(dx.p + off, du.p + off, n, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(first_bit_mismatch(xs, dx.get()), -1) << "add n " << n << " off " << off;
    }
  for (int64_t dim : {256, 37, 4096})
    for (int64_t n : {1, 5, 37}) {
      const int64_t src_rows = 50;
      const std::vector<float> src = normal(src_rows * dim, rng);
      std::vector<int32_t> rows(n);
      for (int32_t& r : rows) r = static_cast<int32_t>(rng() % src_rows);  // repeats allowed
      std::vector<float> ref(n * dim);
      ASSERT_TRUE(gather_rows(src.data(), rows.data(), n, dim, ref.data()).ok());
      Dev<float> dsrc(src), ddst(n * dim);
      Dev<int32_t> drows(rows);
      ASSERT_TRUE(gather_rows_cuda(dsrc.p, drows.p, n, dim, ddst.p, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(first_bit_mismatch(ref, ddst.get()), -1) << "gather dim " << dim << " n " << n;
    }
}

TEST(OpsCuda, FillNormalBf16BitIdentical) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 7})
    for (float std : {0.02f, 1.f})
      for (uint64_t seed : {uint64_t{0}, uint64_t{12345}, ~uint64_t{0}}) {
        std::vector<bf16_t> ref(n);
        ASSERT_TRUE(fill_normal_bf16(ref.data(), n, std, seed).ok());
        Dev<bf16_t> d(n);
        ASSERT_TRUE(fill_normal_bf16_cuda(d.p, n, std, seed, nullptr).ok());
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<bf16_t> got = d.get();
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; ++i)
          if (got[i] != ref[i]) bad = i;
        EXPECT_EQ(bad, -1) << "n " << n << " std " << std << " seed " << seed;
      }
}

// ---- kv_append, rotate_queries -------------------------------------------------------------

struct KvCase {
  int n_heads_kv, head_dim, page_size, elem_bytes;
  int64_t n_tokens;
  bool mean, rot;
  int layer;
};

void run_kv_case(const KvCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  KvPageLayout L;
  L.n_layers = 3;
  L.n_heads_kv = c.n_heads_kv;
  L.head_dim = c.head_dim;
  L.page_size = c.page_size;
  L.exact_elem_bytes = c.elem_bytes;
  const int d = c.head_dim, H = c.n_heads_kv;
  const int64_t n_pages = (c.n_tokens + c.page_size - 1) / c.page_size + 2;
  const size_t page_bytes = L.exact_page_bytes();
  std::vector<int64_t> all(n_pages * c.page_size);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  const std::vector<int64_t> slots(all.begin(), all.begin() + c.n_tokens);
  const std::vector<float> k = normal(c.n_tokens * H * d, rng, 0.3f, 2.f);
  const std::vector<float> v = normal(c.n_tokens * H * d, rng);
  const std::vector<float> mean = normal(L.n_layers * H * d, rng, 0.3f, 1.f);
  const std::vector<float> rot =
      normal(static_cast<size_t>(L.n_layers) * H * d * d, rng, 0.f, 1.f / std::sqrt(d));
  std::vector<uint8_t> pool(n_pages * page_bytes, 0xFF);

  KvAppendParams hp;
  hp.layout = L;
  hp.layer = c.layer;
  hp.n_tokens = c.n_tokens;
  hp.k = k.data();
  hp.v = v.data();
  hp.slots = slots.data();
  hp.exact_pool = pool.data();
  hp.k_mean = c.mean ? mean.data() : nullptr;
  hp.k_rotation = c.rot ? rot.data() : nullptr;
  ASSERT_TRUE(kv_append(hp).ok());

  Dev<float> dk(k), dv(v), dmean(mean), drot(rot);
  Dev<int64_t> dslots(slots);
  Dev<uint8_t> dpool(std::vector<uint8_t>(n_pages * page_bytes, 0xFF));
  KvAppendParams dp = hp;
  dp.k = dk.p;
  dp.v = dv.p;
  dp.slots = dslots.p;
  dp.exact_pool = dpool.p;
  dp.k_mean = c.mean ? dmean.p : nullptr;
  dp.k_rotation = c.rot ? drot.p : nullptr;
  ASSERT_TRUE(kv_append_cuda(dp, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = dpool.get();

  // Every byte outside the written rows must still be 0xFF on both sides (and equal).
  std::vector<uint8_t> written(pool.size(), 0);
  int64_t key_elems = 0, ulp1 = 0;
  for (int64_t i = 0; i < c.n_tokens; ++i)
    for (int h = 0; h < H; ++h)
      for (int kv = 0; kv < 2; ++kv) {
        const size_t off =
            static_cast<size_t>(slots[i] / c.page_size) * page_bytes +
            L.exact_row_offset(c.layer, kv, h, static_cast<int>(slots[i] % c.page_size));
        std::fill_n(written.begin() + off, L.exact_row_bytes(), 1);
        for (int col = 0; col < d; ++col) {
          const size_t e = off + static_cast<size_t>(col) * c.elem_bytes;
          if (std::memcmp(&got[e], &pool[e], c.elem_bytes) == 0) continue;
          const bool may_round = kv == 0 && c.rot;
          ASSERT_TRUE(may_round) << (kv ? "value" : "key") << " differs: token " << i << " head "
                                 << h << " col " << col;
          if (c.elem_bytes == 2) {
            bf16_t a, b;
            std::memcpy(&a, &got[e], 2);
            std::memcpy(&b, &pool[e], 2);
            ASSERT_LE(std::abs(static_cast<int>(static_cast<int16_t>(a)) -
                               static_cast<int>(static_cast<int16_t>(b))),
                      1)
                << "key more than 1 bf16 ulp off: token " << i << " head " << h << " col " << col;
            ++ulp1;
          } else {
            float a, b;
            std::memcpy(&a, &got[e], 4);
            std::memcpy(&b, &pool[e], 4);
            const size_t head = static_cast<size_t>(c.layer) * H + h;
            double A = 0;
            for (int r = 0; r < d; ++r)
              A += std::fabs((k[(i * H + h) * d + r] - (c.mean ? mean[head * d + r] : 0.f)) *
                             static_cast<double>(rot[(head * d + r) * d + col]));
            ASSERT_LE(std::fabs(static_cast<double>(a) - b), 2.0 * (d + 1) * kU * A)
                << "key: token " << i << " head " << h << " col " << col;
          }
        }
        if (kv == 0) key_elems += d;
      }
  for (size_t b = 0; b < pool.size(); ++b)
    if (!written[b]) {
      ASSERT_TRUE(got[b] == 0xFF && pool[b] == 0xFF) << "untouched byte " << b;
    }
  EXPECT_LE(ulp1, key_elems / 100) << "bf16 keys 1 ulp off on more than 1%";
}

TEST(OpsCuda, KvAppendMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (int d : {64, 128})
    for (int H : {2, 8})
      for (int eb : {2, 4})
        for (int64_t n : {1, 5, 37})
          for (int mode = 0; mode < 4; ++mode) {
            const KvCase c{H,
                           d,
                           d == 128 ? 16 : 32,
                           eb,
                           n,
                           (mode & 1) != 0,
                           (mode & 2) != 0,
                           static_cast<int>(seed % 3)};
            SCOPED_TRACE(::testing::Message()
                         << "head_dim " << d << " kv heads " << H << " elem_bytes " << eb
                         << " tokens " << n << " mean " << c.mean << " rot " << c.rot << " layer "
                         << c.layer);
            run_kv_case(c, seed++);
            if (HasFatalFailure()) return;
          }
}

TEST(OpsCuda, RotateQueriesMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(51);
  int64_t exact = 0, total = 0;
  struct Shape {
    int hq, hkv, d;
  };
  for (Shape s : {Shape{8, 4, 128}, Shape{16, 4, 128}, Shape{8, 4, 64}, Shape{16, 4, 64}})
    for (int64_t rows : {1, 5, 37})
      for (bool null_rot : {false, true}) {
        const int n_layers = 2, layer = 1, d = s.d;
        const std::vector<float> q = normal(rows * s.hq * d, rng, 0.f, 2.f);
        const std::vector<float> rot =
            normal(static_cast<size_t>(n_layers) * s.hkv * d * d, rng, 0.f, 1.f / std::sqrt(d));
        std::vector<float> ref(q.size(), std::nanf(""));
        RotateQueriesParams hp{
            layer, rows, s.hq, s.hkv, d, q.data(), null_rot ? nullptr : rot.data(), ref.data()};
        ASSERT_TRUE(rotate_queries(hp).ok());
        Dev<float> dq(q), drot(rot), dout(std::vector<float>(q.size(), std::nanf("")));
        RotateQueriesParams dp{layer, rows, s.hq, s.hkv, d, dq.p, null_rot ? nullptr : drot.p,
                               dout.p};
        ASSERT_TRUE(rotate_queries_cuda(dp, nullptr).ok());
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> got = dout.get();
        if (null_rot) {
          EXPECT_EQ(first_bit_mismatch(ref, got), -1);
          continue;
        }
        const int gqa = s.hq / s.hkv;
        for (int64_t r = 0; r < rows; ++r)
          for (int h = 0; h < s.hq; ++h)
            for (int col = 0; col < d; ++col) {
              const size_t i = (r * s.hq + h) * d + col;
              ++total;
              if (bits(got[i]) == bits(ref[i])) {
                ++exact;
                continue;
              }
              const float* R = rot.data() + (static_cast<size_t>(layer) * s.hkv + h / gqa) * d * d;
              double A = 0;
              for (int k = 0; k < d; ++k)
                A += std::fabs(static_cast<double>(q[(r * s.hq + h) * d + k]) * R[k * d + col]);
              ASSERT_LE(std::fabs(static_cast<double>(got[i]) - ref[i]), 2.0 * (d + 1) * kU * A)
                  << "hq " << s.hq << " hkv " << s.hkv << " d " << d << " row " << r << " head "
                  << h << " col " << col;
            }
      }
  std::printf("rotate_queries: %lld of %lld values bit-identical to the CPU\n",
              static_cast<long long>(exact), static_cast<long long>(total));
}

// ---- sample --------------------------------------------------------------------------------

struct SampleRun {
  std::vector<int32_t> cpu, gpu;
};

void run_sample(const std::vector<float>& logits, int32_t vocab,
                const std::vector<SamplingConfig>& cfg, const std::vector<uint64_t>& step,
                SampleRun* out) {
  const int32_t n = static_cast<int32_t>(cfg.size());
  out->cpu.assign(n, 12345);
  SampleParams hp{logits.data(), n, vocab, cfg.data(), step.data(), out->cpu.data()};
  // sample_ref refuses invalid configs as a whole; feed it only the rows it accepts.
  for (int32_t r = 0; r < n; ++r) {
    if (!validate_sampling(cfg[r]).ok()) {
      out->cpu[r] = kSampleOnHost;
      continue;
    }
    SampleParams one = hp;
    one.logits = logits.data() + static_cast<size_t>(r) * vocab;
    one.n_rows = 1;
    one.config = &cfg[r];
    one.step = &step[r];
    one.ids = &out->cpu[r];
    ASSERT_TRUE(sample_ref(one).ok());
  }
  Dev<float> dl(logits);
  Dev<SamplingConfig> dc(cfg);
  Dev<uint64_t> ds(step);
  Dev<int32_t> dids(std::vector<int32_t>(n, 12345));
  SampleParams dp{dl.p, n, vocab, dc.p, ds.p, dids.p};
  ASSERT_TRUE(sample_cuda(dp, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  out->gpu = dids.get();
}

TEST(OpsCuda, SampleGreedyNonFiniteAndRouting) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(61);
  for (int32_t vocab : {1, 37, 1000, 151936})
    for (int32_t rows : {1, 7, 37}) {
      std::vector<float> l = normal(static_cast<size_t>(rows) * vocab, rng, 0.f, 3.f);
      std::vector<SamplingConfig> cfg(rows);
      std::vector<uint64_t> step(rows);
      std::vector<int32_t> want(rows, 0);  // 0: compare with the CPU; else the expected id
      for (int32_t r = 0; r < rows; ++r) {
        float* row = l.data() + static_cast<size_t>(r) * vocab;
        step[r] = rng();
        cfg[r].seed = rng();
        const int kind = r % 7;
        if (kind == 1 && vocab > 2) {  // a tie for the max: the lower id wins
          const int32_t a = static_cast<int32_t>(rng() % vocab),
                        b = static_cast<int32_t>(rng() % vocab);
          row[a] = row[b] = 50.f;
        } else if (kind == 2) {
          row[rng() % vocab] = std::nanf("");
        } else if (kind == 3) {
          row[rng() % vocab] = (rng() & 1) ? INFINITY : -INFINITY;
        } else if (kind == 4) {
          cfg[r].temperature = 0.8f, cfg[r].top_k = 40;
          want[r] = kSampleOnHost;
        } else if (kind == 5) {
          cfg[r].temperature = 0.8f, cfg[r].top_p = 0.9f;
          want[r] = kSampleOnHost;
        } else if (kind == 6) {
          cfg[r].temperature = -1.f;  // invalid: the host reports it
          want[r] = kSampleOnHost;
        }
      }
      SampleRun run;
      run_sample(l, vocab, cfg, step, &run);
      if (HasFatalFailure()) return;
      for (int32_t r = 0; r < rows; ++r) {
        if (want[r] == kSampleOnHost && run.cpu[r] != kSampleNonFinite) {
          EXPECT_EQ(run.gpu[r], kSampleOnHost) << "vocab " << vocab << " row " << r;
        } else {
          EXPECT_EQ(run.gpu[r], run.cpu[r]) << "vocab " << vocab << " row " << r;
        }
      }
    }
}

TEST(OpsCuda, SampleTemperatureMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(71);
  int64_t rows_total = 0, mismatches = 0;
  for (int32_t vocab : {2, 37, 1000, 32000, 151936}) {
    const int32_t rows = vocab >= 32000 ? 48 : 400;
    std::vector<float> l(static_cast<size_t>(rows) * vocab);
    std::vector<SamplingConfig> cfg(rows);
    std::vector<uint64_t> step(rows);
    std::normal_distribution<float> nd(0.f, 1.f);
    const float temps[] = {0.3f, 0.7f, 1.f, 1.5f};
    const float scales[] = {0.1f, 1.f, 3.f, 10.f};  // flat .. peaked
    for (int32_t r = 0; r < rows; ++r) {
      const float scale = scales[r % 4];
      for (int32_t i = 0; i < vocab; ++i) l[static_cast<size_t>(r) * vocab + i] = scale * nd(rng);
      cfg[r].temperature = temps[(r / 4) % 4];
      cfg[r].seed = (static_cast<uint64_t>(rng()) << 32) | rng();
      step[r] = rng() % 5000;
    }
    SampleRun run;
    run_sample(l, vocab, cfg, step, &run);
    if (HasFatalFailure()) return;
    for (int32_t r = 0; r < rows; ++r) {
      ++rows_total;
      if (run.gpu[r] == run.cpu[r]) continue;
      ++mismatches;
      ASSERT_GE(run.gpu[r], 0) << "vocab " << vocab << " row " << r;
      ASSERT_LT(run.gpu[r], vocab);
      // Neighbours in the cumulative distribution (float64, id order, the CPU's formula).
      const float* row = l.data() + static_cast<size_t>(r) * vocab;
      const double top = *std::max_element(row, row + vocab), inv_t = 1.0 / cfg[r].temperature;
      std::vector<double> w(vocab);
      double S = 0;
      for (int32_t i = 0; i < vocab; ++i) S += (w[i] = std::exp((row[i] - top) * inv_t));
      const double target = sample_uniform(cfg[r].seed, step[r]) * S;
      const int32_t a = std::min(run.gpu[r], run.cpu[r]), b = std::max(run.gpu[r], run.cpu[r]);
      double below = 0, between = 0;
      for (int32_t i = 0; i <= a; ++i) below += w[i];
      for (int32_t i = a + 1; i < b; ++i) between += w[i];
      EXPECT_GT(w[run.gpu[r]], 0.0) << "picked a zero-probability token";
      EXPECT_LE(std::fabs(below - target), 1e-9 * S)
          << "vocab " << vocab << " row " << r << ": cpu " << run.cpu[r] << " gpu " << run.gpu[r];
      EXPECT_LE(between, 1e-9 * S) << "vocab " << vocab << " row " << r;
    }
  }
  std::printf("sample (temperature): %lld of %lld rows differ from the CPU\n",
              static_cast<long long>(mismatches), static_cast<long long>(rows_total));
  EXPECT_LE(mismatches * 100, rows_total) << "more than 1% of rows differ";
}

}  // namespace
}  // namespace oscar::kernels
