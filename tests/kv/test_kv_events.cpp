// KV-cache events from the RadixCache (no ZMQ, no msgpack): the block hash chains over exact
// token ids (a golden value freezes its definition); the scripted workload's events, applied in
// order by a strict consumer (KvBlockMirror), rebuild exactly the block set the cache holds after
// every step, with the expected event kinds per step; lookups, locks and splits emit nothing;
// attaching to a non-empty cache announces it and detaching stops events; and a seeded random
// workload runs bit-for-bit identically on a cache with and one without a listener (same node
// handles, eviction counts, stats, pages and refcounts) while the events keep the mirror exact.
#include <gtest/gtest.h>

#include <random>

#include "kv/kv_event_workload.h"

namespace oscar::kv {
namespace {

using testing::expected_blocks;
using testing::KvEventWorkload;
using testing::mirrored_blocks;

template <typename T>
int count_kind(const std::vector<KvEvent>& events) {
  int n = 0;
  for (const KvEvent& e : events) n += std::holds_alternative<T>(e);
  return n;
}

TEST(KvEventHash, ChainsOverExactTokens) {
  const auto a = KvEventWorkload::tokens(1, 16);
  const std::vector<BlockHash> ha = block_hashes_of_path(a, 4);
  ASSERT_EQ(ha.size(), 4u);
  // A partial trailing page is not hashed; a prefix has the same leading hashes.
  EXPECT_EQ(block_hashes_of_path(std::span(a).first(15), 4),
            std::vector<BlockHash>(ha.begin(), ha.begin() + 3));
  // One token changed in page 0 changes every hash after it (the chain).
  auto b = a;
  b[1] = 77;
  const auto hb = block_hashes_of_path(b, 4);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(hb[i], ha[i]) << i;
  // Changed in page 2: pages 0-1 keep their hashes, 2-3 change.
  auto c = a;
  c[9] = 77;
  const auto hc = block_hashes_of_path(c, 4);
  EXPECT_EQ(hc[0], ha[0]);
  EXPECT_EQ(hc[1], ha[1]);
  EXPECT_NE(hc[2], ha[2]);
  EXPECT_NE(hc[3], ha[3]);
  // The same tokens in pages of another size are other blocks.
  EXPECT_NE(block_hashes_of_path(a, 8)[0], ha[0]);
  EXPECT_NE(block_hashes_of_path(a, 8)[0], ha[1]);
  // Golden value, also what Python computes: hashlib.sha256(root + struct.pack("<I", 4) +
  // struct.pack("<4i", 1, 2, 3, 4)), last 8 bytes big-endian, with root =
  // hashlib.sha256(b"oscar.kv_events.v1.root"). It freezes the definition in kv_events.h: a
  // change breaks routers that kept state across an upgrade, so bump the domain string instead.
  EXPECT_EQ(ha[0], 0x6b435bd31a5db0c6ull) << std::hex << ha[0];
  // The published hash is the digest's last 8 bytes, big-endian.
  BlockDigest d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(external_block_hash(d), 0x18191a1b1c1d1e1full);
}

TEST(KvEvents, ScriptedWorkloadRebuildsTheCacheAfterEveryStep) {
  KvEventWorkload w;
  KvBlockMirror mirror;
  const std::vector<KvEvent> attach = w.take_attach_events();
  ASSERT_EQ(attach.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(attach[0]));
  ASSERT_TRUE(mirror.apply_all(attach).ok());

  const auto sys_hashes = block_hashes_of_path(
      KvEventWorkload::tokens(1000, 3 * KvEventWorkload::kP), KvEventWorkload::kP);
  int n_steps = 0;
  w.run([&](const std::string& step, std::vector<KvEvent> events) {
    SCOPED_TRACE(step);
    ++n_steps;
    const Status s = mirror.apply_all(events);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(mirrored_blocks(mirror), expected_blocks(w.cache()));
    w.cache().check_invariants();
    if (n_steps == 1) {  // A: one run of 5 blocks from the root, its tokens in order
      ASSERT_EQ(events.size(), 1u);
      const auto& e = std::get<BlockStored>(events[0]);
      EXPECT_EQ(e.block_hashes.size(), 5u);
      EXPECT_FALSE(e.parent_block_hash.has_value());
      EXPECT_EQ(e.block_size, KvEventWorkload::kP);
      EXPECT_EQ(e.token_ids.size(), 5u * KvEventWorkload::kP);
      EXPECT_EQ(e.token_ids[0], 1000);
      EXPECT_EQ(std::vector<BlockHash>(e.block_hashes.begin(), e.block_hashes.begin() + 3),
                sys_hashes);
    } else if (n_steps == 2) {  // B: 2 blocks under sys's last page (the split emits nothing)
      ASSERT_EQ(events.size(), 1u);
      const auto& e = std::get<BlockStored>(events[0]);
      EXPECT_EQ(e.block_hashes.size(), 2u);
      EXPECT_EQ(e.parent_block_hash, sys_hashes[2]);
    } else if (n_steps == 3) {  // C: diverges inside page 1, so 3 blocks under page 0
      ASSERT_EQ(events.size(), 1u);
      const auto& e = std::get<BlockStored>(events[0]);
      EXPECT_EQ(e.block_hashes.size(), 3u);
      EXPECT_EQ(e.parent_block_hash, sys_hashes[0]);
    } else if (n_steps == 5) {  // D was cancelled before inserting
      EXPECT_TRUE(events.empty());
    } else if (n_steps == 6) {  // E: evictions first, then E's blocks
      EXPECT_GE(count_kind<BlockRemoved>(events), 1);
      EXPECT_EQ(count_kind<BlockStored>(events), 1);
      EXPECT_TRUE(std::holds_alternative<BlockStored>(events.back()));
    } else if (n_steps == 7) {  // flush: removals only, and the locked path stays
      EXPECT_GE(count_kind<BlockRemoved>(events), 1);
      EXPECT_EQ(count_kind<BlockRemoved>(events), static_cast<int>(events.size()));
      EXPECT_GT(mirror.size(), 0u);
    } else if (n_steps == 8) {  // reset
      ASSERT_EQ(events.size(), 1u);
      EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(events[0]));
      EXPECT_EQ(mirror.size(), 0u);
    }
  });
  EXPECT_EQ(n_steps, 9);
  EXPECT_EQ(mirror.size(), 5u);  // B after reset
}

TEST(KvEvents, LookupsLocksAndSplitsEmitNothing) {
  PagePool bf16{"bf16", 8, 0}, int2{"int2", 8, 0};
  RadixCache cache(4, {&bf16, &int2});
  KvEventCollector collector;
  cache.set_listener(&collector);
  collector.take();
  const auto t = KvEventWorkload::tokens(1, 12);
  std::vector<CachedPage> pages;
  for (int i = 0; i < 3; ++i) pages.push_back(CachedPage{int2.alloc().value(), kPoolInt2});
  cache.insert(t, pages);
  EXPECT_EQ(collector.take().size(), 1u);
  PrefixMatch m = cache.match_prefix(std::span(t).first(4));  // splits the edge
  cache.lock(m.last_node);
  cache.unlock(m.last_node);
  cache.insert(t, pages);  // already cached: nothing new
  EXPECT_TRUE(collector.empty());
  EXPECT_EQ(cache.evict(0, kPoolInt2), 0);
  EXPECT_TRUE(collector.empty());
  cache.release_pages(pages);
  cache.set_listener(nullptr);
}

TEST(KvEvents, AttachAnnouncesTheCacheAndDetachStopsEvents) {
  PagePool bf16{"bf16", 8, 0}, int2{"int2", 16, 0};
  RadixCache cache(4, {&bf16, &int2});
  auto insert = [&](const std::vector<int32_t>& t) {
    std::vector<CachedPage> pages;
    for (size_t i = 0; i < t.size() / 4; ++i)
      pages.push_back(CachedPage{int2.alloc().value(), kPoolInt2});
    cache.insert(t, pages);
    cache.release_pages(pages);
  };
  const auto a = KvEventWorkload::tokens(1, 12);
  insert(a);
  insert(KvEventWorkload::concat(std::vector<int32_t>(a.begin(), a.begin() + 4),
                                 KvEventWorkload::tokens(50, 8)));
  KvEventCollector collector;
  cache.set_listener(&collector);
  std::vector<KvEvent> events = collector.take();
  ASSERT_EQ(events.size(), 4u);  // cleared, then the 3 nodes (the shared page, two branches)
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(events[0]));
  KvBlockMirror mirror;
  ASSERT_TRUE(mirror.apply_all(events).ok());
  EXPECT_EQ(mirrored_blocks(mirror), expected_blocks(cache));
  // Evicting after the attach names the pages by the same hashes.
  cache.evict_all_unlocked();
  ASSERT_TRUE(mirror.apply_all(collector.take()).ok());
  EXPECT_EQ(mirror.size(), 0u);
  cache.set_listener(nullptr);
  insert(a);
  cache.evict_all_unlocked();
  cache.reset();
  EXPECT_TRUE(collector.empty());
}

TEST(KvBlockMirror, RejectsInconsistentStreams) {
  KvBlockMirror m;
  EXPECT_FALSE(m.apply(BlockStored{{1}, 7, {1, 2}, 2}).ok());      // unknown parent
  EXPECT_FALSE(m.apply(BlockStored{{1}, {}, {1, 2, 3}, 2}).ok());  // tokens != n * block_size
  ASSERT_TRUE(m.apply(BlockStored{{1, 2}, {}, {1, 2, 3, 4}, 2}).ok());
  EXPECT_FALSE(m.apply(BlockStored{{2}, 1, {3, 4}, 2}).ok());  // stored twice
  EXPECT_FALSE(m.apply(BlockRemoved{{1}}).ok());               // still the parent of 2
  EXPECT_FALSE(m.apply(BlockRemoved{{9}}).ok());               // unknown
  ASSERT_TRUE(m.apply(BlockRemoved{{2, 1}}).ok());
  EXPECT_EQ(m.size(), 0u);
}

// One cache world: pools plus the cache; two of them run the same operations.
struct World {
  PagePool bf16{"bf16", 24, 0};
  PagePool int2{"int2", 40, 0};
  RadixCache cache{4, {&bf16, &int2}};
};

TEST(KvEvents, ListenerDoesNotChangeBehaviourAndKeepsTheMirrorExact) {
  World plain, heard;
  KvEventCollector collector;
  heard.cache.set_listener(&collector);
  KvBlockMirror mirror;
  ASSERT_TRUE(mirror.apply_all(collector.take()).ok());

  struct Active {
    std::vector<CachedPage> pages;
    NodeHandle locked;
  };
  std::vector<Active> active[2];
  std::vector<std::vector<int32_t>> history;
  std::mt19937 rng(4242);
  auto uniform = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  int64_t n_removed_events = 0;

  for (int step = 0; step < 3000; ++step) {
    const int op = uniform(20);
    if (op < 9) {  // a request: match, lock, reuse, allocate the rest, insert, maybe keep running
      std::vector<int32_t> t;
      if (!history.empty() && uniform(3) != 0) {
        const auto& base = history[static_cast<size_t>(uniform(static_cast<int>(history.size())))];
        t.assign(base.begin(), base.begin() + uniform(static_cast<int>(base.size()) + 1));
      }
      const size_t total =
          std::max<size_t>(1, (t.size() + static_cast<size_t>(uniform(20))) / 4) * 4;
      while (t.size() < total) t.push_back(uniform(3));
      t.resize(total);
      history.push_back(t);
      const bool keep = uniform(3) == 0;
      NodeHandle handles[2];
      for (int wi = 0; wi < 2; ++wi) {
        World& w = wi == 0 ? plain : heard;
        PrefixMatch m = w.cache.match_prefix(t);
        w.cache.lock(m.last_node);
        w.cache.retain_pages(m.pages);
        std::vector<CachedPage> pages = m.pages;
        bool ok = true;
        for (size_t i = pages.size(); i < t.size() / 4; ++i) {
          PagePool& pool = i < 2 ? w.bf16 : w.int2;
          const uint8_t id = i < 2 ? kPoolBf16 : kPoolInt2;
          if (pool.n_free() == 0 && w.cache.evict(1, id) == 0) {
            ok = false;
            break;
          }
          pages.push_back(CachedPage{pool.alloc().value(), id});
        }
        NodeHandle node = m.last_node;
        if (ok) {
          InsertResult r = w.cache.insert(t, pages);
          w.cache.lock(r.last_node);
          w.cache.unlock(m.last_node);
          node = r.last_node;
        }
        handles[wi] = node;
        if (keep) {
          active[wi].push_back(Active{pages, node});
        } else {
          w.cache.unlock(node);
          w.cache.release_pages(pages);
        }
      }
      ASSERT_EQ(handles[0], handles[1]) << "step " << step;
    } else if (op < 13 && !active[0].empty()) {  // a running request finishes
      const size_t k = static_cast<size_t>(uniform(static_cast<int>(active[0].size())));
      for (int wi = 0; wi < 2; ++wi) {
        World& w = wi == 0 ? plain : heard;
        w.cache.unlock(active[wi][k].locked);
        w.cache.release_pages(active[wi][k].pages);
        active[wi].erase(active[wi].begin() + static_cast<ptrdiff_t>(k));
      }
    } else if (op < 18) {
      const int64_t n = uniform(6);
      const uint8_t pool = uniform(2) == 0 ? kPoolBf16 : kPoolInt2;
      ASSERT_EQ(plain.cache.evict(n, pool), heard.cache.evict(n, pool)) << "step " << step;
    } else if (op == 18) {
      plain.cache.evict_all_unlocked();
      heard.cache.evict_all_unlocked();
    } else if (active[0].empty()) {
      plain.cache.reset();
      heard.cache.reset();
    }
    std::vector<KvEvent> events = collector.take();
    n_removed_events += count_kind<BlockRemoved>(events);
    const Status s = mirror.apply_all(events);
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.to_string();
    if (step % 50 == 0 || step == 2999) {
      ASSERT_EQ(mirrored_blocks(mirror), expected_blocks(heard.cache)) << "step " << step;
      heard.cache.check_invariants();
    }
    // Same behaviour: stats, pages (in order), refcounts.
    const RadixCacheStats& a = plain.cache.stats();
    const RadixCacheStats& b = heard.cache.stats();
    ASSERT_EQ(a.n_nodes, b.n_nodes) << "step " << step;
    ASSERT_EQ(a.cached_pages, b.cached_pages);
    ASSERT_EQ(a.evictable_pages, b.evictable_pages);
    ASSERT_EQ(a.evicted_pages, b.evicted_pages);
    ASSERT_EQ(a.hits, b.hits);
    ASSERT_EQ(a.matched_tokens, b.matched_tokens);
    ASSERT_EQ(a.inserted_pages, b.inserted_pages);
    for (PageId p = 0; p < plain.int2.n_pages(); ++p) {
      ASSERT_EQ(plain.int2.refcount(p), heard.int2.refcount(p));
    }
    for (PageId p = 0; p < plain.bf16.n_pages(); ++p) {
      ASSERT_EQ(plain.bf16.refcount(p), heard.bf16.refcount(p));
    }
  }
  std::vector<std::pair<std::vector<int32_t>, CachedPage>> pa, pb;
  plain.cache.for_each_page([&](std::span<const int32_t> pre, CachedPage p) {
    pa.emplace_back(std::vector<int32_t>(pre.begin(), pre.end()), p);
  });
  heard.cache.for_each_page([&](std::span<const int32_t> pre, CachedPage p) {
    pb.emplace_back(std::vector<int32_t>(pre.begin(), pre.end()), p);
  });
  EXPECT_EQ(pa, pb);
  EXPECT_GT(n_removed_events, 50);  // the workload really evicts
  for (int wi = 0; wi < 2; ++wi) {
    World& w = wi == 0 ? plain : heard;
    for (const Active& s : active[wi]) {
      w.cache.unlock(s.locked);
      w.cache.release_pages(s.pages);
    }
  }
  heard.cache.set_listener(nullptr);
}

}  // namespace
}  // namespace oscar::kv
