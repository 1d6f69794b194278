// Checks shared by the row quantizers of oscar_quant (int2_quant.cpp, bit_plan_quant.cpp):
// preconditions that abort, and the non-finite input that is an InvalidArgument naming the
// element. Internal to src/quant.
#pragma once

#include <cmath>

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

}  // namespace oscar::quant
