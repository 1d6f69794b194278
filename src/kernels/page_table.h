// PageTableView: one region's pages for a batch of sequences, CSR-style, as every attention kernel
// (CPU reference, CPU fast path, CUDA) reads them. Plain data over host or device pointers: the
// kv/ side fills it (kv/page_table.h: PageTableBuilder), kernels only read it.
//
// Sequence s owns pages page_ids[indptr[s] .. indptr[s+1]) in token order; every page but the last
// is full (page_size tokens), the last holds last_page_len[s] tokens in [1, page_size]; a sequence
// with no pages has last_page_len 0. So seq_len(s) = (n_pages(s) - 1) * page_size +
// last_page_len[s]. A step uses three such tables (sinks, history, recent) with the same n_seqs.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace oscar::kernels {

// Borrowed pointers; valid while whoever filled them keeps them unchanged.
struct PageTableView {
  const int32_t* indptr = nullptr;         // [n_seqs + 1], indptr[0] == 0, non-decreasing
  const int32_t* page_ids = nullptr;       // [indptr[n_seqs]] pool page ids, token order per seq
  const int32_t* last_page_len = nullptr;  // [n_seqs] tokens in each seq's last page (0: no pages)
  int32_t n_seqs = 0;

  OSCAR_HD int32_t n_pages(int32_t seq) const { return indptr[seq + 1] - indptr[seq]; }
  OSCAR_HD int64_t seq_len(int32_t seq, int32_t page_size) const {
    const int32_t n = n_pages(seq);
    return n == 0 ? 0 : static_cast<int64_t>(n - 1) * page_size + last_page_len[seq];
  }
  // Pool page id holding token t (0 <= t < seq_len) of sequence seq.
  OSCAR_HD int32_t page_of(int32_t seq, int64_t t, int32_t page_size) const {
    return page_ids[indptr[seq] + static_cast<int32_t>(t / page_size)];
  }
};

}  // namespace oscar::kernels
