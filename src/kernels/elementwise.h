// The small ops of a decoder layer: embedding lookup, RMSNorm, RoPE, SwiGLU and the residual add.
// Float32 activations, row-major. Each is written to match Hugging Face's float32 reference
// operation for operation (the goldens of models/tiny-qwen3 hold the model to it).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/linear.h"

namespace oscar::kernels {

// x[i, :] = table[ids[i], :] widened to float. table: [vocab, hidden].
Status embed(const WeightView& table, const int32_t* ids, int64_t n, float* x);

// y = w ⊙ x / sqrt(mean(x²) + eps), row by row. x, y: [rows, dim] (may alias); w: [dim].
Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y);

struct RopeParams {
  int64_t n_rows = 0;
  int32_t n_heads_q = 0, n_heads_kv = 0, head_dim = 0;
  const float* cos = nullptr;  // [n_rows, head_dim / 2] of each row's position
  const float* sin = nullptr;
  float* q = nullptr;          // [n_rows, n_heads_q, head_dim], rotated in place
  float* k = nullptr;          // [n_rows, n_heads_kv, head_dim], rotated in place
};
// Non-interleaved halves (rotate_half): (a, b) -> (a·cos − b·sin, b·cos + a·sin).
Status rope(const RopeParams& p);
// cos/sin of positions·inv_freq in float32 angles, as the reference computes them.
// positions: [n_rows]; inv_freq: [half]; cos, sin: [n_rows, half].
void rope_tables(const int32_t* positions, int64_t n_rows, const float* inv_freq, int64_t half,
                 float* cos, float* sin);

// gate = silu(gate) ⊙ up, n values.
Status silu_mul(float* gate, const float* up, int64_t n);
// x += y, n values.
Status add(float* x, const float* y, int64_t n);

}  // namespace oscar::kernels
