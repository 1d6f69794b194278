// Hopper (sm_90a) primitives for oscar's kernels: warpgroup matrix multiply (wgmma) with
// shared-memory matrix descriptors for the 128-byte swizzled layout, the fences, the shapes the
// prefill attention uses (S = Q·Kᵀ with 64 or 128 keys, O += P·V with head_dim 64 or 128); and
// for warp-specialised kernels, mbarriers, named barriers and register reallocation (setmaxnreg).
// Compiled only for sm_90a (the `a` target); the callers' host code picks these kernels on such a
// device.
//
// The 128-byte swizzled layout of a [rows][64 BF16] atom (1024 bytes, 1024-aligned): row r's
// 16-byte chunk c sits at r·128 + ((c ^ (r mod 8)) · 16). A K-major operand (k contiguous) of
// more than 64 k values is several such atoms; an MN-major one (n contiguous) likewise along n.
#pragma once

#include <cstdint>

namespace oscar::cuda {

// The accumulator operands of an m64n64 / m64n128 wgmma (d[8][4] / d[16][4], constraint c: "+f"
// or "=f"), in the order of the instruction's register list.
#define OSCAR_WGMMA_ACC4(c, d, i) c(d[i][0]), c(d[i][1]), c(d[i][2]), c(d[i][3])
#define OSCAR_WGMMA_ACC_N64(c, d)                                                               \
  OSCAR_WGMMA_ACC4(c, d, 0), OSCAR_WGMMA_ACC4(c, d, 1), OSCAR_WGMMA_ACC4(c, d, 2),              \
      OSCAR_WGMMA_ACC4(c, d, 3), OSCAR_WGMMA_ACC4(c, d, 4), OSCAR_WGMMA_ACC4(c, d, 5),          \
      OSCAR_WGMMA_ACC4(c, d, 6), OSCAR_WGMMA_ACC4(c, d, 7)
#define OSCAR_WGMMA_ACC_N128(c, d)                                                              \
  OSCAR_WGMMA_ACC4(c, d, 0), OSCAR_WGMMA_ACC4(c, d, 1), OSCAR_WGMMA_ACC4(c, d, 2),              \
      OSCAR_WGMMA_ACC4(c, d, 3), OSCAR_WGMMA_ACC4(c, d, 4), OSCAR_WGMMA_ACC4(c, d, 5),          \
      OSCAR_WGMMA_ACC4(c, d, 6), OSCAR_WGMMA_ACC4(c, d, 7), OSCAR_WGMMA_ACC4(c, d, 8),          \
      OSCAR_WGMMA_ACC4(c, d, 9), OSCAR_WGMMA_ACC4(c, d, 10), OSCAR_WGMMA_ACC4(c, d, 11),        \
      OSCAR_WGMMA_ACC4(c, d, 12), OSCAR_WGMMA_ACC4(c, d, 13), OSCAR_WGMMA_ACC4(c, d, 14),       \
      OSCAR_WGMMA_ACC4(c, d, 15)

// Descriptor of a shared-memory operand in the 128-byte swizzled layout: start address (bytes),
// leading-dimension byte offset (MN-major: between 64-wide atoms along n; unused K-major) and
// stride byte offset (between groups of 8 rows).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                     uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (1ull << 62);
}

// Before the first wgmma of a batch whose register operands or accumulators other instructions
// wrote.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes this thread's ordinary shared-memory writes (stores, cp.async) visible to the async proxy
// (wgmma operand reads) once a barrier follows.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// D[64 x 64] (+)= A[64 x 16] · B[16 x 64]: A from registers (each warp of the warpgroup holds its 16
// rows as an m16n8k16 A fragment), B from shared memory through `desc`; FP32 accumulators in the
// m16n8 C-fragment order per 8-column block. kTransB: B is MN-major (row = k, 64 values contiguous).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4],
                                                   uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : OSCAR_WGMMA_ACC_N64("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d), "n"(kTransB));
}

// D[64 x 128] (+)= A[64 x 16] · B[16 x 128]: A from registers (each warp of the warpgroup holds its 16
// rows as an m16n8k16 A fragment), B from shared memory through `desc`; FP32 accumulators in the
// m16n8 C-fragment order per 8-column block. kTransB: B is MN-major (row = k, 128 values contiguous).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4],
                                                   uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : OSCAR_WGMMA_ACC_N128("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d), "n"(kTransB));
}

// D[64 x 128] (+)= A[64 x 16] · B[16 x 128], both from shared memory through descriptors (A
// K-major); accumulators as wgmma_m64n128k16_rs.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t adesc,
                                                   uint64_t bdesc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, %67;\n}\n"
      : OSCAR_WGMMA_ACC_N128("+f", d)
      : "l"(adesc), "l"(bdesc), "r"(scale_d), "n"(kTransB));
}

// D[64 x 128] = A[64 x 16] · B[16 x 128] (the first k-step: D is written, not read, so the
// compiler carries no old accumulator values into the wgmma stage); operands as
// wgmma_m64n128k16_ss.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_ss_zero(float (&d)[16][4], uint64_t adesc,
                                                        uint64_t bdesc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, %67;\n}\n"
      : OSCAR_WGMMA_ACC_N128("=f", d)
      : "l"(adesc), "l"(bdesc), "r"(0), "n"(kTransB));
}

// Pins registers that an in-flight wgmma reads or writes (accumulators, A fragments) to this
// point of the instruction stream: the compiler sees wgmma's register operands as used at issue
// and could otherwise move other instructions on them (or reuse them) across the wait, which
// ptxas then answers by serialising the wgmmas. Place after wgmma_wait and around a stage.
template <int N, int M>
__device__ __forceinline__ void fence_operands(float (&x)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+f"(x[i][j])::"memory");
}
template <int N, int M>
__device__ __forceinline__ void fence_operands(uint32_t (&x)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+r"(x[i][j])::"memory");
}

// ---- warp specialisation -------------------------------------------------------------------

// A shared-memory mbarrier (8 bytes, 8-aligned) expecting `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrives (release: this thread's earlier writes are visible to threads that then wait).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// Waits (acquire) until the phase with this parity has completed. A fresh barrier counts as
// having completed the phase of parity 1, so a producer's first wait on an empty slot passes.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Arrives and adds `bytes` to the transaction count the phase waits for (the TMA copies that
// complete on this barrier).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// TMA: the box of a 4-D tensor map (a CUtensorMap kernel parameter, __grid_constant__) at
// coordinates c0 .. c3 (innermost first) into shared memory at dst, completing on mbarrier bar.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// A barrier over `threads` threads (whole warps) by id (0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (its count includes the arriving threads).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Register reallocation between warpgroups (every warp of the warpgroup executes it).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace oscar::cuda
