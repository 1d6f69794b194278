// Device bf16 conversions, bit-identical to core/bf16.h (f32_to_bf16: round to nearest, ties to
// even, NaN kept quiet; bf16_to_f32: a shift). core/bf16.h's versions use memcpy and are host
// only; these use the intrinsics. Included only by .cu files in this folder.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace oscar::cuda {

__device__ __forceinline__ float bf16_to_f32_dev(bf16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ bf16_t f32_to_bf16_dev(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_t>((bits + rounding) >> 16);
}

}  // namespace oscar::cuda
