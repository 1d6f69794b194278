// The decode loops' threads (decode_pool.h).
#include "kernels/cpu/decode_pool.h"

#include <linux/futex.h>
#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace oscar::kernels {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// How long a helper spins after its last block before it sleeps: enough for most of the serial
// work between a step's loops (GOMP_SPINCOUNT=1000, ~30 us on the development VM, left about one
// sleep a token, docs/results/bench_method.md), short enough that an idle engine, or one on a
// loaded machine, stops spinning soon (docs/results/cpu_decode_llamacpp.md). OSCAR_CPU_SPIN_US
// overrides it (0: sleep after a few pauses).
int64_t spin_ns() {
  const char* e = std::getenv("OSCAR_CPU_SPIN_US");
  return (e != nullptr ? std::atoll(e) : 50) * 1000;
}

// The current loop in one word, so that claiming a block and seeing which loop it belongs to are
// one atomic step: seq (24 bits) | n_blocks (20) | next block (20).
constexpr int kIdxBits = 20;
constexpr uint64_t kIdxMask = (uint64_t{1} << kIdxBits) - 1;
constexpr int64_t kMaxBlocks = int64_t{1} << kIdxBits;
inline uint64_t pack(uint64_t seq, uint64_t n, uint64_t idx) {
  return (seq << (2 * kIdxBits)) | (n << kIdxBits) | idx;
}
inline uint64_t blocks_of(uint64_t w) { return (w >> kIdxBits) & kIdxMask; }
inline uint64_t next_of(uint64_t w) { return w & kIdxMask; }

thread_local bool in_loop = false;  // this thread runs a body: nested loops run inline

class DecodePool {
 public:
  DecodePool() : spin_ns_(spin_ns()) {
    const int helpers = std::max(1, omp_get_max_threads()) - 1;
    for (int t = 1; t <= helpers; ++t) helpers_.emplace_back([this, t] { helper(t); });
  }
  ~DecodePool() {
    stop_.store(true);
    wake_.fetch_add(1);
    futex_wake();
    for (std::thread& t : helpers_) t.join();
  }

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  void run(int64_t n, detail::BlockFn fn, const void* ctx) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (n <= 1 || helpers_.empty() || in_loop || !lock.owns_lock()) {
      for (int64_t b = 0; b < n; ++b) fn(ctx, b, 0);
      return;
    }
    in_loop = true;
    for (int64_t b0 = 0; b0 < n; b0 += kMaxBlocks - 1) {
      const int64_t m = std::min<int64_t>(n - b0, kMaxBlocks - 1);
      base_.store(b0);
      fn_.store(fn);
      ctx_.store(ctx);
      done_.store(0);
      seq_ = (seq_ + 1) & ((uint64_t{1} << (64 - 2 * kIdxBits)) - 1);
      word_.store(pack(seq_, static_cast<uint64_t>(m), 0));
      wake_.fetch_add(1);
      if (sleepers_.load() > 0) futex_wake();
      work(0);
      // Only blocks a helper has claimed are left: wait for those.
      wait_done(m);
    }
    in_loop = false;
  }

 private:
  // Claims and runs blocks of the current loop until none is left; true if it ran any.
  bool work(int thread) {
    bool ran = false;
    for (;;) {
      uint64_t w = word_.load();
      if (next_of(w) >= blocks_of(w)) return ran;
      // Read before the claim: if the claim succeeds, the loop was still this one when they were
      // read (the caller writes them only after every block of the previous loop has run).
      const detail::BlockFn fn = fn_.load();
      const void* ctx = ctx_.load();
      const int64_t base = base_.load();
      if (!word_.compare_exchange_weak(w, w + 1)) continue;
      const bool outer = in_loop;
      in_loop = true;
      fn(ctx, base + static_cast<int64_t>(next_of(w)), thread);
      in_loop = outer;
      done_.fetch_add(1);
      ran = true;
    }
  }

  // The caller waits for the blocks helpers still run, a few microseconds each. It spins: a
  // sched_yield here gives the core away for a whole time slice when the machine is loaded. Only
  // a helper that lost its core mid-block makes it wait long; then it yields.
  void wait_done(int64_t m) const {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point t0 = Clock::now();
    bool late = false;
    for (int i = 1; done_.load() < m; ++i) {
      if (i % 64 != 0 || (!late && !(late = Clock::now() - t0 > std::chrono::microseconds(200))))
        cpu_relax();
      else
        sched_yield();
    }
  }

  bool has_work() const {
    const uint64_t w = word_.load();
    return next_of(w) < blocks_of(w);
  }

  void helper(int thread) {
    using Clock = std::chrono::steady_clock;
    for (;;) {
      work(thread);
      // Spin for the window (pausing; yielding the core now and then, for a shared machine),
      // then sleep until the next loop is published.
      const Clock::time_point t0 = Clock::now();
      bool sleep = false;
      for (int i = 1; !has_work() && !stop_.load(); ++i) {
        if (i % 64 != 0) {
          cpu_relax();
          continue;
        }
        if (Clock::now() - t0 >= std::chrono::nanoseconds(spin_ns_)) {
          sleep = true;
          break;
        }
        sched_yield();
      }
      if (sleep) {
        const uint32_t seen = wake_.load();
        sleepers_.fetch_add(1);
        if (!has_work() && !stop_.load()) futex_wait(seen);
        sleepers_.fetch_sub(1);
      }
      if (stop_.load()) return;
    }
  }

  // wake_ is the futex word: the caller bumps it after publishing a loop, and a helper sleeps only
  // while it holds the value it read before its last look for work (so no wake-up is lost).
  void futex_wait(uint32_t seen) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAIT_PRIVATE, seen, nullptr,
            nullptr, 0);
  }
  void futex_wake() {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
  }

  const int64_t spin_ns_;
  std::mutex mu_;      // one loop at a time; a second caller runs its loop alone
  uint64_t seq_ = 0;   // the caller's loop counter (under mu_)
  std::atomic<uint64_t> word_{0};
  std::atomic<detail::BlockFn> fn_{nullptr};
  std::atomic<const void*> ctx_{nullptr};
  std::atomic<int64_t> base_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> helpers_;
};

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

DecodePool& pool() {
  static DecodePool p;
  return p;
}

}  // namespace

int decode_pool_threads() { return pool().threads(); }

namespace detail {
void decode_pool_run(int64_t n_blocks, BlockFn fn, const void* ctx) {
  pool().run(n_blocks, fn, ctx);
}
}  // namespace detail

}  // namespace oscar::kernels
