// linear: y[n, out] = x[n, in] · Wᵀ (+ bias), with W [out, in] row-major in its stored type.
// BF16 weights stay BF16 (half the bytes a decode step reads) and are widened to float inside the
// product; F32 weights are for matrices that were computed at load time (a folded value
// rotation, OSCAR.md §3) and would lose precision in BF16.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace oscar::kernels {

enum class DType : int32_t { kF32 = 0, kBF16 = 1 };

inline int dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// A matrix in a backend's memory: [rows, cols] row-major.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
};

struct LinearParams {
  const float* x = nullptr;     // [n, w.cols]
  int64_t n = 0;
  WeightView w;                 // [out, in]
  const float* bias = nullptr;  // [out] or null
  float* y = nullptr;           // [n, out]; may not alias x
  // Row i's result independent of n and of the other rows (README "Deterministic results"):
  // the CPU and the CUDA paths below each say how.
  bool batch_invariant = false;
};

// Plain loops, float64 accumulation: defines "correct".
Status linear_ref(const LinearParams& p);
// Fast CPU path. Few rows (decode), or any number with batch_invariant: the streaming kernel,
// tasks of 64 weight rows by 64 rows of x over the decode pool's threads
// (kernels/cpu/decode_pool.h), each weight row read once per four rows of x, BF16 widened with a
// shift (AVX2+FMA when compiled for it; with x split into even/odd lanes once per call, so that
// one 32-byte load feeds two FMAs); each y[i, r] is one fixed FMA chain, so row i's result is
// bitwise the same whatever n and the other rows. Many rows (prefill) otherwise: blocks of 64
// weight rows widened to float in a per-thread buffer, then Eigen's GEMM (faster prefill,
// docs/results/determinism.md; its sums depend on n).
Status linear(const LinearParams& p);
// Several products of the same x (q/k/v, gate/up): the values of one linear() each. Decode rows
// of BF16 weights run as one parallel loop, not one each.
Status linear_group(const LinearParams* ps, int count);
// CUDA (kernels/cuda/linear.cu): device pointers, asynchronous on `stream` (a cudaStream_t).
// Few rows: a bandwidth-bound kernel that reads each weight once for all rows, float
// activations and accumulation (as the CPU path). Many rows: x rounded to BF16 and a cuBLASLt
// BF16 GEMM with float accumulation and output (F32 weights: float GEMM). With batch_invariant
// and BF16 weights: for every n, x rounded to BF16 and our own tensor-core GEMM
// (kernels/cuda/linear_invariant.cuh), whose y[i, r] is one fixed chain of MMAs over k in order
// whatever tile n picks (cuBLASLt's choice of kernel and split-K follows n, and no documented
// setting pins its reduction order across n); with F32 weights the streaming kernel for every
// n, in passes of 8 rows (also one fixed chain per row).
Status linear_cuda(const LinearParams& p, void* stream);
// Several products of the same x (same n, in and dtype): one streaming launch for all of them
// where linear_cuda would stream each (decode rows; batch_invariant with F32 weights), else one
// linear_cuda each. The same values as one linear_cuda per product.
Status linear_group_cuda(const LinearParams* ps, int count, void* stream);

}  // namespace oscar::kernels
