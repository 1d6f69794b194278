// CPU linear (kernels/linear.h).
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define OSCAR_LINEAR_AVX2 1
#endif

#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/decode_pool.h"
#include "kernels/cpu/simd_lanes.h"
#include "kernels/linear.h"

namespace oscar::kernels {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int64_t kBlockRows = 64;   // weight rows per task
constexpr int64_t kFewRows = 8;      // up to this many x rows: the streaming kernel
constexpr int kXTile = 4;            // x rows served by one pass over a weight row
constexpr int64_t kXBlockRows = 64;  // x rows per task of the streaming loop (many rows)
constexpr int kMaxGroup = 4;         // products that linear_group runs in one parallel region

Status check(const LinearParams& p) {
  if (p.n < 0 || p.w.rows <= 0 || p.w.cols <= 0)
    return invalid_argument("linear: bad shape (n %lld, weight %lld x %lld)",
                            static_cast<long long>(p.n), static_cast<long long>(p.w.rows),
                            static_cast<long long>(p.w.cols));
  if (p.n > 0 && (p.x == nullptr || p.y == nullptr || p.w.data == nullptr))
    return invalid_argument("linear: null x, y or weight");
  if (p.w.dtype != DType::kF32 && p.w.dtype != DType::kBF16)
    return invalid_argument("linear: unknown weight dtype %d", static_cast<int>(p.w.dtype));
  return Status();
}

inline float weight_at(const WeightView& w, int64_t r, int64_t c) {
  if (w.dtype == DType::kF32) return static_cast<const float*>(w.data)[r * w.cols + c];
  return bf16_to_f32(static_cast<const bf16_t*>(w.data)[r * w.cols + c]);
}

#ifdef OSCAR_LINEAR_AVX2
inline __m256 load8_bf16(const bf16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16_t* p) { return load8_bf16(p); }
using simd::hsum;
#endif

inline float to_f32(float v) { return v; }
inline float to_f32(bf16_t v) { return bf16_to_f32(v); }

// y[i, r] for rows [r0, r1) of W and NX <= kXTile rows of x: one pass over each weight row.
template <typename T, int NX>
void rows_dot(const float* x, int64_t ldx, const T* w, int64_t in, int64_t r0, int64_t r1,
              float* y, int64_t ldy) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* wr = w + r * in;
    float out[NX];
    int64_t c = 0;
#ifdef OSCAR_LINEAR_AVX2
    __m256 acc[NX][2];
    for (int i = 0; i < NX; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (; c + 16 <= in; c += 16) {
      const __m256 w0 = load8(wr + c), w1 = load8(wr + c + 8);
      for (int i = 0; i < NX; ++i) {
        acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + c), w0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + c + 8), w1, acc[i][1]);
      }
    }
    for (int i = 0; i < NX; ++i) out[i] = hsum(_mm256_add_ps(acc[i][0], acc[i][1]));
#else
    for (int i = 0; i < NX; ++i) out[i] = 0.f;
#endif
    for (; c < in; ++c) {
      const float wc = to_f32(wr[c]);
      for (int i = 0; i < NX; ++i) out[i] += x[i * ldx + c] * wc;
    }
    for (int i = 0; i < NX; ++i) y[i * ldy + r] = out[i];
  }
}

// One task of the streaming loop: weight rows [b * kBlockRows, ...) against rows [i0, i1) of x,
// kXTile rows of x at a time. dot(nx, x, r0, r1, y) runs the block for nx (a
// std::integral_constant) rows of x starting at x, writing y. Every y[i, r] is one dot() chain
// whatever the tile, the task or the thread, so a row's result does not depend on the other rows
// of the call (batch invariance).
template <class Dot>
void streaming_task(const LinearParams& p, const float* x, int64_t b, int64_t i0, int64_t i1,
                    Dot&& dot) {
  const int64_t in = p.w.cols, out = p.w.rows;
  const int64_t r0 = b * kBlockRows, r1 = std::min(out, r0 + kBlockRows);
  for (int64_t i = i0; i < i1; i += kXTile) {
    const float* xi = x + i * in;
    float* y = p.y + i * out;
    switch (std::min<int64_t>(kXTile, i1 - i)) {
      case 1:
        dot(std::integral_constant<int, 1>{}, xi, r0, r1, y);
        break;
      case 2:
        dot(std::integral_constant<int, 2>{}, xi, r0, r1, y);
        break;
      case 3:
        dot(std::integral_constant<int, 3>{}, xi, r0, r1, y);
        break;
      default:
        dot(std::integral_constant<int, 4>{}, xi, r0, r1, y);
        break;
    }
  }
}

int64_t n_blocks(const LinearParams& p) { return (p.w.rows + kBlockRows - 1) / kBlockRows; }

// Below this many multiply-adds a product runs on one thread (waking the team costs more).
bool worth_threads(int64_t blocks, int64_t madds) {
  return blocks > 1 && madds >= (int64_t{1} << 15);
}

// The streaming loop: tasks of kBlockRows weight rows by kXBlockRows rows of x (a weight block
// and an x block stay in the core's cache) over the decode pool's threads. Decode rows (n <= 8)
// make one task per weight block.
template <class Dot>
void streaming_loop(const LinearParams& p, const float* x, Dot&& dot) {
  const int64_t blocks = n_blocks(p), tasks = blocks * ((p.n + kXBlockRows - 1) / kXBlockRows);
  auto task = [&](int64_t t, int) {
    const int64_t i0 = (t / blocks) * kXBlockRows;
    streaming_task(p, x, t % blocks, i0, std::min(p.n, i0 + kXBlockRows), dot);
  };
  if (!worth_threads(tasks, p.n * p.w.rows * p.w.cols)) {
    for (int64_t t = 0; t < tasks; ++t) task(t, 0);
    return;
  }
  decode_parallel_for(tasks, task);
}

template <typename T>
void streaming(const LinearParams& p) {
  const int64_t in = p.w.cols, out = p.w.rows;
  const T* w = static_cast<const T*>(p.w.data);
  streaming_loop(p, p.x, [&](auto nx, const float* x, int64_t r0, int64_t r1, float* y) {
    rows_dot<T, decltype(nx)::value>(x, in, w, in, r0, r1, y, out);
  });
}

#ifdef OSCAR_LINEAR_AVX2
// BF16 rows without widening loads (simd_lanes.h): x is split once per call, so each 16 weights
// cost one load, a shift, an and and two FMAs (instead of two widening loads and two shifts). One
// weight row at a time: two rows per pass measured slower on the development VM (tiny-qwen3's
// matrices, 2 threads). Needs in % 16 == 0.
template <int NX>
void rows_dot_bf16_split(const float* xs, int64_t ldx, const bf16_t* w, int64_t in, int64_t r0,
                         int64_t r1, float* y, int64_t ldy) {
  for (int64_t r = r0; r < r1; ++r) {
    const bf16_t* wa = w + r * in;
    __m256 acc[NX][2];
    for (int i = 0; i < NX; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < in; c += 16) {
      __m256 ae, ao;
      simd::load_bf16x16(wa + c, ae, ao);
      for (int i = 0; i < NX; ++i) {
        acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xs + i * ldx + c), ae, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xs + i * ldx + c + 8), ao, acc[i][1]);
      }
    }
    for (int i = 0; i < NX; ++i) y[i * ldy + r] = hsum(_mm256_add_ps(acc[i][0], acc[i][1]));
  }
}
#endif

#ifdef OSCAR_LINEAR_AVX2
// x in split order (simd::split_16), in a per-thread buffer reused across calls.
const float* split_x(const LinearParams& p) {
  thread_local std::vector<float> xs;
  xs.resize(static_cast<size_t>(p.n * p.w.cols));
  simd::split_16(p.x, p.n * p.w.cols, xs.data());
  return xs.data();
}

auto bf16_split_dot(const LinearParams& p) {
  return [&p](auto nx, const float* x, int64_t r0, int64_t r1, float* y) {
    const int64_t in = p.w.cols;
    rows_dot_bf16_split<decltype(nx)::value>(x, in, static_cast<const bf16_t*>(p.w.data), in, r0,
                                             r1, y, p.w.rows);
  };
}

bool bf16_split_path(const LinearParams& p) {
  return p.w.dtype == DType::kBF16 && p.w.cols % 16 == 0;
}
#endif

// BF16 weights.
void streaming_bf16(const LinearParams& p) {
#ifdef OSCAR_LINEAR_AVX2
  if (bf16_split_path(p)) {
    streaming_loop(p, split_x(p), bf16_split_dot(p));
    return;
  }
#endif
  streaming<bf16_t>(p);
}

void many_rows(const LinearParams& p) {
  const int64_t in = p.w.cols, out = p.w.rows;
  Eigen::Map<const RowMat> X(p.x, p.n, in);
  if (p.w.dtype == DType::kF32) {
    // Eigen's own OpenMP-parallel GEMM.
    Eigen::Map<const RowMat> W(static_cast<const float*>(p.w.data), out, in);
    Eigen::Map<RowMat> Y(p.y, p.n, out);
    Y.noalias() = X * W.transpose();
    return;
  }
  const bf16_t* w = static_cast<const bf16_t*>(p.w.data);
  const int64_t n_blocks = (out + kBlockRows - 1) / kBlockRows;
#pragma omp parallel
  {
    std::vector<float> wf(static_cast<size_t>(kBlockRows) * in);
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t r0 = b * kBlockRows, rows = std::min(kBlockRows, out - r0);
      for (int64_t i = 0; i < rows * in; ++i) wf[i] = bf16_to_f32(w[r0 * in + i]);
      Eigen::Map<const RowMat> W(wf.data(), rows, in);
      Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(p.y + r0, p.n, rows, Eigen::OuterStride<>(out));
      Y.noalias() = X * W.transpose();
    }
  }
}

}  // namespace

Status linear_ref(const LinearParams& p) {
  OSCAR_RETURN_IF_ERROR(check(p));
  for (int64_t i = 0; i < p.n; ++i)
    for (int64_t r = 0; r < p.w.rows; ++r) {
      double acc = p.bias ? p.bias[r] : 0.0;
      for (int64_t c = 0; c < p.w.cols; ++c)
        acc += static_cast<double>(p.x[i * p.w.cols + c]) * weight_at(p.w, r, c);
      p.y[i * p.w.rows + r] = static_cast<float>(acc);
    }
  return Status();
}

namespace {

void add_bias(const LinearParams& p) {
  if (p.bias != nullptr)
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t r = 0; r < p.w.rows; ++r) p.y[i * p.w.rows + r] += p.bias[r];
}

}  // namespace

Status linear(const LinearParams& p) {
  OSCAR_RETURN_IF_ERROR(check(p));
  if (p.n == 0) return Status();
  if (p.n <= kFewRows || p.batch_invariant) {
    if (p.w.dtype == DType::kBF16)
      streaming_bf16(p);
    else streaming<float>(p);
  } else {
    many_rows(p);
  }
  add_bias(p);
  return Status();
}

Status linear_group(const LinearParams* ps, int count) {
  for (int i = 0; i < count; ++i) OSCAR_RETURN_IF_ERROR(check(ps[i]));
  bool one_region = count > 1 && count <= kMaxGroup;
#ifdef OSCAR_LINEAR_AVX2
  for (int i = 0; i < count && one_region; ++i)
    one_region = bf16_split_path(ps[i]) && ps[i].n <= kFewRows && ps[i].n == ps[0].n &&
                 ps[i].x == ps[0].x &&
                 ps[i].w.cols == ps[0].w.cols;
#else
  one_region = false;
#endif
  if (!one_region || ps[0].n == 0) {
    for (int i = 0; i < count; ++i) OSCAR_RETURN_IF_ERROR(linear(ps[i]));
    return Status();
  }
#ifdef OSCAR_LINEAR_AVX2
  // The products' blocks as one list, in one loop of the decode pool: a batch-1 step's q/k/v and
  // gate/up are one loop instead of one per product (docs/results/bench_method.md).
  int64_t first[kMaxGroup + 1] = {0};
  int64_t madds = 0;
  for (int i = 0; i < count; ++i) {
    first[i + 1] = first[i] + n_blocks(ps[i]);
    madds += ps[i].n * ps[i].w.rows * ps[i].w.cols;
  }
  const float* xs = split_x(ps[0]);
  auto block = [&](int64_t g, int) {
    int i = 0;
    while (g >= first[i + 1]) ++i;
    streaming_task(ps[i], xs, g - first[i], 0, ps[i].n, bf16_split_dot(ps[i]));
  };
  if (worth_threads(first[count], madds))
    decode_parallel_for(first[count], block);
  else
    for (int64_t g = 0; g < first[count]; ++g) block(g, 0);
  for (int i = 0; i < count; ++i) add_bias(ps[i]);
#endif
  return Status();
}

}  // namespace oscar::kernels
