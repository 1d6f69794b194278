// 16-bit float storage types and their exact conversions to and from float.
// bf16 is the cache and weight format; fp16 holds INT2 group metadata (scale, min).
// Both are stored as raw uint16_t so that layouts are plain data shared with CUDA code.
#pragma once

#include <cstdint>
#include <cstring>

namespace oscar {

using bf16_t = uint16_t;  // bfloat16 bits
using fp16_t = uint16_t;  // IEEE half bits

inline float bf16_to_f32(bf16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest, ties to even; NaN stays NaN (quiet).
inline bf16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((bits >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_t>((bits + rounding) >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE binary16 <-> float, round to nearest even, with subnormals, Inf and NaN.
inline float fp16_to_f32(fp16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
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
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline fp16_t f32_to_fp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<fp16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<fp16_t>(sign | 0x7c00u);  // overflow -> Inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<fp16_t>(sign);  // rounds to zero
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 - (exp - 127) + 13 - 1 ... shift into 10-bit subnormal
    uint32_t half_mant = mant >> (shift - 0);
    // round to nearest even on the bits shifted out
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    uint32_t result = half_mant >> 0;
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<fp16_t>(sign | result);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  uint32_t h = ((rounded >> 13) - ((127 - 15) << 10));
  return static_cast<fp16_t>(sign | h);
}

inline float round_to_fp16(float f) { return fp16_to_f32(f32_to_fp16(f)); }

}  // namespace oscar
