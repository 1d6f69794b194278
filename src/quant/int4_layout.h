// The one definition of the 4-bit history row (the top of the precision ladder: `oscar4`, and the
// 4-bit planes of a `--kv-bits` plan, kv/bit_plan.h), shared by CPU and CUDA code.
//
// INT4 row (uniform, x̂ = min + q·s, q in 0..15, s = (max − min)/15 of the clipped group), for
// head_dim d and group size G (int2_valid_group: 32, 64 or 128 dividing d):
//   [d/2 bytes]            codes: group g owns bytes [g·G/2, (g+1)·G/2)
//   [d/G × Int2GroupMeta]  slot0 = s, slot1 = min (fp16), as uniform INT2 (quant/int2_layout.h)
// and nothing else. For d = 128, G = 128: 64 + 4 = 68 bytes = 4.25 bits per element.
//
// Codes inside a group are packed "by halves": byte j (0 <= j < G/2) of the group holds the code
// of element j in bits 0-3 (low nibble) and of element j + G/2 in bits 4-7 (high nibble). So
// element i lives in byte i % (G/2) at shift 4·(i / (G/2)); unpacking a group is one mask (first
// half) and one shift (second half) per byte, the same pattern as INT2's quarters.
// The metadata area starts at byte d/2 (a multiple of 16), like INT2's at d/4.
//
// Plain data and constexpr helpers only (no STL, no CUDA includes); the quantizers are in
// quant/bit_plan_quant.h, the decode kernels' unpacking in kernels/cpu/decode_attn.cpp and
// kernels/cuda/hist_row.cuh.
#pragma once

#include <cstdint>

#include "quant/int2_layout.h"

namespace oscar::quant {

inline constexpr int kInt4Levels = 16;       // codes 0..15
inline constexpr int kInt4CodesPerByte = 2;  // 4 bits each

// Bytes of packed codes in one row: head_dim / 2.
OSCAR_HD constexpr int int4_codes_bytes(int head_dim) { return head_dim / kInt4CodesPerByte; }

OSCAR_HD constexpr int int4_row_bytes(int head_dim, int group_size) {
  return int4_codes_bytes(head_dim) + int2_meta_bytes(head_dim, group_size);
}

// Byte offsets inside a row of group g's first code byte and of its metadata.
OSCAR_HD constexpr int int4_group_codes_offset(int g, int group_size) {
  return g * (group_size / kInt4CodesPerByte);
}
OSCAR_HD constexpr int int4_group_meta_offset(int head_dim, int g) {
  return int4_codes_bytes(head_dim) + g * static_cast<int>(sizeof(Int2GroupMeta));
}

// Code of element i (0 <= i < G) of one group ("by halves"). `group_codes`: [G/2] bytes.
OSCAR_HD constexpr uint8_t int4_get_code(const uint8_t* group_codes, int i, int group_size) {
  return static_cast<uint8_t>((group_codes[i % (group_size / 2)] >> (4 * (i / (group_size / 2)))) &
                              15u);
}
OSCAR_HD constexpr void int4_set_code(uint8_t* group_codes, int i, int group_size, uint8_t code) {
  const int b = i % (group_size / 2);
  const int sh = 4 * (i / (group_size / 2));
  group_codes[b] = static_cast<uint8_t>((group_codes[b] & ~(15u << sh)) | ((code & 15u) << sh));
}

static_assert(int4_codes_bytes(128) == 64);
static_assert(int4_row_bytes(128, 128) == 68, "4.25 bits per element at G 128");
static_assert(int4_row_bytes(128, 32) == 80);
static_assert(int4_group_meta_offset(128, 1) == 68);

}  // namespace oscar::quant
