// prefill_attn: causal attention of the prefill (or evaluation) chunks of a step, each chunk over
// its own sequence's pages (OSCAR.md §4-§5), batched over sequences. Query i of sequence s sits at
// position pos0[s] + i and sees keys [0, pos0[s] + i]; sinks and recent rows are read exactly,
// history rows dequantized. The chunk's own K/V rows are already in the recent pages (kv_append).
//
// Two readings of the recent rows (the attend mode):
//   serving prefill         the chunk reads its own rows exactly (deq_end = the history's end);
//   decode-equivalent       query i reads exactly what decode would read at its position: rows
//                           that decode would already see quantized are quantized on the fly with
//                           the demotion's own quantizer (perplexity evaluation, OSCAR.md §9).
//
// CPU: per sequence, the layer's rows are materialised as float (exact rows, dequantized history)
// and handed to kernels/chunk_attn.h; a paged kernel that reads the pages in place is the CUDA
// version's job. Decode steps (one query) use kernels/decode_attn.h instead.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/status.h"
#include "kernels/kv_codec.h"
#include "kernels/kv_layout.h"
#include "kernels/page_table.h"

namespace oscar::kernels {

struct PrefillAttnParams {
  int32_t n_seqs = 0;
  int32_t n_heads_q = 0;
  int32_t layer = 0;
  float scale = 0.f;
  KvPageLayout layout;
  HistCodec codec;
  int32_t n_sink = 0;    // the regions (multiples of layout.page_size), for decode-equivalent
  int32_t n_recent = 0;
  bool quantized = false;  // the cache has a history region (INT2 / KIVI modes)
  bool decode_equivalent = false;
  // CUDA: an upper bound on the call's query rows (cu_seqlens[n_seqs] - cu_seqlens[0]; the
  // model's plan.n_rows()), which the host cannot read from cu_seqlens (device memory). It sizes
  // the scratch of on-the-fly quantized rows (decode-equivalent on a quantized cache) and, with
  // max_keys, lets serving prefill split a short chunk's keys across blocks
  // (kernels/cuda/prefill_attn.cu). 0: unknown. Ignored by the CPU version.
  int32_t max_rows = 0;
  // CUDA, serving prefill: an upper bound on the keys any query attends to (the largest pos0[s] +
  // queries of s; a host value). 0: unknown (no split).
  int64_t max_keys = 0;
  // [n_seqs + 1] query rows of sequence s: [cu[s], cu[s+1]) of q / out; cu[0] need not be 0
  // (a slice of a step's rows).
  const int32_t* cu_seqlens = nullptr;
  const int64_t* pos0 = nullptr;        // [n_seqs] position of each sequence's first query
  const float* q = nullptr;             // [cu[n_seqs], n_heads_q, head_dim], rotated (R_Q)
  const uint8_t* exact_pool = nullptr;
  const uint8_t* hist_pool = nullptr;
  // Per-region tables over the n_seqs sequences; the recent table covers the chunk's own rows, so
  // sinks + history + recent lengths = pos0[s] + n_queries(s).
  PageTableView sinks, history, recent;
  // CUDA, serving prefill over a quantized cache (optional; ignored by the CPU version): the
  // history table's distinct pages (kernels/distinct_pages.h: sequences sharing a prefix share
  // pages) and each history entry's index among them. With them the history is expanded to BF16
  // once per call, each page once, and read by the BF16 kernel (kernels/cuda/prefill_hist_bf16.cu).
  const int32_t* hist_unique = nullptr;  // [n_hist_unique] pool page ids
  const int32_t* hist_slot = nullptr;    // [history.indptr[n_seqs]] indices into hist_unique
  int32_t n_hist_unique = 0;             // a host value
  float* out = nullptr;                 // [cu[n_seqs], n_heads_q, head_dim]
  // Each query's result independent of the call's other queries and sequences (README
  // "Deterministic results"). CPU: chunk_attn's batch-invariant path (kernels/chunk_attn.h).
  // CUDA: no kernel splits a query's keys across blocks and key tiles start at multiples of the
  // tile from key 0, so only the decode-equivalent passes needed it: each query's split into
  // passes then follows its own deq_end (kernels/cuda/prefill_items.cuh: n_passes).
  bool batch_invariant = false;
};

Status prefill_attn(const PrefillAttnParams& p);
// CUDA (kernels/cuda/prefill_attn.cu): the same params over device pointers (BF16 exact pages),
// reading the pages in place; asynchronous on `stream` (a cudaStream_t).
Status prefill_attn_cuda(const PrefillAttnParams& p, void* stream);

// First token of the recent window once a sequence holds n_tokens tokens: full pages beyond the
// sinks leave the recent window as soon as it would hold n_recent + page_size tokens, so it keeps
// between n_recent and n_recent + page_size - 1 tokens (OSCAR.md §4). The one definition, shared
// by the cache's bookkeeping and the kernels.
OSCAR_HD inline int64_t history_end(int32_t n_sink, int32_t n_recent, int32_t page_size,
                                    int64_t n_tokens) {
  const int64_t beyond_sinks = n_tokens - n_sink;
  if (beyond_sinks - n_recent < page_size) return n_sink;
  return n_sink + page_size * ((beyond_sinks - n_recent) / page_size);
}

}  // namespace oscar::kernels
