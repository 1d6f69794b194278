// PagePool: a fixed number of equally sized pages preallocated from a byte budget, handed out by
// index with reference counts. The pool is the allocator (ids, refcounts, free list, on the
// host); the bytes are one buffer with an explicit base that kernels index (base() + id ·
// page_bytes), owned by the runtime through its backend or, for tests, by the pool itself (a page shared by the radix prefix cache and several sequences is
// freed when its last reference is dropped). One pool holds BF16 pages (sinks, recent window),
// another INT2 pages (history); see kernels/kv_layout.h for what a page contains.
//
// Not thread-safe: the engine's scheduler thread owns the pools. Running out of pages is a
// ResourceExhausted Status, never an abort.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::kv {

using PageId = int32_t;
inline constexpr PageId kNoPage = -1;

// Index of a pool in the engine's pool list, as stored in radix-cache entries (CachedPage::pool).
inline constexpr uint8_t kPoolBf16 = 0;  // sinks and recent window
inline constexpr uint8_t kPoolInt2 = 1;  // history

class PagePool {
 public:
  // n_pages pages of page_bytes each. page_bytes == 0 makes a simulated pool (no memory), used by
  // scheduler and radix-cache tests. Checks 0 <= n_pages <= INT32_MAX (page ids are int32).
  // The pool owns its host storage ([n_pages, page_bytes], tests and tools).
  PagePool(std::string name, int64_t n_pages, size_t page_bytes);
  // Ids only: the bytes live in `storage` ([n_pages, page_bytes], e.g. a backend's DeviceBuffer),
  // which the caller owns and keeps alive longer than the pool.
  PagePool(std::string name, int64_t n_pages, size_t page_bytes, uint8_t* storage);

  // How many whole pages of page_bytes fit in budget_bytes (rounded down, capped at INT32_MAX).
  // page_bytes must be > 0.
  static int64_t pages_for_budget(size_t budget_bytes, size_t page_bytes);

  // A fresh page with refcount 1 (ResourceExhausted when none is free). Page contents are not
  // cleared: whoever allocates a page writes it before anyone reads it.
  Result<PageId> alloc();
  // All-or-nothing: n >= 0 pages, each with refcount 1, or none (ResourceExhausted).
  Result<std::vector<PageId>> alloc_n(int64_t n);
  // refcount += 1. The page must be allocated (refcount > 0): retaining a free page is a bug.
  void retain(PageId page);
  // refcount -= 1; at 0 the page returns to the free list. Releasing a free page is a bug.
  void release(PageId page);
  // Releases each page once (e.g. a sequence's whole page list).
  void release_all(std::span<const PageId> pages);

  // Page id p's bytes start at base() + p * page_bytes() (what kernels index); null when simulated.
  uint8_t* base() { return base_; }
  const uint8_t* base() const { return base_; }
  // [page_bytes] bytes of an allocated page; not available in a simulated pool.
  uint8_t* data(PageId page);
  const uint8_t* data(PageId page) const;
  // 0 for a free page. Checks that the id is in range.
  int32_t refcount(PageId page) const;
  bool valid_id(PageId page) const { return page >= 0 && page < n_pages_; }
  bool simulated() const { return page_bytes_ == 0; }

  const std::string& name() const { return name_; }
  int64_t n_pages() const { return n_pages_; }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used() const { return n_pages_ - n_free(); }
  size_t page_bytes() const { return page_bytes_; }
  size_t total_bytes() const { return page_bytes_ * static_cast<size_t>(n_pages_); }

 private:
  std::string name_;
  int64_t n_pages_;
  size_t page_bytes_;
  std::vector<uint8_t> storage_;   // [n_pages, page_bytes] when the pool owns its storage
  uint8_t* base_ = nullptr;        // storage_.data() or the caller's storage
  std::vector<int32_t> refcount_;  // [n_pages]
  std::vector<PageId> free_;       // LIFO free list
};

}  // namespace oscar::kv
