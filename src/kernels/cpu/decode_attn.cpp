// Fast CPU decode attention (kernels/decode_attn.h). Every segment (sinks, history, recent) is cut
// into chunks of `chunk_tokens`; one task (decode_pool.h) per (KV head, chunk) computes the
// split-KV partials (o, m, ℓ) of all gqa_ratio query heads of that KV head, so each K/V row is read
// and unpacked once per group. A chunk is processed in blocks of kBlock tokens: the block's K rows
// are scored against every head of the group (tiles of 8 FMA chains), the online softmax rescales
// what was accumulated, then the block's V rows go into the accumulators. BF16 and 2-bit rows are
// read in place (Bf16Rows, Int2Rows: widened and looked up 8 or 16 elements at a time inside the
// tiles); the 3-, 4- and 1-bit rows of a bit plan (and f32 pages) are first converted into a
// [kBlock, head_dim] float buffer (level tables of 8 and 2 entries, min + q·s from the nibbles).
// The next block's rows are prefetched. merge_attn_states combines the partials.
//
// AVX2+FMA (and F16C) intrinsics are used when the compiler targets them (-march=native);
// otherwise portable loops that compute the same values.

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define OSCAR_DECODE_AVX2 1
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "kernels/cpu/decode_pool.h"
#include "kernels/cpu/simd_lanes.h"
#include "kernels/decode_attn.h"
#include "quant/bit_plan_layout.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"
#include "quant/int4_layout.h"

namespace oscar::kernels {

namespace {

constexpr int kBlock = 32;              // tokens scored before the values are accumulated
constexpr int64_t kMinChunkTokens = 256;  // auto chunking never goes below this
constexpr int kMaxGqa = 16;

// --- Row conversion -----------------------------------------------------------------------------

// src: [d] bf16 (possibly unaligned) -> dst: [d] float.
inline void bf16_row_to_f32(const uint8_t* src, int d, float* dst) {
  int c = 0;
#ifdef OSCAR_DECODE_AVX2
  for (; c + 8 <= d; c += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(w));
  }
#endif
  for (; c < d; ++c) {
    bf16_t h;
    std::memcpy(&h, src + 2 * c, 2);
    dst[c] = bf16_to_f32(h);
  }
}

// fp16 metadata -> float (F16C when compiled for it).
inline float meta_f32(fp16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return fp16_to_f32(h);
#endif
}

// The four reconstruction values of group g of an INT2 row: min + k·s (uniform) or
// μ + L_k·σ (Lloyd-Max).
inline void int2_group_levels(const uint8_t* row, int d, int g, quant::HistQuantizer quantizer,
                              float (&level)[4]) {
  const quant::Int2GroupMeta meta = quant::read_group_meta(row, d, g);
  const float a = meta_f32(meta.slot0);
  const float b = meta_f32(meta.slot1);
  if (quantizer == quant::HistQuantizer::kInt2Lloyd) {
    for (int k = 0; k < 4; ++k) level[k] = b + quant::kLloydDequantLevels[k] * a;
  } else {
    for (int k = 0; k < 4; ++k) level[k] = b + static_cast<float>(k) * a;
  }
}

// One INT2 row (quant/int2_layout.h) -> [d] float. Each group's four reconstruction values go in
// a table; element i of the group takes level[(byte[i % q] >> 2(i / q)) & 3] with q = G/4.
inline void int2_row_to_f32(const uint8_t* row, int d, int G, quant::HistQuantizer quantizer,
                            float* dst) {
  const int n_groups = d / G;
  const int q = G / 4;
  for (int g = 0; g < n_groups; ++g) {
    float level[4];
    int2_group_levels(row, d, g, quantizer, level);
    const uint8_t* codes = row + quant::int2_group_codes_offset(g, G);
    float* og = dst + g * G;
#ifdef OSCAR_DECODE_AVX2
    // q is 8, 16 or 32: whole vectors of 8 bytes. Each byte is loaded once and yields one element
    // in each quarter.
    const __m256 lv = _mm256_setr_ps(level[0], level[1], level[2], level[3], level[0], level[1],
                                     level[2], level[3]);
    const __m256i three = _mm256_set1_epi32(3);
    for (int j = 0; j < q; j += 8) {
      uint64_t bytes;
      std::memcpy(&bytes, codes + j, 8);
      const __m256i c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(bytes)));
      _mm256_storeu_ps(og + j, _mm256_permutevar8x32_ps(lv, _mm256_and_si256(c, three)));
      _mm256_storeu_ps(og + q + j,
                       _mm256_permutevar8x32_ps(lv, _mm256_and_si256(_mm256_srli_epi32(c, 2), three)));
      _mm256_storeu_ps(og + 2 * q + j,
                       _mm256_permutevar8x32_ps(lv, _mm256_and_si256(_mm256_srli_epi32(c, 4), three)));
      _mm256_storeu_ps(og + 3 * q + j, _mm256_permutevar8x32_ps(lv, _mm256_srli_epi32(c, 6)));
    }
#else
    for (int j = 0; j < q; ++j) {
      const unsigned byte = codes[j];
      og[j] = level[byte & 3u];
      og[q + j] = level[(byte >> 2) & 3u];
      og[2 * q + j] = level[(byte >> 4) & 3u];
      og[3 * q + j] = level[byte >> 6];
    }
#endif
  }
}

// One INT3 row of a bit plan (quant/bit_plan_layout.h) -> [d] float: an 8-entry level table
// min + q·s per group. With q4 = G/4 and q8 = G/8, element k·q4 + j (quarter k) takes its low
// bits from code byte j at shift 2k and its high bit from plane byte j mod q8 at bit 2k + j/q8.
inline void int3_row_to_f32(const uint8_t* row, int d, int G, float* dst) {
  const int q4 = G / 4, q8 = G / 8;
  for (int g = 0; g < d / G; ++g) {
    quant::Int2GroupMeta meta;
    std::memcpy(&meta, row + quant::int3_group_meta_offset(d, g), sizeof meta);
    const float s = meta_f32(meta.slot0), mn = meta_f32(meta.slot1);
    float level[8];
    for (int k = 0; k < 8; ++k) level[k] = mn + static_cast<float>(k) * s;
    const uint8_t* codes = row + quant::int2_group_codes_offset(g, G);
    const uint8_t* high = row + quant::int3_group_high_offset(d, g, G);
    float* og = dst + g * G;
    int j0 = 0;
#ifdef OSCAR_DECODE_AVX2
    if (q8 % 8 == 0) {
      const __m256 lv = _mm256_loadu_ps(level);
      const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1);
      for (int j = 0; j < q8; j += 8) {
        uint64_t c0, c1, hb;
        std::memcpy(&c0, codes + j, 8);
        std::memcpy(&c1, codes + q8 + j, 8);
        std::memcpy(&hb, high + j, 8);
        const __m256i lo0 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(c0)));
        const __m256i lo1 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(c1)));
        const __m256i h = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(hb)));
        for (int k = 0; k < 4; ++k) {
          // Quarter k: low bits at shift 2k in both code bytes; high bits 2k (first half of the
          // quarter) and 2k + 1 (second half) of the plane byte.
          const __m128i sh = _mm_cvtsi32_si128(2 * k), sh_h1 = _mm_cvtsi32_si128(2 * k + 1);
          const __m256i a = _mm256_or_si256(
              _mm256_and_si256(_mm256_srl_epi32(lo0, sh), three),
              _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, sh), one), 2));
          const __m256i b = _mm256_or_si256(
              _mm256_and_si256(_mm256_srl_epi32(lo1, sh), three),
              _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, sh_h1), one), 2));
          _mm256_storeu_ps(og + k * q4 + j, _mm256_permutevar8x32_ps(lv, a));
          _mm256_storeu_ps(og + k * q4 + q8 + j, _mm256_permutevar8x32_ps(lv, b));
        }
      }
      j0 = q8;
    }
#endif
    for (int j = j0; j < q8; ++j) {
      const unsigned c0 = codes[j], c1 = codes[q8 + j], hb = high[j];
      for (int k = 0; k < 4; ++k) {
        og[k * q4 + j] = level[((c0 >> (2 * k)) & 3u) | (((hb >> (2 * k)) & 1u) << 2)];
        og[k * q4 + q8 + j] = level[((c1 >> (2 * k)) & 3u) | (((hb >> (2 * k + 1)) & 1u) << 2)];
      }
    }
  }
}

// One INT4 row (quant/int4_layout.h) -> [d] float: with h = G/2, element j of the group's first
// half is min + (byte[j] & 15)·s, element h + j is min + (byte[j] >> 4)·s. The product is rounded
// before the sum in the vector path, as in dequantize_row_int4_ref.
inline void int4_row_to_f32(const uint8_t* row, int d, int G, float* dst) {
  const int h = G / 2;
  for (int g = 0; g < d / G; ++g) {
    quant::Int2GroupMeta meta;
    std::memcpy(&meta, row + quant::int4_group_meta_offset(d, g), sizeof meta);
    const float s = meta_f32(meta.slot0), mn = meta_f32(meta.slot1);
    const uint8_t* codes = row + quant::int4_group_codes_offset(g, G);
    float* og = dst + g * G;
#ifdef OSCAR_DECODE_AVX2
    // h is 16, 32 or 64: whole vectors of 8 bytes, each yielding one element in each half.
    const __m256 vs = _mm256_set1_ps(s), vmn = _mm256_set1_ps(mn);
    const __m256i fifteen = _mm256_set1_epi32(15);
    for (int j = 0; j < h; j += 8) {
      uint64_t bytes;
      std::memcpy(&bytes, codes + j, 8);
      const __m256i c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(bytes)));
      const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(c, fifteen));
      const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4));
      _mm256_storeu_ps(og + j, _mm256_add_ps(vmn, _mm256_mul_ps(lo, vs)));
      _mm256_storeu_ps(og + h + j, _mm256_add_ps(vmn, _mm256_mul_ps(hi, vs)));
    }
#else
    float level[16];
    for (int k = 0; k < 16; ++k) level[k] = mn + static_cast<float>(k) * s;
    for (int j = 0; j < h; ++j) {
      const unsigned byte = codes[j];
      og[j] = level[byte & 15u];
      og[h + j] = level[byte >> 4];
    }
#endif
  }
}

// One INT1 row -> [d] float: element k·q8 + j is level[(plane byte j >> k) & 1], levels lo, hi.
inline void int1_row_to_f32(const uint8_t* row, int d, int G, float* dst) {
  const int q8 = G / 8;
  for (int g = 0; g < d / G; ++g) {
    quant::Int2GroupMeta meta;
    std::memcpy(&meta, row + quant::int1_group_meta_offset(d, g), sizeof meta);
    const float lo = meta_f32(meta.slot0), hi = meta_f32(meta.slot1);
    const uint8_t* plane = row + quant::int1_group_plane_offset(g, G);
    float* og = dst + g * G;
    int j0 = 0;
#ifdef OSCAR_DECODE_AVX2
    if (q8 % 8 == 0) {
      const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
      const __m256i one = _mm256_set1_epi32(1);
      for (int j = 0; j < q8; j += 8) {
        uint64_t pb;
        std::memcpy(&pb, plane + j, 8);
        const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(pb)));
        for (int k = 0; k < 8; ++k) {
          const __m256i bit = _mm256_and_si256(_mm256_srl_epi32(b, _mm_cvtsi32_si128(k)), one);
          const __m256 take_hi = _mm256_castsi256_ps(_mm256_cmpeq_epi32(bit, one));
          _mm256_storeu_ps(og + k * q8 + j, _mm256_blendv_ps(vlo, vhi, take_hi));
        }
      }
      j0 = q8;
    }
#endif
    // The plane bytes are copied first: stores to og (float) may alias them (uint8_t), which
    // would otherwise force a reload per element.
    uint8_t bytes[16];
    std::memcpy(bytes, plane, static_cast<size_t>(q8));
    for (int k = 0; k < 8; ++k)
      for (int j = j0; j < q8; ++j) og[k * q8 + j] = ((bytes[j] >> k) & 1u) ? hi : lo;
  }
}

// --- Small vector kernels -----------------------------------------------------------------------

inline float dot(const float* a, const float* b, int d) {
  int c = 0;
  float s = 0.f;
#ifdef OSCAR_DECODE_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; c + 16 <= d; c += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 8), _mm256_loadu_ps(b + c + 8), acc1);
  }
  s = simd::hsum(_mm256_add_ps(acc0, acc1));
#else
  // Eight independent partial sums (vectorisable without reassociation flags).
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; c + 8 <= d; c += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[c + k] * b[c + k];
  for (int k = 0; k < 8; ++k) s += acc[k];
#endif
  for (; c < d; ++c) s += a[c] * b[c];
  return s;
}

// y += w * x over [d].
inline void axpy(float w, const float* x, int d, float* y) {
  for (int c = 0; c < d; ++c) y[c] += w * x[c];
}

#ifdef OSCAR_DECODE_AVX2
// The eight sums of v[0..7] as one vector (lane k = Σ v[k]): a tree of horizontal adds instead of
// eight separate reductions.
inline __m256 hsum8(const __m256 (&v)[8]) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Row sources of the score tiles: a block's rows unpacked into floats (8 elements a step), or
// BF16 rows read in place (16 elements a step as their even and odd halves, simd_lanes.h; q split
// to match). Vector v of a step at element c meets q[c + 8v] either way.
struct FloatRows {
  static constexpr int kStep = 8, kVecs = 1;
  const float* rows;  // [nb, d]
  int d;
  void load(int j, int c, __m256 (&x)[kVecs]) const {
    x[0] = _mm256_loadu_ps(rows + static_cast<size_t>(j) * d + c);
  }
};
struct Bf16Rows {
  static constexpr int kStep = 16, kVecs = 2;
  const uint8_t* const* rows;  // row j's first byte
  void load(int j, int c, __m256 (&x)[kVecs]) const {
    simd::load_bf16x16(rows[j] + 2 * c, x[0], x[1]);
  }
};

// INT2 rows (uniform or Lloyd-Max, 2 bits per element) read in place: element c of row j is
// level_{j,g}[byte >> 2k], with g its group, k its quarter and byte the code byte it shares with
// the other three quarters (quant/int2_layout.h). Each row's levels are set up once per block
// (`int2_levels`) as the group's four values twice, so the permute's third index bit, the next
// code's low bit, picks the same value and no mask is needed. Same values as int2_row_to_f32.
struct Int2Rows {
  static constexpr int kStep = 8, kVecs = 1;
  // Where elements c..c+7 (c = 8s) of every row sit: code byte offset, bit shift, group.
  struct Step {
    int32_t code_off, shift, group;
  };
  const uint8_t* const* rows;  // row j's first byte
  const float* levels;         // [nb, n_groups, 8]
  int n_groups;
  const Step* steps;  // [d / 8]
  void load(int j, int c, __m256 (&x)[kVecs]) const {
    const Step& st = steps[c / 8];
    const __m256i bytes = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[j] + st.code_off)));
    x[0] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(levels + 8 * (j * n_groups + st.group)),
                                    _mm256_srl_epi32(bytes, _mm_cvtsi32_si128(st.shift)));
  }
};

// Int2Rows' per-element steps for head_dim d and group size G (q = G/4 code bytes a group).
inline void int2_steps(int d, int G, Int2Rows::Step* steps) {
  const int q = G / 4;
  for (int c = 0; c < d; c += 8) {
    const int g = c / G, i = c % G;
    steps[c / 8] = Int2Rows::Step{g * q + i % q, 2 * (i / q), g};
  }
}

// Row j's levels for Int2Rows: per group, the four reconstruction values twice.
inline void int2_levels(const uint8_t* const* rows, int nb, int d, int G,
                        quant::HistQuantizer quantizer, float* levels) {
  const int n_groups = d / G;
  for (int j = 0; j < nb; ++j)
    for (int g = 0; g < n_groups; ++g) {
      float lv[4];
      int2_group_levels(rows[j], d, g, quantizer, lv);
      float* out = levels + 8 * (j * n_groups + g);
      for (int k = 0; k < 8; ++k) out[k] = lv[k % 4];
    }
}

// sc[h * kBlock + j] = scale · q_h · row j for h < gqa, j < nb. Tiles of R = 8 / H rows x H heads
// (H | gqa): eight independent FMA chains (one chain is latency-bound), reduced together by hsum8.
template <int H, int kBlockT, class Rows>
void block_scores_tiled(const float* q, int gqa, const Rows& rows, int nb, int d, float scale,
                        float* sc) {
  constexpr int R = 8 / H;
  int j = 0;
  for (; j + R <= nb; j += R)
    for (int h = 0; h < gqa; h += H) {
      __m256 acc[8];
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
      const float* q0 = q + static_cast<size_t>(h) * d;
      for (int c = 0; c < d; c += Rows::kStep)
        for (int r = 0; r < R; ++r) {
          __m256 x[Rows::kVecs];
          rows.load(j + r, c, x);
          for (int u = 0; u < H; ++u)
            for (int v = 0; v < Rows::kVecs; ++v)
              acc[r * H + u] =
                  _mm256_fmadd_ps(_mm256_loadu_ps(q0 + static_cast<size_t>(u) * d + c + 8 * v),
                                  x[v], acc[r * H + u]);
        }
      alignas(32) float out[8];
      _mm256_store_ps(out, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
      for (int r = 0; r < R; ++r)
        for (int u = 0; u < H; ++u) sc[(h + u) * kBlockT + j + r] = out[r * H + u];
    }
  for (; j < nb; ++j)  // the block's last rows (a chunk's tail)
    for (int h = 0; h < gqa; ++h) {
      __m256 acc = _mm256_setzero_ps();
      for (int c = 0; c < d; c += Rows::kStep) {
        __m256 x[Rows::kVecs];
        rows.load(j, c, x);
        for (int v = 0; v < Rows::kVecs; ++v)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + static_cast<size_t>(h) * d + c + 8 * v), x[v],
                                acc);
      }
      sc[h * kBlockT + j] = simd::hsum(acc) * scale;
    }
}

template <int kBlockT, class Rows>
void block_scores_any(const float* q, int gqa, const Rows& rows, int nb, int d, float scale,
                      float* sc) {
  if (gqa % 8 == 0) return block_scores_tiled<8, kBlockT>(q, gqa, rows, nb, d, scale, sc);
  if (gqa % 4 == 0) return block_scores_tiled<4, kBlockT>(q, gqa, rows, nb, d, scale, sc);
  if (gqa % 2 == 0) return block_scores_tiled<2, kBlockT>(q, gqa, rows, nb, d, scale, sc);
  return block_scores_tiled<1, kBlockT>(q, gqa, rows, nb, d, scale, sc);
}

// e^x for x <= 0 (softmax weights relative to the running max), eight at a time: x = n·ln2 + r,
// |r| <= ln2/2, e^r by a degree-6 polynomial (Cephes' expf coefficients, ~1 ulp), 2^n through the
// exponent bits. Below -87.3 the result is flushed to 0 (float's normal range).
inline __m256 exp_nonpos(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
#endif

// sc[h * kBlock + j] = scale · q_h · rows[j] for h < gqa, j < nb. q: [gqa, d]; rows: [nb, d].
template <int kBlockT>
void block_scores(const float* q, int gqa, const float* rows, int nb, int d, float scale,
                  float* sc) {
#ifdef OSCAR_DECODE_AVX2
  if (d % 8 == 0) return block_scores_any<kBlockT>(q, gqa, FloatRows{rows, d}, nb, d, scale, sc);
#endif
  for (int j = 0; j < nb; ++j)
    for (int h = 0; h < gqa; ++h)
      sc[h * kBlockT + j] =
          dot(q + static_cast<size_t>(h) * d, rows + static_cast<size_t>(j) * d, d) * scale;
}

// Block weights of one head: w[j] = e^(w[j] − mb) in place for j < nb; returns their sum.
inline float block_weights(float* w, int nb, float mb) {
  int j = 0;
  float sum = 0.f;
#ifdef OSCAR_DECODE_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 m = _mm256_set1_ps(mb);
  for (; j + 8 <= nb; j += 8) {
    const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(w + j), m));
    _mm256_storeu_ps(w + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float a[8];
  _mm256_store_ps(a, acc);
  for (float v : a) sum += v;
#endif
  for (; j < nb; ++j) {
    w[j] = std::exp(w[j] - mb);
    sum += w[j];
  }
  return sum;
}

// o[h] += Σ_j w[h * kBlock + j] · rows[j] for h < gqa. o: [gqa, d]; rows: [nb, d].
// Each 32-float slice of o_h stays in registers across the block.
template <int kBlockT>
void block_values(const float* w, int gqa, const float* rows, int nb, int d, float* o) {
#ifdef OSCAR_DECODE_AVX2
  if (d % 64 == 0) {
    // 64 floats of o_h in eight registers: eight independent FMA chains over the block.
    for (int h = 0; h < gqa; ++h) {
      float* oh = o + static_cast<size_t>(h) * d;
      const float* wh = w + h * kBlockT;
      for (int c = 0; c < d; c += 64) {
        __m256 a[8];
        for (int k = 0; k < 8; ++k) a[k] = _mm256_loadu_ps(oh + c + 8 * k);
        for (int j = 0; j < nb; ++j) {
          const __m256 wj = _mm256_set1_ps(wh[j]);
          const float* r = rows + static_cast<size_t>(j) * d + c;
          for (int k = 0; k < 8; ++k) a[k] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 8 * k), a[k]);
        }
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(oh + c + 8 * k, a[k]);
      }
    }
    return;
  }
  if (d % 32 == 0) {
    for (int h = 0; h < gqa; ++h) {
      float* oh = o + static_cast<size_t>(h) * d;
      const float* wh = w + h * kBlockT;
      for (int c = 0; c < d; c += 32) {
        __m256 a0 = _mm256_loadu_ps(oh + c), a1 = _mm256_loadu_ps(oh + c + 8);
        __m256 a2 = _mm256_loadu_ps(oh + c + 16), a3 = _mm256_loadu_ps(oh + c + 24);
        for (int j = 0; j < nb; ++j) {
          const __m256 wj = _mm256_set1_ps(wh[j]);
          const float* r = rows + static_cast<size_t>(j) * d + c;
          a0 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r), a0);
          a1 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 8), a1);
          a2 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 16), a2);
          a3 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(r + 24), a3);
        }
        _mm256_storeu_ps(oh + c, a0);
        _mm256_storeu_ps(oh + c + 8, a1);
        _mm256_storeu_ps(oh + c + 16, a2);
        _mm256_storeu_ps(oh + c + 24, a3);
      }
    }
    return;
  }
#endif
  for (int j = 0; j < nb; ++j)
    for (int h = 0; h < gqa; ++h)
      axpy(w[h * kBlockT + j], rows + static_cast<size_t>(j) * d, d, o + static_cast<size_t>(h) * d);
}

#ifdef OSCAR_DECODE_AVX2
// block_values for rows read in place (Bf16Rows: o kept split to match; Int2Rows): o[h] +=
// Σ_j w[h * kBlock + j] · rows[j]. Two heads per pass over 32 elements: 8 accumulators, each row
// slice converted once for both. Needs d % 32 == 0.
template <int kBlockT, class Rows>
void block_values_rows(const float* w, int gqa, const Rows& rows, int nb, int d, float* o) {
  static_assert(32 % Rows::kStep == 0 && Rows::kStep == 8 * Rows::kVecs);
  for (int h = 0; h < gqa; h += 2) {
    const bool two = h + 1 < gqa;
    float* o0 = o + static_cast<size_t>(h) * d;
    float* o1 = two ? o0 + d : o0;
    const float* w0 = w + h * kBlockT;
    const float* w1 = two ? w0 + kBlockT : w0;
    for (int c = 0; c < d; c += 32) {
      __m256 a[4], b[4];
      for (int k = 0; k < 4; ++k) {
        a[k] = _mm256_loadu_ps(o0 + c + 8 * k);
        b[k] = two ? _mm256_loadu_ps(o1 + c + 8 * k) : _mm256_setzero_ps();
      }
      for (int j = 0; j < nb; ++j) {
        __m256 x[4];
        for (int s = 0; s < 32; s += Rows::kStep) {
          __m256 y[Rows::kVecs];
          rows.load(j, c + s, y);
          for (int v = 0; v < Rows::kVecs; ++v) x[s / 8 + v] = y[v];
        }
        const __m256 wa = _mm256_set1_ps(w0[j]), wb = _mm256_set1_ps(w1[j]);
        for (int k = 0; k < 4; ++k) {
          a[k] = _mm256_fmadd_ps(wa, x[k], a[k]);
          b[k] = _mm256_fmadd_ps(wb, x[k], b[k]);
        }
      }
      for (int k = 0; k < 4; ++k) {
        _mm256_storeu_ps(o0 + c + 8 * k, a[k]);
        if (two) _mm256_storeu_ps(o1 + c + 8 * k, b[k]);
      }
    }
  }
}
#endif

// --- Chunks -------------------------------------------------------------------------------------

enum class SegKind { kExact, kInt2 };

struct Chunk {
  const PageTableView* seg;
  int32_t seq;         // sequence of the batch
  SegKind kind;
  int64_t begin, end;  // token range inside the sequence's segment
};

int64_t auto_chunk_tokens(const DecodeAttnParams& p, int64_t total_tokens) {
  if (p.chunk_tokens > 0) return p.chunk_tokens;
  // About four tasks per thread, never chunks so small that merging dominates.
  const int64_t n_threads = decode_pool_threads();
  const int64_t chunks_per_head = std::max<int64_t>(1, (4 * n_threads + p.layout.n_heads_kv - 1) /
                                                           p.layout.n_heads_kv);
  int64_t c = std::max(kMinChunkTokens, (total_tokens + chunks_per_head - 1) / chunks_per_head);
  const int64_t P = p.layout.page_size;
  return (c + P - 1) / P * P;  // whole pages
}

// Per-thread scratch for one task.
struct TaskScratch {
  std::vector<float> rows;    // [kBlock, head_dim] unpacked K, then V, rows of one block
  std::vector<float> scores;  // [gqa, kBlock]
  std::vector<float> o;       // [gqa, head_dim]
  std::vector<float> qs;      // [gqa, head_dim]: q split for BF16 rows read in place
#ifdef OSCAR_DECODE_AVX2
  std::vector<float> levels;          // [kBlock, groups, 8]: INT2 rows read in place
  std::vector<Int2Rows::Step> steps;  // [head_dim / 8]
#endif
};

// Partials of query heads [g*gqa, (g+1)*gqa) over one chunk. o_out: [gqa, d] rows with stride d,
// m_out / l_out: [gqa].
void chunk_partial(const DecodeAttnParams& p, const Chunk& ch, int g, TaskScratch& s, float* o_out,
                   float* m_out, float* l_out) {
  const KvPageLayout& L = p.layout;
  const int d = L.head_dim;
  const int gqa = p.n_heads_q / L.n_heads_kv;
  const float* q = p.q + (static_cast<int64_t>(ch.seq) * p.n_heads_q + g * gqa) * d;
  const bool int2 = ch.kind == SegKind::kInt2;
  const uint8_t* pool = int2 ? p.hist_pool : p.exact_pool;
  // This sequence's page ids of the segment, in token order.
  const int32_t* pages = ch.seg->page_ids + ch.seg->indptr[ch.seq];
  const size_t page_bytes = int2 ? L.int2_page_bytes() : L.exact_page_bytes();
  const size_t off_k = int2 ? L.int2_row_offset(p.layer, 0, g, 0) : L.exact_row_offset(p.layer, 0, g, 0);
  const size_t off_v = int2 ? L.int2_row_offset(p.layer, 1, g, 0) : L.exact_row_offset(p.layer, 1, g, 0);
  // K and V rows differ in width under a bit plan (4, 3, 2 or 1 bits per element).
  const size_t rb_k = int2 ? L.hist_row_bytes(p.layer, 0, g) : L.exact_row_bytes();
  const size_t rb_v = int2 ? L.hist_row_bytes(p.layer, 1, g) : L.exact_row_bytes();
  const int bits_k = int2 ? L.hist_row_bits(p.layer, 0, g) : 16;
  const int bits_v = int2 ? L.hist_row_bits(p.layer, 1, g) : 16;

  // Prefetches rows [t0, t1) of K and V: pages are scattered in the pool, so the hardware
  // prefetcher loses the stream at every page edge (INT2 pages hold only page_size * 36 bytes of
  // one head's rows).
  auto prefetch = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1;) {
      const int64_t run_end = std::min(t1, (t / L.page_size + 1) * L.page_size);
      const uint8_t* page = pool + static_cast<size_t>(pages[t / L.page_size]) * page_bytes;
      for (const auto& [off, rb] : {std::pair{off_k, rb_k}, std::pair{off_v, rb_v}}) {
        const size_t a = static_cast<size_t>(t % L.page_size) * rb;
        const size_t b = a + static_cast<size_t>(run_end - t) * rb;
        for (size_t x = a; x < b; x += 64) __builtin_prefetch(page + off + x);
        __builtin_prefetch(page + off + b - 1);
      }
      t = run_end;
    }
  };

  auto row_at = [&](int64_t t, size_t off, size_t row_bytes) {
    return pool + static_cast<size_t>(pages[t / L.page_size]) * page_bytes + off +
           static_cast<size_t>(t % L.page_size) * row_bytes;
  };
  auto load = [&](int64_t t, size_t off, size_t row_bytes, int bits, float* dst) {
    const uint8_t* src = row_at(t, off, row_bytes);
    if (bits == 4) {
      int4_row_to_f32(src, d, p.group_size, dst);
    } else if (bits == 3) {
      int3_row_to_f32(src, d, p.group_size, dst);
    } else if (bits == 1) {
      int1_row_to_f32(src, d, p.group_size, dst);
    } else if (int2) {
      int2_row_to_f32(src, d, p.group_size, p.quantizer, dst);
    } else if (L.exact_elem_bytes == 2) {
      bf16_row_to_f32(src, d, dst);
    } else {
      std::memcpy(dst, src, sizeof(float) * d);
    }
  };

  float m[kMaxGqa], l[kMaxGqa];
  for (int h = 0; h < gqa; ++h) {
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.f;
  }
  std::fill(s.o.begin(), s.o.begin() + static_cast<size_t>(gqa) * d, 0.f);
  float* rows = s.rows.data();
  float* sc = s.scores.data();
#ifdef OSCAR_DECODE_AVX2
  // Rows read in place where the format allows (BF16; 2-bit history rows), else unpacked into
  // `rows` first.
  const bool bf16_in_place = !int2 && L.exact_elem_bytes == 2 && d % 32 == 0;
  const bool k_in_place = bf16_in_place || (int2 && bits_k == 2 && d % 32 == 0);
  const bool v_in_place = bf16_in_place || (int2 && bits_v == 2 && d % 32 == 0);
  if (bf16_in_place)
    for (int h = 0; h < gqa; ++h)
      simd::split_16(q + static_cast<size_t>(h) * d, d, s.qs.data() + static_cast<size_t>(h) * d);
  const int n_groups = d / p.group_size;
  // Scores (K) or values (V) of one block from rows read in place.
  const uint8_t* row_ptr[kBlock];
  auto in_place_rows = [&](int64_t t0, int nb, size_t off, size_t rb) {
    for (int j = 0; j < nb; ++j) row_ptr[j] = row_at(t0 + j, off, rb);
    if (int2) int2_levels(row_ptr, nb, d, p.group_size, p.quantizer, s.levels.data());
  };
  const Int2Rows int2_rows{row_ptr, s.levels.data(), n_groups, s.steps.data()};
#else
  constexpr bool bf16_in_place = false, k_in_place = false, v_in_place = false;
#endif

  prefetch(ch.begin, std::min<int64_t>(ch.end, ch.begin + kBlock));
  for (int64_t t0 = ch.begin; t0 < ch.end; t0 += kBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kBlock, ch.end - t0));
    prefetch(t0 + nb, std::min<int64_t>(ch.end, t0 + nb + kBlock));
    // Scores of the block: its K rows unpacked once, every head of the group reads them.
    if (k_in_place) {
#ifdef OSCAR_DECODE_AVX2
      in_place_rows(t0, nb, off_k, rb_k);
      if (int2)
        block_scores_any<kBlock>(q, gqa, int2_rows, nb, d, p.scale, sc);
      else
        block_scores_any<kBlock>(s.qs.data(), gqa, Bf16Rows{row_ptr}, nb, d, p.scale, sc);
#endif
    } else {
      for (int j = 0; j < nb; ++j)
        load(t0 + j, off_k, rb_k, bits_k, rows + static_cast<size_t>(j) * d);
      block_scores<kBlock>(q, gqa, rows, nb, d, p.scale, sc);
    }
    // Online softmax: new running max, rescale what was accumulated, block weights.
    for (int h = 0; h < gqa; ++h) {
      float mb = m[h];
      for (int j = 0; j < nb; ++j) mb = std::max(mb, sc[h * kBlock + j]);
      const float alpha = m[h] == -std::numeric_limits<float>::infinity() ? 0.f
                                                                          : std::exp(m[h] - mb);
      if (alpha != 1.f) {
        float* oh = s.o.data() + static_cast<size_t>(h) * d;
        for (int c = 0; c < d; ++c) oh[c] *= alpha;
      }
      const float lb = block_weights(sc + h * kBlock, nb, mb);
      l[h] = l[h] * alpha + lb;
      m[h] = mb;
    }
    // Values: the block's V rows unpacked once, shared by the group.
    if (v_in_place) {
#ifdef OSCAR_DECODE_AVX2
      in_place_rows(t0, nb, off_v, rb_v);
      if (int2)
        block_values_rows<kBlock>(sc, gqa, int2_rows, nb, d, s.o.data());
      else
        block_values_rows<kBlock>(sc, gqa, Bf16Rows{row_ptr}, nb, d, s.o.data());
#endif
    } else {
      for (int j = 0; j < nb; ++j)
        load(t0 + j, off_v, rb_v, bits_v, rows + static_cast<size_t>(j) * d);
      block_values<kBlock>(sc, gqa, rows, nb, d, s.o.data());
    }
  }
  for (int h = 0; h < gqa; ++h) {
    m_out[h] = m[h];
    l_out[h] = l[h];
    if (bf16_in_place)
      simd::merge_16(s.o.data() + static_cast<size_t>(h) * d, d,
                     o_out + static_cast<size_t>(h) * d);
    else
      std::memcpy(o_out + static_cast<size_t>(h) * d, s.o.data() + static_cast<size_t>(h) * d,
                  sizeof(float) * d);
  }
}

}  // namespace

Status decode_attn(const DecodeAttnParams& p) {
  OSCAR_RETURN_IF_ERROR(validate_decode_attn(p));
  const KvPageLayout& L = p.layout;
  const int d = L.head_dim;
  const int H = L.n_heads_kv;
  const int gqa = p.n_heads_q / H;
  if (gqa > kMaxGqa)
    return invalid_argument("decode_attn: gqa_ratio %d > %d (fast path)", gqa, kMaxGqa);

  auto seq_tokens = [&](int s) {
    return p.sinks.seq_len(s, L.page_size) + p.history.seq_len(s, L.page_size) +
           p.recent.seq_len(s, L.page_size);
  };
  int64_t total = 0;
  for (int s = 0; s < p.n_seqs; ++s) total += seq_tokens(s);
  // Batch-invariant: a sequence's chunk size follows from its own length only, so its split-KV
  // partials, and the order merge_attn_states combines them in, do not depend on the batch.
  const int64_t batch_chunk = auto_chunk_tokens(p, total);
  // Chunks sequence by sequence, so that each sequence's partials are contiguous.
  std::vector<Chunk> chunks;
  std::vector<int32_t> seq_parts(static_cast<size_t>(p.n_seqs) + 1, 0);  // [n_seqs + 1] offsets
  for (int s = 0; s < p.n_seqs; ++s) {
    const int64_t chunk = p.batch_invariant ? auto_chunk_tokens(p, seq_tokens(s)) : batch_chunk;
    auto add = [&](const PageTableView& seg, SegKind kind) {
      const int64_t n = seg.seq_len(s, L.page_size);
      for (int64_t b = 0; b < n; b += chunk)
        chunks.push_back(Chunk{&seg, s, kind, b, std::min(n, b + chunk)});
    };
    add(p.sinks, SegKind::kExact);
    add(p.history, SegKind::kInt2);
    add(p.recent, SegKind::kExact);
    seq_parts[s + 1] = static_cast<int32_t>(chunks.size());
  }
  const int n_parts = static_cast<int>(chunks.size());

  // Partials: [n_parts, n_heads_q, d] and [n_parts, n_heads_q].
  std::vector<float> part_o(static_cast<size_t>(n_parts) * p.n_heads_q * d);
  std::vector<float> part_m(static_cast<size_t>(n_parts) * p.n_heads_q);
  std::vector<float> part_l(part_m.size());
  const int n_tasks = n_parts * H;
  // Small problems are not worth waking the thread team.
  const bool parallel = total * H * d >= (int64_t{1} << 16) && n_tasks > 1;

  // The tasks over the decode pool's threads (kernels/cpu/decode_pool.h), then the per-sequence
  // merges. Scratch is per thread and kept between calls (it only grows).
  auto task = [&](int64_t t, int) {
    thread_local TaskScratch s;
    s.rows.resize(static_cast<size_t>(kBlock) * d);
    s.scores.resize(static_cast<size_t>(gqa) * kBlock);
    s.o.resize(static_cast<size_t>(gqa) * d);
    s.qs.resize(static_cast<size_t>(gqa) * d);
#ifdef OSCAR_DECODE_AVX2
    if (quant::int2_valid_group(d, p.group_size)) {  // for INT2 rows read in place
      s.levels.resize(static_cast<size_t>(kBlock) * (d / p.group_size) * 8);
      s.steps.resize(static_cast<size_t>(d / 8));
      int2_steps(d, p.group_size, s.steps.data());
    }
#endif
    const int pi = static_cast<int>(t / H);
    const int g = static_cast<int>(t % H);
    const size_t r0 = static_cast<size_t>(pi) * p.n_heads_q + static_cast<size_t>(g) * gqa;
    chunk_partial(p, chunks[pi], g, s, part_o.data() + r0 * d, part_m.data() + r0,
                  part_l.data() + r0);
  };
  auto merge = [&](int64_t q, int) {
    const size_t first = static_cast<size_t>(seq_parts[q]) * p.n_heads_q;
    merge_attn_states(part_o.data() + first * d, part_m.data() + first, part_l.data() + first,
                      seq_parts[q + 1] - seq_parts[q], p.n_heads_q, d, p.n_heads_q,
                      p.out + static_cast<size_t>(q) * p.n_heads_q * d);
  };
  if (parallel) {
    decode_parallel_for(n_tasks, task);
    decode_parallel_for(p.n_seqs, merge);
  } else {
    for (int t = 0; t < n_tasks; ++t) task(t, 0);
    for (int q = 0; q < p.n_seqs; ++q) merge(q, 0);
  }
  return Status();
}

}  // namespace oscar::kernels
