// Page tables for a batch of sequences, CSR-style: the plain-data PageTableView that a kernel
// (CPU reference or CUDA) reads, and PageTableBuilder, the host-side owner that fills it.
//
// One table describes one region over one pool (e.g. every sequence's INT2 history pages, or
// every sequence's BF16 recent-window pages); the sequence cache builds one per region. Sequence s
// owns pages page_ids[indptr[s] .. indptr[s+1]) in token order; every page but the last is full
// (page_size tokens), the last holds last_page_len[s] tokens in [1, page_size]; a sequence with no
// pages has last_page_len 0. So seq_len(s) = (n_pages(s) - 1) * page_size + last_page_len[s].
//
// Not here: device copies (the caller uploads the three arrays), the per-region bounds, and which
// pool a table refers to. The view may later move to src/kernels/ (STYLE: kernels declare the
// plain-data views they read, kv/ fills them).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kv/page_pool.h"

namespace oscar::kv {

// Borrowed pointers; valid while the PageTableBuilder that produced them is alive and unmodified.
struct PageTableView {
  const int32_t* indptr = nullptr;         // [n_seqs + 1], indptr[0] == 0, non-decreasing
  const int32_t* page_ids = nullptr;       // [indptr[n_seqs]] pool page ids, token order per seq
  const int32_t* last_page_len = nullptr;  // [n_seqs] tokens in each seq's last page (0: no pages)
  int32_t n_seqs = 0;

  int32_t n_pages(int32_t seq) const { return indptr[seq + 1] - indptr[seq]; }
  int64_t seq_len(int32_t seq, int32_t page_size) const {
    const int32_t n = n_pages(seq);
    return n == 0 ? 0 : static_cast<int64_t>(n - 1) * page_size + last_page_len[seq];
  }
};

// Checks a view against the pool it indexes: indptr shape, page ids in [0, n_pool_pages),
// last_page_len in [1, page_size] (0 for empty sequences). Kernel entry points may call it on
// host-side views; InvalidArgument names the sequence and value at fault.
Status validate_page_table(const PageTableView& view, int64_t n_pool_pages, int32_t page_size);

class PageTableBuilder {
 public:
  explicit PageTableBuilder(int32_t page_size);

  // Appends a sequence holding n_tokens tokens in `pages` (token order). Checks that
  // pages.size() == ceil(n_tokens / page_size): a mismatch is a bug in the caller's bookkeeping.
  // Returns the new sequence's index in the batch.
  int32_t add_sequence(std::span<const PageId> pages, int64_t n_tokens);
  void clear();  // empty batch; keeps capacity

  PageTableView view() const;
  int32_t n_seqs() const { return static_cast<int32_t>(last_page_len_.size()); }
  int32_t total_pages() const { return static_cast<int32_t>(page_ids_.size()); }
  int32_t page_size() const { return page_size_; }
  std::span<const int32_t> indptr() const { return indptr_; }
  std::span<const int32_t> page_ids() const { return page_ids_; }
  std::span<const int32_t> last_page_len() const { return last_page_len_; }

 private:
  int32_t page_size_;
  std::vector<int32_t> indptr_{0};      // [n_seqs + 1]
  std::vector<int32_t> page_ids_;       // [indptr_.back()]
  std::vector<int32_t> last_page_len_;  // [n_seqs]
};

}  // namespace oscar::kv
