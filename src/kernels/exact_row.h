// One exact (sink or recent) K/V row of a page as float: BF16 widened, or F32 copied
// (kernels/kv_layout.h exact_elem_bytes). Host code shared by the CPU ops and kv::SequenceCache.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/bf16.h"

namespace oscar::kernels {

// src: [d] elements of elem_bytes (2 = bf16, 4 = f32), possibly unaligned -> out: [d] float.
inline void load_exact_row(const uint8_t* src, int elem_bytes, int d, float* out) {
  if (elem_bytes == 4) {
    std::memcpy(out, src, sizeof(float) * d);
    return;
  }
  for (int c = 0; c < d; ++c) {
    bf16_t h;
    std::memcpy(&h, src + 2 * c, 2);
    out[c] = bf16_to_f32(h);
  }
}

}  // namespace oscar::kernels
