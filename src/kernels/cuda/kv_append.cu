// CUDA kv_append and rotate_queries (kernels/kv_append.h: kv_append_cuda, rotate_queries_cuda):
// device pointers, one launch per call, asynchronous on the caller's stream, no allocation. The
// host side checks shapes only (it never reads device memory: slots are trusted, as on the CPU).
//
// Shape of both kernels: a block of head_dim threads owns (a tile of kTile rows, one head);
// thread c computes output column c of every row of the tile, out[t][c] = Σ_r x[t][r]·R[r, c],
// r in order, one fused multiply-add per term: the CPU's operations in the CPU's order
// (cpu/kv_append.cpp: rotate_row, which GCC contracts to FMA under its default
// -ffp-contract=fast when the target has FMA, as x86-64-v3 and -march=native do), so the outputs
// are bit-identical to such a CPU build (a CPU build without FMA differs by rounding). The tile's
// inputs (centred keys / queries) sit in shared memory and are read as broadcasts; R is streamed
// from global memory (L2-resident, coalesced over c) once per tile, not once per row. Keys are
// centred first (x − μ, OSCAR.md §1/§3), values are copied; the exact page element is bf16 (round
// to nearest even, bit-identical to core/bf16.h) or float, per layout.exact_elem_bytes.
#include <cstdint>

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/kv_append.h"

namespace oscar::kernels {

namespace {

constexpr int kTile = 8;          // rows per block
constexpr int kMaxHeadDim = 256;  // threads per block = head_dim × kSplit (below), <= 1024

// out[t] = Σ_r xs[t][r] · R[r, c] for the n (<= kTile) rows of the tile. The block is head_dim
// × kSplit threads: thread (c, g) sums r in [g·d/kSplit, (g+1)·d/kSplit) in r order, one fused
// multiply-add per term, and the kSplit partials are added in g order (through shared memory,
// `part`: [kSplit, kTile, d]). At one row per step (decode) the rotation was latency-bound with
// one thread per column walking all d rows of R (~25 us a layer on the H200); split four ways
// each thread has a quarter of the loads in flight. The sum's order differs from the CPU's
// single r-order chain only by rounding (test_ops_cuda's bounds).
constexpr int kSplit = 4;
__device__ __forceinline__ void rotate_tile(const float* xs, int n, const float* __restrict__ R,
                                            int d, int c, int g, float* part, float (&out)[kTile]) {
  float acc[kTile];
#pragma unroll
  for (int t = 0; t < kTile; ++t) acc[t] = 0.f;
  const int span = d / kSplit, r0 = g * span;
#pragma unroll 8
  for (int r = r0; r < r0 + span; ++r) {
    const float rc = R[static_cast<size_t>(r) * d + c];
#pragma unroll
    for (int t = 0; t < kTile; ++t)
      if (t < n) acc[t] = __fmaf_rn(xs[t * d + r], rc, acc[t]);
  }
#pragma unroll
  for (int t = 0; t < kTile; ++t) part[(g * kTile + t) * d + c] = acc[t];
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    float sum = part[t * d + c];
    for (int j = 1; j < kSplit; ++j) sum = __fadd_rn(sum, part[(j * kTile + t) * d + c]);
    out[t] = sum;
  }
}

__device__ __forceinline__ void store_elem(uint8_t* row, int elem_bytes, int c, float v) {
  if (elem_bytes == 4)
    reinterpret_cast<float*>(row)[c] = v;
  else
    reinterpret_cast<bf16_t*>(row)[c] = cuda::f32_to_bf16_dev(v);
}

// grid (ceil(n_tokens / kTile), n_heads_kv), block head_dim; dynamic shared kTile·head_dim floats.
__global__ void kv_append_kernel(KvPageLayout L, int32_t layer, int64_t n_tokens,
                                 const float* __restrict__ k, const float* __restrict__ v,
                                 const int64_t* __restrict__ slots, uint8_t* __restrict__ pool,
                                 const float* __restrict__ k_mean,
                                 const float* __restrict__ k_rotation) {
  extern __shared__ float xs[];  // [kTile, d] centred keys of the tile, then [kSplit, kTile, d]
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();  // k, v and the pages come from earlier kernels
  const int d = L.head_dim, H = L.n_heads_kv, c = threadIdx.x, g = threadIdx.y;
  const int h = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int n = static_cast<int>(n_tokens - t0 < kTile ? n_tokens - t0 : kTile);
  const size_t head = static_cast<size_t>(layer) * H + h;
  const float mu = k_mean != nullptr ? k_mean[head * d + c] : 0.f;
  const size_t page_bytes = L.exact_page_bytes();
  float out[kTile];
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    if (t >= n) break;
    const float x = k[((t0 + t) * H + h) * d + c];
    out[t] = k_mean != nullptr ? __fsub_rn(x, mu) : x;
    if (g == 0) xs[t * d + c] = out[t];
  }
  if (k_rotation != nullptr) {
    __syncthreads();
    rotate_tile(xs, n, k_rotation + head * d * d, d, c, g, xs + kTile * d, out);
  }
  if (g != 0) return;  // the other groups only helped with the rotation
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    if (t >= n) break;
    const int64_t s = slots[t0 + t];
    const int64_t page = s / L.page_size;
    const int slot = static_cast<int>(s % L.page_size);
    uint8_t* base = pool + static_cast<size_t>(page) * page_bytes;
    store_elem(base + L.exact_row_offset(layer, 0, h, slot), L.exact_elem_bytes, c, out[t]);
    store_elem(base + L.exact_row_offset(layer, 1, h, slot), L.exact_elem_bytes, c,
               v[((t0 + t) * H + h) * d + c]);
  }
}

// grid (ceil(n_rows / kTile), n_heads_q), block head_dim; dynamic shared kTile·head_dim floats.
__global__ void rotate_queries_kernel(int32_t layer, int64_t n_rows, int32_t n_heads_q,
                                      int32_t n_heads_kv, int32_t d, const float* __restrict__ q,
                                      const float* __restrict__ rot, float* __restrict__ o) {
  extern __shared__ float xs[];  // [kTile, d], then [kSplit, kTile, d]
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();
  const int c = threadIdx.x, g = threadIdx.y, h = blockIdx.y, gqa = n_heads_q / n_heads_kv;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int n = static_cast<int>(n_rows - t0 < kTile ? n_rows - t0 : kTile);
  if (g == 0)
    for (int t = 0; t < n; ++t) xs[t * d + c] = q[((t0 + t) * n_heads_q + h) * d + c];
  __syncthreads();
  float out[kTile];
  rotate_tile(xs, n, rot + (static_cast<size_t>(layer) * n_heads_kv + h / gqa) * d * d, d, c, g,
              xs + kTile * d, out);
  if (g != 0) return;
#pragma unroll
  for (int t = 0; t < kTile; ++t)
    if (t < n) o[((t0 + t) * n_heads_q + h) * d + c] = out[t];
}

}  // namespace

Status kv_append_cuda(const KvAppendParams& p, void* stream) {
  const KvPageLayout& L = p.layout;
  const int d = L.head_dim, H = L.n_heads_kv;
  if (p.layer < 0 || p.layer >= L.n_layers || d <= 0 || d > kMaxHeadDim || H <= 0 || H > 65535 ||
      L.page_size <= 0 || p.n_tokens < 0 || (L.exact_elem_bytes != 2 && L.exact_elem_bytes != 4))
    return invalid_argument(
        "kv_append_cuda: bad shape (layer %d of %d, head_dim %d (<= %d), %d "
        "kv heads, page_size %d, exact_elem_bytes %d, %lld tokens)",
        p.layer, L.n_layers, d, kMaxHeadDim, H, L.page_size, L.exact_elem_bytes,
        static_cast<long long>(p.n_tokens));
  if (p.n_tokens == 0) return Status();
  if (p.k == nullptr || p.v == nullptr || p.slots == nullptr || p.exact_pool == nullptr)
    return invalid_argument("kv_append_cuda: null k, v, slots or pool");
  const int64_t tiles = (p.n_tokens + kTile - 1) / kTile;
  if (tiles > 0x7fffffff)
    return invalid_argument("kv_append_cuda: %lld tokens", static_cast<long long>(p.n_tokens));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(H));
  const dim3 block(static_cast<unsigned>(d), kSplit);
  const size_t smem = sizeof(float) * (1 + kSplit) * kTile * d;  // 20 KiB at head_dim 128
  OSCAR_CUDA_CHECK(cuda::launch_pdl(kv_append_kernel, grid, block, smem,
                                    static_cast<cudaStream_t>(stream), L, p.layer, p.n_tokens, p.k,
                                    p.v, p.slots, p.exact_pool, p.k_mean, p.k_rotation));
  OSCAR_CUDA_LAUNCH_CHECK("kv_append_kernel");
  return Status();
}

Status rotate_queries_cuda(const RotateQueriesParams& p, void* stream) {
  const int d = p.head_dim;
  if (p.n_heads_kv <= 0 || p.n_heads_q <= 0 || p.n_heads_q % p.n_heads_kv != 0 || d <= 0 ||
      d > kMaxHeadDim || p.n_heads_q > 65535 || p.n_rows < 0 || p.layer < 0)
    return invalid_argument(
        "rotate_queries_cuda: bad shape (%d q heads, %d kv heads, head_dim %d "
        "(<= %d), %lld rows, layer %d)",
        p.n_heads_q, p.n_heads_kv, d, kMaxHeadDim, static_cast<long long>(p.n_rows), p.layer);
  if (p.n_rows == 0) return Status();
  if (p.q == nullptr || p.out == nullptr)
    return invalid_argument("rotate_queries_cuda: null q or out");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.q_rotation == nullptr) {
    OSCAR_CUDA_CHECK(cudaMemcpyAsync(p.out, p.q, sizeof(float) * p.n_rows * p.n_heads_q * d,
                                     cudaMemcpyDeviceToDevice, s));
    return Status();
  }
  const int64_t tiles = (p.n_rows + kTile - 1) / kTile;
  if (tiles > 0x7fffffff)
    return invalid_argument("rotate_queries_cuda: %lld rows", static_cast<long long>(p.n_rows));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.n_heads_q));
  OSCAR_CUDA_CHECK(cuda::launch_pdl(rotate_queries_kernel, grid,
                                    dim3(static_cast<unsigned>(d), kSplit),
                                    sizeof(float) * (1 + kSplit) * kTile * d, s, p.layer, p.n_rows,
                                    p.n_heads_q, p.n_heads_kv, d, p.q, p.q_rotation, p.out));
  OSCAR_CUDA_LAUNCH_CHECK("rotate_queries_kernel");
  return Status();
}

}  // namespace oscar::kernels
