// Decode attention over a paged three-region KV cache (OSCAR.md §4-§5), batched: each of n_seqs
// sequences has one new query per query head, which attends to all of that sequence's keys of one
// layer, read straight from the pages:
//   sinks    tokens [0, n_sink_s)                 exact pages (BF16, or F32 in the reference mode)
//   history  tokens [n_sink_s, n_sink_s + n_hist_s)  history pages (INT2 / bit-plan rows),
//                                                  unpacked and dequantized per row in a small
//                                                  local buffer, never materialised whole
//   recent   tokens [.., n_tokens_s)              exact pages
// Each region's pages are one PageTableView over the batch (kernels/page_table.h), so one call per
// layer serves the whole batch. Each region (and each chunk of it) gives a split-KV partial state
// (o, m, ℓ); the partials merge by log-sum-exp (online softmax). Every entry point computes exactly
// softmax attention over the dequantized cache, to rounding.
//
// Also here: the partial-state convention and merge_attn_states(), which CUDA code shares.
// Not here: prefill / multi-query attention (kernels/chunk_attn.h), rotation of q by R_K (the
// caller does it: q must already be in the rotated key basis), the page tables' ownership
// (the step planner, kv/step_plan.h, fills them).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/kv_layout.h"
#include "kernels/page_table.h"
#include "quant/row_codec.h"

namespace oscar::kernels {

struct DecodeAttnParams {
  int32_t n_seqs = 1;          // sequences in the batch, each with one query row per query head
  int32_t n_heads_q = 0;       // multiple of layout.n_heads_kv (gqa_ratio = n_heads_q / n_heads_kv)
  int32_t group_size = 128;    // quant_group: values per INT2 scale/min (history only)
  quant::HistQuantizer quantizer = quant::HistQuantizer::kInt2Uniform;  // INT2 only: no KIVI
  int32_t layer = 0;           // which layer's rows to read, 0 <= layer < layout.n_layers
  float scale = 0.f;           // softmax scale, usually 1/sqrt(head_dim)
  // Page layout: n_layers, n_heads_kv, head_dim, page_size, exact_elem_bytes (2 = bf16, 4 = f32),
  // int2_row_bytes (must equal quant::int2_row_bytes(head_dim, group_size) when history exists),
  // and optionally a bit plan (hist_bits, hist_row_prefix; uniform quantizer only): history rows
  // of 4, 3, 2 or 1 bits per element, per (K/V, KV head) of the layer.
  KvPageLayout layout;

  // [n_seqs, n_heads_q, head_dim] float, already rotated by R_K (OSCAR.md §3). Query head h reads
  // KV head h / gqa_ratio of its own sequence.
  const float* q = nullptr;
  // Exact pool: [n_pages, layout.exact_page_bytes()] bytes, page layout kernels/kv_layout.h.
  const uint8_t* exact_pool = nullptr;
  // History pool: [n_pages, layout.int2_page_bytes()] bytes; may be null when no sequence has
  // history.
  const uint8_t* hist_pool = nullptr;
  // Per-region page tables over the n_seqs sequences (each table's n_seqs == n_seqs). Sequence s
  // reads sinks.seq_len(s) sink tokens, then history.seq_len(s), then recent.seq_len(s) tokens, in
  // that order of positions. History pages are always full. Sinks and recent: exact pool.
  PageTableView sinks, history, recent;

  // Fast CPU path only: tokens per chunk; every segment is cut into chunks, one parallel task per
  // (sequence, KV head, chunk). 0 = chosen from the batch's token count and the thread count (with
  // batch_invariant: from the sequence's own count). Tests set small values to force many
  // partials and merges. The reference ignores it.
  int32_t chunk_tokens = 0;
  // Each sequence's output independent of the other sequences of the batch (README
  // "Deterministic results"). Fast CPU path: slightly more, smaller tasks for a batch. CUDA: the
  // split cap of a batch of one for every batch (decode_attn.cu), so more (early-exiting)
  // blocks for a batch.
  bool batch_invariant = false;

  float* out = nullptr;  // [n_seqs, n_heads_q, head_dim] float, written. No keys at all: zeros.
};

// Plain loops, float64 accumulation, each INT2 row dequantized by quant's *_ref functions; one
// partial per region, merged in float64. Defines "correct". Single-threaded.
Status decode_attn_ref(const DecodeAttnParams& p);
// Fast CPU path: one OpenMP team for the whole batch, tasks over (sequence, KV head, segment
// chunk); each task serves all gqa_ratio
// query heads of its KV head (each K/V row is read and unpacked once per group); rows are
// unpacked with shifts and masks (AVX2 when compiled with it) into a small per-thread float
// buffer ([32, head_dim], one block of tokens);
// float accumulation; partials merged by merge_attn_states. Allocates its partial buffers per
// call ([n_heads_q, n_parts, head_dim + 2] floats).
Status decode_attn(const DecodeAttnParams& p);

// CUDA (kernels/cuda/decode_attn.cu, built with OSCAR_CUDA): the same params with device
// pointers (q, out, pools, the three page tables and the bit-plan arrays of `layout`); BF16 exact
// pages only (exact_elem_bytes 2). `stream` is a cudaStream_t. Asynchronous: returns after the
// launch, checked.
Status decode_attn_cuda(const DecodeAttnParams& p, void* stream);

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
