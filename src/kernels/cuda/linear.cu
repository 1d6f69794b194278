// CUDA linear (kernels/linear.h: linear_cuda; forced paths in kernels/cuda/linear_cuda.h):
// y[n, out] = x[n, in] · Wᵀ (+ bias), x and y float32, W BF16 or F32 [out, in] row-major.
//
// Two paths, chosen by the number of rows of x:
//   n <= kLinearCudaFewRows (8): the streaming kernel below. Float x, float accumulation (as the
//     CPU path). Why 8: the kernel reads each weight once for all rows of x and does 2·n flops
//     per weight on the FP32 units; at the H200's ~4.3 TB/s that is 2.15e12 BF16 weights/s, so
//     n = 8 needs 34 TFLOP/s of FMA (plus one ALU op per weight for the BF16 widening and the
//     x loads) out of ~67 peak: still memory-bound; n = 16 would need 69, more than the FP32
//     peak. Larger n is done in passes of 8 when the streaming path is forced (tests, bench).
//   n > 8: x rounded to BF16 into a per-device buffer, then one cuBLASLt BF16 x BF16 GEMM with
//     FP32 compute and FP32 output (tensor cores), bias through the BIAS epilogue (or a small
//     kernel where no algorithm offers the epilogue). F32 weights: cuBLASLt FP32 GEMM with
//     CUBLAS_COMPUTE_32F (no TF32), x used as is.
// Batch-invariant calls (p.batch_invariant) with BF16 weights take the batch-invariant
// tensor-core GEMM (linear_invariant.cuh, which states why a row's bits do not depend on n or
// on the other rows) for every n, x rounded to BF16 as on the GEMM path: each y[i, r] is one
// chain of m16n8k16 MMAs over k in increasing steps of 16 into one accumulator, then the bias.
// n only picks the tile configuration (launch_invariant below). With F32 weights (matrices
// computed at load time, few and small) they keep the streaming kernel, whose y[i, r] is also
// one fixed FMA chain (thread t's chunks t, t + 256, ... in order, the warp's xor tree, the 8
// warps in order, the bias) whatever n and the other rows are, as the pass of 8 rows a row falls
// in only changes which accumulators sit beside it. cuBLASLt cannot promise either: the
// heuristic picks the kernel, tile and split-K per shape (cuBLAS guarantees run-to-run
// reproducibility for one shape only), as vLLM's and SGLang's batch-invariant modes note.
//
// Streaming kernel: one block of 256 threads (8 warps) per 4 weight rows; thread t takes the
// 16-byte chunks t, t + 256, ... of each of the 4 rows (8 BF16 or 4 F32 weights each), 2 chunks
// per row per iteration, so 8 independent 16-byte loads per thread are in flight before any
// arithmetic (128 B per thread; at 2-4 resident blocks per SM that is 64-128 KiB per SM, well
// above the ~16 KiB that Little's law asks for at 16.5 B/clock/SM and ~1 µs latency). Weights are
// loaded with ld.global.nc.L1::no_allocate (read once: they must not evict x from L1); x is read
// with __ldg from L1 (all blocks of an SM walk the same columns; 16-48 KiB per row of x). Each
// thread keeps n x 4 float accumulators; a warp-shuffle reduce, then one across the 8 warps in
// shared memory, and the bias added in float. Preconditions (all paths): in % 8 == 0, x and W
// 16-byte aligned.
//
// Not here: quantized weights, fused activations, split-K for very short outputs.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/cuda/linear_invariant.cuh"
#include "kernels/linear.h"

namespace oscar::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kRows = 4;    // weight rows per block
constexpr int kUnroll = 2;  // chunks per row per thread per iteration

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 16 bytes of weights as floats: 8 BF16 (widened by a shift / mask) or 4 F32.
template <typename T>
struct Chunk;
template <>
struct Chunk<__nv_bfloat16> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <>
struct Chunk<float> {
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[4]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};

// The matrices of one streaming launch: up to kMaxGroup products of the same x (q/k/v, gate/up),
// blocks [first[m], first[m + 1]) taking matrix m's rows.
constexpr int kMaxGroup = 4;
struct StreamGroup {
  int count = 0;
  int first[kMaxGroup + 1] = {};
  const void* w[kMaxGroup] = {};
  const float* bias[kMaxGroup] = {};
  float* y[kMaxGroup] = {};
  int out[kMaxGroup] = {};
};

// y[i, r] for NX rows of x (x: [NX, in], y: [NX, out] with row stride out) and the kRows weight
// rows of this block. Grid: Σ ceil(out_m / kRows) blocks of kThreads.
template <typename T, int NX>
__global__ void __launch_bounds__(kThreads)
    linear_stream_kernel(const float* __restrict__ x, const __grid_constant__ StreamGroup g, int in,
                         int64_t x_row0) {
  constexpr int E = Chunk<T>::kElems;
  __shared__ float red[kWarpsPerBlock][NX * kRows];
  int m = 0;
#pragma unroll
  for (int j = 1; j < kMaxGroup; ++j)
    m += (j < g.count && static_cast<int>(blockIdx.x) >= g.first[j]);
  const T* __restrict__ w = static_cast<const T*>(g.w[m]);
  const float* __restrict__ bias = g.bias[m];
  const int out = g.out[m];
  float* __restrict__ y = g.y[m] + x_row0 * out;
  const int r0 = (static_cast<int>(blockIdx.x) - g.first[m]) * kRows;
  const int C = in / E;  // 16-byte chunks per weight row
  const uint4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    wr[r] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(min(r0 + r, out - 1)) * in);
  float acc[NX][kRows];
#pragma unroll
  for (int i = 0; i < NX; ++i)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[i][r] = 0.f;

  // The weights of an iteration are loaded before its arithmetic, and those of the first one
  // before waiting for the kernel that writes x (programmatic dependent launch: common.cuh): for
  // in = 4096 that is all of this block's weights.
  uint4 wv[kUnroll][kRows];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kThreads;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        wv[u][r] = c < C ? ld_stream(wr[r] + c) : make_uint4(0, 0, 0, 0);
    }
  };
  oscar::cuda::pdl_trigger();
  load(threadIdx.x);
  oscar::cuda::pdl_wait();
#pragma unroll 1
  for (int c0 = threadIdx.x; c0 < C; c0 += kThreads * kUnroll) {
    if (c0 != static_cast<int>(threadIdx.x)) load(c0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kThreads;
      if (c >= C) break;
      float wf[kRows][E];
#pragma unroll
      for (int r = 0; r < kRows; ++r) Chunk<T>::unpack(wv[u][r], wf[r]);
#pragma unroll
      for (int i = 0; i < NX; ++i) {
        const float4* xp = reinterpret_cast<const float4*>(x + static_cast<int64_t>(i) * in +
                                                           static_cast<int64_t>(c) * E);
        float xv[E];
#pragma unroll
        for (int j = 0; j < E / 4; ++j) {
          const float4 t = __ldg(xp + j);
          xv[4 * j] = t.x;
          xv[4 * j + 1] = t.y;
          xv[4 * j + 2] = t.z;
          xv[4 * j + 3] = t.w;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int e = 0; e < E; ++e) acc[i][r] = fmaf(xv[e], wf[r][e], acc[i][r]);
      }
    }
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < NX; ++i)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float v = acc[i][r];
#pragma unroll
      for (int sh = 16; sh >= 1; sh >>= 1) v += __shfl_xor_sync(0xffffffffu, v, sh);
      if (lane == 0) red[warp][i * kRows + r] = v;
    }
  __syncthreads();
  if (threadIdx.x < NX * kRows) {
    const int i = threadIdx.x / kRows, r = threadIdx.x % kRows;
    if (r0 + r < out) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kWarpsPerBlock; ++k) s += red[k][threadIdx.x];
      if (bias != nullptr) s += bias[r0 + r];
      y[static_cast<int64_t>(i) * out + r0 + r] = s;
    }
  }
}

// One launch per kLinearCudaFewRows rows of x for all the products of ps (same x, n, cols and
// dtype; checked by the caller).
template <typename T>
Status launch_stream(const LinearParams* ps, int count, cudaStream_t stream) {
  const LinearParams& p = ps[0];
  const int in = static_cast<int>(p.w.cols);
  StreamGroup g;
  g.count = count;
  for (int m = 0; m < count; ++m) {
    g.w[m] = ps[m].w.data;
    g.bias[m] = ps[m].bias;
    g.y[m] = ps[m].y;
    g.out[m] = static_cast<int>(ps[m].w.rows);
    g.first[m + 1] = g.first[m] + static_cast<int>((ps[m].w.rows + kRows - 1) / kRows);
  }
  const unsigned grid = static_cast<unsigned>(g.first[count]);
  for (int64_t i0 = 0; i0 < p.n; i0 += kLinearCudaFewRows) {
    const int nx = static_cast<int>(std::min<int64_t>(kLinearCudaFewRows, p.n - i0));
    const float* x = p.x + i0 * p.w.cols;
#define OSCAR_LINEAR_CASE(NX)                                                                     \
  case NX:                                                                                        \
    OSCAR_CUDA_CHECK(cuda::launch_pdl(linear_stream_kernel<T, NX>, dim3(grid), dim3(kThreads), 0, \
                                      stream, x, g, in, i0));                                     \
    break;
    switch (nx) {
      OSCAR_LINEAR_CASE(1)
      OSCAR_LINEAR_CASE(2)
      OSCAR_LINEAR_CASE(3)
      OSCAR_LINEAR_CASE(4)
      OSCAR_LINEAR_CASE(5)
      OSCAR_LINEAR_CASE(6)
      OSCAR_LINEAR_CASE(7)
      default:
        OSCAR_CUDA_CHECK(cuda::launch_pdl(linear_stream_kernel<T, 8>, dim3(grid), dim3(kThreads), 0,
                                          stream, x, g, in, i0));
    }
#undef OSCAR_LINEAR_CASE
    OSCAR_CUDA_LAUNCH_CHECK("linear_stream_kernel");
  }
  return Status();
}

// ---- GEMM path -------------------------------------------------------------------------------

// x [n] floats -> BF16 (round to nearest even), 4 per thread per step (n % 4 == 0).
__global__ void to_bf16_kernel(const float4* __restrict__ x, uint2* __restrict__ xb, int64_t n4) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    xb[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                       *reinterpret_cast<const uint32_t*>(&hi));
  }
}

// y[i, r] += bias[r]: the fallback when the chosen cuBLASLt algorithm has no bias epilogue.
__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n,
                                int64_t out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * out;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += bias[i % out];
}

const char* lt_error(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "alloc failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "not supported";
    default:
      return "error";
  }
}

#define OSCAR_LT_CHECK(expr)                                                                   \
  do {                                                                                         \
    const cublasStatus_t oscar_lt_st_ = (expr);                                                \
    if (oscar_lt_st_ != CUBLAS_STATUS_SUCCESS)                                                 \
      return ::oscar::internal_error("%s:%d: %s: cublasLt %s (%d)", __FILE__, __LINE__, #expr, \
                                     lt_error(oscar_lt_st_), static_cast<int>(oscar_lt_st_));  \
  } while (0)

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;  // what NVIDIA recommends for Hopper
constexpr size_t kMaxPlans = 1024;

// One GEMM shape's descriptors and algorithm (the bias pointer is set per call).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;
};

void destroy(Plan& pl) {
  if (pl.desc) cublasLtMatmulDescDestroy(pl.desc);
  if (pl.a) cublasLtMatrixLayoutDestroy(pl.a);
  if (pl.b) cublasLtMatrixLayoutDestroy(pl.b);
  if (pl.c) cublasLtMatrixLayoutDestroy(pl.c);
  pl = Plan{};
}

// Per device: created on first use, never freed (the driver frees it at exit).
struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  cuda::GrownBuffer xbf;  // x as BF16
  // (dtype, out, n, in, bias, alignment of W, x, y) -> plan
  std::map<std::tuple<int, int64_t, int64_t, int64_t, bool, int, int, int>, Plan> plans;
};

std::mutex g_mu;
LtDevice g_dev[64];

// Descriptors for D[out, n] (column-major, ld out) = op(A)·B with A = W as column-major
// [in, out] (ld in), op(A) = Aᵀ, and B = x as column-major [in, n] (ld in): the row-major
// y[n, out] = x · Wᵀ. Heuristic picks the first algorithm; with a bias it asks for the BIAS
// epilogue first.
Status make_plan(LtDevice& dv, DType dt, int64_t out, int64_t n, int64_t in, bool bias,
                 const uint32_t (&align)[3], Plan* plan) {
  Plan pl;
  const cudaDataType_t ab = dt == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  OSCAR_LT_CHECK(cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  OSCAR_LT_CHECK(
      cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  OSCAR_LT_CHECK(
      cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  OSCAR_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.a, ab, in, out, in));
  OSCAR_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.b, ab, in, n, in));
  OSCAR_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.c, CUDA_R_32F, out, n, out));
  cublasLtMatmulPreference_t pref = nullptr;
  OSCAR_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  // The heuristic assumes 256-byte aligned buffers unless told otherwise.
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0],
                                       sizeof align[0]);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1],
                                       sizeof align[1]);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2],
                                       sizeof align[2]);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2],
                                       sizeof align[2]);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = CUDA_R_32F;
    cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    if (cublasLtMatmulAlgoGetHeuristic(dv.handle, pl.desc, pl.a, pl.b, pl.c, pl.c, pref, 1, &res,
                                       &found) != CUBLAS_STATUS_SUCCESS)
      found = 0;
    pl.bias_epilogue = found > 0;
    if (!pl.bias_epilogue) {
      const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
      cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof none);
    }
  }
  if (found == 0) {
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(dv.handle, pl.desc, pl.a, pl.b, pl.c,
                                                             pl.c, pref, 1, &res, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatmulPreferenceDestroy(pref);
      destroy(pl);
      return internal_error(
          "linear_cuda: no cuBLASLt algorithm for %s [%lld x %lld] x [%lld x %lld]",
          dt == DType::kBF16 ? "bf16" : "f32", static_cast<long long>(n),
          static_cast<long long>(in), static_cast<long long>(out), static_cast<long long>(in));
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  pl.algo = res.algo;
  *plan = pl;
  return Status();
}

// Largest power of two (<= 256) dividing the address.
uint32_t alignment(const void* ptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

Status gemm(const LinearParams& p, cudaStream_t stream) {
  int dev = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return internal_error("linear_cuda: device %d", dev);
  std::lock_guard<std::mutex> lock(g_mu);
  LtDevice& dv = g_dev[dev];
  if (dv.handle == nullptr) {
    OSCAR_LT_CHECK(cublasLtCreate(&dv.handle));
    OSCAR_CUDA_CHECK(cudaMalloc(&dv.workspace, kLtWorkspaceBytes));
  }
  const int64_t in = p.w.cols, out = p.w.rows;
  const void* b_ptr = p.x;
  if (p.w.dtype == DType::kBF16) {
    const size_t bytes = static_cast<size_t>(p.n) * in * 2;
    OSCAR_RETURN_IF_ERROR(
        dv.xbf.reserve(bytes, std::max<size_t>(bytes + bytes / 4, size_t{4} << 20), stream));
    const int64_t n4 = p.n * in / 4;
    const int blocks = static_cast<int>(std::min<int64_t>((n4 + 255) / 256, 4096));
    to_bf16_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(p.x),
                                               static_cast<uint2*>(dv.xbf.ptr), n4);
    OSCAR_CUDA_LAUNCH_CHECK("linear to_bf16_kernel");
    b_ptr = dv.xbf.ptr;
  }
  const bool bias = p.bias != nullptr;
  const uint32_t align[3] = {alignment(p.w.data), alignment(b_ptr), alignment(p.y)};
  const auto key =
      std::make_tuple(static_cast<int>(p.w.dtype), out, p.n, in, bias, static_cast<int>(align[0]),
                      static_cast<int>(align[1]), static_cast<int>(align[2]));
  auto it = dv.plans.find(key);
  if (it == dv.plans.end()) {
    if (dv.plans.size() >= kMaxPlans) {
      for (auto& kv : dv.plans) destroy(kv.second);
      dv.plans.clear();
    }
    Plan pl;
    OSCAR_RETURN_IF_ERROR(make_plan(dv, p.w.dtype, out, p.n, in, bias, align, &pl));
    it = dv.plans.emplace(key, pl).first;
  }
  Plan& pl = it->second;
  if (pl.bias_epilogue) {
    const float* bp = p.bias;
    OSCAR_LT_CHECK(
        cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  }
  const float alpha = 1.f, beta = 0.f;
  OSCAR_LT_CHECK(cublasLtMatmul(dv.handle, pl.desc, &alpha, p.w.data, pl.a, b_ptr, pl.b, &beta, p.y,
                                pl.c, p.y, pl.c, &pl.algo, dv.workspace, kLtWorkspaceBytes,
                                stream));
  if (bias && !pl.bias_epilogue) {
    const int blocks = static_cast<int>(std::min<int64_t>((p.n * out + 255) / 256, 4096));
    add_bias_kernel<<<blocks, 256, 0, stream>>>(p.y, p.bias, p.n, out);
    OSCAR_CUDA_LAUNCH_CHECK("linear add_bias_kernel");
  }
  return Status();
}

// ---- Batch-invariant tensor-core GEMM (linear_invariant.cuh) -------------------------------
//
// Configurations, chosen by n only (and, for decode, by out against the SM count): any choice
// gives each row the same bits (linear_invariant.cuh), so they are picked for speed alone.
//   n <= 16 / <= 64: BM = 16 / 32 rows, float x rounded in registers (no conversion launch),
//     BK = 128, 96 KiB of stages (2 blocks per SM): memory-bound on W, which is read once per
//     call (one M tile; for 33..64 rows the two M tiles of a W tile run side by side and share
//     it in L2). BN = 64 (4 warps of 16 columns) where that still gives every SM a block
//     (gate/up, lm_head), else BN = 32 (2 warps; q/o, k/v), for more blocks in flight.
//   n <= 256: 64 x 128 x 32, 8 warps of 32 x 32, 4 stages (48 KiB), x converted to BF16 first.
//   n > 256: 128 x 128 x 32, 8 warps of 64 x 32, 4 stages (64 KiB), 2 blocks per SM.
using InvDecode16N32 = bi::Config<16, 32, 128, 1, 2, 6, true, 2>;
using InvDecode16N64 = bi::Config<16, 64, 128, 1, 4, 4, true, 2>;
using InvDecode32N32 = bi::Config<32, 32, 128, 1, 2, 4, true, 2>;
using InvDecode32N64 = bi::Config<32, 64, 128, 1, 4, 3, true, 2>;
using InvMid = bi::Config<64, 128, 32, 2, 4, 4, false, 2>;
using InvLarge = bi::Config<128, 128, 32, 2, 4, 4, false, 2>;

struct InvFacts {
  int sms = 0;
};
Status inv_facts(InvFacts* out) {
  return cuda::facts_per_device(out, [](InvFacts* f, int dev) {
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&f->sms, cudaDevAttrMultiProcessorCount, dev));
    return Status();
  });
}

// One launch of configuration C over x ([n, in] float for C::kXF32, else BF16).
template <class C>
Status launch_invariant_config(const LinearParams& p, const void* x, cudaStream_t stream) {
  // The dynamic shared-memory limit, raised once per device (bit dev of `raised`).
  static std::atomic<uint64_t> raised{0};
  int dev = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if ((raised.load(std::memory_order_acquire) & bit) == 0) {
    OSCAR_CUDA_CHECK(cudaFuncSetAttribute(bi::linear_invariant_kernel<C>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          C::kSmemBytes));
    raised.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int64_t m_tiles = (p.n + C::kBM - 1) / C::kBM, n_tiles = (p.w.rows + C::kBN - 1) / C::kBN;
  if (m_tiles * n_tiles > INT_MAX)
    return invalid_argument("linear_cuda: %lld x %lld tiles for the batch-invariant GEMM",
                            static_cast<long long>(m_tiles), static_cast<long long>(n_tiles));
  const bool vec2 = p.w.rows % 2 == 0 && (reinterpret_cast<uintptr_t>(p.y) & 7) == 0;
  OSCAR_CUDA_CHECK(cuda::launch_pdl(
      bi::linear_invariant_kernel<C>, dim3(static_cast<unsigned>(m_tiles * n_tiles)),
      dim3(C::kThreads), static_cast<size_t>(C::kSmemBytes), stream, x,
      static_cast<const __nv_bfloat16*>(p.w.data), p.bias, p.y, static_cast<int>(p.n),
      static_cast<int>(p.w.cols), static_cast<int>(p.w.rows), static_cast<int>(m_tiles), vec2));
  OSCAR_CUDA_LAUNCH_CHECK("linear_invariant_kernel");
  return Status();
}

// BF16 weights only (the caller sends F32 weights to the streaming kernel).
Status launch_invariant(const LinearParams& p, cudaStream_t stream) {
  if (p.n > INT_MAX)
    return invalid_argument("linear_cuda: n %lld too large", static_cast<long long>(p.n));
  if (p.n <= 64) {
    InvFacts f;
    OSCAR_RETURN_IF_ERROR(inv_facts(&f));
    const bool wide = (p.w.rows + 63) / 64 >= f.sms;
    if (p.n <= 16)
      return wide ? launch_invariant_config<InvDecode16N64>(p, p.x, stream)
                  : launch_invariant_config<InvDecode16N32>(p, p.x, stream);
    return wide ? launch_invariant_config<InvDecode32N64>(p, p.x, stream)
                : launch_invariant_config<InvDecode32N32>(p, p.x, stream);
  }
  // x to BF16 in the GEMM path's per-device buffer (same lock, same one-stream-per-device rule).
  int dev = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return internal_error("linear_cuda: device %d", dev);
  std::lock_guard<std::mutex> lock(g_mu);
  LtDevice& dv = g_dev[dev];
  const size_t bytes = static_cast<size_t>(p.n) * p.w.cols * 2;
  OSCAR_RETURN_IF_ERROR(
      dv.xbf.reserve(bytes, std::max<size_t>(bytes + bytes / 4, size_t{4} << 20), stream));
  const int64_t n4 = p.n * p.w.cols / 4;
  const int blocks = static_cast<int>(std::min<int64_t>((n4 + 255) / 256, 4096));
  to_bf16_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(p.x),
                                             static_cast<uint2*>(dv.xbf.ptr), n4);
  OSCAR_CUDA_LAUNCH_CHECK("linear to_bf16_kernel");
  return p.n <= 256 ? launch_invariant_config<InvMid>(p, dv.xbf.ptr, stream)
                    : launch_invariant_config<InvLarge>(p, dv.xbf.ptr, stream);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

Status check_cuda(const LinearParams& p) {
  if (p.n < 0 || p.w.rows <= 0 || p.w.cols <= 0)
    return invalid_argument("linear_cuda: bad shape (n %lld, weight %lld x %lld)",
                            static_cast<long long>(p.n), static_cast<long long>(p.w.rows),
                            static_cast<long long>(p.w.cols));
  if (p.w.dtype != DType::kF32 && p.w.dtype != DType::kBF16)
    return invalid_argument("linear_cuda: unknown weight dtype %d", static_cast<int>(p.w.dtype));
  if (p.w.cols % 8 != 0)
    return invalid_argument("linear_cuda: in %lld is not a multiple of 8 (16-byte weight loads)",
                            static_cast<long long>(p.w.cols));
  if (p.w.rows > (int64_t{1} << 31) - kRows || p.w.cols > (int64_t{1} << 30))
    return invalid_argument("linear_cuda: weight %lld x %lld too large",
                            static_cast<long long>(p.w.rows), static_cast<long long>(p.w.cols));
  if (p.n > 0 && (p.x == nullptr || p.y == nullptr || p.w.data == nullptr))
    return invalid_argument("linear_cuda: null x, y or weight");
  if (p.n > 0 && (!aligned16(p.x) || !aligned16(p.w.data)))
    return invalid_argument("linear_cuda: x and the weight must be 16-byte aligned");
  return Status();
}

}  // namespace

Status linear_cuda_ex(const LinearParams& p, LinearCudaPath path, void* stream_ptr) {
  OSCAR_RETURN_IF_ERROR(check_cuda(p));
  if (p.n == 0) return Status();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool invariant = path == LinearCudaPath::kInvariant ||
                         (path == LinearCudaPath::kAuto && p.batch_invariant);
  if (invariant && p.w.dtype == DType::kBF16) return launch_invariant(p, stream);
  const bool few = path == LinearCudaPath::kStream || invariant ||
                   (path == LinearCudaPath::kAuto && linear_cuda_streams(p.n, p.w.rows, p.w.cols));
  if (!few) return gemm(p, stream);
  return p.w.dtype == DType::kBF16 ? launch_stream<__nv_bfloat16>(&p, 1, stream)
                                   : launch_stream<float>(&p, 1, stream);
}

Status linear_cuda(const LinearParams& p, void* stream) {
  return linear_cuda_ex(p, LinearCudaPath::kAuto, stream);
}

Status linear_group_cuda(const LinearParams* ps, int count, void* stream_ptr) {
  if (count <= 0) return Status();
  bool one_launch = count <= kMaxGroup;
  int64_t rows = 0;
  for (int m = 0; m < count; ++m) {
    OSCAR_RETURN_IF_ERROR(check_cuda(ps[m]));
    rows += ps[m].w.rows;
    one_launch = one_launch && ps[m].x == ps[0].x && ps[m].n == ps[0].n &&
                 ps[m].w.cols == ps[0].w.cols && ps[m].w.dtype == ps[0].w.dtype &&
                 ps[m].batch_invariant == ps[0].batch_invariant;
  }
  if (ps[0].n == 0) return Status();
  // Batch-invariant BF16 products: one linear_cuda each (the tensor-core GEMM; F32 weights
  // stream, and may share a launch).
  one_launch = one_launch && rows <= (int64_t{1} << 31) - kRows * kMaxGroup &&
               (ps[0].batch_invariant ? ps[0].w.dtype == DType::kF32
                                      : linear_cuda_streams(ps[0].n, rows, ps[0].w.cols));
  if (!one_launch) {
    for (int m = 0; m < count; ++m) OSCAR_RETURN_IF_ERROR(linear_cuda(ps[m], stream_ptr));
    return Status();
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  return ps[0].w.dtype == DType::kBF16 ? launch_stream<__nv_bfloat16>(ps, count, stream)
                                       : launch_stream<float>(ps, count, stream);
}

}  // namespace oscar::kernels
