// RadixCache: exact and partial-page matching, edge splits at page boundaries, locks, LRU
// eviction (whole leaves and tail trimming), pool accounting, duplicate inserts, multi-turn reuse,
// stats, and a seeded randomized stress test against a brute-force model (a map from every cached
// page-aligned prefix to its page) that also checks every pool refcount equals its holders.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "kv/radix_cache.h"

namespace oscar::kv {
namespace {

constexpr int32_t kP = 4;  // page size for these tests

// Tokens first..first+n-1.
std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class RadixCacheTest : public ::testing::Test {
 protected:
  // The first n_sink_pages chunks of a path are BF16 sink pages, the rest INT2 history pages.
  static constexpr int kSinkPages = 2;

  PagePool bf16_{"bf16", 64, 0};
  PagePool int2_{"int2", 64, 0};
  RadixCache cache_{kP, {&bf16_, &int2_}};

  // Fresh pages for chunks [first_chunk, first_chunk + n) of a path (refcount 1, caller-owned).
  std::vector<CachedPage> alloc_chunks(int first_chunk, int n) {
    std::vector<CachedPage> pages;
    for (int i = first_chunk; i < first_chunk + n; ++i) {
      const uint8_t pool = i < kSinkPages ? kPoolBf16 : kPoolInt2;
      auto page = (pool == kPoolBf16 ? bf16_ : int2_).alloc();
      EXPECT_TRUE(page.ok());
      pages.push_back(CachedPage{*page, pool});
    }
    return pages;
  }
  // Inserts tokens with fresh pages, then drops the caller's references (a finished request).
  InsertResult insert_fresh(const std::vector<int32_t>& tokens) {
    auto pages = alloc_chunks(0, static_cast<int>(tokens.size()) / kP);
    InsertResult r = cache_.insert(tokens, pages);
    cache_.release_pages(pages);
    return r;
  }
  int32_t refcount(CachedPage p) const {
    return (p.pool == kPoolBf16 ? bf16_ : int2_).refcount(p.page);
  }
};

TEST_F(RadixCacheTest, ExactMatchAndPrefixes) {
  const auto a = iota_tokens(1, 12);
  auto pages = alloc_chunks(0, 3);
  InsertResult ins = cache_.insert(a, pages);
  EXPECT_EQ(ins.n_tokens_existing, 0);
  EXPECT_EQ(ins.n_pages_adopted, 3);
  EXPECT_EQ(ins.cached_pages, pages);
  for (const CachedPage& p : pages) EXPECT_EQ(refcount(p), 2);  // caller + cache

  PrefixMatch m = cache_.match_prefix(a);
  EXPECT_EQ(m.n_tokens_matched, 12);
  EXPECT_EQ(m.pages, pages);
  EXPECT_EQ(m.last_node, ins.last_node);

  // A longer query matches the cached part.
  m = cache_.match_prefix(concat(a, iota_tokens(100, 8)));
  EXPECT_EQ(m.n_tokens_matched, 12);
  // A shorter one matches its whole pages and splits the edge so last_node is exact.
  m = cache_.match_prefix(iota_tokens(1, 8));
  EXPECT_EQ(m.n_tokens_matched, 8);
  EXPECT_EQ(m.pages, std::vector<CachedPage>(pages.begin(), pages.begin() + 2));
  EXPECT_NE(m.last_node, ins.last_node);
  EXPECT_EQ(cache_.stats().n_nodes, 2);
  // Unrelated tokens match nothing.
  m = cache_.match_prefix(iota_tokens(50, 12));
  EXPECT_EQ(m.n_tokens_matched, 0);
  EXPECT_EQ(m.last_node, NodeHandle{});
  cache_.check_invariants();
  cache_.release_pages(pages);
}

TEST_F(RadixCacheTest, PartialPagesAreNotMatched) {
  insert_fresh(iota_tokens(1, 12));
  EXPECT_EQ(cache_.match_prefix(iota_tokens(1, 11)).n_tokens_matched, 8);
  EXPECT_EQ(cache_.match_prefix(iota_tokens(1, 3)).n_tokens_matched, 0);
  // Diverging inside the second page matches only the first page.
  auto t = iota_tokens(1, 12);
  t[5] = 999;
  EXPECT_EQ(cache_.match_prefix(t).n_tokens_matched, 4);
  cache_.check_invariants();
}

TEST_F(RadixCacheTest, DivergenceInTheMiddleOfAnEdgeSplitsIt) {
  const auto a = iota_tokens(1, 16);                             // 4 pages
  const auto b = concat(iota_tokens(1, 8), iota_tokens(90, 8));  // shares 2 pages with a
  auto pa = alloc_chunks(0, 4);
  auto pb = alloc_chunks(0, 4);
  cache_.insert(a, pa);
  EXPECT_EQ(cache_.stats().n_nodes, 1);
  InsertResult rb = cache_.insert(b, pb);
  EXPECT_EQ(rb.n_tokens_existing, 8);
  EXPECT_EQ(rb.n_pages_adopted, 2);
  // b's first two chunks are a's pages; its own two duplicates were not adopted.
  EXPECT_EQ(rb.cached_pages[0], pa[0]);
  EXPECT_EQ(rb.cached_pages[1], pa[1]);
  EXPECT_EQ(rb.cached_pages[2], pb[2]);
  EXPECT_EQ(refcount(pb[0]), 1);  // only b's holder
  EXPECT_EQ(refcount(pb[2]), 2);
  EXPECT_EQ(cache_.stats().n_nodes, 3);  // shared [1..8], a's tail, b's tail
  EXPECT_EQ(cache_.stats().cached_pages[kPoolBf16], 2);
  EXPECT_EQ(cache_.stats().cached_pages[kPoolInt2], 4);

  PrefixMatch ma = cache_.match_prefix(a);
  EXPECT_EQ(ma.pages, pa);
  PrefixMatch mb = cache_.match_prefix(b);
  EXPECT_EQ(mb.n_tokens_matched, 16);
  EXPECT_EQ(mb.pages, rb.cached_pages);
  cache_.check_invariants();
  cache_.release_pages(pa);
  cache_.release_pages(pb);
  EXPECT_EQ(bf16_.n_used(), 2);  // exactly the cache's pages remain
  EXPECT_EQ(int2_.n_used(), 4);
}

TEST_F(RadixCacheTest, InsertingAnExistingPrefixDoesNotDoubleCount) {
  const auto a = iota_tokens(1, 12);
  auto pages = alloc_chunks(0, 3);
  cache_.insert(a, pages);
  InsertResult again = cache_.insert(a, pages);  // same pages (e.g. the request that matched them)
  EXPECT_EQ(again.n_tokens_existing, 12);
  EXPECT_EQ(again.n_pages_adopted, 0);
  for (const CachedPage& p : pages) EXPECT_EQ(refcount(p), 2);
  // A prefix with other pages (computed concurrently by another request): nothing adopted.
  auto dup = alloc_chunks(0, 2);
  InsertResult r = cache_.insert(iota_tokens(1, 8), dup);
  EXPECT_EQ(r.n_pages_adopted, 0);
  EXPECT_EQ(r.cached_pages, std::vector<CachedPage>(pages.begin(), pages.begin() + 2));
  for (const CachedPage& p : dup) EXPECT_EQ(refcount(p), 1);
  cache_.release_pages(dup);
  EXPECT_EQ(cache_.stats().cached_pages[kPoolBf16], 2);
  EXPECT_EQ(cache_.stats().cached_pages[kPoolInt2], 1);
  EXPECT_EQ(cache_.stats().inserted_pages, 3);
  cache_.release_pages(pages);
  cache_.check_invariants();
}

TEST_F(RadixCacheTest, LockPreventsEvictionOfNodeAndAncestors) {
  const auto a = iota_tokens(1, 16);
  const auto b = concat(iota_tokens(1, 8), iota_tokens(90, 8));
  insert_fresh(a);
  insert_fresh(b);
  PrefixMatch m = cache_.match_prefix(a);
  cache_.lock(m.last_node);
  EXPECT_EQ(cache_.lock_count(m.last_node), 1);
  EXPECT_EQ(cache_.stats().evictable_pages[kPoolInt2], 2);  // only b's tail
  // Ask for everything: only b's two unshared INT2 pages can go.
  EXPECT_EQ(cache_.evict(100, kPoolInt2), 2);
  EXPECT_EQ(cache_.evict(100, kPoolBf16), 0);
  EXPECT_EQ(cache_.match_prefix(a).n_tokens_matched, 16);
  EXPECT_EQ(cache_.match_prefix(b).n_tokens_matched, 8);
  cache_.check_invariants();
  cache_.unlock(m.last_node);
  EXPECT_EQ(cache_.evict(100, kPoolBf16), 2);
  EXPECT_EQ(cache_.stats().n_nodes, 0);
  EXPECT_EQ(bf16_.n_free(), bf16_.n_pages());
  EXPECT_EQ(int2_.n_free(), int2_.n_pages());
  cache_.check_invariants();
}

TEST_F(RadixCacheTest, EvictsLeastRecentlyUsedLeafFirst) {
  // Three independent 3-page paths (2 BF16 + 1 INT2 each), inserted x, y, z; then x is used.
  const auto x = iota_tokens(100, 12), y = iota_tokens(200, 12), z = iota_tokens(300, 12);
  insert_fresh(x);
  insert_fresh(y);
  insert_fresh(z);
  cache_.match_prefix(x);
  EXPECT_EQ(cache_.evict(1, kPoolInt2), 1);               // y's tail page: least recently used
  EXPECT_EQ(cache_.match_prefix(y).n_tokens_matched, 8);  // trimmed, not removed (now fresh)
  EXPECT_EQ(cache_.match_prefix(z).n_tokens_matched, 12);
  // Now x is the oldest: its INT2 page goes next.
  EXPECT_EQ(cache_.evict(1, kPoolInt2), 1);
  EXPECT_EQ(cache_.match_prefix(x).n_tokens_matched, 8);
  EXPECT_EQ(cache_.match_prefix(z).n_tokens_matched, 12);
  // BF16-only leaves (x, y) hold nothing of INT2 and are skipped for an INT2 request.
  EXPECT_EQ(cache_.evict(5, kPoolInt2), 1);  // only z's page
  EXPECT_EQ(cache_.match_prefix(x).n_tokens_matched, 8);
  EXPECT_EQ(cache_.match_prefix(y).n_tokens_matched, 8);
  EXPECT_EQ(cache_.match_prefix(z).n_tokens_matched, 8);
  // LRU among BF16 leaves is now x, y, z (the order of the last lookups): trims x from its tail.
  EXPECT_EQ(cache_.evict(3, kPoolBf16), 3);
  EXPECT_EQ(cache_.match_prefix(x).n_tokens_matched, 0);
  EXPECT_EQ(cache_.match_prefix(y).n_tokens_matched, 4);
  EXPECT_EQ(cache_.match_prefix(z).n_tokens_matched, 8);
  EXPECT_EQ(cache_.stats().evicted_pages[kPoolInt2], 3);
  EXPECT_EQ(cache_.stats().evicted_pages[kPoolBf16], 3);
  EXPECT_EQ(cache_.stats().evicted_nodes, 1);
  cache_.check_invariants();
}

TEST_F(RadixCacheTest, EvictionOnlyCountsPagesThatBecomeFree) {
  const auto a = iota_tokens(1, 12);
  auto pages = alloc_chunks(0, 3);
  cache_.insert(a, pages);  // the caller keeps its references and does not lock (allowed)
  EXPECT_EQ(cache_.evict(1, kPoolInt2), 0);  // dropped the cache's reference, freed nothing
  EXPECT_EQ(cache_.stats().cached_pages[kPoolInt2], 0);
  EXPECT_EQ(refcount(pages[2]), 1);
  cache_.release_pages(pages);
  EXPECT_EQ(int2_.n_free(), int2_.n_pages());
  cache_.reset();
  EXPECT_EQ(bf16_.n_free(), bf16_.n_pages());
  cache_.check_invariants();
}

TEST_F(RadixCacheTest, MultiTurnReusesGeneratedTokens) {
  const auto prompt1 = iota_tokens(1, 8);
  const auto output1 = iota_tokens(500, 8);
  // Turn 1 finishes: prompt + output (4 whole pages) are inserted.
  insert_fresh(concat(prompt1, output1));
  // Turn 2 sends the whole conversation plus a new user message.
  const auto prompt2 = concat(concat(prompt1, output1), iota_tokens(900, 10));
  PrefixMatch m = cache_.match_prefix(prompt2);
  EXPECT_EQ(m.n_tokens_matched, 16);
  EXPECT_EQ(m.pages.size(), 4u);
  EXPECT_EQ(m.pages[0].pool, kPoolBf16);
  EXPECT_EQ(m.pages[3].pool, kPoolInt2);
}

TEST_F(RadixCacheTest, StatsAndReset) {
  insert_fresh(iota_tokens(1, 12));
  cache_.match_prefix(iota_tokens(1, 12));  // hit, 12
  cache_.match_prefix(iota_tokens(1, 6));   // hit, 4
  cache_.match_prefix(iota_tokens(40, 8));  // miss
  const RadixCacheStats& s = cache_.stats();
  EXPECT_EQ(s.lookups, 3);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.lookup_tokens, 26);
  EXPECT_EQ(s.matched_tokens, 16);
  EXPECT_EQ(s.inserts, 1);
  EXPECT_EQ(s.inserted_pages, 3);
  cache_.reset();
  EXPECT_EQ(cache_.stats().cached_pages[kPoolBf16], 0);
  EXPECT_EQ(cache_.stats().n_nodes, 0);
  EXPECT_EQ(cache_.stats().lookups, 3);  // cumulative counters survive reset()
  cache_.reset_stats();
  EXPECT_EQ(cache_.stats().lookups, 0);
  EXPECT_EQ(cache_.match_prefix(iota_tokens(1, 12)).n_tokens_matched, 0);
  EXPECT_EQ(bf16_.n_free(), bf16_.n_pages());
  EXPECT_EQ(int2_.n_free(), int2_.n_pages());
  cache_.check_invariants();
}

TEST_F(RadixCacheTest, EvictAllUnlockedKeepsLockedPaths) {
  const auto a = iota_tokens(1, 12);
  insert_fresh(a);
  insert_fresh(iota_tokens(100, 16));
  PrefixMatch m = cache_.match_prefix(a);
  cache_.lock(m.last_node);
  cache_.evict_all_unlocked();
  EXPECT_EQ(cache_.stats().n_nodes, 1);
  EXPECT_EQ(cache_.match_prefix(a).n_tokens_matched, 12);
  cache_.unlock(m.last_node);
  cache_.evict_all_unlocked();
  EXPECT_EQ(cache_.stats().n_nodes, 0);
  EXPECT_EQ(int2_.n_free(), int2_.n_pages());
  cache_.check_invariants();
}

using RadixCacheDeathTest = RadixCacheTest;

// A chunk past the sinks may be cached as a BF16 page (a full recent-window page) and as an INT2
// page (history) at once: a second insert of the same tokens adds the missing form, match_prefix's
// chooser picks forms and where to stop, and eviction removes every form of a chunk it trims.
TEST_F(RadixCacheTest, ChunksHoldBothForms) {
  const auto a = iota_tokens(1, 16);  // 4 chunks: 2 sinks, 2 past them
  std::vector<CachedPage> recent = alloc_chunks(0, 2);  // BF16 sinks
  for (int i = 0; i < 2; ++i) recent.push_back(CachedPage{bf16_.alloc().value(), kPoolBf16});
  InsertResult first = cache_.insert(a, recent);
  EXPECT_EQ(first.n_pages_adopted, 4);
  // Later the sequence holds chunks 2-3 as INT2 (demoted): the insert adds that form.
  std::vector<CachedPage> demoted(recent.begin(), recent.begin() + 2);
  for (const CachedPage& p : alloc_chunks(2, 2)) demoted.push_back(p);
  InsertResult second = cache_.insert(a, demoted);
  EXPECT_EQ(second.n_tokens_existing, 16);
  EXPECT_EQ(second.n_pages_adopted, 2);
  EXPECT_EQ(second.cached_pages, demoted);
  EXPECT_EQ(cache_.stats().cached_pages[kPoolBf16], 4);
  EXPECT_EQ(cache_.stats().cached_pages[kPoolInt2], 2);
  EXPECT_EQ(cache_.stats().cached_chunks, 4);
  cache_.check_invariants();
  int n_forms = 0;
  cache_.for_each_page([&](std::span<const int32_t>, CachedPage) { ++n_forms; });
  EXPECT_EQ(n_forms, 6);
  cache_.release_pages(recent);
  cache_.release_pages(std::span(demoted).subspan(2));  // the sinks were released with recent

  // Without a chooser: the lowest pool's form of each chunk.
  EXPECT_EQ(cache_.match_prefix(a).pages, recent);
  // A chooser that takes chunk 2 as INT2 and stops before chunk 3: the match ends there, on a
  // node of its own (the edge is split).
  std::vector<CachedChunk> seen;
  PrefixMatch m = cache_.match_prefix(a, [&](std::span<const CachedChunk> chunks) {
    seen.assign(chunks.begin(), chunks.end());
    return std::vector<CachedPage>{chunks[0].form(kPoolBf16), chunks[1].form(kPoolBf16),
                                   chunks[2].form(kPoolInt2)};
  });
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_TRUE(seen[3].has(kPoolBf16) && seen[3].has(kPoolInt2));
  EXPECT_FALSE(seen[0].has(kPoolInt2));
  EXPECT_EQ(m.n_tokens_matched, 12);
  EXPECT_EQ(m.pages, (std::vector<CachedPage>{recent[0], recent[1], demoted[2]}));
  cache_.lock(m.last_node);
  cache_.check_invariants();
  // The locked part [0, 12) stays; evicting BF16 pages trims chunk 3 (both of its forms).
  EXPECT_EQ(cache_.evict(4, kPoolBf16), 1);
  EXPECT_EQ(refcount(recent[3]), 0);
  EXPECT_EQ(refcount(demoted[3]), 0);
  EXPECT_EQ(refcount(recent[2]), 1);
  EXPECT_EQ(cache_.match_prefix(a).n_tokens_matched, 12);
  cache_.unlock(m.last_node);
  cache_.check_invariants();
  // Unlocked: evicting INT2 removes chunk 2 (and its BF16 form), then the sinks hold no INT2.
  EXPECT_EQ(cache_.evict(4, kPoolInt2), 1);
  EXPECT_EQ(refcount(recent[2]), 0);
  EXPECT_EQ(refcount(demoted[2]), 0);
  EXPECT_EQ(cache_.match_prefix(a).n_tokens_matched, 8);
  cache_.evict_all_unlocked();
  EXPECT_EQ(bf16_.n_free(), bf16_.n_pages());
  EXPECT_EQ(int2_.n_free(), int2_.n_pages());
  cache_.check_invariants();
}

TEST_F(RadixCacheDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto pages = alloc_chunks(0, 1);
  EXPECT_DEATH(cache_.insert(iota_tokens(1, 5), pages), "insert of 5 tokens");
  InsertResult r = cache_.insert(iota_tokens(1, 4), pages);
  EXPECT_DEATH(cache_.unlock(r.last_node), "unlock of unlocked");
  cache_.lock(r.last_node);
  EXPECT_DEATH(cache_.reset(), "locked");
  cache_.unlock(r.last_node);
  cache_.release_pages(pages);
  cache_.evict_all_unlocked();
  EXPECT_DEATH(cache_.lock(r.last_node), "stale node handle");
}

// ---------------------------------------------------------------------------------------------
// Randomized stress test against a brute-force model.

struct ActiveSeq {
  std::vector<int32_t> tokens;    // whole pages
  std::vector<CachedPage> pages;  // one per chunk; the sequence holds one reference to each
  NodeHandle locked;              // the matched node, locked for the sequence's lifetime
  size_t n_matched_chunks = 0;    // chunks that came from the cache
};

using Model = std::map<std::vector<int32_t>, CachedPage>;  // cached prefix -> its last page

Model dump(const RadixCache& cache) {
  Model m;
  cache.for_each_page([&](std::span<const int32_t> prefix, CachedPage page) {
    const bool fresh = m.emplace(std::vector<int32_t>(prefix.begin(), prefix.end()), page).second;
    EXPECT_TRUE(fresh) << "prefix cached twice";
  });
  return m;
}

// Longest cached prefix of tokens according to the model, in chunks, and its pages.
std::vector<CachedPage> model_match(const Model& model, const std::vector<int32_t>& tokens) {
  std::vector<CachedPage> pages;
  for (size_t end = kP; end <= tokens.size(); end += kP) {
    auto it = model.find(std::vector<int32_t>(tokens.begin(), tokens.begin() + end));
    if (it == model.end()) break;
    pages.push_back(it->second);
  }
  return pages;
}

TEST_F(RadixCacheTest, RandomizedStressMatchesModel) {
  std::mt19937 rng(20240611);
  auto uniform = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<ActiveSeq> active;
  std::vector<std::vector<int32_t>> history;  // token lists seen so far, to build shared prefixes
  Model model;
  int64_t n_hits = 0, n_evict_calls = 0, n_splits_seen = 0, n_exhausted = 0;

  auto check_refcounts = [&] {
    for (uint8_t pool_id : {kPoolBf16, kPoolInt2}) {
      PagePool& pool = pool_id == kPoolBf16 ? bf16_ : int2_;
      std::vector<int32_t> holders(static_cast<size_t>(pool.n_pages()), 0);
      for (const auto& [prefix, page] : model) {
        if (page.pool == pool_id) ++holders[static_cast<size_t>(page.page)];
      }
      for (const ActiveSeq& s : active) {
        for (const CachedPage& page : s.pages) {
          if (page.pool == pool_id) ++holders[static_cast<size_t>(page.page)];
        }
      }
      for (PageId p = 0; p < pool.n_pages(); ++p) {
        ASSERT_EQ(pool.refcount(p), holders[static_cast<size_t>(p)])
            << pool.name() << " page " << p;
      }
    }
  };

  auto make_tokens = [&] {
    std::vector<int32_t> t;
    if (!history.empty() && uniform(4) != 0) {
      const auto& base = history[static_cast<size_t>(uniform(static_cast<int>(history.size())))];
      t.assign(base.begin(), base.begin() + uniform(static_cast<int>(base.size()) + 1));
    }
    const int total = std::max<int>(1, (static_cast<int>(t.size()) + uniform(6 * kP)) / kP) * kP;
    while (static_cast<int>(t.size()) < total) t.push_back(uniform(3));
    t.resize(static_cast<size_t>(total));
    return t;
  };

  for (int step = 0; step < 10000; ++step) {
    const int op = uniform(10);
    if (op < 4) {  // start a sequence: match, lock, retain, allocate the rest
      ActiveSeq s;
      s.tokens = make_tokens();
      const int64_t nodes_before = cache_.stats().n_nodes;
      PrefixMatch m = cache_.match_prefix(s.tokens);
      n_splits_seen += cache_.stats().n_nodes > nodes_before;
      const std::vector<CachedPage> expected = model_match(model, s.tokens);
      ASSERT_EQ(m.pages, expected) << "step " << step;
      ASSERT_EQ(m.n_tokens_matched, static_cast<int64_t>(expected.size()) * kP);
      n_hits += m.n_tokens_matched > 0;
      cache_.lock(m.last_node);
      cache_.retain_pages(m.pages);
      s.locked = m.last_node;
      s.pages = m.pages;
      s.n_matched_chunks = m.pages.size();
      bool ok = true;
      for (size_t chunk = s.pages.size(); chunk < s.tokens.size() / kP; ++chunk) {
        const uint8_t pool_id = chunk < kSinkPages ? kPoolBf16 : kPoolInt2;
        PagePool& pool = pool_id == kPoolBf16 ? bf16_ : int2_;
        auto page = pool.alloc();
        if (!page.ok()) {
          ASSERT_EQ(page.status().code(), StatusCode::kResourceExhausted);
          ++n_exhausted;
          cache_.evict(1 + uniform(4), pool_id);
          model = dump(cache_);
          page = pool.alloc();
        }
        if (!page.ok()) {
          ok = false;
          break;
        }
        s.pages.push_back(CachedPage{*page, pool_id});
      }
      if (!ok) {  // could not admit: give everything back
        cache_.release_pages(s.pages);
        cache_.unlock(s.locked);
      } else {
        history.push_back(s.tokens);
        active.push_back(std::move(s));
      }
    } else if (op < 7 && !active.empty()) {  // finish a sequence, usually caching it
      const size_t i = static_cast<size_t>(uniform(static_cast<int>(active.size())));
      ActiveSeq s = std::move(active[i]);
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
      if (uniform(10) < 8) {
        // Sometimes only a page-aligned prefix is cached (e.g. the recent window is not).
        const size_t n_chunks = s.pages.size() - static_cast<size_t>(uniform(2));
        std::span<const int32_t> toks(s.tokens.data(), n_chunks * kP);
        std::span<const CachedPage> pages(s.pages.data(), n_chunks);
        const std::vector<CachedPage> existing = model_match(model, s.tokens);
        const size_t n_existing = std::min(existing.size(), n_chunks);
        InsertResult r = cache_.insert(toks, pages);
        ASSERT_EQ(r.n_tokens_existing, static_cast<int64_t>(n_existing) * kP);
        ASSERT_EQ(r.n_pages_adopted, static_cast<int64_t>(n_chunks - n_existing));
        for (size_t c = 0; c < n_chunks; ++c) {
          ASSERT_EQ(r.cached_pages[c], c < n_existing ? existing[c] : s.pages[c]);
          if (c >= n_existing) {
            model.emplace(
                std::vector<int32_t>(s.tokens.begin(),
                                     s.tokens.begin() + static_cast<std::ptrdiff_t>((c + 1) * kP)),
                s.pages[c]);
          }
        }
      }
      cache_.release_pages(s.pages);
      cache_.unlock(s.locked);
    } else if (op < 8) {  // evict from one pool
      const uint8_t pool_id = uniform(2) == 0 ? kPoolBf16 : kPoolInt2;
      PagePool& pool = pool_id == kPoolBf16 ? bf16_ : int2_;
      const int64_t want = 1 + uniform(8);
      const int64_t free_before = pool.n_free();
      const Model before = model;
      const int64_t freed = cache_.evict(want, pool_id);
      ++n_evict_calls;
      // In this test unlocked cached pages have no other holder, so dropping one frees it.
      ASSERT_EQ(pool.n_free() - free_before, freed);
      if (freed < want) {
        ASSERT_EQ(cache_.stats().evictable_pages[pool_id], 0);
      }
      model = dump(cache_);
      for (const auto& [prefix, page] : model) {
        auto it = before.find(prefix);
        ASSERT_TRUE(it != before.end() && it->second == page) << "eviction invented a prefix";
      }
      // Every active sequence's matched prefix survives.
      for (const ActiveSeq& s : active) {
        const auto still = model_match(model, s.tokens);
        ASSERT_GE(still.size(), s.n_matched_chunks);
        ASSERT_TRUE(std::equal(s.pages.begin(),
                               s.pages.begin() + static_cast<std::ptrdiff_t>(s.n_matched_chunks),
                               still.begin()));
        if (s.locked != NodeHandle{}) {
          ASSERT_GT(cache_.lock_count(s.locked), 0);
        }
      }
    } else {  // a plain lookup, or rarely a flush
      if (uniform(50) == 0) {
        cache_.evict_all_unlocked();
        model = dump(cache_);
        if (active.empty()) {
          cache_.reset();
          model.clear();
        }
      } else {
        const auto t = make_tokens();
        ASSERT_EQ(cache_.match_prefix(t).pages, model_match(model, t));
      }
    }
    cache_.check_invariants();
    ASSERT_EQ(dump(cache_), model) << "step " << step;
    check_refcounts();
    if (HasFatalFailure()) return;
  }
  // Everything returns to the pools once the sequences finish and the cache is dropped.
  for (ActiveSeq& s : active) {
    cache_.release_pages(s.pages);
    cache_.unlock(s.locked);
  }
  active.clear();
  cache_.reset();
  EXPECT_EQ(bf16_.n_free(), bf16_.n_pages());
  EXPECT_EQ(int2_.n_free(), int2_.n_pages());
  // The workload must actually exercise sharing, splits and eviction.
  EXPECT_GT(n_hits, 300);
  EXPECT_GT(n_splits_seen, 40);
  EXPECT_GT(n_exhausted, 50);
  EXPECT_GT(n_evict_calls, 500);
  EXPECT_GT(cache_.stats().evicted_pages[kPoolInt2], 100);
  std::printf(
      "stress: hits %lld, splits %lld, pool exhausted %lld, evict calls %lld, evicted pages bf16 "
      "%lld int2 %lld\n",
      static_cast<long long>(n_hits), static_cast<long long>(n_splits_seen),
      static_cast<long long>(n_exhausted), static_cast<long long>(n_evict_calls),
      static_cast<long long>(cache_.stats().evicted_pages[kPoolBf16]),
      static_cast<long long>(cache_.stats().evicted_pages[kPoolInt2]));
}

}  // namespace
}  // namespace oscar::kv
