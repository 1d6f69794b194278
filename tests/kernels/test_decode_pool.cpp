// decode_parallel_for (kernels/cpu/decode_pool.h): every block runs exactly once, on a thread index
// in range, for loop sizes around the pool's packing limits; nested loops and loops from a second
// thread run inline and complete.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "kernels/cpu/decode_pool.h"

namespace oscar::kernels {
namespace {

void expect_each_once(int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<bool> bad_thread{false};
  const int threads = decode_pool_threads();
  decode_parallel_for(n, [&](int64_t b, int t) {
    hits[static_cast<size_t>(b)].fetch_add(1);
    if (t < 0 || t >= threads) bad_thread = true;
  });
  for (int64_t b = 0; b < n; ++b) ASSERT_EQ(hits[static_cast<size_t>(b)].load(), 1) << "n " << n;
  EXPECT_FALSE(bad_thread.load());
}

TEST(DecodePool, EveryBlockOnce) {
  EXPECT_GE(decode_pool_threads(), 1);
  for (int64_t n : {0, 1, 2, 3, 7, 64, 1000})
    for (int rep = 0; rep < 50; ++rep) expect_each_once(n);
  expect_each_once((int64_t{1} << 20) + 5);  // more blocks than one loop word holds
}

TEST(DecodePool, NestedAndConcurrentLoops) {
  std::atomic<int64_t> sum{0};
  decode_parallel_for(8, [&](int64_t b, int) {
    decode_parallel_for(4, [&](int64_t c, int) { sum += b * 4 + c; });
  });
  EXPECT_EQ(sum.load(), 31 * 32 / 2);
  std::atomic<int64_t> a{0}, c{0};
  std::thread other([&] {
    for (int rep = 0; rep < 200; ++rep) decode_parallel_for(16, [&](int64_t b, int) { a += b; });
  });
  for (int rep = 0; rep < 200; ++rep) decode_parallel_for(16, [&](int64_t b, int) { c += b; });
  other.join();
  EXPECT_EQ(a.load(), 200 * 120);
  EXPECT_EQ(c.load(), 200 * 120);
}

}  // namespace
}  // namespace oscar::kernels
