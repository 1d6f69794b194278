// Internal controls of the CUDA linear (kernels/linear.h: linear_cuda), for tests and
// benchmarks: force the streaming (few-rows) kernel, the cuBLASLt GEMM or the batch-invariant
// GEMM. Plain C++: tests include it without nvcc. Production code calls linear_cuda, which is
// linear_cuda_ex with kAuto.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/linear.h"

namespace oscar::kernels {

enum class LinearCudaPath : int32_t {
  kAuto = 0,    // linear_cuda_streams() below decides; p.batch_invariant: as kInvariant
  kStream = 1,  // streaming kernel, in passes of kLinearCudaFewRows rows of x
  kGemm = 2,    // x rounded to BF16 (BF16 weights) and cuBLASLt
  // Batch-invariant tensor-core GEMM (linear_invariant.cuh; x rounded to BF16) whatever
  // p.batch_invariant says; F32 weights: the streaming kernel.
  kInvariant = 3,
};

// Up to this many rows of x: the streaming kernel (see linear.cu for the reasoning).
inline constexpr int64_t kLinearCudaFewRows = 8;
// What kAuto picks: the streaming kernel for one or two rows, and up to four rows of a small
// matrix; the GEMM above. Measured on the H200 (bench_linear_cuda, 2026-12-01): at n = 4 the
// GEMM was faster for 4096x12288 (31.9 vs 40.4 us) and the lm_head (302 vs 402 us), the
// streaming kernel for 4096x1024 (7.6 vs 11.2 us); at n = 16 the GEMM by 3-4x everywhere.
inline bool linear_cuda_streams(int64_t n, int64_t rows, int64_t cols) {
  return n <= 2 || (n <= 4 && rows * cols <= (int64_t{8} << 20));
}

// Same contract as linear_cuda. Precondition of every path: w.cols % 8 == 0 and x, w, y (and
// bias) 16-byte aligned (InvalidArgument otherwise). The GEMM path owns, per device, a cuBLASLt
// handle, its workspace and a BF16 copy of x (grown, never shrunk; guarded by a mutex: calls from
// several host threads are safe, but two calls in flight on different streams share the BF16
// buffer, so use one stream per device).
Status linear_cuda_ex(const LinearParams& p, LinearCudaPath path, void* stream);

}  // namespace oscar::kernels
