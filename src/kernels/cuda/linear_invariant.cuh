// Device code of the batch-invariant tensor-core linear (kernels/cuda/linear.cu: the path of
// LinearParams::batch_invariant with BF16 weights, LinearCudaPath::kInvariant):
// y[n, out] = bf16(x)[n, in] · Wᵀ (+ bias), W BF16 [out, in] row-major, FP32 accumulation,
// y float32. Not here: F32 weights (the streaming kernel serves them), split-K, fused epilogues.
//
// Why a row's bits do not depend on n or on the other rows: every y[i, r] is one fixed chain.
// acc = 0; for k0 = 0, 16, 32, ... < in, in increasing order:
//   acc = mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32(x̂[i, k0:k0+16], W[r, k0:k0+16], acc)
// one accumulator, no split-K (across blocks or warps), then y = acc + bias[r] in float (one
// rounding; no FMA can form). x̂ = x rounded to BF16 (round to nearest even, __floats2bfloat162_rn:
// in linear.cu's to_bf16_kernel for the tiles that read a BF16 copy of x, here in registers for
// those that read float x; the same operation, the same bits). The tail of in (in % 16 == 8) is
// zero-filled in both operands, the same in every configuration, and no k-step past in is run
// (an all-zero step is not a no-op: -0 + 0 = +0). Nothing of that chain depends on the position
// of row i in its 16-row MMA tile, on the tile (BM rows of x per block) or on the column tile
// (BN): the configurations below differ in BM, BN, BK, warps and stages, all of which only change
// which other rows and columns are computed beside (i, r), and when. n picks the configuration
// (linear.cu: launch_invariant). That mma.sync's result for one element does not depend on the
// other rows of its tile is a property of the hardware, checked on the GPU by
// tests/kernels/test_linear_cuda.cpp (BatchInvariantTensorCoreRows), not assumed.
//
// Kernel: a block computes a BM x BN tile of y with WARPS_M x WARPS_N warps (warp tile WM x WN,
// WM/16 x WN/8 accumulators of m16n8), streaming K in tiles of BK through a STAGES-deep cp.async
// ring (one commit group per stage, one __syncthreads per k-tile). Shared-memory rows are 16-byte
// chunks XOR-swizzled by the row (swizzle()), so that ldmatrix (8 rows, one chunk each) and the
// cp.async stores are free of bank conflicts. W is read with ldmatrix (m8n8, no transpose: its
// rows are the B operand's columns). x is either the BF16 copy (ldmatrix) or, for the decode
// configurations, float x copied as is and rounded to BF16 when the A fragments are built
// (ld.shared.v2.f32 + cvt.rn.bf16x2), which saves the conversion launch. Blocks are numbered with
// the M tile fastest: the blocks of one W tile run together and W is read from DRAM once.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace oscar::kernels::bi {

// One tile configuration. kXF32: the A tile holds float x (rounded when read), else BF16 x.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, bool XF32, int MIN_BLOCKS>
struct Config {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kWarpsM = WARPS_M, kWarpsN = WARPS_N;
  static constexpr int kStages = STAGES, kMinBlocks = MIN_BLOCKS;
  static constexpr bool kXF32 = XF32;
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kWM = BM / WARPS_M, kWN = BN / WARPS_N;
  static constexpr int kMT = kWM / 16, kNT = kWN / 8;    // m16 / n8 tiles per warp
  static constexpr int kXBytes = XF32 ? 4 : 2;           // bytes per element of the A tile
  static constexpr int kAChunks = BK * kXBytes / 16;     // 16-byte chunks per A row
  static constexpr int kBChunks = BK * 2 / 16;           // ... per W row
  static constexpr int kAStageBytes = BM * kAChunks * 16;
  static constexpr int kBStageBytes = BN * kBChunks * 16;
  static constexpr int kStageBytes = kAStageBytes + kBStageBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static_assert(kWM % 16 == 0 && kWN % 16 == 0, "warp tile: m16 rows, pairs of n8 columns");
  static_assert(BK % 16 == 0 && kBChunks >= 4 && kAChunks >= 4, "k tile");
  static_assert(STAGES >= 2, "stages");
};

// Physical 16-byte chunk of logical chunk c in row r of a tile with `chunks` chunks per row:
// rows of >= 128 bytes XOR the low 3 bits with r % 8; rows of 64 bytes (4 chunks) with
// (r / 2) % 4, so that 8 consecutive rows at one logical chunk hit 8 different bank quads.
template <int kChunks>
__device__ __forceinline__ int swizzle(int r, int c) {
  if constexpr (kChunks >= 8)
    return c ^ (r & 7);
  else
    return c ^ ((r >> 1) & 3);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// x: [n, in] float (C::kXF32) or BF16; w: [out, in] BF16; bias: [out] or null; y: [n, out]
// (vec2: y 8-byte aligned and out even, so pairs of columns go out as one float2).
// Grid: m_tiles x ceil(out / BN) blocks of C::kThreads, block b at M tile b % m_tiles.
// Preconditions (linear.cu checks them): in % 8 == 0, x and w 16-byte aligned.
template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    linear_invariant_kernel(const void* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                            const float* __restrict__ bias, float* __restrict__ y, int n, int in,
                            int out, int m_tiles, bool vec2) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_n = warp % C::kWarpsN, warp_m = warp / C::kWarpsN;
  const int m0 = static_cast<int>(blockIdx.x % m_tiles) * C::kBM;
  const int n0 = static_cast<int>(blockIdx.x / m_tiles) * C::kBN;
  const uint32_t smem0 = cuda::smem_addr(smem);
  const int k_tiles = (in + C::kBK - 1) / C::kBK;

  // Stage s of the ring: the A tile [BM][kAChunks], then the W tile [BN][kBChunks].
  auto load_w = [&](int s, int k0) {
    const uint32_t base = smem0 + s * C::kStageBytes + C::kAStageBytes;
    constexpr int kTotal = C::kBN * C::kBChunks;
#pragma unroll
    for (int j = 0; j < (kTotal + C::kThreads - 1) / C::kThreads; ++j) {
      const int i = tid + j * C::kThreads;
      if (kTotal % C::kThreads == 0 || i < kTotal) {
        const int r = i / C::kBChunks, c = i % C::kBChunks;
        const int gr = n0 + r, gk = k0 + c * 8;
        const bool ok = gr < out && gk < in;
        const void* src = ok ? static_cast<const void*>(w + static_cast<int64_t>(gr) * in + gk) : w;
        cuda::cp_async16(base + (r * C::kBChunks + swizzle<C::kBChunks>(r, c)) * 16, src, ok);
      }
    }
  };
  auto load_x = [&](int s, int k0) {
    const uint32_t base = smem0 + s * C::kStageBytes;
    constexpr int kTotal = C::kBM * C::kAChunks;
    constexpr int kElems = 16 / C::kXBytes;  // elements per chunk
    const char* xb = static_cast<const char*>(x);
#pragma unroll
    for (int j = 0; j < (kTotal + C::kThreads - 1) / C::kThreads; ++j) {
      const int i = tid + j * C::kThreads;
      if (kTotal % C::kThreads == 0 || i < kTotal) {
        const int r = i / C::kAChunks, c = i % C::kAChunks;
        const int gr = m0 + r, gk = k0 + c * kElems;
        const bool ok = gr < n && gk < in;
        const int64_t at = (static_cast<int64_t>(gr) * in + gk) * C::kXBytes;
        const void* src = ok ? static_cast<const void*>(xb + at) : static_cast<const void*>(xb);
        cuda::cp_async16(base + (r * C::kAChunks + swizzle<C::kAChunks>(r, c)) * 16, src, ok);
      }
    }
  };

  float acc[C::kMT][C::kNT][4];
#pragma unroll
  for (int a = 0; a < C::kMT; ++a)
#pragma unroll
    for (int b = 0; b < C::kNT; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.f;

  // One k-step of 16 (kk-th of the stage): A and B fragments, then the MMAs of the warp tile.
  auto step = [&](uint32_t stage_base, int kk) {
    uint32_t af[C::kMT][4], bf[C::kNT][2];
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt) {
      const int rb = warp_m * C::kWM + mt * 16;
      if constexpr (C::kXF32) {
        // Fragment a0..a3 = (row g, k 2t..2t+1), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8).
        const unsigned char* tile = smem + (stage_base - smem0);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = rb + g + (q & 1) * 8, col = kk * 16 + 2 * t + (q >> 1) * 8;
          const int c = col / 4;
          const float2 v = *reinterpret_cast<const float2*>(
              tile + (r * C::kAChunks + swizzle<C::kAChunks>(r, c)) * 16 + (col % 4) * 4);
          af[mt][q] = pack_bf16(v.x, v.y);
        }
      } else {
        const int r = rb + (lane & 15), c = kk * 2 + (lane >> 4);
        cuda::ldmatrix_x4(af[mt],
                          stage_base + (r * C::kAChunks + swizzle<C::kAChunks>(r, c)) * 16);
      }
    }
    const uint32_t wbase = stage_base + C::kAStageBytes;
#pragma unroll
    for (int np = 0; np < C::kNT / 2; ++np) {
      const int r = warp_n * C::kWN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
      const int c = kk * 2 + ((lane >> 3) & 1);
      uint32_t v[4];
      cuda::ldmatrix_x4(v, wbase + (r * C::kBChunks + swizzle<C::kBChunks>(r, c)) * 16);
      bf[2 * np][0] = v[0];
      bf[2 * np][1] = v[1];
      bf[2 * np + 1][0] = v[2];
      bf[2 * np + 1][1] = v[3];
    }
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt)
        cuda::mma_bf16(acc[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[nt][0],
                       bf[nt][1]);
  };

  // Prologue: the weights of the first STAGES - 1 k-tiles before waiting for the kernel that
  // writes x (programmatic dependent launch, common.cuh), then their x; one group per stage
  // (the first group also holds every prologue W copy, which only makes stage 0 wait for more).
  cuda::pdl_trigger();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s)
    if (s < k_tiles) load_w(s, s * C::kBK);
  cuda::pdl_wait();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < k_tiles) load_x(s, s * C::kBK);
    cuda::cp_async_commit();
  }

#pragma unroll 1
  for (int kt = 0; kt < k_tiles; ++kt) {
    cuda::cp_async_wait<C::kStages - 2>();
    __syncthreads();  // stage kt % STAGES is in; stage (kt - 1) % STAGES is free
    const int next = kt + C::kStages - 1;
    if (next < k_tiles) {
      load_w(next % C::kStages, next * C::kBK);
      load_x(next % C::kStages, next * C::kBK);
    }
    cuda::cp_async_commit();
    const uint32_t stage_base = smem0 + (kt % C::kStages) * C::kStageBytes;
    const int k0 = kt * C::kBK;
    if (k0 + C::kBK <= in) {
#pragma unroll
      for (int kk = 0; kk < C::kBK / 16; ++kk) step(stage_base, kk);
    } else {
      const int steps = (in - k0 + 15) / 16;  // the last k-tile: no step past in
#pragma unroll 1
      for (int kk = 0; kk < steps; ++kk) step(stage_base, kk);
    }
  }
  cuda::cp_async_wait<0>();

  // Epilogue: acc (row g / g + 8, columns 2t, 2t + 1 of each m16n8 tile) + bias, to y.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt) {
      const int col = n0 + warp_n * C::kWN + nt * 8 + 2 * t;
      if (col >= out) continue;
      const bool two = col + 1 < out;
      const float b0 = bias != nullptr ? bias[col] : 0.f;
      const float b1 = bias != nullptr && two ? bias[col + 1] : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + warp_m * C::kWM + mt * 16 + g + h * 8;
        if (row >= n) continue;
        float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
        if (bias != nullptr) {
          v0 += b0;
          v1 += b1;
        }
        float* dst = y + static_cast<int64_t>(row) * out + col;
        if (vec2 && two) {
          *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
          dst[0] = v0;
          if (two) dst[1] = v1;
        }
      }
    }
}

}  // namespace oscar::kernels::bi
