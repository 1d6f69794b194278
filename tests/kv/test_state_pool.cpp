// StatePool (kv/state_pool.h): slots come zeroed, keep their contents while the pool grows (each
// layer's array keeps its slot stride), are reused after release; and a SequenceCache with a pool
// takes one slot at its first reserve() and gives it back in clear().
#include <gtest/gtest.h>

#include <vector>

#include "kv/sequence_cache.h"
#include "kv/state_pool.h"

namespace oscar::kv {
namespace {

TEST(StatePool, SlotsAreZeroedKeptAcrossGrowthAndReused) {
  StatePool pool(/*n_layers=*/2, /*conv_floats=*/3, /*recurrent_floats=*/5);
  EXPECT_EQ(pool.bytes_per_slot(), 2 * (3 + 5) * 4);
  std::vector<int32_t> slots;
  for (int i = 0; i < 9; ++i) {  // past the first growth (4 slots) and the second (8)
    auto s = pool.acquire();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    slots.push_back(s.value());
    for (int l = 0; l < 2; ++l) {
      for (int j = 0; j < 3; ++j) EXPECT_EQ(pool.conv(l)[s.value() * 3 + j], 0.0f);
      for (int j = 0; j < 5; ++j) EXPECT_EQ(pool.recurrent(l)[s.value() * 5 + j], 0.0f);
      // Mark the slot: its id in every float of both layers.
      for (int j = 0; j < 3; ++j) pool.conv(l)[s.value() * 3 + j] = static_cast<float>(s.value());
      for (int j = 0; j < 5; ++j)
        pool.recurrent(l)[s.value() * 5 + j] = static_cast<float>(s.value() + 100 * l);
    }
  }
  EXPECT_EQ(pool.n_live(), 9);
  EXPECT_GE(pool.n_slots(), 9);
  for (int32_t s : slots) {
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(pool.conv(l)[s * 3 + 2], static_cast<float>(s));
      EXPECT_EQ(pool.recurrent(l)[s * 5 + 4], static_cast<float>(s + 100 * l));
    }
  }
  pool.release(slots[4]);
  auto again = pool.acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value(), slots[4]);  // reused, and zeroed again
  EXPECT_EQ(pool.recurrent(1)[again.value() * 5], 0.0f);
}

TEST(StatePool, SequenceCacheHoldsOneSlotWhileItHasTokens) {
  KvCacheSpec spec;
  spec.n_layers = 1;
  spec.n_heads_kv = 1;
  spec.head_dim = 64;
  spec.regions.n_sink = 16;
  spec.regions.n_recent = 32;
  spec.regions.page_size = 16;
  ASSERT_TRUE(spec.validate().ok());
  std::vector<uint8_t> bytes(64 * spec.layout().exact_page_bytes());
  PagePool pages("bf16", 64, spec.layout().exact_page_bytes(), bytes.data());
  StatePool states(3, 4, 8);
  {
    SequenceCache cache(&spec, &pages, nullptr, &states);
    EXPECT_EQ(cache.state_slot(), -1);
    ASSERT_TRUE(cache.reserve(5).ok());
    EXPECT_EQ(cache.state_slot(), 0);
    EXPECT_EQ(states.n_live(), 1);
    cache.unreserve();  // the slot stays with the sequence
    ASSERT_TRUE(cache.reserve(3).ok());
    EXPECT_EQ(cache.state_slot(), 0);
    EXPECT_EQ(states.n_live(), 1);
    cache.unreserve();
    cache.clear();
    EXPECT_EQ(cache.state_slot(), -1);
    EXPECT_EQ(states.n_live(), 0);
    ASSERT_TRUE(cache.reserve(1).ok());
    EXPECT_EQ(states.n_live(), 1);
    cache.unreserve();
  }
  EXPECT_EQ(states.n_live(), 0);  // the destructor gives it back
}

}  // namespace
}  // namespace oscar::kv
