// Decode attention over a paged three-region KV cache (OSCAR.md §4-§5): one new query per query
// head attends to all n_tokens keys of one layer, read straight from the pages:
//   sinks    tokens [0, n_sink_tokens)             exact pages (BF16, or F32 in the reference mode)
//   history  tokens [n_sink_tokens, hist_end)      INT2 pages, unpacked and dequantized per row in
//                                                  a small local buffer, never materialised whole
//   recent   tokens [hist_end, n_tokens)           exact pages
// Each region (and each chunk of the history) gives a split-KV partial state (o, m, ℓ); the
// partials merge by log-sum-exp (online softmax). Both entry points compute exactly softmax
// attention over the dequantized cache, to rounding.
//
// Also here: the partial-state convention and merge_attn_states(), which CUDA code will share.
// Not here: prefill / multi-query attention (kernels/chunk_attn.h), rotation of q by R_K (the
// caller does it: q must already be in the rotated key basis), the page tables' ownership
// (kv::SequenceCache fills the page-id lists).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/kv_layout.h"

namespace oscar::kernels {

// How INT2 rows were quantized (quant/int2_quant.h); both share the row layout of
// quant/int2_layout.h and dequantize to a 4-entry level table per group.
enum class Int2Quantizer : int32_t {
  kUniform = 0,  // slot0 = scale s, slot1 = min:  x̂ = min + q·s
  kLloyd = 1,    // slot0 = σ, slot1 = μ:          x̂ = μ + level[q]·σ
};

// One page-addressed run of tokens. Token t of the segment (0 <= t < n_tokens) lives in page
// pages[t / page_size], slot t % page_size; the page's bytes start at pool + page * page_bytes.
struct KvSegment {
  const int32_t* pages = nullptr;  // [ceil(n_tokens / page_size)] page ids
  int64_t n_tokens = 0;            // 0 = empty segment (pages may be null)
};

struct DecodeAttnParams {
  int32_t n_heads_q = 0;       // multiple of layout.n_heads_kv (gqa_ratio = n_heads_q / n_heads_kv)
  int32_t group_size = 128;    // quant_group: values per INT2 scale/min (history only)
  Int2Quantizer quantizer = Int2Quantizer::kUniform;
  int32_t layer = 0;           // which layer's rows to read, 0 <= layer < layout.n_layers
  float scale = 0.f;           // softmax scale, usually 1/sqrt(head_dim)
  // Page layout: n_layers, n_heads_kv, head_dim, page_size, exact_elem_bytes (2 = bf16, 4 = f32),
  // int2_row_bytes (must equal quant::int2_row_bytes(head_dim, group_size) when history exists),
  // and optionally a bit plan (hist_bits, hist_row_prefix; uniform quantizer only): history rows
  // of 3, 2 or 1 bits per element, per (K/V, KV head) of the layer.
  KvPageLayout layout;

  // [n_heads_q, head_dim] float, already rotated by R_K (OSCAR.md §3). Query head h reads KV head
  // h / gqa_ratio.
  const float* q = nullptr;
  // Exact pool: [n_pages, layout.exact_page_bytes()] bytes, page layout kernels/kv_layout.h.
  const uint8_t* exact_pool = nullptr;
  KvSegment sinks;   // tokens [0, sinks.n_tokens), exact pool
  KvSegment recent;  // tokens [hist_end, n_tokens), exact pool
  // INT2 pool: [n_pages, layout.int2_page_bytes()] bytes; may be null when history is empty.
  const uint8_t* int2_pool = nullptr;
  KvSegment history;  // tokens [sinks.n_tokens, hist_end), INT2 pool

  // Fast path only: tokens per chunk; every segment is cut into chunks, one parallel task per
  // (KV head, chunk). 0 = chosen from the token count and the thread count. Tests set small
  // values to force many partials and merges. The reference ignores it.
  int32_t chunk_tokens = 0;

  float* out = nullptr;  // [n_heads_q, head_dim] float, written. No keys at all: zeros.
};

// Plain loops, float64 accumulation, each INT2 row dequantized by quant's *_ref functions; one
// partial per region, merged in float64. Defines "correct". Single-threaded.
Status decode_attn_ref(const DecodeAttnParams& p);
// Fast CPU path: OpenMP tasks over (KV head, segment chunk); each task serves all gqa_ratio
// query heads of its KV head (each K/V row is read and unpacked once per group); rows are
// unpacked with shifts and masks (AVX2 when compiled with it) into a small per-thread float
// buffer ([32, head_dim], one block of tokens);
// float accumulation; partials merged by merge_attn_states. Allocates its partial buffers per
// call ([n_heads_q, n_parts, head_dim + 2] floats).
Status decode_attn(const DecodeAttnParams& p);

// Split-KV partial state of one query row over a set of keys with scores s_j and values v_j:
//   m = max_j s_j,  ℓ = Σ_j exp(s_j − m),  o = Σ_j exp(s_j − m) · v_j   (o NOT divided by ℓ)
// An empty key set is m = -inf, ℓ = 0, o = 0.
//
// merge_attn_states combines n_parts partials of n_rows rows into the normalised output:
//   M = max_p m_p,  ℓ = Σ_p ℓ_p e^{m_p − M},  out = Σ_p o_p e^{m_p − M} / ℓ
// Parts with m = -inf contribute nothing; a row whose parts are all empty gets out = 0.
//   o:   [n_parts, n_rows, head_dim]     m, l: [n_parts, n_rows]     out: [n_rows, head_dim]
// `part_stride_rows` lets o/m/l be strided per part (the row count between parts, >= n_rows).
void merge_attn_states(const float* o, const float* m, const float* l, int n_parts, int n_rows,
                       int head_dim, int64_t part_stride_rows, float* out);

// Checks shapes, pointers and layout consistency; shared by both entry points.
Status validate_decode_attn(const DecodeAttnParams& p);

}  // namespace oscar::kernels
