// Device code of demote_pages_cuda (kernels/demote_pages.h; host side in demote_pages.cu): one
// warp per history row (page, layer, K/V, head, slot), 32·NR values of head_dim = 32·NR, element
// r of the row in register r / 32 of lane r % 32. Every float operation of the CPU reference
// quantizers (quant/int2_quant.cpp, bit_plan_quant.cpp, kivi.cpp, row_common.h; compiled with
// -ffp-contract=off) is reproduced in the same order with explicitly rounded intrinsics
// (__fadd_rn, __fdiv_rn, __dmul_rn, ...; the file is also compiled with --fmad=false), so the
// bytes are identical to the CPU's:
//   - the clip quantile: a bitonic sort of |x| across the warp, then the same order statistics
//     and the same float64 interpolation as clip_threshold_ref;
//   - min/max of the clipped group: std::min/std::max semantics, including which of −0/+0 wins
//     (the first in element order), by a (value, index) reduction;
//   - float64 sums that the CPU evaluates sequentially (Lloyd mean, INT1 Lloyd rounds): a warp
//     reduction when every partial sum is provably exact (sums_exact()), else lane 0 runs the
//     CPU's loop over shared memory. The Lloyd sum of squares is always sequential (lane 0).
//   - fp16 conversions: ports of core/bf16.h.
// Not here: validation and launch (demote_pages.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/demote_pages.h"
#include "kernels/kv_layout.h"
#include "quant/bit_plan_layout.h"
#include "quant/bit_plan_quant.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"
#include "quant/int4_layout.h"
#include "quant/kivi.h"
#include "quant/row_codec.h"

namespace oscar::kernels::cuda_demote {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxGroup = 128;

struct Args {
  KvPageLayout L;  // device pointers for hist_bits / hist_row_prefix
  quant::HistQuantizer quantizer;
  int32_t group_size;
  const float* k_clip;  // [n_layers * n_heads_kv] device, or null (= 1)
  const float* v_clip;
  const uint8_t* exact_pool;  // [*, L.exact_page_bytes()]
  uint8_t* hist_pool;         // [*, L.int2_page_bytes()]
  const int32_t* src_pages;   // [n_pages]
  const int32_t* dst_pages;   // [n_pages]
  int32_t* status;            // [n_pages], zeroed (kDemoteOk) before the launch
  int64_t n_rows;             // n_pages · n_layers · 2 · n_heads_kv · page_size
};

// ---- fp16 (ports of core/bf16.h, bit for bit)
// ----------------------------------------------------

__device__ __forceinline__ float fp16_to_f32_dev(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return __uint_as_float(bits);
}

__device__ __forceinline__ uint16_t f32_to_fp16_dev(float f) {
  const uint32_t bits = __float_as_uint(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = mant >> shift;
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded >> 13) - ((127 - 15) << 10)));
}

__device__ __forceinline__ bool finite_f(float v) {
  return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

// std::min(std::max(v, −thr), thr), with std::min/max's choice among equal operands.
__device__ __forceinline__ float clamp_abs(float v, float thr) {
  const float nthr = -thr;
  const float a = (v < nthr) ? nthr : v;
  return (thr < a) ? thr : a;
}

// ---- warp helpers
// ----------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// Element p (0 <= p < 32V) of a group held as a[k] at element k·32 + lane; p warp-uniform.
template <int V>
__device__ __forceinline__ float pick(const float (&a)[V], int p) {
  float sel = a[0];
#pragma unroll
  for (int k = 1; k < V; ++k)
    if (k == p / 32) sel = a[k];
  return __shfl_sync(kFull, sel, p % 32);
}

// Ascending bitonic sort of the 32V values of a group (element k·32 + lane in a[k]). Values are
// |x| of finite x: no NaN, and equal values have equal bits.
template <int V>
__device__ __forceinline__ void warp_sort(float (&a)[V], int lane) {
  constexpr int G = 32 * V;
#pragma unroll
  for (int size = 2; size <= G; size <<= 1) {
#pragma unroll
    for (int j = size >> 1; j > 0; j >>= 1) {
      if (j >= 32) {
        const int jr = j / 32;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          if ((k & jr) == 0) {
            const bool up = ((k * 32) & size) == 0;
            const float x = a[k], y = a[k | jr];
            const bool swap = up ? (y < x) : (x < y);
            a[k] = swap ? y : x;
            a[k | jr] = swap ? x : y;
          }
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float y = __shfl_xor_sync(kFull, a[k], j);
          const bool up = ((k * 32 + lane) & size) == 0;
          const bool lower = (lane & j) == 0;
          a[k] = (lower == up) ? fminf(a[k], y) : fmaxf(a[k], y);
        }
      }
    }
  }
}

// clip_threshold_ref (quant/int2_quant.cpp): the ρ-quantile of |x| over the group, linear
// interpolation between order statistics in float64; +inf for ρ >= 1.
template <int V>
__device__ float clip_threshold(const float (&x)[V], float clip, int lane) {
  if (clip >= 1.0f) return __int_as_float(0x7f800000);
  constexpr int n = 32 * V;
  float a[V];
#pragma unroll
  for (int k = 0; k < V; ++k) a[k] = fabsf(x[k]);
  warp_sort<V>(a, lane);
  const double pos = __dmul_rn(static_cast<double>(clip), static_cast<double>(n - 1));
  int lo = static_cast<int>(floor(pos));
  lo = lo < n - 1 ? lo : n - 1;
  const double frac = __dsub_rn(pos, static_cast<double>(lo));
  const float a_lo = pick<V>(a, lo);
  if (frac == 0.0 || lo + 1 >= n) return a_lo;
  const float a_hi = pick<V>(a, lo + 1);
  const double d = __dsub_rn(static_cast<double>(a_hi), static_cast<double>(a_lo));
  return __double2float_rn(__dadd_rn(static_cast<double>(a_lo), __dmul_rn(frac, d)));
}

// True when every partial sum, in any order, of the group's values is exact in float64: all are
// multiples of 2^lo (lo = the lowest set bit over the group) and |sum| < 2^7 · 2^(hi + 1) (hi =
// the largest exponent, at most 128 values) < 2^(lo + 53) when hi − lo <= 45. Then a warp tree
// sum equals the CPU's sequential sum bit for bit.
template <int V>
__device__ bool sums_exact(const float (&v)[V]) {
  int hi = -100000, lo = 100000;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const uint32_t u = __float_as_uint(v[k]) & 0x7fffffffu;
    if (u == 0) continue;
    const int ex = static_cast<int>(u >> 23);
    uint32_t m = u & 0x7fffffu;
    int h, l;
    if (ex == 0) {  // subnormal: m · 2^-149
      h = -149 + 31 - __clz(m);
      l = -149 + __ffs(m) - 1;
    } else {
      m |= 0x800000u;
      h = ex - 127;
      l = ex - 150 + __ffs(m) - 1;
    }
    hi = h > hi ? h : hi;
    lo = l < lo ? l : lo;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    hi = max(hi, __shfl_xor_sync(kFull, hi, off));
    lo = min(lo, __shfl_xor_sync(kFull, lo, off));
  }
  return lo > hi || hi - lo <= 45;  // lo > hi: all zero
}

// Σ v (float64, the CPU's sequential order over the group's elements), result on every lane.
// buf: this warp's [32V] doubles of shared memory.
template <int V>
__device__ double group_sum_f64(const float (&v)[V], double* buf, int lane) {
  if (sums_exact<V>(v)) {
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < V; ++k) s = __dadd_rn(s, static_cast<double>(v[k]));
    return warp_sum(s);
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < V; ++k) buf[k * 32 + lane] = static_cast<double>(v[k]);
  __syncwarp();
  double s = 0.0;
  if (lane == 0)
    for (int i = 0; i < 32 * V; ++i) s = __dadd_rn(s, buf[i]);
  return __shfl_sync(kFull, s, 0);
}

// Σ v of doubles in element order, sequentially by lane 0; result on every lane.
template <int V>
__device__ double group_sum_seq(const double (&v)[V], double* buf, int lane) {
  __syncwarp();
#pragma unroll
  for (int k = 0; k < V; ++k) buf[k * 32 + lane] = v[k];
  __syncwarp();
  double s = 0.0;
  if (lane == 0)
    for (int i = 0; i < 32 * V; ++i) s = __dadd_rn(s, buf[i]);
  return __shfl_sync(kFull, s, 0);
}

// Packs a group's codes into the bytes of one plane: kBits = 2 ("by quarters", int2_layout.h),
// 1 ("by eighths", bit_plan_layout.h) or, for V = 1 only (B <= 32), 4 ("by halves",
// int4_layout.h; int4_group packs V >= 2 itself). Element i = k·32 + lane lives in byte i % B at
// slot i / B, B = G·kBits/8 bytes. dst: the group's first byte of that plane.
template <int V, int kBits>
__device__ __forceinline__ void pack_store(const int (&q)[V], int lane, uint8_t* dst) {
  constexpr int B = 32 * V * kBits / 8;
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  uint32_t c = 0;
#pragma unroll
  for (int k = 0; k < V; ++k)
    c |= (static_cast<uint32_t>(q[k]) & kMask) << (kBits * (k * (32 / B) + lane / B));
#pragma unroll
  for (int off = B; off < 32; off <<= 1) c |= __shfl_xor_sync(kFull, c, off);
  if (lane < B) dst[lane] = static_cast<uint8_t>(c);
}

__device__ __forceinline__ void store_meta(uint8_t* dst, uint16_t slot0, uint16_t slot1, int lane) {
  if (lane == 0) {
    reinterpret_cast<uint16_t*>(dst)[0] = slot0;
    reinterpret_cast<uint16_t*>(dst)[1] = slot1;
  }
}

// ---- group quantizers (each returns false where the CPU returns a non-OK Status) ----------------

// A uniform grid (row_common.h uniform_params): clipped range with std::min/max semantics, then
// min = fp16(lo), s = fp16((hi − min)/steps). codes/meta are written by the caller.
struct Uniform {
  float min, scale;
  uint16_t slot0, slot1;
};

template <int V>
__device__ bool uniform_params(const float (&xc)[V], int steps, int lane, Uniform* u) {
  float lo = __int_as_float(0x7f800000), hi = __int_as_float(0xff800000);
  int ilo = 1 << 30, ihi = 1 << 30;
#pragma unroll
  for (int k = 0; k < V; ++k) {  // this lane's elements in increasing element order
    if (xc[k] < lo) {
      lo = xc[k];
      ilo = k * 32 + lane;
    }
    if (hi < xc[k]) {
      hi = xc[k];
      ihi = k * 32 + lane;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {  // first element attaining the min / the max
    const float olo = __shfl_xor_sync(kFull, lo, off), ohi = __shfl_xor_sync(kFull, hi, off);
    const int oilo = __shfl_xor_sync(kFull, ilo, off), oihi = __shfl_xor_sync(kFull, ihi, off);
    if (olo < lo || (olo == lo && oilo < ilo)) {
      lo = olo;
      ilo = oilo;
    }
    if (hi < ohi || (ohi == hi && oihi < ihi)) {
      hi = ohi;
      ihi = oihi;
    }
  }
  u->slot1 = f32_to_fp16_dev(lo);
  u->min = fp16_to_f32_dev(u->slot1);
  if (!finite_f(u->min)) return false;
  u->slot0 = 0;
  u->scale = 0.0f;
  if (hi > lo) {
    const float s = __fdiv_rn(__fsub_rn(hi, u->min), static_cast<float>(steps));
    const uint16_t s_h = f32_to_fp16_dev(s);
    const float sf = fp16_to_f32_dev(s_h);
    if (!finite_f(sf)) return false;
    if (sf > 0.0f) {
      u->slot0 = s_h;
      u->scale = sf;
    }
  }
  return true;
}

// Uniform INT2 group (quantize_rows_int2). codes: group's code bytes; meta: its Int2GroupMeta.
template <int V>
__device__ bool int2_uniform_group(const float (&x)[V], float clip, int lane, uint8_t* codes,
                                   uint8_t* meta) {
  const float thr = clip_threshold<V>(x, clip, lane);
  float xc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) xc[k] = clamp_abs(x[k], thr);
  Uniform u;
  if (!uniform_params<V>(xc, quant::kInt2Levels - 1, lane, &u)) return false;
  int q[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    q[k] = 0;
    if (u.scale > 0.0f) {
      const float t = __fdiv_rn(__fsub_rn(xc[k], u.min), u.scale);
      q[k] = (t >= 0.5f) + (t >= 1.5f) + (t >= 2.5f);
    }
  }
  pack_store<V, 2>(q, lane, codes);
  store_meta(meta, u.slot0, u.slot1, lane);
  return true;
}

// INT3 group (quantize_row_int3_ref).
template <int V>
__device__ bool int3_group(const float (&x)[V], float clip, int lane, uint8_t* low, uint8_t* high,
                           uint8_t* meta) {
  const float thr = clip_threshold<V>(x, clip, lane);
  float xc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) xc[k] = clamp_abs(x[k], thr);
  Uniform u;
  if (!uniform_params<V>(xc, quant::kInt3Levels - 1, lane, &u)) return false;
  int q_lo[V], q_hi[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    int q = 0;
    if (u.scale > 0.0f) {
      const float t = __fdiv_rn(__fsub_rn(xc[k], u.min), u.scale);
      // |t| < 2^31 for every finite group (see the INT3 note in demote_pages.cu).
      q = __float2int_rz(floorf(__fadd_rn(t, 0.5f)));
      q = q < 0 ? 0 : (q > quant::kInt3Levels - 1 ? quant::kInt3Levels - 1 : q);
    }
    q_lo[k] = q & 3;
    q_hi[k] = q >> 2;
  }
  pack_store<V, 2>(q_lo, lane, low);
  pack_store<V, 1>(q_hi, lane, high);
  store_meta(meta, u.slot0, u.slot1, lane);
  return true;
}

// INT4 group (quantize_row_int4_ref): as INT3 with 16 levels; codes "by halves"
// (quant/int4_layout.h): element i in byte i % (G/2), nibble i / (G/2). With G = 32V and
// element k·32 + lane in register k: for V = 1, lanes l and l + 16 share byte l % 16 (pack_store);
// for V >= 2 lane l owns bytes k·32 + l (k < V/2), low nibble q[k], high nibble q[k + V/2].
template <int V>
__device__ bool int4_group(const float (&x)[V], float clip, int lane, uint8_t* codes,
                           uint8_t* meta) {
  const float thr = clip_threshold<V>(x, clip, lane);
  float xc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) xc[k] = clamp_abs(x[k], thr);
  Uniform u;
  if (!uniform_params<V>(xc, quant::kInt4Levels - 1, lane, &u)) return false;
  int q[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    q[k] = 0;
    if (u.scale > 0.0f) {
      const float t = __fdiv_rn(__fsub_rn(xc[k], u.min), u.scale);
      // |t| < 2^31 for every finite group (as for INT3, see demote_pages.cu).
      int c = __float2int_rz(floorf(__fadd_rn(t, 0.5f)));
      q[k] = c < 0 ? 0 : (c > quant::kInt4Levels - 1 ? quant::kInt4Levels - 1 : c);
    }
  }
  if constexpr (V == 1) {
    pack_store<1, 4>(q, lane, codes);
  } else {
#pragma unroll
    for (int k = 0; k < V / 2; ++k)
      codes[k * 32 + lane] = static_cast<uint8_t>(q[k] | (q[k + V / 2] << 4));
  }
  store_meta(meta, u.slot0, u.slot1, lane);
  return true;
}

// Lloyd-Max INT2 group (quantize_rows_lloyd: lloyd_params, lloyd_code).
template <int V>
__device__ bool lloyd_group(const float (&x)[V], float clip, int lane, double* buf, uint8_t* codes,
                            uint8_t* meta) {
  constexpr int n = 32 * V;
  const float thr = clip_threshold<V>(x, clip, lane);
  float xc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) xc[k] = clamp_abs(x[k], thr);
  const double mean = __ddiv_rn(group_sum_f64<V>(xc, buf, lane), static_cast<double>(n));
  double sq[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const double d = __dsub_rn(static_cast<double>(xc[k]), mean);
    sq[k] = __dmul_rn(d, d);
  }
  const double ss = group_sum_seq<V>(sq, buf, lane);
  const double sigma = __dsqrt_rn(__ddiv_rn(ss, static_cast<double>(n)));
  const uint16_t s1 = f32_to_fp16_dev(__double2float_rn(mean));
  const uint16_t s0 = f32_to_fp16_dev(__double2float_rn(sigma));
  const float mu = fp16_to_f32_dev(s1), sg = fp16_to_f32_dev(s0);
  if (!finite_f(mu) || !finite_f(sg)) return false;
  const float th = __fmul_rn(quant::kLloydThreshold, sg);
  int q[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    q[k] = 0;
    if (sg > 0.0f) {
      const float t = __fsub_rn(xc[k], mu);
      q[k] = (t >= -th) + (t >= 0.0f) + (t >= th);
    }
  }
  pack_store<V, 2>(q, lane, codes);
  store_meta(meta, s0, s1, lane);
  return true;
}

// The two INT1 levels of a group, the CPU loop of quantize_row_int1_ref verbatim (lane 0, over
// the group in shared memory).
__device__ inline void int1_levels_seq(const double* xg, int n, double* lo_out, double* hi_out) {
  double mean = 0;
  for (int i = 0; i < n; ++i) mean = __dadd_rn(mean, xg[i]);
  mean = __ddiv_rn(mean, static_cast<double>(n));
  double t = mean, lo = mean, hi = mean;
  for (int round = 0; round < quant::kInt1LloydRounds; ++round) {
    double sl = 0, sh = 0;
    int nl = 0, nh = 0;
    for (int i = 0; i < n; ++i) {
      if (xg[i] < t) {
        sl = __dadd_rn(sl, xg[i]);
        ++nl;
      } else {
        sh = __dadd_rn(sh, xg[i]);
        ++nh;
      }
    }
    if (nl == 0 || nh == 0) {
      lo = hi = mean;
      break;
    }
    const double new_lo = __ddiv_rn(sl, static_cast<double>(nl));
    const double new_hi = __ddiv_rn(sh, static_cast<double>(nh));
    const bool converged = round > 0 && new_lo == lo && new_hi == hi;
    lo = new_lo;
    hi = new_hi;
    t = __dmul_rn(0.5, __dadd_rn(lo, hi));
    if (converged) break;
  }
  *lo_out = lo;
  *hi_out = hi;
}

// INT1 group (quantize_row_int1_ref): no clip.
template <int V>
__device__ bool int1_group(const float (&x)[V], int lane, double* buf, uint8_t* plane,
                           uint8_t* meta) {
  constexpr int n = 32 * V;
  double lo, hi;
  if (sums_exact<V>(x)) {  // every subset sum exact: the same rounds, in parallel
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < V; ++k) s = __dadd_rn(s, static_cast<double>(x[k]));
    const double mean = __ddiv_rn(warp_sum(s), static_cast<double>(n));
    double t = mean;
    lo = hi = mean;
    for (int round = 0; round < quant::kInt1LloydRounds; ++round) {
      double sl = 0, sh = 0;
      int nl = 0;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const double v = static_cast<double>(x[k]);
        if (v < t) {
          sl = __dadd_rn(sl, v);
          ++nl;
        } else {
          sh = __dadd_rn(sh, v);
        }
      }
      sl = warp_sum(sl);
      sh = warp_sum(sh);
      nl = warp_sum(nl);
      const int nh = n - nl;
      if (nl == 0 || nh == 0) {
        lo = hi = mean;
        break;
      }
      const double new_lo = __ddiv_rn(sl, static_cast<double>(nl));
      const double new_hi = __ddiv_rn(sh, static_cast<double>(nh));
      const bool converged = round > 0 && new_lo == lo && new_hi == hi;
      lo = new_lo;
      hi = new_hi;
      t = __dmul_rn(0.5, __dadd_rn(lo, hi));
      if (converged) break;
    }
  } else {
    __syncwarp();
#pragma unroll
    for (int k = 0; k < V; ++k) buf[k * 32 + lane] = static_cast<double>(x[k]);
    __syncwarp();
    if (lane == 0) int1_levels_seq(buf, n, &lo, &hi);
    lo = __shfl_sync(kFull, lo, 0);
    hi = __shfl_sync(kFull, hi, 0);
  }
  const uint16_t s0 = f32_to_fp16_dev(__double2float_rn(lo));
  if (!finite_f(fp16_to_f32_dev(s0))) return false;
  const uint16_t s1 = f32_to_fp16_dev(__double2float_rn(hi));
  if (!finite_f(fp16_to_f32_dev(s1))) return false;
  const float lo_s = fp16_to_f32_dev(s0), hi_s = fp16_to_f32_dev(s1);
  const float mid = __fmul_rn(0.5f, __fadd_rn(lo_s, hi_s));
  int q[V];
#pragma unroll
  for (int k = 0; k < V; ++k) q[k] = (hi_s > lo_s && x[k] >= mid) ? 1 : 0;
  pack_store<V, 1>(q, lane, plane);
  store_meta(meta, s0, s1, lane);
  return true;
}

// ---- rows ---------------------------------------------------------------------------------------

// One row of NR·32 values in groups of 32V (x[k] = element k·32 + lane) in format f; false on
// the CPU's failure conditions (metadata beyond fp16).
template <int NR, int V>
__device__ bool quantize_row(const float (&x)[NR], quant::RowFormat f, float clip, int lane,
                             double* buf, uint8_t* row) {
  constexpr int d = NR * 32, G = V * 32, n_groups = NR / V;
  bool ok = true;
#pragma unroll
  for (int g = 0; g < n_groups; ++g) {
    float xg[V];
#pragma unroll
    for (int k = 0; k < V; ++k) xg[k] = x[g * V + k];
    switch (f) {
      case quant::RowFormat::kInt2Uniform:
      case quant::RowFormat::kKiviValue:
        ok = ok && int2_uniform_group<V>(xg, clip, lane, row + quant::int2_group_codes_offset(g, G),
                                         row + quant::int2_group_meta_offset(d, g));
        break;
      case quant::RowFormat::kInt2Lloyd:
        ok = ok && lloyd_group<V>(xg, clip, lane, buf, row + quant::int2_group_codes_offset(g, G),
                                  row + quant::int2_group_meta_offset(d, g));
        break;
      case quant::RowFormat::kInt3:
        ok = ok && int3_group<V>(xg, clip, lane, row + quant::int2_group_codes_offset(g, G),
                                 row + quant::int3_group_high_offset(d, g, G),
                                 row + quant::int3_group_meta_offset(d, g));
        break;
      case quant::RowFormat::kInt1:
        ok = ok && int1_group<V>(xg, lane, buf, row + quant::int1_group_plane_offset(g, G),
                                 row + quant::int1_group_meta_offset(d, g));
        break;
      case quant::RowFormat::kInt4:
        ok = ok && int4_group<V>(xg, clip, lane, row + quant::int4_group_codes_offset(g, G),
                                 row + quant::int4_group_meta_offset(d, g));
        break;
      default:
        ok = false;
        break;
    }
  }
  return ok;
}

__device__ __forceinline__ float load_exact(const uint8_t* row, int elem_bytes, int c) {
  if (elem_bytes == 4) return reinterpret_cast<const float*>(row)[c];
  return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[c]) << 16);
}

__device__ __forceinline__ void zero_bytes(uint8_t* p, size_t n, int lane) {
  __syncwarp();  // orders the group writes of this row before the zeros
  for (size_t b = lane; b < n; b += 32) p[b] = 0;
}

__device__ __forceinline__ quant::RowFormat row_format(quant::HistQuantizer qz, int kv, int bits) {
  if (qz == quant::HistQuantizer::kKivi)
    return kv == 0 ? quant::RowFormat::kKiviKeyBlock : quant::RowFormat::kKiviValue;
  if (bits == 4) return quant::RowFormat::kInt4;
  if (bits == 3) return quant::RowFormat::kInt3;
  if (bits == 1) return quant::RowFormat::kInt1;
  return qz == quant::HistQuantizer::kInt2Lloyd ? quant::RowFormat::kInt2Lloyd
                                                : quant::RowFormat::kInt2Uniform;
}

// KIVI keys (quantize_kivi_key_block_ref): the warp of slot s of a K plane quantizes channels
// [(s % 32)·NR, +NR) of key block s / 32, each channel one uniform INT2 group of 32 tokens (lane =
// token), no clip. False on a non-finite value or metadata beyond fp16.
template <int NR>
__device__ bool kivi_key_part(const Args& a, const uint8_t* src_page, uint8_t* dst_page, int layer,
                              int head, int slot, int lane) {
  const KvPageLayout& L = a.L;
  constexpr int d = NR * 32, kT = quant::kKiviKeyBlockTokens;
  const int block = slot / kT;
  const int c0 = (slot % kT) * NR;
  const uint8_t* tok = src_page + L.exact_row_offset(layer, 0, head, block * kT + lane);
  float v[NR];
  bool finite = true;
#pragma unroll
  for (int j = 0; j < NR; ++j) {
    v[j] = load_exact(tok, L.exact_elem_bytes, c0 + j);
    finite = finite && finite_f(v[j]);
  }
  if (__any_sync(kFull, !finite)) return false;
  uint8_t* blk = dst_page + L.kivi_key_block_offset(layer, head, block);
  bool ok = true;
#pragma unroll
  for (int j = 0; j < NR; ++j) {
    const float xg[1] = {v[j]};
    const int c = c0 + j;
    ok = ok && int2_uniform_group<1>(
                   xg, 1.0f, lane, blk + c * (kT / 4),
                   blk + d * (kT / 4) + c * static_cast<int>(sizeof(quant::Int2GroupMeta)));
  }
  return ok;
}

template <int NR>
__global__ void __launch_bounds__(kThreads) demote_pages_kernel(Args a) {
  __shared__ double s_buf[kWarps][kMaxGroup];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= a.n_rows) return;
  const KvPageLayout& L = a.L;
  int64_t r = row;
  const int slot = static_cast<int>(r % L.page_size);
  r /= L.page_size;
  const int head = static_cast<int>(r % L.n_heads_kv);
  r /= L.n_heads_kv;
  const int kv = static_cast<int>(r % 2);
  r /= 2;
  const int layer = static_cast<int>(r % L.n_layers);
  const int i = static_cast<int>(r / L.n_layers);

  const uint8_t* src_page =
      a.exact_pool + static_cast<size_t>(a.src_pages[i]) * L.exact_page_bytes();
  uint8_t* dst_page = a.hist_pool + static_cast<size_t>(a.dst_pages[i]) * L.int2_page_bytes();
  const quant::RowFormat f = row_format(a.quantizer, kv, L.hist_row_bits(layer, kv, head));

  bool ok;
  if (f == quant::RowFormat::kKiviKeyBlock) {
    ok = kivi_key_part<NR>(a, src_page, dst_page, layer, head, slot, lane);
  } else {
    const uint8_t* src = src_page + L.exact_row_offset(layer, kv, head, slot);
    uint8_t* dst = dst_page + L.int2_row_offset(layer, kv, head, slot);
    float x[NR];
    bool finite = true;
#pragma unroll
    for (int k = 0; k < NR; ++k) {
      x[k] = load_exact(src, L.exact_elem_bytes, k * 32 + lane);
      finite = finite && finite_f(x[k]);
    }
    ok = !__any_sync(kFull, !finite);
    if (ok) {
      const float* clips = kv == 0 ? a.k_clip : a.v_clip;
      const float clip = f == quant::RowFormat::kKiviValue || clips == nullptr
                             ? 1.0f
                             : clips[layer * L.n_heads_kv + head];
      double* buf = s_buf[warp];
      const int G = f == quant::RowFormat::kKiviValue ? quant::kKiviValueGroup : a.group_size;
      if (G == 32) {
        ok = quantize_row<NR, 1>(x, f, clip, lane, buf, dst);
      } else if (G == 64) {
        ok = quantize_row<NR, 2>(x, f, clip, lane, buf, dst);
      } else {
        if constexpr (NR >= 4)
          ok = quantize_row<NR, 4>(x, f, clip, lane, buf, dst);
        else
          ok = false;
      }
    }
    if (!ok) zero_bytes(dst, L.hist_row_bytes(layer, kv, head), lane);
  }
  if (!ok && lane == 0) atomicOr(a.status + i, kDemoteNonFinite);
}

}  // namespace oscar::kernels::cuda_demote
