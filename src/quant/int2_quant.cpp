// INT2 uniform and Lloyd-Max quantizers: references and the fast CPU path (see int2_quant.h).
// Compiled with -ffp-contract=off (src/quant/CMakeLists.txt) so that the reference and the fast
// path evaluate the very same float expressions and agree bit for bit.
#include "quant/int2_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "quant/row_common.h"

namespace oscar::quant {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Linear interpolation between the order statistics a_lo <= a_hi at fraction frac.
float interpolate(float a_lo, float a_hi, double frac) {
  return static_cast<float>(static_cast<double>(a_lo) +
                            frac * (static_cast<double>(a_hi) - static_cast<double>(a_lo)));
}

// Position of the ρ-quantile among n sorted values: index lo and interpolation fraction.
void quantile_position(int n, float clip_ratio, int* lo, double* frac) {
  const double pos = static_cast<double>(clip_ratio) * (n - 1);
  *lo = std::min(static_cast<int>(std::floor(pos)), n - 1);
  *frac = pos - *lo;
}

// Fast clip threshold: selection instead of a full sort. scratch: [n] floats.
float clip_threshold_fast(const float* x, int n, float clip_ratio, float* scratch) {
  if (clip_ratio >= 1.0f) return kInf;
  for (int i = 0; i < n; ++i) scratch[i] = std::fabs(x[i]);
  int lo;
  double frac;
  quantile_position(n, clip_ratio, &lo, &frac);
  std::nth_element(scratch, scratch + lo, scratch + n);
  const float a_lo = scratch[lo];
  if (frac == 0.0 || lo + 1 >= n) return a_lo;
  const float a_hi = *std::min_element(scratch + lo + 1, scratch + n);
  return interpolate(a_lo, a_hi, frac);
}

// --- uniform ---

// Code of one clipped value for the stored (min, scale); scale > 0.
inline uint8_t uniform_code(float xc, float min, float scale) {
  const float t = (xc - min) / scale;
  return static_cast<uint8_t>((t >= 0.5f) + (t >= 1.5f) + (t >= 2.5f));
}

// --- Lloyd-Max ---

struct LloydParams {
  float sigma = 0.0f;  // fp16-rounded σ
  float mu = 0.0f;     // fp16-rounded μ
  Int2GroupMeta stored{0, 0};
};

// Mean and population std of clamp(x, ±thr) over n values, float64, sequential order.
Status lloyd_params(const char* fn, int row, int g, const float* x, int n, float thr,
                    LloydParams* p) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += clamp_abs(x[i], thr);
  const double mean = sum / n;
  double ss = 0.0;
  for (int i = 0; i < n; ++i) {
    const double d = clamp_abs(x[i], thr) - mean;
    ss += d * d;
  }
  const double sigma = std::sqrt(ss / n);
  p->stored.slot1 = f32_to_fp16(static_cast<float>(mean));
  p->stored.slot0 = f32_to_fp16(static_cast<float>(sigma));
  p->mu = fp16_to_f32(p->stored.slot1);
  p->sigma = fp16_to_f32(p->stored.slot0);
  if (!std::isfinite(p->mu) || !std::isfinite(p->sigma)) {
    return out_of_range("%s: row %d group %d mean %g / std %g do not fit fp16", fn, row, g, mean,
                        sigma);
  }
  return Status();
}

// Code of one clipped value; sigma > 0.
inline uint8_t lloyd_code(float xc, float mu, float sigma) {
  const float t = xc - mu;
  const float thr = kLloydThreshold * sigma;
  return static_cast<uint8_t>((t >= -thr) + (t >= 0.0f) + (t >= thr));
}

// Packs G codes (one byte each, 0..3) of a group by quarters. codes: [G]; out: [G/4].
void pack_group(const uint8_t* codes, int group_size, uint8_t* out) {
  const int q = group_size / 4;
  for (int j = 0; j < q; ++j) {
    out[j] = static_cast<uint8_t>(codes[j] | (codes[j + q] << 2) | (codes[j + 2 * q] << 4) |
                                  (codes[j + 3 * q] << 6));
  }
}

// The fast row loop shared by both quantizers: finite check, clip threshold by selection, then
// `encode(r, g, xg, thr, codes, &meta)` chooses one group's codes and metadata. A failing row is
// zero-filled and ends the call (see the error policy in the header).
template <typename EncodeGroup>
Status quantize_rows(const char* fn, const float* x, int n_rows, int head_dim, int group_size,
                     float clip_ratio, uint8_t* rows, EncodeGroup encode) {
  check_row_preconditions(x, head_dim, group_size, clip_ratio, rows);
  OSCAR_CHECK(n_rows >= 0, "n_rows %d", n_rows);
  const int row_bytes = int2_row_bytes(head_dim, group_size);
  const int n_groups = int2_groups_per_row(head_dim, group_size);
  std::vector<float> scratch(static_cast<size_t>(group_size));
  std::vector<uint8_t> codes(static_cast<size_t>(group_size));
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * head_dim;
    uint8_t* row = rows + static_cast<size_t>(r) * row_bytes;
    Status st = check_row_finite(fn, r, xr, head_dim, group_size);
    for (int g = 0; g < n_groups && st.ok(); ++g) {
      const float* xg = xr + g * group_size;
      const float thr = clip_threshold_fast(xg, group_size, clip_ratio, scratch.data());
      Int2GroupMeta meta{0, 0};
      st = encode(r, g, xg, thr, codes.data(), &meta);
      if (!st.ok()) break;
      pack_group(codes.data(), group_size, row + int2_group_codes_offset(g, group_size));
      write_group_meta(row, head_dim, g, meta);
    }
    if (!st.ok()) {
      std::fill(row, row + row_bytes, uint8_t{0});
      return st;
    }
  }
  return Status();
}

}  // namespace


float clip_threshold_ref(const float* x, int n, float clip_ratio) {
  OSCAR_CHECK(n > 0 && clip_ratio > 0.0f, "n %d, clip_ratio %g", n, static_cast<double>(clip_ratio));
  if (clip_ratio >= 1.0f) return kInf;
  std::vector<float> a(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) a[i] = std::fabs(x[i]);
  std::sort(a.begin(), a.end());
  int lo;
  double frac;
  quantile_position(n, clip_ratio, &lo, &frac);
  if (frac == 0.0 || lo + 1 >= n) return a[lo];
  return interpolate(a[lo], a[lo + 1], frac);
}

// ------------------------------------------------------------------------------------------------
// References: one row, per-element code access through int2_layout.h.

Status quantize_row_int2_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                             uint8_t* row) {
  check_row_preconditions(x, head_dim, group_size, clip_ratio, row);
  static constexpr const char* kFn = "quantize_row_int2_ref";
  const int row_bytes = int2_row_bytes(head_dim, group_size);
  std::fill(row, row + row_bytes, uint8_t{0});
  OSCAR_RETURN_IF_ERROR(check_row_finite(kFn, 0, x, head_dim, group_size));
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const float* xg = x + g * group_size;
    const float thr = clip_threshold_ref(xg, group_size, clip_ratio);
    float lo, hi;
    clipped_range(xg, group_size, thr, &lo, &hi);
    UniformParams p;
    Status st = uniform_params(kFn, 0, g, lo, hi, kInt2Levels - 1, &p);
    if (!st.ok()) {
      std::fill(row, row + row_bytes, uint8_t{0});
      return st;
    }
    uint8_t* codes = row + int2_group_codes_offset(g, group_size);
    for (int i = 0; i < group_size; ++i) {
      const uint8_t q = p.scale > 0.0f ? uniform_code(clamp_abs(xg[i], thr), p.min, p.scale) : 0;
      int2_set_code(codes, i, group_size, q);
    }
    write_group_meta(row, head_dim, g, p.stored);
  }
  return Status();
}

void dequantize_row_int2_ref(const uint8_t* row, int head_dim, int group_size, float* out) {
  check_row_preconditions(row, head_dim, group_size, 1.0f, out);
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const Int2GroupMeta m = read_group_meta(row, head_dim, g);
    const float scale = fp16_to_f32(m.slot0);
    const float min = fp16_to_f32(m.slot1);
    const uint8_t* codes = row + int2_group_codes_offset(g, group_size);
    for (int i = 0; i < group_size; ++i) {
      out[g * group_size + i] = min + static_cast<float>(int2_get_code(codes, i, group_size)) * scale;
    }
  }
}

Status quantize_row_lloyd_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                              uint8_t* row) {
  check_row_preconditions(x, head_dim, group_size, clip_ratio, row);
  static constexpr const char* kFn = "quantize_row_lloyd_ref";
  const int row_bytes = int2_row_bytes(head_dim, group_size);
  std::fill(row, row + row_bytes, uint8_t{0});
  OSCAR_RETURN_IF_ERROR(check_row_finite(kFn, 0, x, head_dim, group_size));
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const float* xg = x + g * group_size;
    const float thr = clip_threshold_ref(xg, group_size, clip_ratio);
    LloydParams p;
    Status st = lloyd_params(kFn, 0, g, xg, group_size, thr, &p);
    if (!st.ok()) {
      std::fill(row, row + row_bytes, uint8_t{0});
      return st;
    }
    uint8_t* codes = row + int2_group_codes_offset(g, group_size);
    for (int i = 0; i < group_size; ++i) {
      const uint8_t q = p.sigma > 0.0f ? lloyd_code(clamp_abs(xg[i], thr), p.mu, p.sigma) : 0;
      int2_set_code(codes, i, group_size, q);
    }
    write_group_meta(row, head_dim, g, p.stored);
  }
  return Status();
}

void dequantize_row_lloyd_ref(const uint8_t* row, int head_dim, int group_size, float* out) {
  check_row_preconditions(row, head_dim, group_size, 1.0f, out);
  for (int g = 0; g < int2_groups_per_row(head_dim, group_size); ++g) {
    const Int2GroupMeta m = read_group_meta(row, head_dim, g);
    const float sigma = fp16_to_f32(m.slot0);
    const float mu = fp16_to_f32(m.slot1);
    const uint8_t* codes = row + int2_group_codes_offset(g, group_size);
    for (int i = 0; i < group_size; ++i) {
      const int code = int2_get_code(codes, i, group_size);
      out[g * group_size + i] = mu + kLloydDequantLevels[code] * sigma;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Fast path: many rows, selection for the quantile, byte-wise pack and quarter-wise unpack.

Status quantize_rows_int2(const float* x, int n_rows, int head_dim, int group_size,
                          float clip_ratio, uint8_t* rows) {
  static constexpr const char* kFn = "quantize_rows_int2";
  return quantize_rows(kFn, x, n_rows, head_dim, group_size, clip_ratio, rows,
                       [&](int r, int g, const float* xg, float thr, uint8_t* codes,
                           Int2GroupMeta* meta) -> Status {
                         float lo, hi;
                         clipped_range(xg, group_size, thr, &lo, &hi);
                         UniformParams p;
                         OSCAR_RETURN_IF_ERROR(
                             uniform_params(kFn, r, g, lo, hi, kInt2Levels - 1, &p));
                         for (int i = 0; i < group_size; ++i)
                           codes[i] = p.scale > 0.0f
                                          ? uniform_code(clamp_abs(xg[i], thr), p.min, p.scale)
                                          : uint8_t{0};
                         *meta = p.stored;
                         return Status();
                       });
}

void dequantize_rows_int2(const uint8_t* rows, int n_rows, int head_dim, int group_size,
                          float* out) {
  check_row_preconditions(rows, head_dim, group_size, 1.0f, out);
  const int row_bytes = int2_row_bytes(head_dim, group_size);
  const int n_groups = int2_groups_per_row(head_dim, group_size);
  const int q = group_size / 4;
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* row = rows + static_cast<size_t>(r) * row_bytes;
    float* outr = out + static_cast<size_t>(r) * head_dim;
    for (int g = 0; g < n_groups; ++g) {
      const Int2GroupMeta m = read_group_meta(row, head_dim, g);
      const float scale = fp16_to_f32(m.slot0);
      const float min = fp16_to_f32(m.slot1);
      const uint8_t* codes = row + int2_group_codes_offset(g, group_size);
      float* og = outr + g * group_size;
      for (int k = 0; k < 4; ++k) {
        for (int j = 0; j < q; ++j) {
          og[k * q + j] = min + static_cast<float>((codes[j] >> (2 * k)) & 3u) * scale;
        }
      }
    }
  }
}

Status quantize_rows_lloyd(const float* x, int n_rows, int head_dim, int group_size,
                           float clip_ratio, uint8_t* rows) {
  static constexpr const char* kFn = "quantize_rows_lloyd";
  return quantize_rows(kFn, x, n_rows, head_dim, group_size, clip_ratio, rows,
                       [&](int r, int g, const float* xg, float thr, uint8_t* codes,
                           Int2GroupMeta* meta) -> Status {
                         LloydParams p;
                         OSCAR_RETURN_IF_ERROR(lloyd_params(kFn, r, g, xg, group_size, thr, &p));
                         for (int i = 0; i < group_size; ++i)
                           codes[i] = p.sigma > 0.0f
                                          ? lloyd_code(clamp_abs(xg[i], thr), p.mu, p.sigma)
                                          : uint8_t{0};
                         *meta = p.stored;
                         return Status();
                       });
}

void dequantize_rows_lloyd(const uint8_t* rows, int n_rows, int head_dim, int group_size,
                           float* out) {
  check_row_preconditions(rows, head_dim, group_size, 1.0f, out);
  const int row_bytes = int2_row_bytes(head_dim, group_size);
  const int n_groups = int2_groups_per_row(head_dim, group_size);
  const int q = group_size / 4;
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* row = rows + static_cast<size_t>(r) * row_bytes;
    float* outr = out + static_cast<size_t>(r) * head_dim;
    for (int g = 0; g < n_groups; ++g) {
      const Int2GroupMeta m = read_group_meta(row, head_dim, g);
      const float sigma = fp16_to_f32(m.slot0);
      const float mu = fp16_to_f32(m.slot1);
      // The four reconstruction values of this group, then a table lookup per element.
      float level[4];
      for (int k = 0; k < 4; ++k) level[k] = mu + kLloydDequantLevels[k] * sigma;
      const uint8_t* codes = row + int2_group_codes_offset(g, group_size);
      float* og = outr + g * group_size;
      for (int k = 0; k < 4; ++k) {
        for (int j = 0; j < q; ++j) og[k * q + j] = level[(codes[j] >> (2 * k)) & 3u];
      }
    }
  }
}

}  // namespace oscar::quant
