#include "kv/page_pool.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "core/check.h"

namespace oscar::kv {

PagePool::PagePool(std::string name, int64_t n_pages, size_t page_bytes)
    : name_(std::move(name)), n_pages_(n_pages), page_bytes_(page_bytes) {
  OSCAR_CHECK(n_pages >= 0 && n_pages <= std::numeric_limits<int32_t>::max(),
              "pool %s: n_pages %lld out of range", name_.c_str(), static_cast<long long>(n_pages));
  if (page_bytes_ > 0) storage_.resize(page_bytes_ * static_cast<size_t>(n_pages_));
  base_ = storage_.empty() ? nullptr : storage_.data();
  refcount_.assign(static_cast<size_t>(n_pages_), 0);
  // LIFO: pop_back hands out page 0 first, then 1, ...; a released page is the next one reused
  // (it is likely still warm in cache).
  free_.reserve(static_cast<size_t>(n_pages_));
  for (int64_t i = n_pages_ - 1; i >= 0; --i) free_.push_back(static_cast<PageId>(i));
}

PagePool::PagePool(std::string name, int64_t n_pages, size_t page_bytes, uint8_t* storage)
    : PagePool(std::move(name), n_pages, 0) {
  page_bytes_ = page_bytes;
  base_ = storage;
  OSCAR_CHECK(page_bytes == 0 || n_pages == 0 || storage != nullptr,
              "pool %s: %lld pages of %zu bytes without storage", name_.c_str(),
              static_cast<long long>(n_pages), page_bytes);
}

int64_t PagePool::pages_for_budget(size_t budget_bytes, size_t page_bytes) {
  OSCAR_CHECK(page_bytes > 0, "pages_for_budget: page_bytes must be > 0");
  const size_t n = budget_bytes / page_bytes;
  const size_t cap = static_cast<size_t>(std::numeric_limits<int32_t>::max());
  return static_cast<int64_t>(n < cap ? n : cap);
}

Result<PageId> PagePool::alloc() {
  if (free_.empty()) {
    return resource_exhausted("pool %s: no free page (%lld pages, all in use)", name_.c_str(),
                              static_cast<long long>(n_pages_));
  }
  const PageId page = free_.back();
  free_.pop_back();
  OSCAR_CHECK(refcount_[page] == 0, "pool %s: free-listed page %d has refcount %d", name_.c_str(),
              page, refcount_[page]);
  refcount_[page] = 1;
  return page;
}

Result<std::vector<PageId>> PagePool::alloc_n(int64_t n) {
  OSCAR_CHECK(n >= 0, "pool %s: alloc_n(%lld)", name_.c_str(), static_cast<long long>(n));
  if (n > n_free()) {
    return resource_exhausted("pool %s: %lld pages requested, %lld free of %lld", name_.c_str(),
                              static_cast<long long>(n), static_cast<long long>(n_free()),
                              static_cast<long long>(n_pages_));
  }
  std::vector<PageId> pages;
  pages.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const PageId page = free_.back();
    free_.pop_back();
    OSCAR_CHECK(refcount_[page] == 0, "pool %s: free-listed page %d has refcount %d", name_.c_str(),
                page, refcount_[page]);
    refcount_[page] = 1;
    pages.push_back(page);
  }
  return pages;
}

void PagePool::retain(PageId page) {
  OSCAR_CHECK(valid_id(page), "pool %s: retain of bad page id %d (n_pages %lld)", name_.c_str(),
              page, static_cast<long long>(n_pages_));
  OSCAR_CHECK(refcount_[page] > 0, "pool %s: retain of free page %d", name_.c_str(), page);
  OSCAR_CHECK(refcount_[page] < std::numeric_limits<int32_t>::max(),
              "pool %s: refcount overflow on page %d", name_.c_str(), page);
  ++refcount_[page];
}

void PagePool::release(PageId page) {
  OSCAR_CHECK(valid_id(page), "pool %s: release of bad page id %d (n_pages %lld)", name_.c_str(),
              page, static_cast<long long>(n_pages_));
  OSCAR_CHECK(refcount_[page] > 0, "pool %s: double free of page %d", name_.c_str(), page);
  if (--refcount_[page] == 0) free_.push_back(page);
}

void PagePool::release_all(std::span<const PageId> pages) {
  for (PageId page : pages) release(page);
}

uint8_t* PagePool::data(PageId page) {
  return const_cast<uint8_t*>(std::as_const(*this).data(page));
}

const uint8_t* PagePool::data(PageId page) const {
  OSCAR_CHECK(page_bytes_ > 0, "pool %s: data() on a simulated pool", name_.c_str());
  OSCAR_CHECK(valid_id(page), "pool %s: data() of bad page id %d (n_pages %lld)", name_.c_str(),
              page, static_cast<long long>(n_pages_));
  OSCAR_CHECK(refcount_[page] > 0, "pool %s: data() of free page %d", name_.c_str(), page);
  return base_ + static_cast<size_t>(page) * page_bytes_;
}

int32_t PagePool::refcount(PageId page) const {
  OSCAR_CHECK(valid_id(page), "pool %s: refcount() of bad page id %d (n_pages %lld)", name_.c_str(),
              page, static_cast<long long>(n_pages_));
  return refcount_[page];
}

}  // namespace oscar::kv
