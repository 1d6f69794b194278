// Sharing full recent-window (BF16) pages through the radix cache (kv/radix_cache.h,
// kv/admission.h choose_prefix_forms, SequenceCache::adopt_prefix), on real pools and the CPU
// kernels (int2-naive, page 16, 16 sink tokens, a 32-token window):
//   - a sequence adopting another's sinks, history and full recent pages reads every row exactly
//     as the owner does (the same pages);
//   - its demotion of a shared recent page is a copy: the shared BF16 page keeps its bytes, the
//     adopter's new INT2 page equals, byte for byte, the owner's own demotion of that page, and
//     the adopter drops only its reference;
//   - after an adopter is "preempted" (publishes its pages to the cache and clears) and both
//     sequences finish, every refcount is back to the cache's own, and evicting the cache frees
//     every page of both pools.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kv/admission.h"
#include "kv/radix_cache.h"
#include "kv/sequence_cache.h"

namespace oscar::kv {
namespace {

constexpr int kP = 16;

KvCacheSpec small_spec() {
  KvCacheSpec s;
  s.n_layers = 2;
  s.n_heads_kv = 2;
  s.head_dim = 128;
  s.mode = quant::CacheMode::kInt2Naive;
  s.regions = RegionConfig{kP, 16, 32};
  return s;
}

class SharedRecentTest : public ::testing::Test {
 protected:
  // n more tokens of seeded normal K/V in one prefill chunk, committed (demotions included).
  void fill(SequenceCache& c, int64_t n) {
    ASSERT_TRUE(c.reserve(n).ok());
    const size_t rows = static_cast<size_t>(n) * spec_.n_heads_kv * spec_.head_dim;
    std::vector<float> k(rows), v(rows);
    for (int layer = 0; layer < spec_.n_layers; ++layer) {
      for (float& x : k) x = normal_(rng_);
      for (float& x : v) x = normal_(rng_);
      c.write(layer, k.data(), v.data(), n);
    }
    ASSERT_TRUE(c.commit(n).ok());
  }
  std::vector<float> row(const SequenceCache& c, int layer, int kv, int head, int64_t pos) {
    std::vector<float> out(static_cast<size_t>(spec_.head_dim));
    c.read_row(layer, kv, head, pos, out.data());
    return out;
  }
  std::vector<uint8_t> bytes(const PagePool& pool, PageId page) {
    const uint8_t* d = pool.data(page);
    return std::vector<uint8_t>(d, d + pool.page_bytes());
  }

  const KvCacheSpec spec_ = small_spec();
  PagePool exact_{"bf16", 64, spec_.layout().exact_page_bytes()};
  PagePool int2_{"int2", 64, spec_.layout().int2_page_bytes()};
  RadixCache radix_{kP, {&exact_, &int2_}};
  std::mt19937 rng_{2026};
  std::normal_distribution<float> normal_;
};

TEST_F(SharedRecentTest, AdopterReadsOwnersPagesAndDemotesIntoItsOwn) {
  SequenceCache owner(&spec_, &exact_, &int2_);
  fill(owner, 100);  // sinks [0, 16), history [16, 64), recent [64, 100): 2 full pages + 4 tokens
  ASSERT_EQ(owner.hist_end(), 64);
  std::vector<int32_t> tokens(96);
  for (int i = 0; i < 96; ++i) tokens[i] = i;
  const std::vector<CachedPage> owned = owner.shareable_pages();
  ASSERT_EQ(owned.size(), 6u);  // the partial page is not shared
  EXPECT_EQ(owned[4].pool, kPoolBf16);
  radix_.insert(tokens, owned);
  const CachedPage shared = owned[4];  // recent tokens [64, 80)
  const std::vector<uint8_t> shared_bytes = bytes(exact_, shared.page);
  EXPECT_EQ(exact_.refcount(shared.page), 2);  // owner + cache

  // The adopter's prompt: the 96 shared tokens and 14 of its own. A cold sequence of 96 tokens
  // holds history [16, 64) and recent [64, 96): the forms chosen.
  std::vector<int32_t> prompt = tokens;
  for (int i = 0; i < 14; ++i) prompt.push_back(500 + i);
  PrefixMatch m = radix_.match_prefix(prompt, [&](std::span<const CachedChunk> chunks) {
    return choose_prefix_forms(spec_.regions, true, static_cast<int64_t>(prompt.size()), chunks);
  });
  ASSERT_EQ(m.n_tokens_matched, 96);
  EXPECT_EQ(m.pages, owned);
  radix_.lock(m.last_node);
  radix_.retain_pages(m.pages);
  auto adopter = std::make_unique<SequenceCache>(&spec_, &exact_, &int2_);
  ASSERT_TRUE(adopter->adopt_prefix(m.pages).ok());
  EXPECT_EQ(adopter->n_tokens(), 96);
  EXPECT_EQ(adopter->hist_end(), 64);
  EXPECT_EQ(exact_.refcount(shared.page), 3);
  for (int64_t pos = 0; pos < 96; pos += 5)
    for (int kv = 0; kv < 2; ++kv)
      ASSERT_EQ(row(*adopter, 1, kv, 1, pos), row(owner, 1, kv, 1, pos)) << pos;

  // 30 more tokens: history_end(126) = 80, so [64, 80) (the shared page) is demoted.
  fill(*adopter, 30);
  ASSERT_EQ(adopter->hist_end(), 80);
  EXPECT_EQ(bytes(exact_, shared.page), shared_bytes);
  EXPECT_EQ(exact_.refcount(shared.page), 2);  // the adopter's reference only was dropped
  const CachedPage adopter_int2 = adopter->shareable_pages()[4];
  ASSERT_EQ(adopter_int2.pool, kPoolInt2);
  EXPECT_EQ(int2_.refcount(adopter_int2.page), 1);
  // The owner demotes the same page itself: the same INT2 bytes.
  fill(owner, 20);
  ASSERT_EQ(owner.hist_end(), 80);
  const CachedPage owner_int2 = owner.shareable_pages()[4];
  EXPECT_NE(owner_int2.page, adopter_int2.page);
  EXPECT_EQ(bytes(int2_, owner_int2.page), bytes(int2_, adopter_int2.page));
  EXPECT_EQ(bytes(exact_, shared.page), shared_bytes);
  EXPECT_EQ(exact_.refcount(shared.page), 1);  // the cache's

  // The adopter is preempted: its pages go to the cache (the INT2 form of the shared chunk joins
  // it), it unlocks and clears.
  std::vector<int32_t> adopter_tokens = prompt;
  adopter_tokens.resize(static_cast<size_t>(adopter->shareable_tokens()));
  for (size_t i = prompt.size(); i < adopter_tokens.size(); ++i) adopter_tokens[i] = 900;
  const InsertResult ins = radix_.insert(adopter_tokens, adopter->shareable_pages());
  EXPECT_EQ(ins.n_tokens_existing, 96);
  radix_.unlock(m.last_node);
  adopter.reset();
  EXPECT_EQ(exact_.refcount(shared.page), 1);
  EXPECT_EQ(int2_.refcount(adopter_int2.page), 1);  // the cache's
  radix_.check_invariants();
  owner.clear();
  EXPECT_EQ(exact_.refcount(owned[0].page), 1);  // every cached page: the cache's reference
  EXPECT_EQ(int2_.refcount(owned[1].page), 1);
  radix_.evict_all_unlocked();
  EXPECT_EQ(exact_.n_free(), exact_.n_pages());
  EXPECT_EQ(int2_.n_free(), int2_.n_pages());
}

}  // namespace
}  // namespace oscar::kv
