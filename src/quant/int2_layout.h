// The one definition of the INT2 group storage (OSCAR.md §2), shared by CPU and CUDA code.
//
// A token's row for one KV head holds head_dim elements split into groups of G consecutive
// elements (G in {32, 64, 128}, G divides head_dim). The row is
//   [head_dim/4 bytes]            codes: group g owns bytes [g*G/4, (g+1)*G/4)
//   [head_dim/G x Int2GroupMeta]  metadata: two fp16 per group, group g at index g
// and nothing else (no padding). For head_dim 128, G 128: 32 + 4 = 36 bytes = 2.25 bits/element.
//
// Codes inside a group are packed "by quarters": byte j (0 <= j < G/4) of the group holds the
// 2-bit codes of elements j, j + G/4, j + G/2, j + 3G/4 in bit pairs 0-1, 2-3, 4-5, 6-7. So
// element i lives in byte i % (G/4) at bit shift 2 * (i / (G/4)); unpacking a quarter of the
// group is one shift and one mask per byte.
//
// Metadata slots (fp16 bits, IEEE binary16, see core/bf16.h):
//   uniform INT2:  slot0 = scale s,  slot1 = min;        x̂ = min + q * s
//   Lloyd-Max:     slot0 = sigma σ,  slot1 = mean μ;     x̂ = μ + level[q] * σ
// Both slots are plain fp16 bits; the metadata area starts at byte head_dim/4, which is a multiple
// of 8, so it is 2-byte aligned whenever the row is (CPU code reads it with memcpy regardless).
//
// This header holds only plain data and constexpr helpers: no STL, no allocation, no CUDA
// includes. The quantizers themselves live in quant/int2_quant.h; the KIVI baseline's own layout
// in quant/kivi.h.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "core/hd.h"

namespace oscar::quant {

inline constexpr int kInt2Levels = 4;        // codes 0..3
inline constexpr int kInt2CodesPerByte = 4;  // 2 bits each

// Per-group metadata, as stored: two fp16 values, 4 bytes, no padding.
struct Int2GroupMeta {
  fp16_t slot0;  // uniform: scale s (>= 0); Lloyd-Max: sigma σ (>= 0)
  fp16_t slot1;  // uniform: min;            Lloyd-Max: mean μ
};
static_assert(sizeof(Int2GroupMeta) == 4, "Int2GroupMeta must be two packed fp16");

// True when G is one of the supported group sizes and divides head_dim (head_dim > 0).
OSCAR_HD constexpr bool int2_valid_group(int head_dim, int group_size) {
  return (group_size == 32 || group_size == 64 || group_size == 128) && head_dim > 0 &&
         head_dim % group_size == 0;
}

OSCAR_HD constexpr int int2_groups_per_row(int head_dim, int group_size) {
  return head_dim / group_size;
}

// Bytes of packed codes in one row: head_dim / 4.
OSCAR_HD constexpr int int2_codes_bytes(int head_dim) { return head_dim / kInt2CodesPerByte; }

// Bytes of metadata in one row: (head_dim / G) groups x 2 fp16.
OSCAR_HD constexpr int int2_meta_bytes(int head_dim, int group_size) {
  return int2_groups_per_row(head_dim, group_size) * static_cast<int>(sizeof(Int2GroupMeta));
}

// Bytes of one token's row for one head: codes followed by metadata.
OSCAR_HD constexpr int int2_row_bytes(int head_dim, int group_size) {
  return int2_codes_bytes(head_dim) + int2_meta_bytes(head_dim, group_size);
}

// Byte offset, inside a row, of group g's first code byte and of its metadata.
OSCAR_HD constexpr int int2_group_codes_offset(int g, int group_size) {
  return g * (group_size / kInt2CodesPerByte);
}
OSCAR_HD constexpr int int2_group_meta_offset(int head_dim, int g) {
  return int2_codes_bytes(head_dim) + g * static_cast<int>(sizeof(Int2GroupMeta));
}

// Position of element i (0 <= i < G) of a group: its byte within the group's code bytes and the
// bit shift of its 2-bit code in that byte ("by quarters").
OSCAR_HD constexpr int int2_code_byte(int i, int group_size) {
  return i % (group_size / kInt2CodesPerByte);
}
OSCAR_HD constexpr int int2_code_shift(int i, int group_size) {
  return 2 * (i / (group_size / kInt2CodesPerByte));
}

// Reads / writes the code of element i of one group. `group_codes`: [G/4] bytes of that group.
OSCAR_HD constexpr uint8_t int2_get_code(const uint8_t* group_codes, int i, int group_size) {
  return static_cast<uint8_t>((group_codes[int2_code_byte(i, group_size)] >>
                               int2_code_shift(i, group_size)) & 3u);
}
OSCAR_HD constexpr void int2_set_code(uint8_t* group_codes, int i, int group_size,
                                            uint8_t code) {
  const int b = int2_code_byte(i, group_size);
  const int sh = int2_code_shift(i, group_size);
  group_codes[b] = static_cast<uint8_t>((group_codes[b] & ~(3u << sh)) | ((code & 3u) << sh));
}

// A row's codes read as 32-bit words (how the CUDA prefill kernel unpacks a tile: one load per
// 16 elements): word w holds code bytes 4w .. 4w+3, all in group int2_word_group(w, G) (G / 4 is
// a multiple of 4). Its code at bit shift 8x + 2k (x, k in 0..3) is the element
// int2_word_element(w, G, k) + x of the row: four runs of four consecutive elements.
OSCAR_HD constexpr int int2_word_group(int w, int group_size) {
  return 4 * w / (group_size / kInt2CodesPerByte);
}
OSCAR_HD constexpr int int2_word_element(int w, int group_size, int k) {
  const int quarter = group_size / kInt2CodesPerByte;
  return int2_word_group(w, group_size) * group_size + k * quarter + (4 * w) % quarter;
}
OSCAR_HD constexpr uint32_t int2_word_code(uint32_t word, int x, int k) {
  return (word >> (8 * x + 2 * k)) & 3u;
}

// Byte-permutation selector of run k of a code word (how the CUDA prefill kernels unpack): with a
// group's four levels as BF16 at bytes 2q, 2q + 1 of an 8-byte pair {lo, hi}, __byte_perm(lo, hi,
// sel) is elements 0 and 1 of the run as a BF16 pair, and __byte_perm(lo, hi, sel >> 16) elements
// 2 and 3. Byte x of (word >> 2k) & 0x03030303 is element x's code q, and q·0x22 + 0x10 is the
// selector byte of nibbles 2q, 2q + 1 (no carries: q·0x22 + 0x10 <= 0x76).
OSCAR_HD constexpr uint32_t int2_run_perm_selector(uint32_t word, int k) {
  return ((word >> (2 * k)) & 0x03030303u) * 0x22u + 0x10101010u;
}

// Bits per element of the quantized region alone (codes + metadata), e.g. 2.25 for G = 128.
OSCAR_HD constexpr double int2_bits_per_element(int head_dim, int group_size) {
  return 8.0 * int2_row_bytes(head_dim, group_size) / head_dim;
}

static_assert(int2_codes_bytes(128) == 32);
static_assert(int2_meta_bytes(128, 128) == 4);
static_assert(int2_row_bytes(128, 128) == 36);
static_assert(int2_row_bytes(128, 64) == 40);
static_assert(int2_row_bytes(128, 32) == 48);
static_assert(int2_bits_per_element(128, 128) == 2.25);
static_assert(int2_bits_per_element(128, 32) == 3.0);
static_assert(int2_code_byte(33, 128) == 1 && int2_code_shift(33, 128) == 2);
static_assert(int2_code_byte(127, 128) == 31 && int2_code_shift(127, 128) == 6);
static_assert(int2_valid_group(128, 64) && !int2_valid_group(96, 64) && !int2_valid_group(128, 16));

}  // namespace oscar::quant
