// Reference quantizers for the 4-, 3- and 1-bit rows of quant/int4_layout.h and
// quant/bit_plan_layout.h (the precision ladder oscar4 / oscar3 and mixed-precision bit plans;
// docs/results/ablation.md, precision_ladder.md). They follow the INT2 quantizers' conventions
// (quant/int2_quant.h): one row at a time, fp16 metadata rounded before the codes are chosen,
// InvalidArgument naming the element for a non-finite input and OutOfRange for metadata beyond
// fp16, the row zero-filled on error; dequantizers trust their input.
//
// INT3, per group: clip to the ρ-quantile of |x| (clip_threshold_ref), lo/hi of the clipped
//   values, min = fp16(lo), s = fp16((hi − min)/7), q = round-half-up((x_c − min)/s) clamped to
//   0..7; constant group (s rounds to 0): codes 0, x̂ = min.
// INT4, per group: as INT3 with 16 levels, s = fp16((hi − min)/15), q clamped to 0..15, codes
//   packed "by halves" (int4_layout.h).
// INT1, per group: the two-level Lloyd-Max quantizer of the group itself (no clip): starting from
//   t = mean, rounds of lo = mean{x < t}, hi = mean{x >= t}, t = (lo + hi)/2 until the partition
//   repeats (at most kInt1LloydRounds; one side empty: lo = hi = mean); lo and hi stored as fp16,
//   and each code picks the nearer stored level (bit = x >= (lo' + hi')/2).
// Preconditions (checked): int2_valid_group(head_dim, G), clip_ratio > 0, non-null pointers.
// The cache (kv::SequenceCache, under a kv::BitPlan) quantizes with these functions directly: a
// plan changes a few planes in 32+ per token (4 of 32 rows in the shipped tiny-qwen3 plan), so
// their sort-based clip costs little next to the forward pass. The decode kernel has its own
// vectorised unpacking (kernels/cpu/decode_attn.cpp), tested against the dequantizers here.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "quant/bit_plan_layout.h"

namespace oscar::quant {

// Upper bound on the INT1 Lloyd rounds; 1-D two-level Lloyd reaches its fixed point in a few.
inline constexpr int kInt1LloydRounds = 32;

// x: [head_dim]; row: [int3_row_bytes(head_dim, G)].
Status quantize_row_int3_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                             uint8_t* row);
void dequantize_row_int3_ref(const uint8_t* row, int head_dim, int group_size, float* out);

// x: [head_dim]; row: [int4_row_bytes(head_dim, G)].
Status quantize_row_int4_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                             uint8_t* row);
void dequantize_row_int4_ref(const uint8_t* row, int head_dim, int group_size, float* out);

// x: [head_dim]; row: [int1_row_bytes(head_dim, G)].
Status quantize_row_int1_ref(const float* x, int head_dim, int group_size, uint8_t* row);
void dequantize_row_int1_ref(const uint8_t* row, int head_dim, int group_size, float* out);

}  // namespace oscar::quant
