// The decode-equivalent zone of prefill_attn_cuda (kernels/prefill_attn.h, decode_equivalent on a
// quantized cache), shared by the pre-pass that fills it (prefill_deq_rows.cu) and the attention
// kernels that read it (prefill_attn.cu). Query i of sequence s (position pos0 + i) reads key j
// in [n_sink, deq_end(i)) quantized and the keys above exactly, deq_end(i) = max(lo,
// history_end(n_sink, n_recent, page_size, pos0 + i)), lo = max(history's end, n_sink), exactly
// as kernels/cpu/prefill_attn.cpp. Keys below the history's end are history rows; the recent rows
// [lo, hi), hi = min(deq_end(n - 1), pos0 + n), are quantized on the fly (the demotion's
// quantizer) and dequantized by the pre-pass into the scratch:
//   scratch  [cap_rows, 2 (K, V), n_heads_kv, head_dim] float; row j of sequence s in slot
//            base(s) + (j - lo), base(s) = (cu[s] - cu[0]) + s · page_size.
// Each sequence owns n + page_size slots (n: its query rows); cap_rows = max_rows + n_seqs ·
// page_size. hi - lo <= n - 1 + page_size whenever the cache holds at least history_end(pos0)
// rows in history when the chunk starts (the model demotes after every forward; a first chunk
// has pos0 = 0): then hi - lo <= history_end(pos0 + n - 1) - history_end(pos0) <= page_size ·
// (floor((n - 1) / page_size) + 1) <= n - 1 + page_size. A sequence whose zone does not fit (ok
// false: a broken precondition) gets NaN outputs instead of reading other sequences' slots.
// Not here: the quantizers (demote_pages.cuh), the key addressing (prefill_attn.cu).
#pragma once

#include <cstdint>

#include "kernels/page_table.h"
#include "kernels/prefill_attn.h"

namespace oscar::kernels::cuda_detail {

struct DeqZone {
  int64_t hist_end;  // sinks + history lengths (the first recent row)
  int64_t lo, hi;    // recent rows [lo, hi) quantized on the fly; empty when hi <= lo
  int64_t base;      // scratch slot of row lo
  bool ok;           // the zone fits the sequence's slots (or is empty)
};

// Zone of sequence s. de: decode-equivalent on a quantized cache (else lo == hi, nothing read
// from the scratch).
__device__ __forceinline__ DeqZone deq_zone(const int32_t* cu, const int64_t* pos0,
                                            const PageTableView& sinks,
                                            const PageTableView& history, int s, bool de,
                                            int n_sink, int n_recent, int page_size,
                                            int64_t cap_rows) {
  DeqZone z;
  z.hist_end = sinks.seq_len(s, page_size) + history.seq_len(s, page_size);
  z.lo = z.hist_end > n_sink ? z.hist_end : n_sink;
  z.hi = z.lo;
  z.base = static_cast<int64_t>(cu[s] - cu[0]) + static_cast<int64_t>(s) * page_size;
  z.ok = true;
  const int n = cu[s + 1] - cu[s];
  if (!de || n <= 0) return z;
  const int64_t last = pos0[s] + n - 1;
  int64_t e = history_end(n_sink, n_recent, page_size, last);
  e = e > z.lo ? e : z.lo;
  z.hi = e < last + 1 ? e : last + 1;
  if (z.hi > z.lo)
    z.ok = z.hi - z.lo <= static_cast<int64_t>(n) + page_size && z.base + n + page_size <= cap_rows;
  return z;
}

// deq_end of the query at position pos (see above).
__device__ __forceinline__ int64_t deq_end(const DeqZone& z, bool de, int n_sink, int n_recent,
                                           int page_size, int64_t pos) {
  if (!de) return z.lo;
  const int64_t e = history_end(n_sink, n_recent, page_size, pos);
  return e > z.lo ? e : z.lo;
}

}  // namespace oscar::kernels::cuda_detail
