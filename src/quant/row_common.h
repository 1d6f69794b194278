// What the row quantizers of oscar_quant (int2_quant.cpp, bit_plan_quant.cpp) share: the
// preconditions that abort, the non-finite input that is an InvalidArgument naming the element,
// clipping, and the fp16 min/scale of a uniform grid. Internal to src/quant; the files that
// include it are compiled with -ffp-contract=off, so every user evaluates the same expressions.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/status.h"
#include "quant/int2_layout.h"

namespace oscar::quant {

inline void check_row_preconditions(const void* in, int head_dim, int group_size,
                                    float clip_ratio, const void* out) {
  OSCAR_CHECK(in != nullptr && out != nullptr, "null input or output pointer");
  OSCAR_CHECK(int2_valid_group(head_dim, group_size), "head_dim %d, group_size %d", head_dim,
              group_size);
  OSCAR_CHECK(clip_ratio > 0.0f, "clip_ratio %g must be > 0", static_cast<double>(clip_ratio));
}

// InvalidArgument naming the first non-finite element of x[0..head_dim) (row `row` of a batch),
// OK if none.
inline Status check_row_finite(const char* fn, int row, const float* x, int head_dim,
                               int group_size) {
  for (int i = 0; i < head_dim; ++i) {
    if (!std::isfinite(x[i])) {
      return invalid_argument("%s: row %d element %d (group %d) is %s; quantization needs finite "
                              "inputs",
                              fn, row, i, i / group_size,
                              std::isnan(x[i]) ? "NaN" : (x[i] > 0 ? "+Inf" : "-Inf"));
    }
  }
  return Status();
}

inline float clamp_abs(float v, float thr) { return std::min(std::max(v, -thr), thr); }

// Min and max of a group of G values clipped to ±thr.
inline void clipped_range(const float* xg, int group_size, float thr, float* lo, float* hi) {
  *lo = std::numeric_limits<float>::infinity();
  *hi = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < group_size; ++i) {
    const float xc = clamp_abs(xg[i], thr);
    *lo = std::min(*lo, xc);
    *hi = std::max(*hi, xc);
  }
}

// A uniform grid min + q·s, q in 0..steps, with min and s rounded to fp16 (the stored values).
struct UniformParams {
  float scale = 0.0f;  // fp16-rounded s, 0 for a constant group
  float min = 0.0f;    // fp16-rounded min
  Int2GroupMeta stored{0, 0};  // slot0 = s, slot1 = min
};

// The grid of a group whose clipped values span [lo, hi]: min = fp16(lo), s = fp16((hi − min) /
// steps); s = 0 when hi == lo or s rounds to 0. OutOfRange when min or s do not fit fp16.
inline Status uniform_params(const char* fn, int row, int g, float lo, float hi, int steps,
                             UniformParams* p) {
  p->stored.slot1 = f32_to_fp16(lo);
  p->min = fp16_to_f32(p->stored.slot1);
  if (!std::isfinite(p->min)) {
    return out_of_range("%s: row %d group %d min %g does not fit fp16", fn, row, g,
                        static_cast<double>(lo));
  }
  p->stored.slot0 = 0;
  p->scale = 0.0f;
  if (hi > lo) {
    const float s = (hi - p->min) / static_cast<float>(steps);
    const fp16_t s_h = f32_to_fp16(s);
    const float sf = fp16_to_f32(s_h);
    if (!std::isfinite(sf)) {
      return out_of_range("%s: row %d group %d scale %g (range [%g, %g]) does not fit fp16", fn,
                          row, g, static_cast<double>(s), static_cast<double>(lo),
                          static_cast<double>(hi));
    }
    if (sf > 0.0f) {  // else: range below fp16 resolution, treat as constant
      p->stored.slot0 = s_h;
      p->scale = sf;
    }
  }
  return Status();
}

}  // namespace oscar::quant
