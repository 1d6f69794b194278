// The small ops of a decoder layer: embedding lookup, RMSNorm, RoPE, SwiGLU and the residual add.
// Float32 activations, row-major. Each is written to match Hugging Face's float32 reference
// operation for operation (the goldens of models/tiny-qwen3 hold the model to it).
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "core/hd.h"
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
  const float* cos = nullptr;  // [n_rows, rotary_dim / 2] of each row's position
  const float* sin = nullptr;
  float* q = nullptr;          // [n_rows, n_heads_q, head_dim], rotated in place
  float* k = nullptr;          // [n_rows, n_heads_kv, head_dim], rotated in place
  // Qwen3's q_norm / k_norm [head_dim] (or null): each head RMS-normalized before its rotation,
  // exactly rms_norm(q, n_rows · n_heads_q, head_dim, q_norm, norm_eps, q) first (same bits).
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 0.f;
  // Partial rotary (Qwen3.5: head_dim · partial_rotary_factor): only the first rotary_dim dims of
  // each head turn, as halves of rotary_dim / 2; the rest pass through. 0 = head_dim. CPU only.
  // (Last, so that the positional initialisations of the full-rotary callers stay as they were.)
  int32_t rotary_dim = 0;
};
// Non-interleaved halves (rotate_half): (a, b) -> (a·cos − b·sin, b·cos + a·sin), after the
// per-head norms when q_norm / k_norm are set.
Status rope(const RopeParams& p);
// cos/sin of positions·inv_freq in float32 angles, as the reference computes them.
// positions: [n_rows]; inv_freq: [half]; cos, sin: [n_rows, half].
void rope_tables(const int32_t* positions, int64_t n_rows, const float* inv_freq, int64_t half,
                 float* cos, float* sin);

// gate = silu(gate) ⊙ up, n values.
Status silu_mul(float* gate, const float* up, int64_t n);
// x = x ⊙ sigmoid(gate), n values (Qwen3.5's gated attention output: attn · sigmoid(gate)).
Status sigmoid_mul(float* x, const float* gate, int64_t n);
// x[r, :] = x[r, :] · sigmoid(gate[r]), rows of dim values (Qwen3-Next's shared-expert gate).
Status sigmoid_scale_rows(float* x, const float* gate, int64_t rows, int64_t dim);
// x += y, n values.
Status add(float* x, const float* y, int64_t n);
// dst[i, :] = src[rows[i], :], n rows of dim values (the rows that produce logits).
Status gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t dim, float* dst);

// Random weights for --dummy-weights, the same bits on every backend: value i is
// (Σ of the four 16-bit lanes of SplitMix64(seed + i) − 2·65535) · std·√3 / 65536, rounded to
// bf16 (an Irwin–Hall sum of four uniforms: mean 0, standard deviation ≈ std, |x| < 2√3·std).
// Integer arithmetic and one float multiply, so host and device agree exactly.
Status fill_normal_bf16(bf16_t* dst, int64_t n, float std, uint64_t seed);
OSCAR_HD inline float dummy_weight(uint64_t seed, int64_t i, float std) {
  uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const int32_t sum = static_cast<int32_t>(z & 0xFFFF) + static_cast<int32_t>((z >> 16) & 0xFFFF) +
                      static_cast<int32_t>((z >> 32) & 0xFFFF) + static_cast<int32_t>(z >> 48);
  return static_cast<float>(sum - 2 * 65535) * (std * 1.7320508f / 65536.0f);
}

// CUDA versions (kernels/cuda/elementwise.cu, built with OSCAR_CUDA): the same contracts over
// device pointers, asynchronous on `stream` (a cudaStream_t), checked at launch.
Status embed_cuda(const WeightView& table, const int32_t* ids, int64_t n, float* x, void* stream);
Status rms_norm_cuda(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
                     void* stream);
// x += y, then h = rms_norm(x): add_cuda then rms_norm_cuda in one launch, the same bits.
Status add_rms_norm_cuda(float* x, const float* y, int64_t rows, int64_t dim, const float* w,
                         float eps, float* h, void* stream);
Status rope_cuda(const RopeParams& p, void* stream);
Status silu_mul_cuda(float* gate, const float* up, int64_t n, void* stream);
Status add_cuda(float* x, const float* y, int64_t n, void* stream);
Status gather_rows_cuda(const float* src, const int32_t* rows, int64_t n, int64_t dim, float* dst,
                        void* stream);
Status fill_normal_bf16_cuda(bf16_t* dst, int64_t n, float std, uint64_t seed, void* stream);

}  // namespace oscar::kernels
