// PageTableBuilder: the host-side owner that fills a kernels::PageTableView (kernels/page_table.h,
// the CSR form every attention kernel reads) for one region of a batch of sequences.
//
// One table describes one region over one pool (every sequence's INT2 history pages, or every
// sequence's BF16 sink or recent-window pages); the step planner builds one per region per step.
//
// Not here: device copies (the backend uploads the three arrays), and which pool a table refers to.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kernels/page_table.h"
#include "kv/page_pool.h"

namespace oscar::kv {

using kernels::PageTableView;

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
