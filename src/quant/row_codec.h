// The one table of history row formats (OSCAR.md §2, §8): for each format its bits, its row
// bytes, its reference quantizer and its dequantizer, like ggml's type_traits. Every place that
// quantizes or reads a history row (demotion, the decode-equivalent prefill, the reference decode,
// SequenceCache::read_row) goes through it, so a new width is one row of this table.
//
// A KIVI key is not a row but a block of 32 tokens quantized per channel (quant/kivi.h); it is the
// one format outside this table, and kHistKivi's key planes say so (hist_row_format()).
// Not here: the fast decode kernels' own unpacking (kernels/cpu/decode_attn.cpp, CUDA), which read
// the same bytes; the layouts themselves (quant/int2_layout.h, quant/int4_layout.h,
// quant/bit_plan_layout.h, kivi.h).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace oscar::quant {

enum class RowFormat : int32_t {
  kInt2Uniform = 0,   // 2 bits, uniform grid with clip (x̂ = min + q·s)
  kInt2Lloyd = 1,     // 2 bits, Lloyd-Max levels (x̂ = μ + level[q]·σ)
  kInt3 = 2,          // 3 bits, uniform with clip (bit plans)
  kInt1 = 3,          // 1 bit, two Lloyd-Max levels, no clip (bit plans)
  kKiviValue = 4,     // KIVI value row: 2 bits per token over groups of 32 channels, no clip
  kKiviKeyBlock = 5,  // KIVI key block (32 tokens, per channel): not a row, see above
  kInt4 = 6,          // 4 bits, uniform with clip (oscar4, --kv-bits plans; quant/int4_layout.h)
};

struct RowCodec {
  const char* name;
  int bits;  // bits per element of the codes
  // Bytes of one row of head_dim values with group size G (ignored by the KIVI value row).
  int (*row_bytes)(int head_dim, int group_size);
  // Reference quantizer: x [head_dim] -> row. InvalidArgument on non-finite input or bad sizes.
  Status (*quantize)(const float* x, int head_dim, int group_size, float clip, uint8_t* row);
  // row -> out [head_dim] float.
  void (*dequantize)(const uint8_t* row, int head_dim, int group_size, float* out);
};

// The codec of a row format; kKiviKeyBlock has none (checked).
const RowCodec& row_codec(RowFormat format);

// How the history rows of an engine are made (the cache mode's side of the table), and the
// quantizer choice of everything that reads or makes INT2 rows: the decode kernels
// (kernels/decode_attn.h) and the clip search (calib/clip_search.h), which take only the two INT2
// ones. Both share the row layout of quant/int2_layout.h and dequantize to a 4-entry level table
// per group: kInt2Uniform has slot0 = scale s, slot1 = min, x̂ = min + q·s; kInt2Lloyd has
// slot0 = σ, slot1 = μ, x̂ = μ + level[q]·σ. kKivi is quant/kivi.h.
enum class HistQuantizer : int32_t { kInt2Uniform = 0, kInt2Lloyd = 1, kKivi = 2 };

// The format of a history plane: K or V (kv 0/1) of a head whose bit plan width is `bits`
// (2 without a plan). Widths 1, 3 and 4 are uniform (Lloyd for 1) whatever the quantizer.
RowFormat hist_row_format(HistQuantizer quantizer, int kv, int bits);

}  // namespace oscar::quant
