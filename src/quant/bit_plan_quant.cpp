// 4-, 3- and 1-bit reference row quantizers (see bit_plan_quant.h).
#include "quant/bit_plan_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "quant/int2_quant.h"
#include "quant/row_common.h"

namespace oscar::quant {
namespace {

// fp16 bits of v, or OutOfRange naming what did not fit.
Status to_fp16(const char* fn, const char* what, int g, float v, fp16_t* out) {
  *out = f32_to_fp16(v);
  if (!std::isfinite(fp16_to_f32(*out)))
    return out_of_range("%s: group %d %s %g does not fit fp16", fn, g, what, static_cast<double>(v));
  return Status();
}

Int2GroupMeta read_meta(const uint8_t* row, int offset) {
  Int2GroupMeta m;
  std::memcpy(&m, row + offset, sizeof m);
  return m;
}

// Group g's grid (its clipped range, fp16 min and scale, uniform_params) and the code 0..steps
// of each element, handed to set_code(i, q): the 3- and 4-bit rows differ only in how they pack
// the codes. Returns uniform_params's error (nothing is written then).
template <class SetCode>
Status quantize_group_uniform(const char* fn, const float* xg, int g, int group_size,
                              float clip_ratio, int steps, Int2GroupMeta* stored,
                              SetCode&& set_code) {
  const float thr = clip_threshold_ref(xg, group_size, clip_ratio);
  float lo, hi;
  clipped_range(xg, group_size, thr, &lo, &hi);
  UniformParams p;
  OSCAR_RETURN_IF_ERROR(uniform_params(fn, 0, g, lo, hi, steps, &p));
  for (int i = 0; i < group_size; ++i) {
    int q = 0;
    if (p.scale > 0.0f) {
      const float t = (clamp_abs(xg[i], thr) - p.min) / p.scale;
      q = std::clamp(static_cast<int>(std::floor(t + 0.5f)), 0, steps);
    }
    set_code(i, q);
  }
  *stored = p.stored;
  return Status();
}

}  // namespace

Status quantize_row_int3_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                             uint8_t* row) {
  check_row_preconditions(x, head_dim, group_size, clip_ratio, row);
  static constexpr const char* kFn = "quantize_row_int3_ref";
  const int row_bytes = int3_row_bytes(head_dim, group_size);
  std::fill(row, row + row_bytes, uint8_t{0});
  OSCAR_RETURN_IF_ERROR(check_row_finite(kFn, 0, x, head_dim, group_size));
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    uint8_t* low = row + int2_group_codes_offset(g, group_size);
    uint8_t* high = row + int3_group_high_offset(head_dim, g, group_size);
    Int2GroupMeta stored;
    const Status st =
        quantize_group_uniform(kFn, x + g * group_size, g, group_size, clip_ratio, kInt3Levels - 1,
                               &stored, [&](int i, int q) {
                                 int2_set_code(low, i, group_size, static_cast<uint8_t>(q & 3));
                                 plane_set_bit(high, i, group_size, static_cast<uint8_t>(q >> 2));
                               });
    if (!st.ok()) {
      std::fill(row, row + row_bytes, uint8_t{0});
      return st;
    }
    std::memcpy(row + int3_group_meta_offset(head_dim, g), &stored, sizeof stored);
  }
  return Status();
}

void dequantize_row_int3_ref(const uint8_t* row, int head_dim, int group_size, float* out) {
  check_row_preconditions(row, head_dim, group_size, 1.0f, out);
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const Int2GroupMeta m = read_meta(row, int3_group_meta_offset(head_dim, g));
    const float scale = fp16_to_f32(m.slot0), min = fp16_to_f32(m.slot1);
    const uint8_t* low = row + int2_group_codes_offset(g, group_size);
    const uint8_t* high = row + int3_group_high_offset(head_dim, g, group_size);
    for (int i = 0; i < group_size; ++i) {
      const int q = int2_get_code(low, i, group_size) | (plane_get_bit(high, i, group_size) << 2);
      out[g * group_size + i] = min + static_cast<float>(q) * scale;
    }
  }
}

Status quantize_row_int4_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                             uint8_t* row) {
  check_row_preconditions(x, head_dim, group_size, clip_ratio, row);
  static constexpr const char* kFn = "quantize_row_int4_ref";
  const int row_bytes = int4_row_bytes(head_dim, group_size);
  std::fill(row, row + row_bytes, uint8_t{0});
  OSCAR_RETURN_IF_ERROR(check_row_finite(kFn, 0, x, head_dim, group_size));
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    uint8_t* codes = row + int4_group_codes_offset(g, group_size);
    Int2GroupMeta stored;
    const Status st = quantize_group_uniform(
        kFn, x + g * group_size, g, group_size, clip_ratio, kInt4Levels - 1, &stored,
        [&](int i, int q) { int4_set_code(codes, i, group_size, static_cast<uint8_t>(q)); });
    if (!st.ok()) {
      std::fill(row, row + row_bytes, uint8_t{0});
      return st;
    }
    std::memcpy(row + int4_group_meta_offset(head_dim, g), &stored, sizeof stored);
  }
  return Status();
}

void dequantize_row_int4_ref(const uint8_t* row, int head_dim, int group_size, float* out) {
  check_row_preconditions(row, head_dim, group_size, 1.0f, out);
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const Int2GroupMeta m = read_meta(row, int4_group_meta_offset(head_dim, g));
    const float scale = fp16_to_f32(m.slot0), min = fp16_to_f32(m.slot1);
    const uint8_t* codes = row + int4_group_codes_offset(g, group_size);
    for (int i = 0; i < group_size; ++i)
      out[g * group_size + i] =
          min + static_cast<float>(int4_get_code(codes, i, group_size)) * scale;
  }
}

Status quantize_row_int1_ref(const float* x, int head_dim, int group_size, uint8_t* row) {
  check_row_preconditions(x, head_dim, group_size, 1.0f, row);
  static constexpr const char* kFn = "quantize_row_int1_ref";
  const int row_bytes = int1_row_bytes(head_dim, group_size);
  std::fill(row, row + row_bytes, uint8_t{0});
  OSCAR_RETURN_IF_ERROR(check_row_finite(kFn, 0, x, head_dim, group_size));
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const float* xg = x + g * group_size;
    double mean = 0;
    for (int i = 0; i < group_size; ++i) mean += xg[i];
    mean /= group_size;
    double t = mean, lo = mean, hi = mean;
    for (int round = 0; round < kInt1LloydRounds; ++round) {
      double sl = 0, sh = 0;
      int nl = 0, nh = 0;
      for (int i = 0; i < group_size; ++i) {
        if (xg[i] < t) {
          sl += xg[i];
          ++nl;
        } else {
          sh += xg[i];
          ++nh;
        }
      }
      if (nl == 0 || nh == 0) {
        lo = hi = mean;
        break;
      }
      const double new_lo = sl / nl, new_hi = sh / nh;
      const bool converged = round > 0 && new_lo == lo && new_hi == hi;  // same partition again
      lo = new_lo;
      hi = new_hi;
      t = 0.5 * (lo + hi);
      if (converged) break;
    }
    Int2GroupMeta meta{0, 0};
    Status st = to_fp16(kFn, "low level", g, static_cast<float>(lo), &meta.slot0);
    if (st.ok()) st = to_fp16(kFn, "high level", g, static_cast<float>(hi), &meta.slot1);
    if (!st.ok()) {
      std::fill(row, row + row_bytes, uint8_t{0});
      return st;
    }
    const float lo_s = fp16_to_f32(meta.slot0), hi_s = fp16_to_f32(meta.slot1);
    const float mid = 0.5f * (lo_s + hi_s);
    uint8_t* plane = row + int1_group_plane_offset(g, group_size);
    for (int i = 0; i < group_size; ++i)
      plane_set_bit(plane, i, group_size, static_cast<uint8_t>(hi_s > lo_s && xg[i] >= mid));
    std::memcpy(row + int1_group_meta_offset(head_dim, g), &meta, sizeof meta);
  }
  return Status();
}

void dequantize_row_int1_ref(const uint8_t* row, int head_dim, int group_size, float* out) {
  check_row_preconditions(row, head_dim, group_size, 1.0f, out);
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const Int2GroupMeta m = read_meta(row, int1_group_meta_offset(head_dim, g));
    const float lo = fp16_to_f32(m.slot0), hi = fp16_to_f32(m.slot1);
    const uint8_t* plane = row + int1_group_plane_offset(g, group_size);
    for (int i = 0; i < group_size; ++i)
      out[g * group_size + i] = plane_get_bit(plane, i, group_size) ? hi : lo;
  }
}

}  // namespace oscar::quant
