// INT2 group quantizers on the CPU (OSCAR.md §1 clipping, §2 quantizer): asymmetric uniform INT2
// and the 4-level Gaussian Lloyd-Max variant, both writing the row layout of quant/int2_layout.h.
//
// Functions ending in `_ref` define "correct": one row (one token, one KV head) at a time, plain
// loops, the clip quantile by a full sort. The functions without `_ref` are the fast CPU path over
// many rows: selection instead of sort, vectorisable pack/unpack loops. They produce bit-identical
// codes and metadata, and dequantize to bit-identical floats (tested). Rotation is not done here
// (quant/rotation.h); the caller rotates first. KIVI's per-channel key layout is in quant/kivi.h.
//
// Algorithm per group of G elements x[0..G):
//  1. Clip (OSCAR.md §1): thr = ρ-quantile of |x| over the group, linear interpolation between
//     order statistics (numpy/torch default: sorted a, pos = ρ(G-1), a[⌊pos⌋] + frac·(a[⌊pos⌋+1] −
//     a[⌊pos⌋])); x_c = clamp(x, −thr, thr). ρ >= 1 means no clipping.
//  2a. Uniform: lo = min x_c, hi = max x_c; min = fp16(lo); s = fp16((hi − min)/3); the codes are
//     chosen for these *stored* fp16 values: t = (x_c − min)/s, q = [t>=0.5]+[t>=1.5]+[t>=2.5]
//     (round half up, clamped to 0..3); x̂ = min + q·s. Constant group (hi == lo, or s rounds to
//     0 in fp16): s = 0, all codes 0, x̂ = fp16(lo).
//  2b. Lloyd-Max: μ = mean x_c, σ = population std of x_c (float64), both rounded to fp16; with
//     t = x_c − μ, q = [t >= −0.9816σ] + [t >= 0] + [t >= 0.9816σ]; x̂ = μ + level[q]·σ with
//     the debiased levels kLloydDequantLevels (below). σ == 0: all codes 0, x̂ = μ.
//
// Error policy (NaN/Inf): quantizers return Status. A non-finite input element is
// InvalidArgument naming the row, group and element; metadata that does not fit fp16 (|values|
// beyond 65504) is OutOfRange. The reference zero-fills the row on error; the fast version writes
// rows before the failing one, zero-fills the failing one and leaves later rows untouched.
// Dequantizers trust their input (it was produced by a quantizer) and return nothing.
//
// Preconditions (checked, abort on violation): int2_valid_group(head_dim, G), clip_ratio > 0,
// non-null pointers. Thread-safety: all functions are pure over their arguments.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/status.h"
#include "quant/int2_layout.h"

namespace oscar::quant {

// Gaussian 4-level Lloyd-Max quantizer in units of σ (OSCAR.md §2). Its MSE is D ≈ 0.1175 σ².
inline constexpr float kLloydThreshold = 0.9816f;
inline constexpr float kLloydLevels[4] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
// Reconstruction levels actually used (beyond the release, docs/results/ablation.md): the
// Lloyd-Max levels divided by their gain 1 − D = 0.8825. Lloyd-Max levels are conditional means,
// so E[x̂ | x] ≈ 0.8825·x: every INT2 logit q·k̂ would shrink by ~12% (a flatter attention over
// the history) and every value's contribution likewise. Debiased, E[x̂ | x] ≈ x at an MSE of
// D / (1 − D) ≈ 0.133 σ², still below clipped uniform INT2 (0.15-0.17 σ²); measured end to end,
// perplexity 5.845 -> 5.565 on 20 windows. Same codes, same bits.
inline constexpr float kLloydGain = 0.8825f;
inline constexpr float kLloydDequantLevels[4] = {-1.5104f / kLloydGain, -0.4528f / kLloydGain,
                                                 0.4528f / kLloydGain, 1.5104f / kLloydGain};

// ρ-quantile of |x[0..n)| with linear interpolation (see above); +inf when clip_ratio >= 1.
// Precondition: all x finite, n > 0, clip_ratio > 0.
float clip_threshold_ref(const float* x, int n, float clip_ratio);

// --- Uniform INT2 -------------------------------------------------------------------------------
// x:   [head_dim] float, one token of one KV head (already rotated if the mode rotates)
// row: [int2_row_bytes(head_dim, group_size)] bytes, written
Status quantize_row_int2_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                             uint8_t* row);
// row: [int2_row_bytes] bytes; out: [head_dim] float
void dequantize_row_int2_ref(const uint8_t* row, int head_dim, int group_size, float* out);

// Fast path. x: [n_rows, head_dim] float; rows: [n_rows, int2_row_bytes(head_dim, G)] bytes.
Status quantize_rows_int2(const float* x, int n_rows, int head_dim, int group_size,
                          float clip_ratio, uint8_t* rows);
// rows: [n_rows, int2_row_bytes] bytes; out: [n_rows, head_dim] float.
void dequantize_rows_int2(const uint8_t* rows, int n_rows, int head_dim, int group_size,
                          float* out);

// --- Lloyd-Max INT2 (same layout, slot0 = σ, slot1 = μ) ------------------------------------------
Status quantize_row_lloyd_ref(const float* x, int head_dim, int group_size, float clip_ratio,
                              uint8_t* row);
void dequantize_row_lloyd_ref(const uint8_t* row, int head_dim, int group_size, float* out);
Status quantize_rows_lloyd(const float* x, int n_rows, int head_dim, int group_size,
                           float clip_ratio, uint8_t* rows);
void dequantize_rows_lloyd(const uint8_t* rows, int n_rows, int head_dim, int group_size,
                           float* out);

// Metadata of group g of a row (unaligned-safe read / write).
inline Int2GroupMeta read_group_meta(const uint8_t* row, int head_dim, int g) {
  Int2GroupMeta m;
  std::memcpy(&m, row + int2_group_meta_offset(head_dim, g), sizeof m);
  return m;
}
inline void write_group_meta(uint8_t* row, int head_dim, int g, Int2GroupMeta m) {
  std::memcpy(row + int2_group_meta_offset(head_dim, g), &m, sizeof m);
}

}  // namespace oscar::quant
