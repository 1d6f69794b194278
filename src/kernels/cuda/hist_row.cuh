// Device-side reading of one history row element (any bit-plan width 1-4, uniform INT2 or
// Lloyd-Max INT2), shared by the decode (decode_attn.cuh) and prefill (prefill_attn.cu) kernels.
// It computes what quant's *_ref dequantizers compute, from the layouts of quant/int2_layout.h,
// quant/int4_layout.h and quant/bit_plan_layout.h. Not here: the fast INT2 tile arithmetic of
// decode_attn.cuh.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace oscar::kernels::cuda_detail {

__device__ __forceinline__ float fp16_bits_to_f32(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16 & 0xffffu)));
}

// One element of a history row (any supported format), as quant's *_ref dequantizers compute it
// (quant/int2_layout.h, quant/bit_plan_layout.h). `row` may be shared or global memory.
__device__ __forceinline__ float dequant_element(const uint8_t* row, int e, int head_dim, int G,
                                                 int bits, int uniform, const float* lloyd) {
  const int gi = e / G, i = e % G;
  if (bits == 1) {
    const int b = row[gi * (G / 8) + i % (G / 8)] >> (i / (G / 8)) & 1;
    const uint8_t* m = row + head_dim / 8 + 4 * gi;
    const uint32_t meta = m[0] | (m[1] << 8) | (m[2] << 16) | (m[3] << 24);
    return b ? fp16_bits_to_f32(meta >> 16) : fp16_bits_to_f32(meta);
  }
  if (bits == 4) {  // "by halves": byte i % (G/2) of the group, nibble i / (G/2)
    const int q4 = row[gi * (G / 2) + i % (G / 2)] >> (4 * (i / (G / 2))) & 15;
    const uint8_t* m = row + head_dim / 2 + 4 * gi;
    const uint32_t meta = m[0] | (m[1] << 8) | (m[2] << 16) | (m[3] << 24);
    return fp16_bits_to_f32(meta >> 16) + static_cast<float>(q4) * fp16_bits_to_f32(meta);
  }
  int q = row[gi * (G / 4) + i % (G / 4)] >> (2 * (i / (G / 4))) & 3;
  int meta_off = head_dim / 4 + 4 * gi;
  if (bits == 3) {
    q |= (row[head_dim / 4 + gi * (G / 8) + i % (G / 8)] >> (i / (G / 8)) & 1) << 2;
    meta_off = head_dim / 4 + head_dim / 8 + 4 * gi;
  }
  const uint8_t* m = row + meta_off;
  const uint32_t meta = m[0] | (m[1] << 8) | (m[2] << 16) | (m[3] << 24);
  const float s0 = fp16_bits_to_f32(meta), s1 = fp16_bits_to_f32(meta >> 16);
  if (bits == 2 && !uniform) return s1 + lloyd[q] * s0;  // μ + level[q]·σ
  return s1 + static_cast<float>(q) * s0;                // min + q·s
}

}  // namespace oscar::kernels::cuda_detail
