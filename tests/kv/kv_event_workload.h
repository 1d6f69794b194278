// A scripted radix-cache workload for the KV-events tests (tests/kv/test_kv_events.cpp applies
// its events directly, tests/server/test_kv_event_publisher.cpp sends them through ZMQ): a shared
// system prompt, divergence at a page boundary and inside a page, multi-turn reuse, a request
// cancelled mid-prefill, eviction under a small pool, a flush that keeps a locked path, a reset
// and a re-insert. Pools are simulated (no page bytes). Also expected_blocks(): the block set the
// cache holds, computed from for_each_page by re-hashing every page's path, which is what the
// events must rebuild.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "kv/kv_events.h"
#include "kv/radix_cache.h"

namespace oscar::kv::testing {

struct ExpectedBlock {
  std::optional<BlockHash> parent;
  std::vector<int32_t> token_ids;
  friend bool operator==(const ExpectedBlock&, const ExpectedBlock&) = default;
};

// hash -> block, for every page the cache holds.
inline std::map<BlockHash, ExpectedBlock> expected_blocks(const RadixCache& cache) {
  std::map<BlockHash, ExpectedBlock> out;
  const int32_t p = cache.page_size();
  cache.for_each_page([&](std::span<const int32_t> prefix, CachedPage) {
    const std::vector<BlockHash> hashes = block_hashes_of_path(prefix, p);
    ExpectedBlock b;
    if (hashes.size() >= 2) b.parent = hashes[hashes.size() - 2];
    b.token_ids.assign(prefix.end() - p, prefix.end());
    out.emplace(hashes.back(), std::move(b));
  });
  return out;
}

inline std::map<BlockHash, ExpectedBlock> mirrored_blocks(const KvBlockMirror& mirror) {
  std::map<BlockHash, ExpectedBlock> out;
  for (const auto& [h, block] : mirror.blocks())
    out.emplace(h, ExpectedBlock{block.parent, block.token_ids});
  return out;
}

class KvEventWorkload {
 public:
  static constexpr int32_t kP = 4;  // page_size (block_size on the wire)
  static constexpr size_t kSinkPages = 2;

  // on_step(name, events of that step) runs after each step, on this thread.
  using StepFn = std::function<void(const std::string& step, std::vector<KvEvent> events)>;

  KvEventWorkload() { cache_.set_listener(&collector_); }
  ~KvEventWorkload() { cache_.set_listener(nullptr); }

  RadixCache& cache() { return cache_; }
  // The events of set_listener (one AllBlocksCleared), before any step.
  std::vector<KvEvent> take_attach_events() { return collector_.take(); }

  void run(const StepFn& on_step) {
    const auto sys = tokens(1000, 3 * kP);  // shared system prompt: 3 pages
    const auto a = concat(sys, tokens(2000, 2 * kP));
    const auto b = concat(sys, tokens(3000, 2 * kP));
    // Shares the first page of sys, then differs in the middle of the second page.
    auto c = concat(sys, tokens(4000, kP));
    c[kP + 1] = 9999;

    finish_request(a);  // A: all 5 pages new, one BlockStored from the root
    on_step("A: system prompt + user a", collector_.take());
    finish_request(b);  // B: hits 3 pages (a split, no event), stores 2 under sys's last page
    on_step("B: shared prefix, divergence at a page boundary", collector_.take());
    finish_request(c);  // C: hits 1 page, stores 3 under it
    on_step("C: divergence inside a page", collector_.take());
    finish_request(concat(a, tokens(5000, 2 * kP)));  // multi-turn: A + its output
    on_step("A again: multi-turn reuse", collector_.take());

    {  // D matches sys, allocates its own pages, then is cancelled before it inserts anything
      const auto d = concat(sys, tokens(6000, 3 * kP));
      PrefixMatch m = cache_.match_prefix(d);
      cache_.lock(m.last_node);
      cache_.retain_pages(m.pages);
      std::vector<CachedPage> own = alloc_chunks(m.pages.size(), d.size() / kP);
      cache_.unlock(m.last_node);
      cache_.release_pages(m.pages);
      cache_.release_pages(own);
    }
    on_step("D: cancelled mid-prefill (no events)", collector_.take());

    // E is long: the INT2 pool (12 pages) runs out, so the scheduler evicts LRU leaves first.
    const auto e = concat(tokens(7000, 2 * kP), tokens(7100, 8 * kP));
    int64_t need = static_cast<int64_t>(e.size() / kP - kSinkPages) - int2_.n_free();
    if (need > 0) {
      EXPECT_GE(cache_.evict(need, kPoolInt2), need);
    }
    finish_request(e);
    on_step("E: eviction under a small pool", collector_.take());

    // F locks B's path; a flush evicts everything else (tail-trimmed leaves, then their parents).
    PrefixMatch f = cache_.match_prefix(b);
    cache_.lock(f.last_node);
    cache_.evict_all_unlocked();
    on_step("flush with one locked path", collector_.take());
    cache_.unlock(f.last_node);

    cache_.reset();
    on_step("reset", collector_.take());
    finish_request(b);
    on_step("B after reset", collector_.take());
  }

  static std::vector<int32_t> tokens(int32_t first, int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    std::iota(t.begin(), t.end(), first);
    return t;
  }
  static std::vector<int32_t> concat(std::vector<int32_t> x, const std::vector<int32_t>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  }

 private:
  // Chunks [first, last) of a path: sinks from the BF16 pool, the rest INT2 (caller-owned).
  std::vector<CachedPage> alloc_chunks(size_t first, size_t last) {
    std::vector<CachedPage> pages;
    for (size_t i = first; i < last; ++i) {
      const uint8_t pool = i < kSinkPages ? kPoolBf16 : kPoolInt2;
      auto page = (pool == kPoolBf16 ? bf16_ : int2_).alloc();
      EXPECT_TRUE(page.ok()) << "pool " << int{pool} << " exhausted at chunk " << i;
      if (!page.ok()) break;
      pages.push_back(CachedPage{*page, pool});
    }
    return pages;
  }
  // A request that runs to completion: match, reuse, compute the rest, insert, release.
  void finish_request(const std::vector<int32_t>& t) {
    PrefixMatch m = cache_.match_prefix(t);
    cache_.lock(m.last_node);
    cache_.retain_pages(m.pages);
    std::vector<CachedPage> pages = m.pages;
    const std::vector<CachedPage> own = alloc_chunks(m.pages.size(), t.size() / kP);
    pages.insert(pages.end(), own.begin(), own.end());
    ASSERT_EQ(pages.size(), t.size() / kP);
    cache_.insert(t, pages);
    cache_.unlock(m.last_node);
    cache_.release_pages(pages);
  }

  PagePool bf16_{"bf16", 16, 0};
  PagePool int2_{"int2", 12, 0};
  RadixCache cache_{kP, {&bf16_, &int2_}};
  KvEventCollector collector_;
};

}  // namespace oscar::kv::testing
