// Shared CUDA helpers for oscar's kernels: error checks (OSCAR_CUDA_CHECK for runtime calls,
// OSCAR_CUDA_LAUNCH_CHECK right after a launch; OSCAR_CUDA_SYNC_CHECKS=1 at compile time adds a
// device synchronisation after each launch, for debugging) and the few PTX wrappers the kernels
// use (cp.async, ldmatrix, movmatrix, mma.sync), and programmatic dependent launch (launch_pdl).
// Included only by .cu/.cuh files in this folder. Not here: anything format-specific (quant/,
// kernels/kv_layout.h hold the formats).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "core/status.h"

// Returns an internal_error Status from the enclosing function when a CUDA runtime call fails.
#define OSCAR_CUDA_CHECK(expr)                                                              \
  do {                                                                                      \
    const cudaError_t oscar_cuda_err_ = (expr);                                             \
    if (oscar_cuda_err_ != cudaSuccess)                                                     \
      return ::oscar::internal_error("%s:%d: %s: %s", __FILE__, __LINE__, #expr,            \
                                     cudaGetErrorString(oscar_cuda_err_));                  \
  } while (0)

#ifndef OSCAR_CUDA_SYNC_CHECKS
#define OSCAR_CUDA_SYNC_CHECKS 0
#endif

// After a <<<...>>> launch: the launch error, and with OSCAR_CUDA_SYNC_CHECKS the execution error.
#define OSCAR_CUDA_LAUNCH_CHECK(what)                                                       \
  do {                                                                                      \
    cudaError_t oscar_cuda_err_ = cudaGetLastError();                                       \
    if (oscar_cuda_err_ == cudaSuccess && OSCAR_CUDA_SYNC_CHECKS)                          \
      oscar_cuda_err_ = cudaDeviceSynchronize();                                            \
    if (oscar_cuda_err_ != cudaSuccess)                                                     \
      return ::oscar::internal_error("%s:%d: launch of %s: %s", __FILE__, __LINE__, what,   \
                                     cudaGetErrorString(oscar_cuda_err_));                  \
  } while (0)

namespace oscar::cuda {

// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl() may start while the
// kernel before it on the stream is still running, once every block of that one has called
// pdl_trigger(); it must call pdl_wait() (which returns when the previous kernel has completed
// and its writes are visible) before it reads anything an earlier kernel wrote. What it may do
// before: read its weights and the step plan (uploaded before the step's first kernel). So the
// small kernels of a decode step overlap their launch and first loads with the kernel before.
// Kernels launched without the attribute see both calls as no-ops. OSCAR_PDL=0 turns it off
// (to compare).
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("OSCAR_PDL");
    return e == nullptr || e[0] != '0';
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-serialization attribute
// (without it where `pdl` is false).
template <typename... Params, typename... Args>
cudaError_t launch_pdl_if(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  return launch_pdl_if(true, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous global -> shared copy (L2 only, bypassing L1); with valid == false the 16
// destination bytes are zero-filled and nothing is read (src must still be a mapped address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Transposes an 8x8 matrix of 16-bit values held one row-pair per thread (m8n8 fragment).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// D = A·B + D, m16n8k16, fp32 accumulators; A row-major 16x16, B column-major 16x8.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Resident blocks per SM of `kernel` at `threads` threads and `smem_bytes` of dynamic shared
// memory (raising its dynamic shared-memory limit to that first); at least 1.
template <typename K>
Status kernel_resident_blocks(K kernel, int threads, size_t smem_bytes, int* blocks) {
  const int smem = static_cast<int>(smem_bytes);
  OSCAR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  OSCAR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, smem));
  *blocks = std::max(1, *blocks);
  return Status();
}

// Facts about the current device computed once per device (fill(&facts, device) on the first
// call there; thread-safe), then copied to *out. One cache per Facts type.
template <typename Facts, typename Fill>
Status facts_per_device(Facts* out, Fill fill) {
  static std::mutex mu;
  static Facts facts[64];
  static bool ready[64] = {};
  int dev = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return ::oscar::internal_error("device %d out of range", dev);
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[dev]) {
    Facts f;
    const Status st = fill(&f, dev);
    if (!st.ok()) return st;
    facts[dev] = f;
    ready[dev] = true;
  }
  *out = facts[dev];
  return Status();
}

// A device buffer that grows and never shrinks: a kernel's own workspace, one per device, under
// the caller's lock. When `need` bytes do not fit, it waits for `stream` (work in flight may
// still read the old buffer), frees it and allocates `want` (>= need) bytes. Not freed: the
// driver reclaims it at exit.
struct GrownBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  Status reserve(size_t need, size_t want, cudaStream_t stream) {
    if (need <= bytes) return Status();
    if (ptr != nullptr) {
      OSCAR_CUDA_CHECK(cudaStreamSynchronize(stream));
      OSCAR_CUDA_CHECK(cudaFree(ptr));
      ptr = nullptr;
      bytes = 0;
    }
    OSCAR_CUDA_CHECK(cudaMalloc(&ptr, want));
    bytes = want;
    return Status();
  }
};

}  // namespace oscar::cuda
