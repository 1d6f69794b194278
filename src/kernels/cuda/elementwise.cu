// CUDA elementwise ops (kernels/elementwise.h: embed_cuda, rms_norm_cuda, add_rms_norm_cuda,
// rope_cuda (with the q/k norms fused when asked),
// silu_mul_cuda, add_cuda, gather_rows_cuda, fill_normal_bf16_cuda): device pointers, one launch
// per call, asynchronous on the caller's stream, no allocation, no host synchronisation. The host
// side checks shapes and null pointers only; it never reads device memory (so embed cannot
// report an out-of-range id as the CPU does: the kernel writes a NaN row instead).
//
// Arithmetic follows cpu/elementwise.cpp operation for operation, spelled with the rounding
// intrinsics (__fmul_rn, __fadd_rn, __fmaf_rn) so that nvcc contracts nothing on its own. GCC
// builds the CPU code with its default -ffp-contract=fast; for an FMA target (x86-64-v3,
// -march=native) it fuses rope into a·cos − b·sin = fma(a, cos, −(b·sin)) and
// b·cos + a·sin = fma(b, cos, a·sin) and rms_norm's ss into fma(x, x, ss), and the kernels do the
// same. embed, gather_rows, add and fill_normal_bf16 give the CPU's bits; rope does too for such
// a build (the test allows the rounding of the other contraction choices); rms_norm sums x² in a
// different order and silu_mul uses CUDA's expf (2 ulp): tolerances derived in
// tests/kernels/test_ops_cuda.cpp. Not here: the linear layer
// (linear.cu) and attention.
#include <cstdint>

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise.h"

namespace oscar::kernels {

namespace {

using cuda::bf16_to_f32_dev;
using cuda::f32_to_bf16_dev;

constexpr int kThreads = 256;

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks for a grid-stride loop over n items, kThreads per block.
inline unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

// ---- embed / gather_rows: one block per output row -----------------------------------------

// kVec: table row, x row 16-byte aligned and cols % 8 == 0 (8 bf16 / 4 floats per step).
template <bool kBf16, bool kVec>
__global__ void embed_kernel(const void* __restrict__ table, int64_t vocab, int64_t cols,
                             const int32_t* __restrict__ ids, float* __restrict__ x) {
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  float* dst = x + i * cols;
  if (id < 0 || id >= vocab) {  // the CPU returns InvalidArgument; here the row becomes NaN
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = __int_as_float(0x7fc00000);
    return;
  }
  if constexpr (kBf16) {
    const bf16_t* src = static_cast<const bf16_t*>(table) + static_cast<int64_t>(id) * cols;
    if constexpr (kVec) {
      for (int64_t c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) {
        const uint4 w = *reinterpret_cast<const uint4*>(src + c);
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
        float4 lo, hi;
        lo.x = __uint_as_float(u[0] << 16), lo.y = __uint_as_float(u[0] & 0xffff0000u);
        lo.z = __uint_as_float(u[1] << 16), lo.w = __uint_as_float(u[1] & 0xffff0000u);
        hi.x = __uint_as_float(u[2] << 16), hi.y = __uint_as_float(u[2] & 0xffff0000u);
        hi.z = __uint_as_float(u[3] << 16), hi.w = __uint_as_float(u[3] & 0xffff0000u);
        *reinterpret_cast<float4*>(dst + c) = lo;
        *reinterpret_cast<float4*>(dst + c + 4) = hi;
      }
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = bf16_to_f32_dev(src[c]);
    }
  } else {
    const float* src = static_cast<const float*>(table) + static_cast<int64_t>(id) * cols;
    if constexpr (kVec) {
      for (int64_t c = threadIdx.x * 4; c < cols; c += blockDim.x * 4)
        *reinterpret_cast<float4*>(dst + c) = *reinterpret_cast<const float4*>(src + c);
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
    }
  }
}

template <bool kVec>
__global__ void gather_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ rows,
                                   int64_t dim, float* __restrict__ dst) {
  const int64_t i = blockIdx.x;
  const float* s = src + static_cast<int64_t>(rows[i]) * dim;
  float* d = dst + i * dim;
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x * 4; c < dim; c += blockDim.x * 4)
      *reinterpret_cast<float4*>(d + c) = *reinterpret_cast<const float4*>(s + c);
  } else {
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) d[c] = s[c];
  }
}

// ---- rms_norm --------------------------------------------------------------------------------

// y = w ⊙ (x · inv), inv = 1 / sqrt(ss / dim + eps), the CPU's operations in the CPU's order
// (only ss is summed in a different order). x and y may alias: every element is read and then
// written by the same thread, after the whole row has been read for ss.
__device__ __forceinline__ float rms_inv(float ss, int64_t dim, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(dim)), eps)));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per row (dim <= 1024: the per-head q_norm / k_norm rows); 8 rows per block.
__global__ void rms_norm_warp_kernel(const float* x, int64_t rows, int64_t dim,
                                     const float* __restrict__ w, float eps, float* y) {
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  float ss = 0.f;
#pragma unroll 4
  for (int64_t c = lane; c < dim; c += 32) ss = __fmaf_rn(xr[c], xr[c], ss);
  ss = warp_sum(ss);
  const float inv = rms_inv(ss, dim, eps);
#pragma unroll 4
  for (int64_t c = lane; c < dim; c += 32) yr[c] = __fmul_rn(w[c], __fmul_rn(xr[c], inv));
}

// One block per row (dim > 1024: the hidden-state norms).
__global__ void rms_norm_block_kernel(const float* x, int64_t dim, const float* __restrict__ w,
                                      float eps, float* y) {
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  __shared__ float part[kThreads / 32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.f;
  // Unrolled: the loads of a thread's 16 elements (dim 4096) go out together instead of one
  // latency each (the sum keeps its order). A one-row norm took ~8 us rolled.
#pragma unroll 8
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) ss = __fmaf_rn(xr[c], xr[c], ss);
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < kThreads / 32; ++i) tot += part[i];
  const float inv = rms_inv(tot, dim, eps);
#pragma unroll 8
  for (int64_t c = threadIdx.x; c < dim; c += kThreads)
    yr[c] = __fmul_rn(w[c], __fmul_rn(xr[c], inv));
}

// add_rms_norm: x += y, then y-norm as above, in one launch. Same operations and order as
// add_cuda followed by rms_norm_cuda (the same bits): each thread adds and stores its elements,
// sums their squares, and after the reduction reads them back (its own stores).
__global__ void add_rms_norm_warp_kernel(float* x, const float* __restrict__ y, int64_t rows,
                                         int64_t dim, const float* __restrict__ w, float eps,
                                         float* h) {
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float* xr = x + r * dim;
  const float* yr = y + r * dim;
  float* hr = h + r * dim;
  float ss = 0.f;
#pragma unroll 4
  for (int64_t c = lane; c < dim; c += 32) {
    const float v = __fadd_rn(xr[c], yr[c]);
    xr[c] = v;
    ss = __fmaf_rn(v, v, ss);
  }
  ss = warp_sum(ss);
  const float inv = rms_inv(ss, dim, eps);
#pragma unroll 4
  for (int64_t c = lane; c < dim; c += 32) hr[c] = __fmul_rn(w[c], __fmul_rn(xr[c], inv));
}

__global__ void add_rms_norm_block_kernel(float* x, const float* __restrict__ y, int64_t dim,
                                          const float* __restrict__ w, float eps, float* h) {
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  __shared__ float part[kThreads / 32];
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  const float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float* hr = h + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.f;
#pragma unroll 8
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
    const float v = __fadd_rn(xr[c], yr[c]);
    xr[c] = v;
    ss = __fmaf_rn(v, v, ss);
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < kThreads / 32; ++i) tot += part[i];
  const float inv = rms_inv(tot, dim, eps);
#pragma unroll 8
  for (int64_t c = threadIdx.x; c < dim; c += kThreads)
    hr[c] = __fmul_rn(w[c], __fmul_rn(xr[c], inv));
}

// The hidden-state norms (dim > 1024, dim % 4 == 0, 16-byte aligned rows, dim <= 16384): one
// block of 1024 threads per row, thread t holding float4 chunks t, t + 1024, ... in registers, so
// the row is read once (and x written once) with every load in flight together, and w is loaded
// before the wait for the previous kernel. The 256-thread kernels above walk the row twice (a
// one-row norm took ~10 us on the H200, ncu, 2026-12-01). kAdd: x += y first (add_rms_norm).
// rms_norm_cuda and add_rms_norm_cuda take this kernel for the same shapes, so they keep giving
// the same bits; the sum order (each thread's chunks, then a warp tree, then the 32 warps in
// order) is another order of the same sum as the CPU's (test_ops_cuda's bound).
constexpr int kRowThreads = 1024;
template <bool kAdd, int kChunks>
__global__ void __launch_bounds__(kRowThreads)
    norm_row_vec_kernel(const float* x_in, float* x_out, const float* __restrict__ y, int64_t dim,
                        const float* __restrict__ w, float eps, float* h) {
  oscar::cuda::pdl_trigger();
  __shared__ float part[kRowThreads / 32];
  const int n4 = static_cast<int>(dim / 4);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4 wv[kChunks], v[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + kRowThreads * i;
    if (c < n4) wv[i] = w4[c];
  }
  oscar::cuda::pdl_wait();
  const float4* x4 = reinterpret_cast<const float4*>(x_in + base);
  const float4* y4 = reinterpret_cast<const float4*>(y + (kAdd ? base : 0));
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + kRowThreads * i;
    if (c < n4) {
      v[i] = x4[c];
      if constexpr (kAdd) {
        const float4 b = y4[c];
        v[i] = make_float4(__fadd_rn(v[i].x, b.x), __fadd_rn(v[i].y, b.y), __fadd_rn(v[i].z, b.z),
                           __fadd_rn(v[i].w, b.w));
      }
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + kRowThreads * i;
    if (c < n4) {
      if constexpr (kAdd) reinterpret_cast<float4*>(x_out + base)[c] = v[i];
      ss = __fmaf_rn(v[i].x, v[i].x, ss);
      ss = __fmaf_rn(v[i].y, v[i].y, ss);
      ss = __fmaf_rn(v[i].z, v[i].z, ss);
      ss = __fmaf_rn(v[i].w, v[i].w, ss);
    }
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < kRowThreads / 32; ++i) tot += part[i];
  const float inv = rms_inv(tot, dim, eps);
  float4* h4 = reinterpret_cast<float4*>(h + base);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = threadIdx.x + kRowThreads * i;
    if (c < n4)
      h4[c] = make_float4(
          __fmul_rn(wv[i].x, __fmul_rn(v[i].x, inv)), __fmul_rn(wv[i].y, __fmul_rn(v[i].y, inv)),
          __fmul_rn(wv[i].z, __fmul_rn(v[i].z, inv)), __fmul_rn(wv[i].w, __fmul_rn(v[i].w, inv)));
  }
}

// Launches norm_row_vec_kernel where it applies (see above); false when the shape or alignment
// needs the scalar kernels.
template <bool kAdd>
Result<bool> launch_norm_row_vec(const float* x_in, float* x_out, const float* y, int64_t rows,
                                 int64_t dim, const float* w, float eps, float* h, cudaStream_t s) {
  if (dim % 4 != 0 || dim > 4 * kRowThreads * 4 || rows > 0x7fffffff || !aligned16(x_in) ||
      !aligned16(w) || !aligned16(h) || (kAdd && !aligned16(y)))
    return false;
  const int chunks = static_cast<int>((dim / 4 + kRowThreads - 1) / kRowThreads);
  const dim3 grid(static_cast<unsigned>(rows)), block(kRowThreads);
  cudaError_t e;
  switch (chunks) {
    case 1:
      e = cuda::launch_pdl(norm_row_vec_kernel<kAdd, 1>, grid, block, 0, s, x_in, x_out, y, dim, w,
                           eps, h);
      break;
    case 2:
      e = cuda::launch_pdl(norm_row_vec_kernel<kAdd, 2>, grid, block, 0, s, x_in, x_out, y, dim, w,
                           eps, h);
      break;
    case 3:
      e = cuda::launch_pdl(norm_row_vec_kernel<kAdd, 3>, grid, block, 0, s, x_in, x_out, y, dim, w,
                           eps, h);
      break;
    default:
      e = cuda::launch_pdl(norm_row_vec_kernel<kAdd, 4>, grid, block, 0, s, x_in, x_out, y, dim, w,
                           eps, h);
  }
  OSCAR_CUDA_CHECK(e);
  OSCAR_CUDA_LAUNCH_CHECK("norm_row_vec_kernel");
  return true;
}

// ---- rope ------------------------------------------------------------------------------------

// One thread per (row, head, i < half), q heads then k heads of each row.
__global__ void rope_kernel(int64_t n_rows, int32_t n_heads_q, int32_t n_heads_kv, int32_t half,
                            const float* __restrict__ cos, const float* __restrict__ sin,
                            float* __restrict__ q, float* __restrict__ k) {
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  const int64_t heads = n_heads_q + n_heads_kv;
  const int64_t total = n_rows * heads * half;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(idx % half);
    const int64_t rh = idx / half;
    const int64_t row = rh / heads;
    const int32_t hh = static_cast<int32_t>(rh % heads);
    float* xh = hh < n_heads_q ? q + (row * n_heads_q + hh) * (2 * half)
                               : k + (row * n_heads_kv + (hh - n_heads_q)) * (2 * half);
    const float cs = cos[row * half + i], sn = sin[row * half + i];
    const float a = xh[i], b = xh[i + half];
    xh[i] = __fmaf_rn(a, cs, -__fmul_rn(b, sn));
    xh[i + half] = __fmaf_rn(b, cs, __fmul_rn(a, sn));
  }
}

// q/k norm and RoPE in one launch: one warp per (row, head), lane holding d = lane + 32j
// (NJ = head_dim / 32 values; head_dim % 64 == 0 puts both halves of a rotation pair in the
// lane). The norm is rms_norm_warp_kernel's (same order: the same bits), the rotation
// rope_kernel's, so the result equals rms_norm_cuda twice then rope_cuda.
template <int NJ>
__global__ void norm_rope_kernel(int64_t n_rows, int32_t n_heads_q, int32_t n_heads_kv,
                                 const float* __restrict__ cos, const float* __restrict__ sin,
                                 float* __restrict__ q, float* __restrict__ k,
                                 const float* __restrict__ wq, const float* __restrict__ wk,
                                 float eps) {
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  constexpr int D = 32 * NJ, half = D / 2;
  const int64_t heads = n_heads_q + n_heads_kv;
  const int64_t wid = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (wid >= n_rows * heads) return;
  const int64_t row = wid / heads;
  const int32_t hh = static_cast<int32_t>(wid % heads);
  float* xh = hh < n_heads_q ? q + (row * n_heads_q + hh) * D
                             : k + (row * n_heads_kv + (hh - n_heads_q)) * D;
  const float* w = hh < n_heads_q ? wq : wk;
  float v[NJ];
#pragma unroll
  for (int j = 0; j < NJ; ++j) v[j] = xh[lane + 32 * j];
  if (w != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) ss = __fmaf_rn(v[j], v[j], ss);
    ss = warp_sum(ss);
    const float inv = rms_inv(ss, D, eps);
#pragma unroll
    for (int j = 0; j < NJ; ++j) v[j] = __fmul_rn(w[lane + 32 * j], __fmul_rn(v[j], inv));
  }
#pragma unroll
  for (int j = 0; j < NJ / 2; ++j) {
    const int i = lane + 32 * j;
    const float cs = cos[row * half + i], sn = sin[row * half + i];
    const float a = v[j], b = v[j + NJ / 2];
    xh[i] = __fmaf_rn(a, cs, -__fmul_rn(b, sn));
    xh[i + half] = __fmaf_rn(b, cs, __fmul_rn(a, sn));
  }
}

// ---- silu_mul, add: float4 over the aligned body, scalars for the tail -----------------------

__device__ __forceinline__ float silu_mul1(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// x[i] = op(x[i], y[i]) over n floats: float4 over the aligned body, scalars for the tail.
struct SiluMulOp {
  __device__ float operator()(float g, float u) const { return silu_mul1(g, u); }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
template <bool kVec, typename Op>
__global__ void binary_inplace_kernel(float* __restrict__ x, const float* __restrict__ y,
                                      int64_t n, Op op) {
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    for (int64_t j = i; j < n4; j += stride) {
      float4 a = reinterpret_cast<float4*>(x)[j];
      const float4 b = reinterpret_cast<const float4*>(y)[j];
      a.x = op(a.x, b.x), a.y = op(a.y, b.y);
      a.z = op(a.z, b.z), a.w = op(a.w, b.w);
      reinterpret_cast<float4*>(x)[j] = a;
    }
    i += n4 * 4;
  }
  for (; i < n; i += stride) x[i] = op(x[i], y[i]);
}

// ---- fill_normal_bf16 ------------------------------------------------------------------------

__global__ void fill_normal_bf16_kernel(bf16_t* __restrict__ dst, int64_t n, float std,
                                        uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = f32_to_bf16_dev(dummy_weight(seed, i, std));
}

}  // namespace

Status embed_cuda(const WeightView& table, const int32_t* ids, int64_t n, float* x, void* stream) {
  if (n < 0 || table.rows <= 0 || table.cols <= 0)
    return invalid_argument("embed_cuda: bad shape (%lld ids, table [%lld, %lld])",
                            static_cast<long long>(n), static_cast<long long>(table.rows),
                            static_cast<long long>(table.cols));
  if (table.dtype != DType::kF32 && table.dtype != DType::kBF16)
    return invalid_argument("embed_cuda: table dtype %d (F32 or BF16)",
                            static_cast<int>(table.dtype));
  if (n == 0) return Status();
  if (table.data == nullptr || ids == nullptr || x == nullptr)
    return invalid_argument("embed_cuda: null table, ids or x");
  if (n > 0x7fffffff) return invalid_argument("embed_cuda: %lld ids", static_cast<long long>(n));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool bf = table.dtype == DType::kBF16;
  const bool vec = aligned16(table.data) && aligned16(x) && table.cols % 8 == 0;
  const dim3 grid(static_cast<unsigned>(n));
  if (bf && vec)
    embed_kernel<true, true><<<grid, kThreads, 0, s>>>(table.data, table.rows, table.cols, ids, x);
  else if (bf)
    embed_kernel<true, false><<<grid, kThreads, 0, s>>>(table.data, table.rows, table.cols, ids, x);
  else if (vec)
    embed_kernel<false, true><<<grid, kThreads, 0, s>>>(table.data, table.rows, table.cols, ids, x);
  else
    embed_kernel<false, false>
        <<<grid, kThreads, 0, s>>>(table.data, table.rows, table.cols, ids, x);
  OSCAR_CUDA_LAUNCH_CHECK("embed_kernel");
  return Status();
}

Status rms_norm_cuda(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
                     void* stream) {
  if (rows < 0 || dim <= 0)
    return invalid_argument("rms_norm_cuda: bad shape (%lld rows, dim %lld)",
                            static_cast<long long>(rows), static_cast<long long>(dim));
  if (rows == 0) return Status();
  if (x == nullptr || w == nullptr || y == nullptr)
    return invalid_argument("rms_norm_cuda: null x, w or y");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dim <= 1024) {
    const int64_t rows_per_block = kThreads / 32;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (blocks > 0x7fffffff)
      return invalid_argument("rms_norm_cuda: %lld rows", static_cast<long long>(rows));
    OSCAR_CUDA_CHECK(cuda::launch_pdl(rms_norm_warp_kernel, dim3(static_cast<unsigned>(blocks)),
                                      dim3(kThreads), 0, s, x, rows, dim, w, eps, y));
    OSCAR_CUDA_LAUNCH_CHECK("rms_norm_warp_kernel");
  } else {
    if (rows > 0x7fffffff)
      return invalid_argument("rms_norm_cuda: %lld rows", static_cast<long long>(rows));
    OSCAR_ASSIGN_OR_RETURN(
        const bool vec, launch_norm_row_vec<false>(x, nullptr, nullptr, rows, dim, w, eps, y, s));
    if (vec) return Status();
    OSCAR_CUDA_CHECK(cuda::launch_pdl(rms_norm_block_kernel, dim3(static_cast<unsigned>(rows)),
                                      dim3(kThreads), 0, s, x, dim, w, eps, y));
    OSCAR_CUDA_LAUNCH_CHECK("rms_norm_block_kernel");
  }
  return Status();
}

Status add_rms_norm_cuda(float* x, const float* y, int64_t rows, int64_t dim, const float* w,
                         float eps, float* h, void* stream) {
  if (rows < 0 || dim <= 0)
    return invalid_argument("add_rms_norm_cuda: bad shape (%lld rows, dim %lld)",
                            static_cast<long long>(rows), static_cast<long long>(dim));
  if (rows == 0) return Status();
  if (x == nullptr || y == nullptr || w == nullptr || h == nullptr)
    return invalid_argument("add_rms_norm_cuda: null x, y, w or h");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dim <= 1024) {  // the split of rms_norm_cuda, so that the bits match it
    const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
    if (blocks > 0x7fffffff)
      return invalid_argument("add_rms_norm_cuda: %lld rows", static_cast<long long>(rows));
    OSCAR_CUDA_CHECK(cuda::launch_pdl(add_rms_norm_warp_kernel, dim3(static_cast<unsigned>(blocks)),
                                      dim3(kThreads), 0, s, x, y, rows, dim, w, eps, h));
    OSCAR_CUDA_LAUNCH_CHECK("add_rms_norm_warp_kernel");
  } else {
    if (rows > 0x7fffffff)
      return invalid_argument("add_rms_norm_cuda: %lld rows", static_cast<long long>(rows));
    OSCAR_ASSIGN_OR_RETURN(const bool vec,
                           launch_norm_row_vec<true>(x, x, y, rows, dim, w, eps, h, s));
    if (vec) return Status();
    OSCAR_CUDA_CHECK(cuda::launch_pdl(add_rms_norm_block_kernel, dim3(static_cast<unsigned>(rows)),
                                      dim3(kThreads), 0, s, x, y, dim, w, eps, h));
    OSCAR_CUDA_LAUNCH_CHECK("add_rms_norm_block_kernel");
  }
  return Status();
}

Status rope_cuda(const RopeParams& p, void* stream) {
  if (p.n_rows < 0 || p.n_heads_q < 0 || p.n_heads_kv < 0 || p.head_dim <= 0 || p.head_dim % 2 != 0)
    return invalid_argument(
        "rope_cuda: bad shape (%lld rows, %d q heads, %d kv heads, head_dim "
        "%d)",
        static_cast<long long>(p.n_rows), p.n_heads_q, p.n_heads_kv, p.head_dim);
  if (p.rotary_dim != 0 && p.rotary_dim != p.head_dim)
    return unimplemented("rope_cuda: partial rotary (%d of %d dims) is not implemented on CUDA "
                         "yet", p.rotary_dim, p.head_dim);
  const int64_t total = p.n_rows * (p.n_heads_q + p.n_heads_kv) * (p.head_dim / 2);
  if (total == 0) return Status();
  if (p.cos == nullptr || p.sin == nullptr || (p.n_heads_q > 0 && p.q == nullptr) ||
      (p.n_heads_kv > 0 && p.k == nullptr))
    return invalid_argument("rope_cuda: null cos, sin, q or k");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (p.q_norm != nullptr || p.k_norm != nullptr) {
    const int64_t warps = p.n_rows * (p.n_heads_q + p.n_heads_kv);
    const int64_t blocks = (warps + kThreads / 32 - 1) / (kThreads / 32);
    const unsigned grid = static_cast<unsigned>(blocks);
#define OSCAR_NORM_ROPE(NJ)                                                                      \
  OSCAR_CUDA_CHECK(cuda::launch_pdl(norm_rope_kernel<NJ>, dim3(grid), dim3(kThreads), 0, st,     \
                                    p.n_rows, p.n_heads_q, p.n_heads_kv, p.cos, p.sin, p.q, p.k, \
                                    p.q_norm, p.k_norm, p.norm_eps))
    if (blocks <= 0x7fffffff && p.head_dim == 128) {
      OSCAR_NORM_ROPE(4);
    } else if (blocks <= 0x7fffffff && p.head_dim == 64) {
      OSCAR_NORM_ROPE(2);
    } else if (blocks <= 0x7fffffff && p.head_dim == 256) {
      OSCAR_NORM_ROPE(8);
    } else {  // other head sizes: the two norms, then the rotation
#undef OSCAR_NORM_ROPE
      if (p.q_norm != nullptr)
        OSCAR_RETURN_IF_ERROR(rms_norm_cuda(p.q, p.n_rows * p.n_heads_q, p.head_dim, p.q_norm,
                                            p.norm_eps, p.q, stream));
      if (p.k_norm != nullptr)
        OSCAR_RETURN_IF_ERROR(rms_norm_cuda(p.k, p.n_rows * p.n_heads_kv, p.head_dim, p.k_norm,
                                            p.norm_eps, p.k, stream));
      RopeParams plain = p;
      plain.q_norm = plain.k_norm = nullptr;
      return rope_cuda(plain, stream);
    }
    OSCAR_CUDA_LAUNCH_CHECK("norm_rope_kernel");
    return Status();
  }
  OSCAR_CUDA_CHECK(cuda::launch_pdl(rope_kernel, dim3(grid_for(total)), dim3(kThreads), 0, st,
                                    p.n_rows, p.n_heads_q, p.n_heads_kv, p.head_dim / 2, p.cos,
                                    p.sin, p.q, p.k));
  OSCAR_CUDA_LAUNCH_CHECK("rope_kernel");
  return Status();
}

Status silu_mul_cuda(float* gate, const float* up, int64_t n, void* stream) {
  if (n < 0) return invalid_argument("silu_mul_cuda: n %lld", static_cast<long long>(n));
  if (n == 0) return Status();
  if (gate == nullptr || up == nullptr) return invalid_argument("silu_mul_cuda: null gate or up");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (aligned16(gate) && aligned16(up))
    OSCAR_CUDA_CHECK(cuda::launch_pdl(binary_inplace_kernel<true, SiluMulOp>,
                                      dim3(grid_for((n + 3) / 4)), dim3(kThreads), 0, s, gate, up,
                                      n, SiluMulOp{}));
  else
    OSCAR_CUDA_CHECK(cuda::launch_pdl(binary_inplace_kernel<false, SiluMulOp>, dim3(grid_for(n)),
                                      dim3(kThreads), 0, s, gate, up, n, SiluMulOp{}));
  OSCAR_CUDA_LAUNCH_CHECK("silu_mul (binary_inplace_kernel)");
  return Status();
}

Status add_cuda(float* x, const float* y, int64_t n, void* stream) {
  if (n < 0) return invalid_argument("add_cuda: n %lld", static_cast<long long>(n));
  if (n == 0) return Status();
  if (x == nullptr || y == nullptr) return invalid_argument("add_cuda: null x or y");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (aligned16(x) && aligned16(y))
    OSCAR_CUDA_CHECK(cuda::launch_pdl(binary_inplace_kernel<true, AddOp>,
                                      dim3(grid_for((n + 3) / 4)), dim3(kThreads), 0, s, x, y, n,
                                      AddOp{}));
  else
    OSCAR_CUDA_CHECK(cuda::launch_pdl(binary_inplace_kernel<false, AddOp>, dim3(grid_for(n)),
                                      dim3(kThreads), 0, s, x, y, n, AddOp{}));
  OSCAR_CUDA_LAUNCH_CHECK("add (binary_inplace_kernel)");
  return Status();
}

Status gather_rows_cuda(const float* src, const int32_t* rows, int64_t n, int64_t dim, float* dst,
                        void* stream) {
  if (n < 0 || dim <= 0 || n > 0x7fffffff)
    return invalid_argument("gather_rows_cuda: bad shape (%lld rows, dim %lld)",
                            static_cast<long long>(n), static_cast<long long>(dim));
  if (n == 0) return Status();
  if (src == nullptr || rows == nullptr || dst == nullptr)
    return invalid_argument("gather_rows_cuda: null src, rows or dst");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(n));
  if (aligned16(src) && aligned16(dst) && dim % 4 == 0)
    gather_rows_kernel<true><<<grid, kThreads, 0, s>>>(src, rows, dim, dst);
  else
    gather_rows_kernel<false><<<grid, kThreads, 0, s>>>(src, rows, dim, dst);
  OSCAR_CUDA_LAUNCH_CHECK("gather_rows_kernel");
  return Status();
}

Status fill_normal_bf16_cuda(bf16_t* dst, int64_t n, float std, uint64_t seed, void* stream) {
  if (n < 0) return invalid_argument("fill_normal_bf16_cuda: n %lld", static_cast<long long>(n));
  if (n == 0) return Status();
  if (dst == nullptr) return invalid_argument("fill_normal_bf16_cuda: null dst");
  fill_normal_bf16_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, n, std, seed);
  OSCAR_CUDA_LAUNCH_CHECK("fill_normal_bf16_kernel");
  return Status();
}

}  // namespace oscar::kernels
