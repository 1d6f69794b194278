// KIVI-style 2-bit baseline (`kivi2`, OSCAR.md §8): keys per channel over blocks of 32 tokens,
// values per token over groups of 32 channels, plain min/max asymmetric INT2 with fp16 scale and
// min, no rotation, no clipping. The 128-token full-precision residual and the cache plumbing are
// kv/'s business; this file only defines the storage of one key block and one value row and
// their reference quantizers.
//
// Key block (32 tokens x head_dim): for every channel c, its 32 values (one per token) form one
// uniform INT2 group of G = 32 along the token axis, quantized exactly as quantize_row_int2_ref
// would (same rounding, same constant-group guard) and packed by quarters (token t of the
// block in byte t % 8 at shift 2 * (t / 8)). Block layout, no padding:
//   [head_dim x 8 bytes]            codes, channel c at bytes [8c, 8c + 8)
//   [head_dim x Int2GroupMeta]      (scale, min) of channel c at index c
// = 12 · head_dim bytes for 32 · head_dim elements = 3 bits/element (head_dim 128: 1536 bytes).
// Value row: the ordinary INT2 row of int2_layout.h with G = 32: head_dim/4 + (head_dim/32) · 4
// bytes = 3 bits/element (head_dim 128: 48 bytes).
// NaN/Inf and fp16-overflow policy: as in int2_quant.h (Status; output zero-filled on error).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "quant/int2_layout.h"

namespace oscar::quant {

inline constexpr int kKiviKeyBlockTokens = 32;   // tokens per key block (per-channel group)
inline constexpr int kKiviValueGroup = 32;       // channels per value group
inline constexpr int kKiviResidualTokens = 128;  // full-precision recent tokens (used by kv/)

// Bytes of one key block for one head: 32 · head_dim / 4 codes + head_dim · 4 metadata.
constexpr int kivi_key_block_bytes(int head_dim) {
  return head_dim * (kKiviKeyBlockTokens / kInt2CodesPerByte) +
         head_dim * static_cast<int>(sizeof(Int2GroupMeta));
}
// Bytes of one value row for one head.
constexpr int kivi_value_row_bytes(int head_dim) { return int2_row_bytes(head_dim, kKiviValueGroup); }

static_assert(kivi_key_block_bytes(128) == 1536);  // 3 bits per element
static_assert(kivi_value_row_bytes(128) == 48);    // 3 bits per element

// k: [32, head_dim] float, row-major (token, channel); block: [kivi_key_block_bytes] written.
// Precondition: head_dim > 0 (checked).
Status quantize_kivi_key_block_ref(const float* k, int head_dim, uint8_t* block);
// block: [kivi_key_block_bytes]; k: [32, head_dim] float written.
void dequantize_kivi_key_block_ref(const uint8_t* block, int head_dim, float* k);
// One token t (0 <= t < 32) of a key block: k_t [head_dim] written, bit-identical to row t of
// dequantize_kivi_key_block_ref (same fp16 decode, same min + code * scale). For reading single
// rows (kv::SequenceCache::read_row) without dequantizing the other 31.
void dequantize_kivi_key_token(const uint8_t* block, int head_dim, int t, float* k_t);

// v: [head_dim] float; row: [kivi_value_row_bytes] written. Precondition: head_dim % 32 == 0.
Status quantize_kivi_value_row_ref(const float* v, int head_dim, uint8_t* row);
void dequantize_kivi_value_row_ref(const uint8_t* row, int head_dim, float* v);

}  // namespace oscar::quant
