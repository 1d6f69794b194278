// RadixCache in hybrid mode (attach_state_pool): a lookup ends at the deepest matched node that
// holds a DeltaNet state snapshot (KV pages beyond it are useless without a state), a prompt that
// diverges before any snapshot misses, the snapshot budget drops the least recently used one,
// eviction drops the snapshots of trimmed nodes (leaves without one go first) and gives their
// slots back, and a seeded random workload keeps the invariants, every snapshot's contents (a
// value derived from its prefix), the brute-force longest-snapshot match, and the KV events
// (only blocks on a path to a snapshot are announced) exact. Simulated pools; a StatePool of one
// float per slot stands for the states.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kv/kv_event_workload.h"
#include "kv/radix_cache.h"
#include "kv/state_pool.h"

namespace oscar::kv {
namespace {

constexpr int32_t kP = 4;

std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> head(const std::vector<int32_t>& t, size_t n) {
  return std::vector<int32_t>(t.begin(), t.begin() + static_cast<ptrdiff_t>(n));
}

// The "state" after a prefix: any value that differs between prefixes.
float state_of(std::span<const int32_t> prefix) {
  uint32_t h = 2166136261u;
  for (int32_t t : prefix) h = (h ^ static_cast<uint32_t>(t)) * 16777619u;
  return static_cast<float>(h % 1000003u) + 0.25f * static_cast<float>(prefix.size());
}

class HybridRadixTest : public ::testing::Test {
 protected:
  PagePool bf16_{"bf16", 64, 0};
  StatePool states_{1, 1, 1};
  RadixCache cache_{kP, {&bf16_}};
  int32_t scratch_ = -1;  // the "sequence" slot snapshots are copied from

  virtual int32_t budget() const { return 3; }
  void SetUp() override {
    cache_.attach_state_pool(&states_, budget());
    scratch_ = states_.acquire().value();
  }
  void TearDown() override { cache_.check_invariants(); }

  // Inserts tokens with fresh pages and drops the caller's references.
  void insert_fresh(const std::vector<int32_t>& tokens) {
    std::vector<CachedPage> pages;
    for (size_t i = 0; i < tokens.size() / kP; ++i) pages.push_back({bf16_.alloc().value(), 0});
    cache_.insert(tokens, pages);
    cache_.release_pages(pages);
  }
  bool snapshot(const std::vector<int32_t>& prefix) {
    states_.recurrent(0)[scratch_] = state_of(prefix);
    return cache_.store_snapshot(prefix, scratch_);
  }
  // Tokens matched, checking that the state handed out is the one after them.
  int64_t matched(const std::vector<int32_t>& tokens) {
    const PrefixMatch m = cache_.match_prefix(tokens);
    EXPECT_EQ(static_cast<int64_t>(m.pages.size()) * kP, m.n_tokens_matched);
    if (m.n_tokens_matched == 0) {
      EXPECT_EQ(m.state_slot, -1);
    } else {
      EXPECT_GE(m.state_slot, 0);
      if (m.state_slot >= 0) {
        EXPECT_EQ(states_.recurrent(0)[m.state_slot],
                  state_of(std::span(tokens).first(static_cast<size_t>(m.n_tokens_matched))));
      }
    }
    return m.n_tokens_matched;
  }
};

TEST_F(HybridRadixTest, MatchEndsAtTheDeepestSnapshot) {
  const auto a = iota_tokens(1, 20);  // 5 pages
  insert_fresh(a);
  EXPECT_EQ(matched(a), 0);  // pages without a state serve nothing
  EXPECT_EQ(cache_.stats().misses, 1);
  ASSERT_TRUE(snapshot(head(a, 8)));  // splits the edge after page 2
  EXPECT_EQ(cache_.stats().n_nodes, 2);
  EXPECT_EQ(matched(a), 8);
  ASSERT_TRUE(snapshot(a));
  EXPECT_EQ(matched(a), 20);
  EXPECT_EQ(matched(head(a, 19)), 8);  // a partial last page: back to the snapshot at 8
  auto b = a;
  b[13] = 99;  // diverges in page 3: the snapshot at 8 serves
  EXPECT_EQ(matched(b), 8);
  b[5] = 99;  // diverges in page 1, before any snapshot
  EXPECT_EQ(matched(b), 0);
  EXPECT_FALSE(cache_.store_snapshot(b, scratch_));  // not cached: nothing stored
  EXPECT_EQ(cache_.stats().snapshots, 2);
  EXPECT_EQ(states_.n_live(), 3);  // two snapshots and the scratch slot
  // A chooser that takes fewer chunks than the deepest snapshot's falls back to a shallower one.
  const PrefixMatch m = cache_.match_prefix(a, [](std::span<const CachedChunk> chunks) {
    std::vector<CachedPage> pages;
    for (size_t i = 0; i < chunks.size() && i < 3; ++i) pages.push_back(chunks[i].form(0));
    return pages;
  });
  EXPECT_EQ(m.n_tokens_matched, 8);
}

TEST_F(HybridRadixTest, BudgetDropsTheLeastRecentlyUsedSnapshot) {
  std::vector<std::vector<int32_t>> paths;
  for (int i = 0; i < 4; ++i) {
    paths.push_back(iota_tokens(100 * (i + 1), 8));
    insert_fresh(paths.back());
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(snapshot(paths[i]));
  EXPECT_EQ(matched(paths[0]), 8);  // path 0 is now more recent than path 1
  ASSERT_TRUE(snapshot(paths[3]));  // the budget of 3 drops path 1's
  EXPECT_EQ(cache_.stats().snapshots, 3);
  EXPECT_EQ(cache_.stats().evicted_snapshots, 1);
  EXPECT_EQ(matched(paths[1]), 0);
  EXPECT_EQ(matched(paths[0]), 8);
  EXPECT_EQ(matched(paths[3]), 8);
  EXPECT_EQ(states_.n_live(), 4);
  // Storing an existing snapshot keeps it (no copy, no budget).
  states_.recurrent(0)[scratch_] = -1.f;
  ASSERT_TRUE(cache_.store_snapshot(paths[0], scratch_));
  EXPECT_EQ(matched(paths[0]), 8);
  EXPECT_EQ(cache_.stats().stored_snapshots, 4);
}

TEST_F(HybridRadixTest, EvictionTrimsSnapshotsLeavesWithoutOneFirst) {
  const auto with = iota_tokens(1, 8), without = iota_tokens(50, 8);
  insert_fresh(with);
  ASSERT_TRUE(snapshot(with));
  insert_fresh(without);  // more recent, but it serves nothing
  EXPECT_EQ(cache_.evict(1, 0), 1);
  EXPECT_EQ(matched(with), 8);
  EXPECT_EQ(cache_.stats().snapshots, 1);
  EXPECT_EQ(cache_.evict(2, 0), 2);  // without's last page, then with's tail: its state goes
  EXPECT_EQ(cache_.stats().snapshots, 0);
  EXPECT_EQ(states_.n_live(), 1);
  EXPECT_EQ(matched(with), 0);
  cache_.reset();
  EXPECT_EQ(bf16_.n_used(), 0);
}

// Blocks the listener should know: every chunk on a path from the root to a snapshot.
std::map<BlockHash, testing::ExpectedBlock> hybrid_expected_blocks(const RadixCache& cache) {
  std::set<std::vector<int32_t>> snapshot_paths;
  cache.for_each_snapshot([&](std::span<const int32_t> prefix, int32_t) {
    snapshot_paths.emplace(prefix.begin(), prefix.end());
  });
  std::map<BlockHash, testing::ExpectedBlock> all = testing::expected_blocks(cache), out;
  for (const auto& path : snapshot_paths) {
    const std::vector<BlockHash> hashes = block_hashes_of_path(path, cache.page_size());
    for (BlockHash h : hashes) out.emplace(h, all.at(h));
  }
  return out;
}

class HybridRadixRandomTest : public HybridRadixTest {
 protected:
  int32_t budget() const override { return 12; }
};

TEST_F(HybridRadixRandomTest, RandomWorkloadKeepsStatesMatchesAndEventsExact) {
  KvEventCollector events;
  KvBlockMirror mirror;
  cache_.set_listener(&events);
  std::mt19937 rng(25042);
  auto uniform = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<std::vector<int32_t>> history;
  struct Live {
    NodeHandle node;
    std::vector<CachedPage> pages;
  };
  std::vector<Live> live;
  int64_t hits = 0, stored = 0;
  auto make_tokens = [&] {
    std::vector<int32_t> t;
    if (!history.empty() && uniform(4) != 0) {
      const auto& base = history[static_cast<size_t>(uniform(static_cast<int>(history.size())))];
      t.assign(base.begin(), base.begin() + uniform(static_cast<int>(base.size()) + 1));
    }
    const int total = std::max<int>(1, (static_cast<int>(t.size()) + uniform(5 * kP)) / kP) * kP;
    while (static_cast<int>(t.size()) < total) t.push_back(uniform(3));
    t.resize(static_cast<size_t>(total));
    return t;
  };
  for (int step = 0; step < 4000; ++step) {
    const int op = uniform(10);
    if (op < 4) {  // a sequence: match, check against the snapshots, insert, snapshot, maybe hold
      const auto t = make_tokens();
      size_t best = 0;
      cache_.for_each_snapshot([&](std::span<const int32_t> prefix, int32_t slot) {
        EXPECT_EQ(states_.recurrent(0)[slot], state_of(prefix));
        if (prefix.size() <= t.size() && prefix.size() > best &&
            std::equal(prefix.begin(), prefix.end(), t.begin()))
          best = prefix.size();
      });
      const PrefixMatch m = cache_.match_prefix(t);
      ASSERT_EQ(m.n_tokens_matched, static_cast<int64_t>(best)) << "step " << step;
      if (m.state_slot >= 0) {
        ASSERT_EQ(states_.recurrent(0)[m.state_slot],
                  state_of(std::span(t).first(static_cast<size_t>(m.n_tokens_matched))));
      }
      hits += best > 0;
      std::vector<CachedPage> pages = m.pages;
      cache_.retain_pages(pages);
      bool ok = true;
      while (pages.size() < t.size() / kP) {
        auto page = bf16_.alloc();
        if (!page.ok()) {
          cache_.evict(2, 0);
          page = bf16_.alloc();
        }
        if (!page.ok()) {
          ok = false;
          break;
        }
        pages.push_back({page.value(), 0});
      }
      if (!ok) {
        cache_.release_pages(pages);
      } else {
        const NodeHandle node = cache_.insert(t, pages).last_node;
        // Snapshots where the scheduler takes them: the whole path, or an earlier page boundary.
        const size_t at = uniform(3) == 0 ? kP * (1 + uniform(static_cast<int>(t.size()) / kP))
                                          : t.size();
        stored += snapshot(head(t, at));
        history.push_back(t);
        if (live.size() < 4 && uniform(2) == 0) {
          cache_.lock(node);
          live.push_back({node, pages});
        } else {
          cache_.release_pages(pages);
        }
      }
    } else if (op < 6 && !live.empty()) {  // a sequence ends
      const size_t i = static_cast<size_t>(uniform(static_cast<int>(live.size())));
      cache_.unlock(live[i].node);
      cache_.release_pages(live[i].pages);
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    } else if (op < 8) {
      cache_.evict(1 + uniform(6), 0);
    } else if (op == 8 && uniform(50) == 0) {
      cache_.evict_all_unlocked();
    } else if (op == 9 && uniform(200) == 0) {  // a router that dropped events resynchronises
      cache_.set_listener(&events);
      mirror = KvBlockMirror();
    }
    ASSERT_TRUE(mirror.apply_all(events.take()).ok()) << "step " << step;
    ASSERT_EQ(testing::mirrored_blocks(mirror), hybrid_expected_blocks(cache_)) << "step " << step;
    if (step % 50 == 0) cache_.check_invariants();
    ASSERT_EQ(states_.n_live(), cache_.stats().snapshots + 1);
  }
  std::printf("hybrid radix workload: %lld hits, %lld snapshots stored, %lld dropped\n",
              static_cast<long long>(hits), static_cast<long long>(stored),
              static_cast<long long>(cache_.stats().evicted_snapshots));
  EXPECT_GT(hits, 100);
  EXPECT_GT(stored, 500);
  EXPECT_GT(cache_.stats().evicted_snapshots, 100);
  for (Live& l : live) {
    cache_.unlock(l.node);
    cache_.release_pages(l.pages);
  }
  cache_.reset();
  EXPECT_EQ(states_.n_live(), 1);
  EXPECT_EQ(bf16_.n_used(), 0);
  cache_.set_listener(nullptr);
}

}  // namespace
}  // namespace oscar::kv
