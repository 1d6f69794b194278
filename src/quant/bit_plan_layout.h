// Row formats for mixed-precision bit plans (and the 4-bit row of quant/int4_layout.h)
// (docs/results/ablation.md, "Budget-equal mixed precision"): a 3-bit row for the few key rows that
// carry long-range retrieval and a 1-bit row for the value rows that can spare it, so that a plan
// keeps the INT2 cache's average bits (for head_dim 128, G 128: 52 + 20 = 2 × 36 bytes). The INT2
// row itself is quant/int2_layout.h.
//
// INT3 row (x̂ = min + q·s, q in 0..7, s = (max − min)/7), for head_dim d and group size G:
//   [d/4 bytes]   low planes: bits 0-1 of each code, packed exactly like INT2 codes ("by
//                 quarters", int2_layout.h), group g at byte g·G/4
//   [d/8 bytes]   high plane: bit 2 of each code, "by eighths": byte j (0 <= j < G/8) of group g
//                 holds bit 2 of elements j + i·G/8 in bit i (i = 0..7); group g at d/4 + g·G/8
//   [d/G × Int2GroupMeta]  slot0 = s, slot1 = min (fp16), as uniform INT2
// INT1 row (x̂ = lo or hi):
//   [d/8 bytes]   one plane "by eighths" (as the INT3 high plane), group g at byte g·G/8
//   [d/G × Int2GroupMeta]  slot0 = lo, slot1 = hi (fp16): the two reconstruction levels
// Plain data and constexpr helpers only, usable from CUDA; the quantizers are
// quant/bit_plan_quant.h.
#pragma once

#include <cstdint>

#include "quant/int2_layout.h"
#include "quant/int4_layout.h"

namespace oscar::quant {

inline constexpr int kInt3Levels = 8;  // codes 0..7

// Bytes of one plane "by eighths" (one bit per element): d / 8.
OSCAR_HD constexpr int bit_plane_bytes(int head_dim) { return head_dim / 8; }

OSCAR_HD constexpr int int3_row_bytes(int head_dim, int group_size) {
  return int2_codes_bytes(head_dim) + bit_plane_bytes(head_dim) + int2_meta_bytes(head_dim, group_size);
}
OSCAR_HD constexpr int int1_row_bytes(int head_dim, int group_size) {
  return bit_plane_bytes(head_dim) + int2_meta_bytes(head_dim, group_size);
}

// Offsets inside a row: group g's high-plane bytes (INT3), plane bytes (INT1), and metadata.
OSCAR_HD constexpr int int3_group_high_offset(int head_dim, int g, int group_size) {
  return int2_codes_bytes(head_dim) + g * (group_size / 8);
}
OSCAR_HD constexpr int int3_group_meta_offset(int head_dim, int g) {
  return int2_codes_bytes(head_dim) + bit_plane_bytes(head_dim) + g * static_cast<int>(sizeof(Int2GroupMeta));
}
OSCAR_HD constexpr int int1_group_plane_offset(int g, int group_size) { return g * (group_size / 8); }
OSCAR_HD constexpr int int1_group_meta_offset(int head_dim, int g) {
  return bit_plane_bytes(head_dim) + g * static_cast<int>(sizeof(Int2GroupMeta));
}

// Bytes of one row of `bits` bits per element (4, 3, 2 or 1); 0 for any other width. Every step
// of one bit adds head_dim/8 bytes of codes; the metadata is the same at every width.
OSCAR_HD constexpr int bit_plan_row_bytes(int bits, int head_dim, int group_size) {
  return bits == 4   ? int4_row_bytes(head_dim, group_size)
         : bits == 3 ? int3_row_bytes(head_dim, group_size)
         : bits == 2 ? int2_row_bytes(head_dim, group_size)
         : bits == 1 ? int1_row_bytes(head_dim, group_size)
                     : 0;
}

// Bit of element i (0 <= i < G) in a group's plane "by eighths". `plane`: [G/8] bytes.
OSCAR_HD constexpr uint8_t plane_get_bit(const uint8_t* plane, int i, int group_size) {
  return static_cast<uint8_t>((plane[i % (group_size / 8)] >> (i / (group_size / 8))) & 1u);
}
OSCAR_HD constexpr void plane_set_bit(uint8_t* plane, int i, int group_size, uint8_t bit) {
  const int b = i % (group_size / 8);
  const int sh = i / (group_size / 8);
  plane[b] = static_cast<uint8_t>((plane[b] & ~(1u << sh)) | ((bit & 1u) << sh));
}

static_assert(int3_row_bytes(128, 128) == 52);
static_assert(int1_row_bytes(128, 128) == 20);
static_assert(int3_row_bytes(128, 128) + int1_row_bytes(128, 128) == 2 * int2_row_bytes(128, 128),
              "one 3-bit row and one 1-bit row cost two INT2 rows");
static_assert(int3_row_bytes(128, 32) == 64 && int1_row_bytes(128, 32) == 32);
static_assert(bit_plan_row_bytes(4, 128, 128) - bit_plan_row_bytes(3, 128, 128) == 16 &&
                  bit_plan_row_bytes(2, 128, 128) - bit_plan_row_bytes(1, 128, 128) == 16,
              "one bit more costs head_dim/8 bytes at every width");

}  // namespace oscar::quant
