// Gated DeltaNet ("linear_attention") layer ops of the hybrid Qwen models (Qwen3-Next, Qwen3.5):
// the causal depthwise conv1d with its state, the gates, the gated delta rule (recurrent for
// decode, chunked for prefill), and the two norms these models use. Semantics follow Hugging Face
// transformers' modeling_qwen3_next.py (torch_causal_conv1d_update, torch_chunk_gated_delta_rule,
// torch_recurrent_gated_delta_rule, Qwen3NextRMSNormGated, Qwen3NextRMSNorm); the projections
// around them (in_proj_qkv/z/b/a, out_proj) are linear() (kernels/linear.h). Not here: the
// state pool (kv/state_pool.h), the layer (model/blocks.h: gated_delta_net), and any device
// version: the Backend virtuals causal_conv1d / gdn_gates / gated_delta_rule / rms_norm_gated are
// these fast paths on the CPU and say "not implemented on <device> yet" elsewhere.
//
// Batching: token rows of several sequences packed one sequence after another, cu_seqlens
// [n_seqs + 1] (host memory, ascending, cu_seqlens[0] = 0) marks each sequence's rows; a sequence
// of one row is a decode step, more rows a prefill (chunk). Each sequence owns one state slot
// (slots[s], or s when slots is null) in a caller-owned pool, read at the start and overwritten
// with the state after its last row. A fresh sequence starts from a zeroed slot. Two sequences of
// one call must not share a slot.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace oscar::kernels {

// ---------------------------------------------------------------------------------------------
// Causal depthwise conv1d (the q/k/v mixer; Qwen3-Next: K = linear_conv_kernel_dim = 4, no bias,
// SiLU after). For channel c and a sequence's row t, with u the sequence's inputs preceded by
// the K-1 inputs in its state:
//   y[t][c] = act(bias[c] + Σ_{j=0..K-1} w[c][j] · u[t - (K-1) + j][c]),
// which is F.conv1d(cat(state, x), w, groups=channels) over the last T positions, as
// causal_conv1d_update and the prefill path (conv with left padding K-1) compute it. The state
// after: the last K-1 entries of cat(state, x) (transformers keeps K entries, the oldest unread).
struct CausalConv1dParams {
  const float* x = nullptr;             // [n_tokens, channels] inputs, sequence after sequence
  const int32_t* cu_seqlens = nullptr;  // [n_seqs + 1] host
  int32_t n_seqs = 0;
  int64_t channels = 0;
  int32_t kernel_size = 4;      // K >= 1
  const float* w = nullptr;     // [channels, K] (conv1d.weight [channels, 1, K] squeezed)
  const float* bias = nullptr;  // [channels], or null
  bool silu = true;             // act = SiLU (the models'), else identity
  float* state = nullptr;       // [n_slots, K-1, channels] in/out: row r = input K-1-r steps back
  const int32_t* slots = nullptr;  // [n_seqs] host, or null (sequence s uses slot s)
  float* y = nullptr;              // out: [n_tokens, channels]; may not alias x
};

// ---------------------------------------------------------------------------------------------
// Gates, per token and value head h:
//   g[t][h]    = -exp(A_log[h]) · softplus(a[t][h] + dt_bias[h])  (log decay, <= 0)
//   beta[t][h] = sigmoid(b[t][h])
// softplus as torch's (x for x > 20, else log1p(exp(x))).
struct GdnGatesParams {
  const float* a = nullptr;        // [n_tokens, n_heads_v]
  const float* b = nullptr;        // [n_tokens, n_heads_v]
  const float* A_log = nullptr;    // [n_heads_v]
  const float* dt_bias = nullptr;  // [n_heads_v]
  int64_t n_tokens = 0;
  int32_t n_heads_v = 0;
  float* g = nullptr;     // out: [n_tokens, n_heads_v]
  float* beta = nullptr;  // out: [n_tokens, n_heads_v]
};

// ---------------------------------------------------------------------------------------------
// Gated delta rule, per sequence and value head h (key head h / (n_heads_v / n_heads_k): the
// repeat_interleave of transformers), state S [d_k, d_v]. With q̂ = l2norm(q) / sqrt(d_k),
// k̂ = l2norm(k) (l2norm(x) = x / sqrt(Σ x² + 1e-6); both skipped when !l2norm_qk, the scale
// kept), for each row t in order:
//   S ← S · exp(g_t);  m = k̂ᵀ S;  δ = (v_t - m) · β_t;  S ← S + k̂ ⊗ δ;  o_t = q̂ᵀ S.
// That recurrence (torch_recurrent_gated_delta_rule) defines the op. The chunked form
// (torch_chunk_gated_delta_rule, chunk 64) is the same map, written per chunk of n rows with
// G = cumsum(g) within the chunk, Γ_ij = exp(G_i - G_j) (i >= j):
//   L = strictly-lower(diag(β) K Kᵀ ∘ Γ);  [U | W] = (I + L)⁻¹ [diag(β) V | diag(β e^G) K];
//   V' = U - W S;  O = (Q ∘ e^G) S + lower(Q Kᵀ ∘ Γ) V';  S ← e^{G_n} S + (K ∘ e^{G_n - G})ᵀ V'.
enum class GatedDeltaMode {
  kAuto,       // one-row sequences (decode) recurrent, longer ones chunked
  kRecurrent,  // every sequence by the recurrence
  kChunked,    // every sequence by the chunked form
};

struct GatedDeltaParams {
  // Row strides (elements between one token's row and the next) let q, k, v be views into the
  // conv output [n_tokens, 2·n_heads_k·d_k + n_heads_v·d_v]; 0 means dense (heads·dim).
  const float* q = nullptr;  // [n_tokens, n_heads_k, d_k]
  const float* k = nullptr;  // [n_tokens, n_heads_k, d_k]
  const float* v = nullptr;  // [n_tokens, n_heads_v, d_v]
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* g = nullptr;             // [n_tokens, n_heads_v] log decay
  const float* beta = nullptr;          // [n_tokens, n_heads_v]
  const int32_t* cu_seqlens = nullptr;  // [n_seqs + 1] host
  int32_t n_seqs = 0;
  int32_t n_heads_k = 0, n_heads_v = 0;  // n_heads_v a multiple of n_heads_k
  int32_t d_k = 0, d_v = 0;
  bool l2norm_qk = true;           // the models': use_qk_l2norm_in_kernel=True
  float* state = nullptr;          // [n_slots, n_heads_v, d_k, d_v] in/out
  const int32_t* slots = nullptr;  // [n_seqs] host, or null (sequence s uses slot s)
  float* o = nullptr;              // out: [n_tokens, n_heads_v, d_v]; may not alias the inputs
  GatedDeltaMode mode = GatedDeltaMode::kAuto;  // fast path only (the reference is recurrent)
};

constexpr int32_t kGatedDeltaChunk = 64;  // chunk_size of torch_chunk_gated_delta_rule
constexpr double kGdnL2NormEps = 1e-6;    // l2norm's eps (on the sum of squares)

// ---------------------------------------------------------------------------------------------
// Norms over rows of dim values, r = 1 / sqrt(mean(x²) + eps):
//   rms_norm_gated:  y = x · r · w · silu(z)   (Qwen3NextRMSNormGated: o per value head, z its
//   gate) rms_norm_zc:     y = x · r · (1 + w)       (Qwen3NextRMSNorm: zero-centred weight)
// y may alias x.
struct RmsNormGatedParams {
  const float* x = nullptr;  // [rows, dim]
  const float* z = nullptr;  // [rows, dim] gate
  const float* w = nullptr;  // [dim]
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
  float* y = nullptr;  // out: [rows, dim]
};

// Plain loops in float64 (cpu/gated_delta_ref.cpp): define "correct". The delta rule's reference
// is the recurrence.
Status causal_conv1d_ref(const CausalConv1dParams& p);
Status gdn_gates_ref(const GdnGatesParams& p);
Status gated_delta_rule_ref(const GatedDeltaParams& p);
Status rms_norm_gated_ref(const RmsNormGatedParams& p);
Status rms_norm_zc_ref(const float* x, int64_t rows, int64_t dim, const float* w, float eps,
                       float* y);

// Fast CPU paths (cpu/gated_delta.cpp), float32. The conv runs channels in vector lanes; the delta
// rule runs (sequence, value head) pairs over threads, decode by the recurrence and prefill by the
// chunked form (Eigen products per chunk; G accumulated in float64 so that exp(G_i - G_j) stays
// accurate when g is very negative). Scratch is allocated per call (a few chunk-sized matrices per
// thread).
Status causal_conv1d(const CausalConv1dParams& p);
Status gdn_gates(const GdnGatesParams& p);
Status gated_delta_rule(const GatedDeltaParams& p);
Status rms_norm_gated(const RmsNormGatedParams& p);
Status rms_norm_zc(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y);

// The chunked form in float64 (same code as the fast path's, instantiated for double): a test of
// the algebra (chunked == recurrence to ~1e-12), not a production path. Ignores p.mode.
Status gated_delta_rule_chunked_f64(const GatedDeltaParams& p);

}  // namespace oscar::kernels
