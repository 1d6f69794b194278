// PagePool: allocation order, refcounts, all-or-nothing alloc_n, exhaustion as a Status, budget
// arithmetic, real page memory, and death on double free / bad ids (those are bugs, not input).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "kv/page_pool.h"

namespace oscar::kv {
namespace {

TEST(PagePool, AllocReleaseRefcount) {
  PagePool pool("bf16", 4, 0);
  EXPECT_TRUE(pool.simulated());
  EXPECT_EQ(pool.n_pages(), 4);
  EXPECT_EQ(pool.n_free(), 4);
  auto a = pool.alloc();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 0);  // LIFO free list starts with page 0
  EXPECT_EQ(pool.refcount(*a), 1);
  EXPECT_EQ(pool.n_used(), 1);
  pool.retain(*a);
  EXPECT_EQ(pool.refcount(*a), 2);
  pool.release(*a);
  EXPECT_EQ(pool.refcount(*a), 1);
  EXPECT_EQ(pool.n_free(), 3);
  pool.release(*a);
  EXPECT_EQ(pool.refcount(*a), 0);
  EXPECT_EQ(pool.n_free(), 4);
  // The page just released is the next one handed out (LIFO).
  auto b = pool.alloc();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  pool.release(*b);
}

TEST(PagePool, ExhaustionIsAStatusAndAllocNIsAllOrNothing) {
  PagePool pool("int2", 5, 0);
  auto three = pool.alloc_n(3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->size(), 3u);
  EXPECT_EQ(pool.n_free(), 2);
  auto too_many = pool.alloc_n(3);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.status().message().find("int2"), std::string::npos);
  EXPECT_EQ(pool.n_free(), 2);  // nothing taken by the failed call
  auto zero = pool.alloc_n(0);
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->empty());
  auto two = pool.alloc_n(2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(pool.n_free(), 0);
  auto none = pool.alloc();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  std::set<PageId> all(three->begin(), three->end());
  all.insert(two->begin(), two->end());
  EXPECT_EQ(all.size(), 5u);  // distinct ids
  pool.release_all(*three);
  pool.release_all(*two);
  EXPECT_EQ(pool.n_free(), pool.n_pages());
}

TEST(PagePool, EmptyPool) {
  PagePool pool("empty", 0, 0);
  EXPECT_EQ(pool.alloc().status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.alloc_n(1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.alloc_n(0).ok());
}

TEST(PagePool, PagesForBudget) {
  EXPECT_EQ(PagePool::pages_for_budget(0, 64), 0);
  EXPECT_EQ(PagePool::pages_for_budget(63, 64), 0);
  EXPECT_EQ(PagePool::pages_for_budget(64, 64), 1);
  EXPECT_EQ(PagePool::pages_for_budget(1000, 64), 15);
  EXPECT_EQ(PagePool::pages_for_budget(size_t{1} << 40, 1), int64_t{INT32_MAX});
}

TEST(PagePool, RealPagesAreDistinctMemory) {
  PagePool pool("bf16", 3, 32);
  EXPECT_FALSE(pool.simulated());
  EXPECT_EQ(pool.total_bytes(), 96u);
  auto pages = pool.alloc_n(3);
  ASSERT_TRUE(pages.ok());
  for (PageId p : *pages) std::fill_n(pool.data(p), 32, static_cast<uint8_t>(p + 1));
  for (PageId p : *pages) {
    const PagePool& cpool = pool;
    EXPECT_EQ(cpool.data(p)[0], p + 1);
    EXPECT_EQ(cpool.data(p)[31], p + 1);
  }
  EXPECT_EQ(pool.data((*pages)[1]) - pool.data((*pages)[0]),
            static_cast<ptrdiff_t>(32) * ((*pages)[1] - (*pages)[0]));
  pool.release_all(*pages);
}

// Random alloc/retain/release against a model of who holds what; every page returns at the end.
TEST(PagePool, RandomizedRefcountsMatchModel) {
  std::mt19937 rng(1234);
  PagePool pool("sim", 64, 0);
  std::vector<PageId> held;  // one entry per reference held by "someone"
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {
      auto n = static_cast<int64_t>(rng() % 5);
      auto pages = pool.alloc_n(n);
      if (pages.ok()) {
        held.insert(held.end(), pages->begin(), pages->end());
      } else {
        EXPECT_GT(n, pool.n_free());
      }
    } else if (op == 1 && !held.empty()) {
      const PageId p = held[rng() % held.size()];
      pool.retain(p);
      held.push_back(p);
    } else if (!held.empty()) {
      const size_t i = rng() % held.size();
      pool.release(held[i]);
      held[i] = held.back();
      held.pop_back();
    }
    if (step % 997 == 0) {
      int64_t used = 0;
      for (PageId p = 0; p < pool.n_pages(); ++p) {
        const auto n = std::count(held.begin(), held.end(), p);
        ASSERT_EQ(pool.refcount(p), n) << "page " << p << " step " << step;
        used += n > 0;
      }
      ASSERT_EQ(pool.n_used(), used);
    }
  }
  for (PageId p : held) pool.release(p);
  EXPECT_EQ(pool.n_free(), pool.n_pages());
}

using PagePoolDeathTest = ::testing::Test;

TEST(PagePoolDeathTest, DoubleFreeAndBadIdsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  PagePool pool("bf16", 2, 0);
  auto a = pool.alloc();
  ASSERT_TRUE(a.ok());
  pool.release(*a);
  EXPECT_DEATH(pool.release(*a), "double free");
  EXPECT_DEATH(pool.retain(*a), "retain of free page");
  EXPECT_DEATH(pool.release(7), "bad page id");
  EXPECT_DEATH(pool.release(kNoPage), "bad page id");
  EXPECT_DEATH((void)pool.data(0), "simulated");
}

}  // namespace
}  // namespace oscar::kv
