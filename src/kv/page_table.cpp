#include "kv/page_table.h"

#include <limits>

#include "core/check.h"

namespace oscar::kv {

Status validate_page_table(const PageTableView& view, int64_t n_pool_pages, int32_t page_size) {
  if (page_size <= 0) return invalid_argument("page table: page_size %d must be > 0", page_size);
  if (view.n_seqs < 0) return invalid_argument("page table: n_seqs %d < 0", view.n_seqs);
  if (view.indptr == nullptr) return invalid_argument("page table: indptr is null");
  if (view.indptr[0] != 0)
    return invalid_argument("page table: indptr[0] = %d, not 0", view.indptr[0]);
  if (view.n_seqs > 0 && view.last_page_len == nullptr) {
    return invalid_argument("page table: last_page_len is null for %d sequences", view.n_seqs);
  }
  for (int32_t s = 0; s < view.n_seqs; ++s) {
    const int32_t n = view.indptr[s + 1] - view.indptr[s];
    if (n < 0) {
      return invalid_argument("page table: indptr decreases at seq %d (%d -> %d)", s,
                              view.indptr[s], view.indptr[s + 1]);
    }
    const int32_t last = view.last_page_len[s];
    if (n == 0 ? last != 0 : (last < 1 || last > page_size)) {
      return invalid_argument("page table: seq %d has %d pages and last_page_len %d (page_size %d)",
                              s, n, last, page_size);
    }
  }
  const int32_t total = view.indptr[view.n_seqs];
  if (total > 0 && view.page_ids == nullptr) {
    return invalid_argument("page table: page_ids is null for %d pages", total);
  }
  for (int32_t s = 0; s < view.n_seqs; ++s) {
    for (int32_t i = view.indptr[s]; i < view.indptr[s + 1]; ++i) {
      const int32_t page = view.page_ids[i];
      if (page < 0 || page >= n_pool_pages) {
        return invalid_argument("page table: seq %d page %d has id %d, pool has %lld pages", s,
                                i - view.indptr[s], page, static_cast<long long>(n_pool_pages));
      }
    }
  }
  return Status();
}

PageTableBuilder::PageTableBuilder(int32_t page_size) : page_size_(page_size) {
  OSCAR_CHECK(page_size > 0, "PageTableBuilder: page_size %d must be > 0", page_size);
}

int32_t PageTableBuilder::add_sequence(std::span<const PageId> pages, int64_t n_tokens) {
  OSCAR_CHECK(n_tokens >= 0, "page table: n_tokens %lld < 0", static_cast<long long>(n_tokens));
  const int64_t n_pages = (n_tokens + page_size_ - 1) / page_size_;
  OSCAR_CHECK(static_cast<int64_t>(pages.size()) == n_pages,
              "page table: %zu pages given for %lld tokens (page_size %d needs %lld)", pages.size(),
              static_cast<long long>(n_tokens), page_size_, static_cast<long long>(n_pages));
  OSCAR_CHECK(
      static_cast<int64_t>(page_ids_.size()) + n_pages <= std::numeric_limits<int32_t>::max(),
      "page table: more than INT32_MAX pages in one batch");
  page_ids_.insert(page_ids_.end(), pages.begin(), pages.end());
  indptr_.push_back(static_cast<int32_t>(page_ids_.size()));
  const int32_t last =
      n_pages == 0 ? 0 : static_cast<int32_t>(n_tokens - (n_pages - 1) * page_size_);
  last_page_len_.push_back(last);
  return n_seqs() - 1;
}

void PageTableBuilder::clear() {
  indptr_.assign(1, 0);
  page_ids_.clear();
  last_page_len_.clear();
}

PageTableView PageTableBuilder::view() const {
  PageTableView v;
  v.indptr = indptr_.data();
  v.page_ids = page_ids_.data();
  v.last_page_len = last_page_len_.data();
  v.n_seqs = n_seqs();
  return v;
}

}  // namespace oscar::kv
