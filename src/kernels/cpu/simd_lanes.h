// AVX2 helpers shared by the CPU kernels (linear.cpp, decode_attn.cpp).
//
// BF16 rows read without widening loads: a 32-byte load holds 16 elements, and each 32-bit word's
// low half shifted up is the even element's float, its high half masked the odd one's. The float
// operands they meet are kept "split" to match: per 16 elements, the 8 even ones, then the 8 odd
// ones (split_16 / merge_16, portable).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define OSCAR_SIMD_AVX2 1
#endif

#include <cstdint>

namespace oscar::kernels::simd {

// x[0, n) -> xs in split order; n % 16 == 0.
inline void split_16(const float* x, int64_t n, float* xs) {
  for (int64_t c = 0; c < n; c += 16)
    for (int k = 0; k < 8; ++k) {
      xs[c + k] = x[c + 2 * k];
      xs[c + 8 + k] = x[c + 2 * k + 1];
    }
}

// The inverse of split_16.
inline void merge_16(const float* xs, int64_t n, float* x) {
  for (int64_t c = 0; c < n; c += 16)
    for (int k = 0; k < 8; ++k) {
      x[c + 2 * k] = xs[c + k];
      x[c + 2 * k + 1] = xs[c + 8 + k];
    }
}

#ifdef OSCAR_SIMD_AVX2
// 16 BF16 values at p (unaligned) as floats: the 8 even elements and the 8 odd ones.
inline void load_bf16x16(const void* p, __m256& even, __m256& odd) {
  const __m256i w = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Σ of the 8 lanes.
inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

}  // namespace oscar::kernels::simd
