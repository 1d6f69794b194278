// The threads of a batch-1 decode step's small parallel loops (GEMVs, decode attention).
//
// A decode token of a small model is ~40 loops of tens of microseconds each. With OpenMP each loop
// is a parallel region that ends in a barrier every thread must reach: a thread that fell asleep
// between regions (core/omp_env.h's short spin) has to be woken, 36-40 us on the development VM,
// and the caller waits for it; longer spins starve the work when the cores are shared
// (docs/results/bench_method.md). Here a loop's blocks are claimed from one counter: the caller
// starts at once and waits only for blocks another thread has claimed, so a late or sleeping
// helper costs a wake-up call, not its wake-up time. Helpers spin (pausing, yielding the core now
// and then) for a short window after each loop, which covers most gaps inside a step, then sleep.
#pragma once

#include <cstdint>
#include <type_traits>

namespace oscar::kernels {

// Threads that run a loop: the caller and the helpers (OMP_NUM_THREADS, or the cores, - 1).
int decode_pool_threads();

namespace detail {
using BlockFn = void (*)(const void* ctx, int64_t block, int thread);
void decode_pool_run(int64_t n_blocks, BlockFn fn, const void* ctx);
}  // namespace detail

// Runs body(block, thread) for every block in [0, n_blocks) and returns when all have run;
// `thread` in [0, decode_pool_threads()) names the running thread (0: the caller) for per-thread
// scratch. Blocks run in any order, on any thread; a call from inside a body, from a second
// thread while a loop runs, or of one block runs on the caller alone.
template <class Body>
void decode_parallel_for(int64_t n_blocks, const Body& body) {
  detail::decode_pool_run(
      n_blocks,
      [](const void* ctx, int64_t block, int thread) {
        (*static_cast<const Body*>(ctx))(block, thread);
      },
      &body);
}

}  // namespace oscar::kernels
