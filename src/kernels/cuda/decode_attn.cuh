// Device code of the paged split-KV decode attention (kernels/decode_attn.h, OSCAR.md §4-§5).
//
// Work split. One block of 4 warps per (sequence, KV head, group of <= 8 query heads, context
// split). A sequence's keys are cut into tiles of 16 tokens (sink tiles, history tiles, recent
// tiles, in position order), weighted in work units (an exact tile counts kExactUnits INT2
// tiles: split_units); split i of n takes the tiles whose first unit lies in [i·U/n, (i+1)·U/n),
// and its warps take those tiles round-robin, each with its own cp.async pipeline in its own 14 or
// 16 KiB of shared memory (the launch configurations below) and its own online-softmax state
// (running reference raised lazily: softmax_update). The block merges its 4 warp states; with one
// split it writes the output, otherwise a partial (o, m, ℓ) that combine_kernel merges by
// log-sum-exp (the device twin of merge_attn_states, in log2 units). n is chosen on the host to
// fill the GPU once; a short sequence uses fewer splits (>= kMinTilesPerSplit units each), computed
// the same way on the device by both kernels, so the host never needs the sequence lengths.
//
// Tensor cores (mma.sync m16n8k16, FP32 accumulators) for both products, each KV byte read once
// for all query heads of its group:
//   S^T[16 keys, 8 heads] = K_tile[16 keys, d] · Q^T[d, 8 heads]     (keys on M, heads on N)
//   O^T[d, 8 heads]      += V_tile^T[d, 16 keys] · P^T[16 keys, 8 heads]   (d on M)
// S's accumulator fragment (keys g, g+8; heads 2t, 2t+1 of lane 4g+t) is exactly what the
// softmax needs per head, and one movmatrix.trans per 8 keys turns P into PV's B fragment.
//
// Exact (BF16) tiles: K and V rows staged with 16-byte cp.async into an XOR-swizzled tile,
// read with ldmatrix (V with .trans); Q and P in BF16.
// INT2 tiles (head_dim 128, group 128, uniform; the OSCAR format), two per step: raw rows staged
// (a tile is 576 contiguous bytes per plane), codes turned into FP16 operands without a table
// (one LOP3 per two codes): a code c masked
// into the mantissa of 1024.0 (0x6400) is the exact FP16 value 1024 + c·2^b. The products stay
// linear in the codes, so scale and min never touch the operands:
//   q·k̂ = min·Σq + s·Σ_d q_d c_d,   Σ_d q_d c_d = (K-tile MMA on 1024 + c·4^qq codes with
//        q scaled by 4^-qq) − 1024·Σ fp16(q·4^-qq)                                       (per key)
//   Σ_t p_t v̂_t = Σ_t p_t·min_t + (V-tile MMA on 1024 + F·c codes with B = fp16(p_t·s_t)
//        − 1024·Σ_t fp16(p_t·s_t)) / F                                                   (per head)
// The d-order inside the fragments follows the byte order of the packed rows ("by quarters");
// a dot product does not care, and Q (and the accumulator of O, converted when a warp moves
// between exact and INT2 tiles) use the same order. Where a block's group has <= 4 query heads
// (Qwen3's GQA 4), a step's two INT2 tiles share the 8 columns of one softmax fragment
// (int2_pair_packed): the per-key work after the K MMAs runs once per pair. Other history formats (3-/1-bit bit-plan
// rows, Lloyd-Max, groups of 32/64) go through a generic path: the warp dequantizes the staged
// raw rows into a BF16 tile in shared memory (16-byte stores, no run-time divisions), then runs
// the exact-tile code on it (the element-wise version measured 40x slower than the INT2 tiles
// on the H200: docs/results/decode_attn_cuda.md; this one is not measured yet).
// Measured on the H200 (2026-12-01, docs/results/cuda_backend.md): INT2 tiles issue-bound at
// ~232 instructions per tile with 16-token pages (2.5-2.75 TB/s at 128K, batch >= 8; of a pair's
// ~480 in SASS, 128 are the operand LOP3s, 32 the MMAs, ~65 the loads); exact tiles at the copy
// bandwidth.
//
// Also here: the naive kernel (one block per query head, scalar FP32), the simplest correct
// version and the fallback for shapes the fast kernel does not take. Host side: decode_attn.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hist_row.cuh"
#include "kernels/page_table.h"

namespace oscar::kernels::cuda_detail {

using oscar::cuda::cp_async16;
using oscar::cuda::smem_addr;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileTokens = 16;
// Two launch configurations (shared memory per warp, resident blocks per SM):
//   wide:  16 KiB per warp, 3 blocks (12 warps) per SM: two 8 KiB exact-tile stages; for calls
//          without history (the bf16 mode), where every tile is an exact one.
//   dense: 14 KiB per warp, 4 blocks (16 warps) per SM, <= 128 registers: more warps for the
//          issue-bound INT2 tiles, at the price of a single exact-tile stage (sinks/recent).
constexpr int kRingWide = 16384, kBlocksWide = 3;
constexpr int kRingDense = 14336, kBlocksDense = 4;
constexpr int kGroupHeads = 8;  // query heads per block (the MMA's N)
constexpr int kMinTilesPerSplit = 16;  // in work units (INT2 tiles; see split_units)
constexpr int kMaxSplits = 128;
constexpr float kNegInf = -__builtin_inff();

// Everything the kernels read; filled on the host from DecodeAttnParams (device pointers).
struct KernelArgs {
  int n_seqs, n_heads_q, n_heads_kv, gqa, n_hgroups, layer, page_size, group_size, head_dim;
  int uniform;  // 1 uniform INT2, 0 Lloyd-Max
  int exact_elem_bytes;
  int n_planes;  // n_layers · 2 · n_heads_kv
  int page_shift;  // log2(page_size) when a power of two, else -1
  int force_generic;
  int debug_flags;  // bit 0: stage the tiles but skip their compute (bandwidth of the loads);
                    // bit 1: skip the INT2 tiles' loads (their compute alone, on zeroed stages)
  float scale_log2;     // softmax scale · log2(e): scores are kept in log2 units
  float lloyd_levels[4];
  const float* q;       // [n_seqs, n_heads_q, head_dim]
  const uint8_t* exact_pool;
  const uint8_t* hist_pool;
  uint64_t exact_page_bytes;
  uint64_t hist_page_bytes;  // 0 with a bit plan: page_size · hist_row_prefix[n_planes]
  PageTableView sinks, history, recent;
  const int8_t* hist_bits;          // bit plan or null
  const uint32_t* hist_row_prefix;  // bit plan or null
  int int2_row_bytes;
  int n_splits;
  float* part_o;   // [n_seqs, n_heads_q, n_splits, head_dim]
  float* part_ml;  // [n_seqs, n_heads_q, n_splits, 2]  (m in log2 units, ℓ)
  float* out;      // [n_seqs, n_heads_q, head_dim]
};

// Page index and slot of token t of a region (t / page_size, t % page_size): by a compile-time
// page size kPage (> 0; the kernel's instance for the default page of 16 tokens, where a tile is
// one page), else by shifts when the page size is a power of two.
template <int kPage>
__device__ __forceinline__ int page_index(const KernelArgs& a, int t) {
  if constexpr (kPage > 0) return t / kPage;
  return a.page_shift >= 0 ? t >> a.page_shift : t / a.page_size;
}
template <int kPage>
__device__ __forceinline__ int page_slot(const KernelArgs& a, int t) {
  if constexpr (kPage > 0) return t % kPage;
  return a.page_shift >= 0 ? t & (a.page_size - 1) : t % a.page_size;
}

__device__ __forceinline__ int ceil_tiles(int64_t n) {
  return static_cast<int>((n + kTileTokens - 1) / kTileTokens);
}

// The context is split by work units, not tiles: an exact (BF16) tile reads 7x the bytes of an
// INT2 tile and, in the dense configuration, runs without a second stage, so it counts
// kExactUnits (an even split by tiles left the split holding the recent window several times
// longer than the others: the tail of a batch-1 call).
constexpr int kExactUnits = 6;
__device__ __forceinline__ int region_units(int r) { return r == 1 ? 1 : kExactUnits; }
__device__ __forceinline__ int split_units(int n_tiles0, int n_tiles1, int n_tiles2) {
  return kExactUnits * (n_tiles0 + n_tiles2) + n_tiles1;
}

// Splits actually used by a sequence of U work units: both kernels compute it the same way.
__device__ __forceinline__ int effective_splits(int U, int n_splits) {
  const int by_len = (U + kMinTilesPerSplit - 1) / kMinTilesPerSplit;
  return max(1, min(n_splits, by_len));
}

// Byte offset inside a history page of the plane (layer, kv, head), its row bytes and bits.
__device__ __forceinline__ void hist_plane(const KernelArgs& a, int kv, int head, uint32_t& off,
                                           int& row_bytes, int& bits) {
  const int p = (a.layer * 2 + kv) * a.n_heads_kv + head;
  if (a.hist_row_prefix != nullptr) {
    off = static_cast<uint32_t>(a.page_size) * a.hist_row_prefix[p];
    row_bytes = static_cast<int>(a.hist_row_prefix[p + 1] - a.hist_row_prefix[p]);
    bits = a.hist_bits[p];
  } else {
    off = static_cast<uint32_t>(p) * a.page_size * a.int2_row_bytes;
    row_bytes = a.int2_row_bytes;
    bits = 2;
  }
}

__device__ __forceinline__ uint64_t hist_page_bytes(const KernelArgs& a) {
  return a.hist_row_prefix != nullptr
             ? static_cast<uint64_t>(a.page_size) * a.hist_row_prefix[a.n_planes]
             : a.hist_page_bytes;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_f16(uint32_t x) {
  return __half22float2(*reinterpret_cast<const __half2*>(&x));
}
__device__ __forceinline__ uint32_t lds32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

constexpr uint32_t kMagic = 0x64006400u;  // fp16 1024.0 in both halves

// (x & mask) | magic in one LOP3. Written as PTX lop3 because the compiler otherwise emits an
// AND and an OR (a LOP3 holds one immediate; here mask is the immediate and magic a register).
__device__ __forceinline__ uint32_t mask_or(uint32_t x, uint32_t mask, uint32_t magic) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(x), "r"(mask), "r"(magic));
  return d;
}
// kMagic in a register the compiler cannot turn back into an immediate.
__device__ __forceinline__ uint32_t magic_reg() {
  uint32_t m = kMagic;
  asm volatile("" : "+r"(m));
  return m;
}

// Accumulator row layouts of O^T (m-tile m, row half r: fragment rows g and g+8) -> d.
__device__ __forceinline__ int d_natural(int m, int r, int g) { return 16 * m + 8 * r + g; }
__device__ __forceinline__ int d_int2(int m, int r, int g) {
  return 32 * (m >> 1) + 4 * g + 2 * (m & 1) + r;
}
// The factor F of the INT2 V codes in m-tile m, row half r (see int2_pair): 256, 4, 16, 64 for
// quarters 0..3.
__device__ __forceinline__ float f_int2(int m, [[maybe_unused]] int r) {
  const int qq = m >> 1;
  return qq == 0 ? 256.f : static_cast<float>(1 << (2 * qq));
}

// Per-warp online-softmax state; lane (g, t) owns heads 2t, 2t+1 of the group.
struct WarpState {
  float o[8][4];  // O^T accumulator fragments, m-tile x (c0..c3)
  float m[2];     // running max (log2 units), warp-uniform per head
  float l[2];     // lane-partial Σ p
  float ps[2];    // INT2 layout: lane-partial Σ fp16(p·s_V)
  float mn[2];    // INT2 layout: lane-partial Σ p·min_V
  bool int2;      // o is in the INT2 layout (d_int2, factors F, offsets pending)
};

__device__ __forceinline__ void state_init(WarpState& st) {
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int c = 0; c < 4; ++c) st.o[m][c] = 0.f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    st.m[j] = kNegInf;
    st.l[j] = st.ps[j] = st.mn[j] = 0.f;
  }
  st.int2 = false;
}

__device__ __forceinline__ float warp_sum_g(float v) {  // over the 8 lanes of one t
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 16);
  return v;
}
__device__ __forceinline__ float warp_max_g(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
  return v;
}

// Converts the accumulator between layouts through `buf` ([8 heads][128] floats, this warp's).
__device__ void to_natural(WarpState& st, float* buf, int g, int t) {
  if (!st.int2) return;
  float ps[2], mn[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    ps[j] = warp_sum_g(st.ps[j]);
    mn[j] = warp_sum_g(st.mn[j]);
  }
  __syncwarp();
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        buf[(2 * t + j) * 128 + d_int2(m, r, g)] =
            (st.o[m][2 * r + j] - 1024.f * ps[j]) / f_int2(m, r) + mn[j];
  __syncwarp();
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 2; ++j) st.o[m][2 * r + j] = buf[(2 * t + j) * 128 + d_natural(m, r, g)];
  __syncwarp();
  st.ps[0] = st.ps[1] = st.mn[0] = st.mn[1] = 0.f;
  st.int2 = false;
}

__device__ void to_int2(WarpState& st, float* buf, int g, int t) {
  if (st.int2) return;
  __syncwarp();
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 2; ++j) buf[(2 * t + j) * 128 + d_natural(m, r, g)] = st.o[m][2 * r + j];
  __syncwarp();
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        st.o[m][2 * r + j] = buf[(2 * t + j) * 128 + d_int2(m, r, g)] * f_int2(m, r);
  __syncwarp();
  st.ps[0] = st.ps[1] = st.mn[0] = st.mn[1] = 0.f;
  st.int2 = true;
}

__device__ __forceinline__ float fast_exp2(float x) {  // 2^x; 2^-inf = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Moves the running references to n0, n1 (heads 2t, 2t+1): every accumulated quantity is
// relative to them, so it is scaled by a = 2^(m_old − m_new).
__device__ __forceinline__ void raise_reference(WarpState& st, float n0, float n1, float a0,
                                                float a1) {
  st.m[0] = n0;
  st.m[1] = n1;
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    st.o[m][0] *= a0;
    st.o[m][1] *= a1;
    st.o[m][2] *= a0;
    st.o[m][3] *= a1;
  }
  st.l[0] *= a0;
  st.l[1] *= a1;
  st.ps[0] *= a0;
  st.ps[1] *= a1;
  st.mn[0] *= a0;
  st.mn[1] *= a1;
}

// The running reference m of a head is raised only when some key exceeds it by more than
// kLazyMax (log2 units): then p <= 2^kLazyMax, and in most tiles no cross-lane max, no exp of a
// correction factor and no rescaling of the accumulator are needed. Any reference works for the
// partial state (o and ℓ are relative to it) and for the merges. kLazyMax = 2 keeps p·s_V of the
// INT2 tiles far inside fp16 (s_V < 16384).
constexpr float kLazyMax = 2.f;

// Online-softmax update with N tiles' scores s (fragment layout: [0] key g head 2t, [1] key g
// head 2t+1, [2] key g+8 head 2t, [3] key g+8 head 2t+1); returns p = 2^(s - m).
template <int N>
__device__ __forceinline__ void softmax_update(WarpState& st, const float (&s)[N][4],
                                               float (&p)[N][4]) {
  float mx0 = fmaxf(s[0][0], s[0][2]), mx1 = fmaxf(s[0][1], s[0][3]);
#pragma unroll
  for (int i = 1; i < N; ++i) {
    mx0 = fmaxf(mx0, fmaxf(s[i][0], s[i][2]));
    mx1 = fmaxf(mx1, fmaxf(s[i][1], s[i][3]));
  }
  if (__any_sync(0xffffffffu, mx0 > st.m[0] + kLazyMax || mx1 > st.m[1] + kLazyMax)) {
    mx0 = warp_max_g(mx0);
    mx1 = warp_max_g(mx1);
    const float n0 = fmaxf(st.m[0], mx0), n1 = fmaxf(st.m[1], mx1);
    const float u0 = n0 == kNegInf ? 0.f : n0, u1 = n1 == kNegInf ? 0.f : n1;
    const float a0 = fast_exp2(st.m[0] - u0), a1 = fast_exp2(st.m[1] - u1);
    raise_reference(st, n0, n1, a0, a1);
  }
  const float u0 = st.m[0] == kNegInf ? 0.f : st.m[0], u1 = st.m[1] == kNegInf ? 0.f : st.m[1];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    p[i][0] = fast_exp2(s[i][0] - u0);
    p[i][1] = fast_exp2(s[i][1] - u1);
    p[i][2] = fast_exp2(s[i][2] - u0);
    p[i][3] = fast_exp2(s[i][3] - u1);
    st.l[0] += p[i][0] + p[i][2];
    st.l[1] += p[i][1] + p[i][3];
  }
}

// The same update for scores given relative to the running reference, t = s − u (u = m, or 0
// while m is −inf): the INT2 tiles fold u into their score arithmetic, so the common case (no
// key above u + kLazyMax) is the exponentials and ℓ alone. t is shifted in place when the
// reference moves.
template <int N>
__device__ __forceinline__ void softmax_update_rel(WarpState& st, float (&t)[N][4],
                                                   float (&p)[N][4]) {
  float mx0 = fmaxf(t[0][0], t[0][2]), mx1 = fmaxf(t[0][1], t[0][3]);
#pragma unroll
  for (int i = 1; i < N; ++i) {
    mx0 = fmaxf(mx0, fmaxf(t[i][0], t[i][2]));
    mx1 = fmaxf(mx1, fmaxf(t[i][1], t[i][3]));
  }
  const float thr0 = st.m[0] == kNegInf ? kNegInf : kLazyMax;
  const float thr1 = st.m[1] == kNegInf ? kNegInf : kLazyMax;
  if (__any_sync(0xffffffffu, mx0 > thr0 || mx1 > thr1)) {
    const float u0 = st.m[0] == kNegInf ? 0.f : st.m[0], u1 = st.m[1] == kNegInf ? 0.f : st.m[1];
    mx0 = warp_max_g(mx0) + u0;  // the group's largest score s
    mx1 = warp_max_g(mx1) + u1;
    const float n0 = fmaxf(st.m[0], mx0), n1 = fmaxf(st.m[1], mx1);
    const float v0 = n0 == kNegInf ? 0.f : n0, v1 = n1 == kNegInf ? 0.f : n1;
    const float a0 = fast_exp2(st.m[0] - v0), a1 = fast_exp2(st.m[1] - v1);
    const float d0 = v0 - u0, d1 = v1 - u1;  // the reference moves by d
    raise_reference(st, n0, n1, a0, a1);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      t[i][0] -= d0;
      t[i][1] -= d1;
      t[i][2] -= d0;
      t[i][3] -= d1;
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) p[i][c] = fast_exp2(t[i][c]);
    st.l[0] += p[i][0] + p[i][2];
    st.l[1] += p[i][1] + p[i][3];
  }
}

// Q fragments (B operand of S^T = K·Q^T) for exact tiles: natural d order, BF16, pre-scaled.
struct QExact {
  uint32_t b[8][2];
};
__device__ __forceinline__ void make_q_exact(QExact& qf, const float* qrow, float sl, int t) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int d = 16 * s + 2 * t;
    qf.b[s][0] = qrow ? pack_bf16(qrow[d] * sl, qrow[d + 1] * sl) : 0u;
    qf.b[s][1] = qrow ? pack_bf16(qrow[d + 8] * sl, qrow[d + 9] * sl) : 0u;
  }
}

// Q fragments for INT2 tiles: k-step s = 4w + qq reads bytes 8t + 4w + {0,2 | 1,3} at quarter qq
// of the key rows, i.e. d = 8t + 4w + {0, 2 | 1, 3} + 32·qq; values scaled by 4^-qq (exact).
struct QInt2 {
  uint32_t b[8][2];
  float off[2];  // heads 2t, 2t+1: 1024·Σ fp16 operands
  float sum[2];  // heads 2t, 2t+1: Σ q (scaled, FP32)
};
__device__ __forceinline__ void make_q_int2(QInt2& qf, const float* qrow, float sl, int g, int t) {
  float offp = 0.f, sump = 0.f;
#pragma unroll
  for (int w = 0; w < 2; ++w)
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
      const int s = 4 * w + qq;
      const int d = 8 * t + 4 * w + 32 * qq;
      const float f = sl / static_cast<float>(1 << (2 * qq));
      float v0 = 0.f, v1 = 0.f, v2 = 0.f, v3 = 0.f;
      if (qrow) {
        v0 = qrow[d];
        v1 = qrow[d + 2];
        v2 = qrow[d + 1];
        v3 = qrow[d + 3];
      }
      qf.b[s][0] = pack_f16(v0 * f, v1 * f);
      qf.b[s][1] = pack_f16(v2 * f, v3 * f);
      const float2 h0 = unpack_f16(qf.b[s][0]), h1 = unpack_f16(qf.b[s][1]);
      offp += (h0.x + h0.y) + (h1.x + h1.y);
      sump += ((v0 + v1) + (v2 + v3)) * sl;
    }
  offp += __shfl_xor_sync(0xffffffffu, offp, 1);
  offp += __shfl_xor_sync(0xffffffffu, offp, 2);
  sump += __shfl_xor_sync(0xffffffffu, sump, 1);
  sump += __shfl_xor_sync(0xffffffffu, sump, 2);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    qf.off[j] = 1024.f * __shfl_sync(0xffffffffu, offp, (2 * t + j) * 4);
    qf.sum[j] = __shfl_sync(0xffffffffu, sump, (2 * t + j) * 4);
  }
}

// One exact tile from a swizzled BF16 stage: K at kst, V at vst (each [16][128] bf16, 16-byte
// chunk c of row r stored at chunk c ^ (r & 7)); n_valid keys (the rest are zero rows); columns
// >= n_cols (no query head, or a packed INT2 column copy: int2_pair_packed) stay empty.
__device__ __forceinline__ void exact_tile(WarpState& st, const QExact& qf, uint32_t kst,
                                           uint32_t vst, int n_valid, int n_cols, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float acc[2][4] = {};
  {
    const int row = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int chi = lane >> 4;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      uint32_t a[4];
      oscar::cuda::ldmatrix_x4(a, kst + row * 256 + (((2 * s + chi) ^ (row & 7)) << 4));
      oscar::cuda::mma_bf16(acc[s & 1], a[0], a[1], a[2], a[3], qf.b[s][0], qf.b[s][1]);
    }
  }
  float s[1][4], p[1][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) s[0][i] = acc[0][i] + acc[1][i];
  if (g >= n_valid) s[0][0] = s[0][1] = kNegInf;
  if (g + 8 >= n_valid) s[0][2] = s[0][3] = kNegInf;
  if (2 * t >= n_cols) s[0][0] = s[0][2] = kNegInf;
  if (2 * t + 1 >= n_cols) s[0][1] = s[0][3] = kNegInf;
  softmax_update<1>(st, s, p);
  const uint32_t b0 = oscar::cuda::movmatrix_trans(pack_bf16(p[0][0], p[0][1]));
  const uint32_t b1 = oscar::cuda::movmatrix_trans(pack_bf16(p[0][2], p[0][3]));
  {
    const int row = (lane & 7) + ((lane >> 4) << 3);
    const int chi = (lane >> 3) & 1;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      uint32_t a[4];
      oscar::cuda::ldmatrix_x4_trans(a, vst + row * 256 + (((2 * m + chi) ^ (row & 7)) << 4));
      oscar::cuda::mma_bf16(st.o[m], a[0], a[1], a[2], a[3], b0, b1);
    }
  }
}

// K side of two INT2 tiles (head_dim 128, group 128, uniform): stage = [K0 | V0 | K1 | V1], each
// 16 rows of 36 bytes. acc[i] = Σ_d q_d c_d of tile i's keys g, g+8 (accumulator fragment): the
// MMAs accumulate from −off (the 1024-offsets of the K operands). Two independent tiles give the
// scheduler independent MMA chains (four chains, two a tile, measured 2% slower on the H200).
__device__ __forceinline__ void int2_k_pair(float (&acc)[2][4], const QInt2& qf,
                                            const uint8_t* stage, int g, int t, uint32_t M) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    acc[i][0] = acc[i][2] = -qf.off[0];
    acc[i][1] = acc[i][3] = -qf.off[1];
  }
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    uint32_t x[2][2], y[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* ks = stage + i * 1152;
      x[i][0] = lds32(ks + 36 * g + 8 * t + 4 * w);
      x[i][1] = lds32(ks + 36 * (g + 8) + 8 * t + 4 * w);
      y[i][0] = x[i][0] >> 8;
      y[i][1] = x[i][1] >> 8;
    }
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
      const uint32_t mask = 0x00030003u << (2 * qq);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        oscar::cuda::mma_f16(acc[i], mask_or(x[i][0], mask, M), mask_or(x[i][1], mask, M),
                             mask_or(y[i][0], mask, M), mask_or(y[i][1], mask, M),
                             qf.b[4 * w + qq][0], qf.b[4 * w + qq][1]);
    }
  }
}

// Relative scores t = s − u = s_K·acc + (min_K·Σq − u) of one tile's keys g, g+8 (ks: its K
// rows), in the softmax fragment layout; u the running reference. Keys >= nv are masked.
__device__ __forceinline__ void int2_scores(const WarpState& st, const QInt2& qf,
                                            const float (&acc)[4], const uint8_t* ks, int nv,
                                            int g, float (&s)[4]) {
  const float2 km0 = unpack_f16(lds32(ks + 36 * g + 32));
  const float2 km1 = unpack_f16(lds32(ks + 36 * (g + 8) + 32));
  const float u0 = st.m[0] == kNegInf ? 0.f : st.m[0], u1 = st.m[1] == kNegInf ? 0.f : st.m[1];
  s[0] = fmaf(km0.x, acc[0], fmaf(km0.y, qf.sum[0], -u0));
  s[1] = fmaf(km0.x, acc[1], fmaf(km0.y, qf.sum[1], -u1));
  s[2] = fmaf(km1.x, acc[2], fmaf(km1.y, qf.sum[0], -u0));
  s[3] = fmaf(km1.x, acc[3], fmaf(km1.y, qf.sum[1], -u1));
  if (nv < kTileTokens) {  // only at the end of a warp's tiles
    if (g >= nv) s[0] = s[1] = kNegInf;
    if (g + 8 >= nv) s[2] = s[3] = kNegInf;
  }
}

// One tile's weights p (softmax fragment layout) -> PV's B fragments b0, b1 = P^T·s_V in fp16
// (vs: its V rows), with the bookkeeping of Σ p·min_V and Σ fp16(p·s_V).
__device__ __forceinline__ void int2_p_to_b(WarpState& st, const float (&p)[4],
                                            const uint8_t* vs, int g, uint32_t& b0,
                                            uint32_t& b1) {
  const float2 vm0 = unpack_f16(lds32(vs + 36 * g + 32));
  const float2 vm1 = unpack_f16(lds32(vs + 36 * (g + 8) + 32));
  st.mn[0] += p[0] * vm0.y + p[2] * vm1.y;
  st.mn[1] += p[1] * vm0.y + p[3] * vm1.y;
  const uint32_t h0 = pack_f16(p[0] * vm0.x, p[1] * vm0.x);
  const uint32_t h1 = pack_f16(p[2] * vm1.x, p[3] * vm1.x);
  {
    const float2 f0 = unpack_f16(h0), f1 = unpack_f16(h1);
    st.ps[0] += f0.x + f1.x;
    st.ps[1] += f0.y + f1.y;
  }
  b0 = oscar::cuda::movmatrix_trans(h0);
  b1 = oscar::cuda::movmatrix_trans(h1);
}

// O^T += V_tile^T · B for one INT2 tile (vs: its V rows), B = (b0, b1) the P^T fragments.
__device__ __forceinline__ void int2_v_tile(WarpState& st, const uint8_t* vs, uint32_t b0,
                                            uint32_t b1, int g, int t, uint32_t M) {
  // V rows of keys 2t, 2t+1, 2t+8, 2t+9: bytes 4g..4g+3 (d = 4g + b + 32·qq).
  const uint32_t v0 = lds32(vs + 36 * (2 * t) + 4 * g);
  const uint32_t v1 = lds32(vs + 36 * (2 * t + 1) + 4 * g);
  const uint32_t v8 = lds32(vs + 36 * (2 * t + 8) + 4 * g);
  const uint32_t v9 = lds32(vs + 36 * (2 * t + 9) + 4 * g);
#pragma unroll
  for (int bp = 0; bp < 2; ++bp) {
    // [key 2t byte 2bp, key 2t byte 2bp+1, key 2t+1 byte 2bp, key 2t+1 byte 2bp+1]
    const uint32_t X = __byte_perm(v0, v1, bp ? 0x7632 : 0x5410);
    const uint32_t Z = __byte_perm(v8, v9, bp ? 0x7632 : 0x5410);
    const uint32_t Xl = X << 8, Xh = X >> 8, Zl = Z << 8, Zh = Z >> 8;
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
      // Row g: byte 2bp (low bytes of the halves); row g+8: byte 2bp+1 (high bytes). Quarter
      // 0 is moved to bits 8-9 (F = 256); quarters 1-3 stay at bits 2qq (F = 4^qq).
      uint32_t lx, lz, hx, hz;
      const uint32_t mq = 0x00030003u << (2 * qq);
      if (qq == 0) {
        lx = mask_or(Xl, 0x03000300u, M);
        lz = mask_or(Zl, 0x03000300u, M);
        hx = mask_or(X, 0x03000300u, M);
        hz = mask_or(Z, 0x03000300u, M);
      } else {
        lx = mask_or(X, mq, M);
        lz = mask_or(Z, mq, M);
        hx = mask_or(Xh, mq, M);
        hz = mask_or(Zh, mq, M);
      }
      oscar::cuda::mma_f16(st.o[2 * qq + bp], lx, hx, lz, hz, b0, b1);
    }
  }
}

// Two INT2 tiles per step, every column its own head (groups of 5-8 query heads, and the
// previous kernel, DecodeAttnCudaOptions::int2_kernel = 1); nv0, nv1 valid keys of each (0: no
// tile, a zero-filled stage).
__device__ __forceinline__ void int2_pair(WarpState& st, const QInt2& qf, const uint8_t* stage,
                                          int nv0, int nv1, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint32_t M = magic_reg();
  float acc[2][4];
  int2_k_pair(acc, qf, stage, g, t, M);
  float s[2][4], p[2][4];
  int2_scores(st, qf, acc[0], stage, nv0, g, s[0]);
  int2_scores(st, qf, acc[1], stage + 1152, nv1, g, s[1]);
  softmax_update_rel<2>(st, s, p);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint32_t b0, b1;
    int2_p_to_b(st, p[i], stage + i * 1152 + 576, g, b0, b1);
    int2_v_tile(st, stage + i * 1152 + 576, b0, b1, g, t, M);
  }
}

// Two INT2 tiles per step packed into the 8 columns of one softmax fragment, for groups of <= 4
// query heads (Qwen3's GQA 4), where half of the columns would otherwise be empty. Column c
// holds head c % 4 over tile c / 4: the K MMAs run as in int2_pair (both tiles, Q of head g % 4
// in column g), and lane (g, t) keeps tile t / 2's scores, so the softmax, the metadata and the
// P bookkeeping run once per pair instead of once per tile. PV: tile i's MMA takes P^T with the
// columns of the other tile zeroed, so O^T column c accumulates tile c / 4's keys only. The two
// column copies of a head are two partial states, merged by log-sum-exp with the warps'.
__device__ __forceinline__ void int2_pair_packed(WarpState& st, const QInt2& qf,
                                                 const uint8_t* stage, int nv0, int nv1,
                                                 int lane) {
  const int g = lane >> 2, t = lane & 3, mine = t >> 1;
  const uint32_t M = magic_reg();
  float acc[2][4];
  int2_k_pair(acc, qf, stage, g, t, M);
  float a[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) a[c] = mine ? acc[1][c] : acc[0][c];
  float s[1][4], p[1][4];
  int2_scores(st, qf, a, stage + mine * 1152, mine ? nv1 : nv0, g, s[0]);
  softmax_update_rel<1>(st, s, p);
  uint32_t b0, b1;
  int2_p_to_b(st, p[0], stage + mine * 1152 + 576, g, b0, b1);
  // Columns g of P^T: tile 0's for g < 4, tile 1's for g >= 4.
  const uint32_t keep0 = g < 4 ? 0xffffffffu : 0u;
  int2_v_tile(st, stage + 576, b0 & keep0, b1 & keep0, g, t, M);
  int2_v_tile(st, stage + 1152 + 576, b0 & ~keep0, b1 & ~keep0, g, t, M);
}

// Dequantizes half of one staged raw history row (head_dim 128, any bits/quantizer, group G) into
// a swizzled BF16 row of the exact-tile layout: elements [64h, 64h + 64). Inside a group, the
// codes of one quarter (R = G/4 elements) sit in R consecutive bytes ("by quarters"), so the
// half row is 64/R runs of R consecutive d, each written as 16-byte chunks of 8 values; the bit
// planes "by eighths" give element j of a quarter qq at byte j % (R/2), bit 2qq + j / (R/2).
// Same values as dequant_element (min + q·s, μ + level[q]·σ, lo/hi), then rounded to BF16.
template <int G>
__device__ __forceinline__ void dequant_half_row(const KernelArgs& a, const uint8_t* row, int bits,
                                                 uint8_t* dst, int r, int h) {
  const int uniform = a.uniform;
  constexpr int R = G / 4;
  const int meta_off = bits == 3 ? 48 : (bits == 1 ? 16 : 32);
  const int plane_off = bits == 3 ? 32 : 0;  // the bit plane "by eighths" (3-bit high / 1-bit)
#pragma unroll 1
  for (int run = 0; run < 64 / R; ++run) {
    const int e0 = 64 * h + run * R;
    const int gi = e0 / G, qq = (e0 % G) / R;
    const uint32_t meta = lds32(row + meta_off + 4 * gi);
    const float s0 = fp16_bits_to_f32(meta), s1 = fp16_bits_to_f32(meta >> 16);
#pragma unroll 1
    for (int j0 = 0; j0 < R; j0 += 8) {
      uint8_t* chunk = dst + ((((e0 + j0) >> 3) ^ (r & 7)) << 4);
      const uint32_t w0 = bits == 1 ? 0u : lds32(row + gi * R + j0);
      const uint32_t w1 = bits == 1 ? 0u : lds32(row + gi * R + j0 + 4);
#pragma unroll 1
      for (int k = 0; k < 8; k += 2) {
        float x[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int j = j0 + k + u;
          const int pb =
              bits == 2 ? 0
                        : (row[plane_off + gi * (R / 2) + j % (R / 2)] >> (2 * qq + j / (R / 2))) & 1;
          if (bits == 1) {
            x[u] = pb ? s1 : s0;  // lo / hi
            continue;
          }
          int q = static_cast<int>((((k + u) < 4 ? w0 : w1) >> (8 * ((k + u) & 3) + 2 * qq)) & 3u);
          if (bits == 3) q |= pb << 2;
          if (uniform || bits == 3) {
            x[u] = s1 + static_cast<float>(q) * s0;  // min + q·s
          } else {
            const float lv = (q & 2) ? ((q & 1) ? a.lloyd_levels[3] : a.lloyd_levels[2])
                                     : ((q & 1) ? a.lloyd_levels[1] : a.lloyd_levels[0]);
            x[u] = s1 + lv * s0;  // μ + level[q]·σ
          }
        }
        *reinterpret_cast<uint32_t*>(chunk + 2 * k) = pack_bf16(x[0], x[1]);
      }
    }
  }
}

// The 4-bit row (quant/int4_layout.h) version of dequant_half_row: inside a group the codes of
// one half (H = G/2 elements) sit in H consecutive bytes, element j of half hh in byte j at
// nibble hh ("by halves"), so the half row is 64/H runs of H consecutive d. Same values as
// dequant_element (min + q·s), then rounded to BF16.
template <int G>
__device__ __forceinline__ void dequant_half_row_int4(const uint8_t* row, uint8_t* dst, int r,
                                                      int h) {
  constexpr int H = G / 2;
#pragma unroll 1
  for (int run = 0; run < 64 / H; ++run) {
    const int e0 = 64 * h + run * H;
    const int gi = e0 / G, hh = (e0 % G) / H;
    const uint32_t meta = lds32(row + 64 + 4 * gi);  // codes: head_dim / 2 = 64 bytes
    const float s0 = fp16_bits_to_f32(meta), s1 = fp16_bits_to_f32(meta >> 16);
#pragma unroll 1
    for (int j0 = 0; j0 < H; j0 += 8) {
      uint8_t* chunk = dst + ((((e0 + j0) >> 3) ^ (r & 7)) << 4);
      const uint32_t w0 = lds32(row + gi * H + j0);
      const uint32_t w1 = lds32(row + gi * H + j0 + 4);
#pragma unroll
      for (int k = 0; k < 8; k += 2) {
        float x[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int q =
              static_cast<int>((((k + u) < 4 ? w0 : w1) >> (8 * ((k + u) & 3) + 4 * hh)) & 15u);
          x[u] = s1 + static_cast<float>(q) * s0;  // min + q·s
        }
        *reinterpret_cast<uint32_t*>(chunk + 2 * k) = pack_bf16(x[0], x[1]);
      }
    }
  }
}

// Dequantizes a staged raw tile (16 K rows of rb_k bytes, then 16 V rows of rb_v bytes) into the
// swizzled BF16 tile layout of exact_tile. Lane: row lane/2, elements [64·(lane&1), +64).
__device__ __noinline__ void dequant_tile(const KernelArgs& a, const uint8_t* raw, int rb_k,
                                             int rb_v, int bits_k, int bits_v, uint8_t* kdst,
                                             uint8_t* vdst, int lane) {
  const int r = lane >> 1, h = lane & 1;
#pragma unroll 1
  for (int kv = 0; kv < 2; ++kv) {
    const uint8_t* row = kv == 0 ? raw + r * rb_k : raw + 16 * rb_k + r * rb_v;
    const int bits = kv == 0 ? bits_k : bits_v;
    uint8_t* dst = (kv == 0 ? kdst : vdst) + r * 256;
    if (bits == 4) {
      if (a.group_size == 128)
        dequant_half_row_int4<128>(row, dst, r, h);
      else if (a.group_size == 64)
        dequant_half_row_int4<64>(row, dst, r, h);
      else
        dequant_half_row_int4<32>(row, dst, r, h);
    } else if (a.group_size == 128)
      dequant_half_row<128>(a, row, bits, dst, r, h);
    else if (a.group_size == 64)
      dequant_half_row<64>(a, row, bits, dst, r, h);
    else
      dequant_half_row<32>(a, row, bits, dst, r, h);
  }
}

// Software pipeline over a warp's n tiles: NST stages, load(k, stage) issues tile k's cp.async
// copies, compute(k, stage) consumes it; issued() runs once the first NST - 1 tiles' copies are
// on their way (work that waits on its own loads meanwhile). The stages advance by counters (no
// k % NST per tile).
template <int NST, class Load, class Issued, class Compute>
__device__ __forceinline__ void pipeline(int n, Load&& load, Issued&& issued, Compute&& compute) {
#pragma unroll
  for (int j = 0; j < NST - 1; ++j) {
    if (j < n) load(j, j);
    oscar::cuda::cp_async_commit();
  }
  issued();
  int ls = NST - 1, cs = 0;  // stages of the next load and the next compute
#pragma unroll 1
  for (int k = 0; k < n; ++k) {
    if (k + NST - 1 < n) load(k + NST - 1, ls);
    oscar::cuda::cp_async_commit();
    oscar::cuda::cp_async_wait<NST - 1>();
    __syncwarp();
    compute(k, cs);
    __syncwarp();
    ls = ls == NST - 1 ? 0 : ls + 1;
    cs = cs == NST - 1 ? 0 : cs + 1;
  }
  oscar::cuda::cp_async_wait<0>();
  __syncwarp();
}
template <int NST, class Load, class Compute>
__device__ __forceinline__ void pipeline(int n, Load&& load, Compute&& compute) {
  pipeline<NST>(n, load, [] {}, compute);
}

// Page ids of a warp's tiles are prefetched 32 at a time (lane j holds the page of the warp's
// tile base + j) for page sizes that are multiples of 16 (a tile inside one page), so that no
// cp.async waits on a page-table load.
template <int kPage, class TileOf>
__device__ __forceinline__ int prefetch_page(const KernelArgs& a, const PageTableView& pt,
                                             int pbase, int n, int k, TileOf tile_of) {
  if (k >= n) return 0;
  return pt.page_ids[pbase + page_index<kPage>(a, tile_of(k) * kTileTokens)];
}

// The whole block: see the file comment. kPage: the page size when fixed at compile time (16,
// the default: the tile loads reduce to a page id and constant per-lane offsets), 0 for any.
// kInt2 (DecodeAttnCudaOptions::int2_kernel; one instance each, so that each has its own
// register allocation): 0 packed INT2 pairs for groups of <= 4 heads, the Q fragments built
// while the first tiles' copies are in flight; 1 the kernel of main before them (int2_pair
// everywhere), kept to measure the two side by side.
template <int kRingBytes, int kMinBlocks, int kPage, int kInt2>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    decode_attn_kernel(const __grid_constant__ KernelArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  // Before pdl_wait (common.cuh): only the step plan (page tables) and the cache spec are read.
  oscar::cuda::pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / a.n_hgroups, hg = blockIdx.y % a.n_hgroups;
  const int seq = blockIdx.z;
  const int P = kPage > 0 ? kPage : a.page_size;
  const int head0 = kvh * a.gqa + hg * kGroupHeads;
  const int nh = min(kGroupHeads, a.gqa - hg * kGroupHeads);

  const int64_t n_tok0 = a.sinks.seq_len(seq, P), n_tok1 = a.history.seq_len(seq, P),
                n_tok2 = a.recent.seq_len(seq, P);
  const int n_tiles0 = ceil_tiles(n_tok0), n_tiles1 = ceil_tiles(n_tok1),
            n_tiles2 = ceil_tiles(n_tok2);
  const int U = split_units(n_tiles0, n_tiles1, n_tiles2);
  const int eff = effective_splits(U, a.n_splits);
  if (split >= eff) return;
  // This split's units [u0, u1); a tile belongs to the split holding its first unit.
  const int u0 = static_cast<int>(static_cast<int64_t>(split) * U / eff);
  const int u1 = static_cast<int>(static_cast<int64_t>(split + 1) * U / eff);

  uint8_t* ring = smem + warp * kRingBytes;
  const uint32_t ring_s = smem_addr(ring);
  float* convbuf = reinterpret_cast<float*>(ring);
  const float* qrow = g < nh ? a.q + (static_cast<int64_t>(seq) * a.n_heads_q + head0 + g) * 128
                             : nullptr;

  WarpState st;
  state_init(st);

  uint32_t off_k, off_v;
  int rb_k, rb_v, bits_k, bits_v;
  hist_plane(a, 0, kvh, off_k, rb_k, bits_k);
  hist_plane(a, 1, kvh, off_v, rb_v, bits_v);
  const uint64_t hpb = hist_page_bytes(a);
  const bool fast_int2 = !a.force_generic && a.uniform && a.group_size == 128 && bits_k == 2 &&
                         bits_v == 2 && rb_k == 36 && rb_v == 36;
  // INT2 tiles packed two per softmax fragment (int2_pair_packed) when the group has <= 4 heads:
  // column c is head c % 4, so lane (g, t) reads the q row of head g % 4 for the K MMAs.
  const bool packed = fast_int2 && kInt2 == 0 && nh <= 4;

  int ustart = 0;
#pragma unroll 1
  for (int r = 0; r < 3; ++r) {
    const int nt_r = r == 0 ? n_tiles0 : (r == 1 ? n_tiles1 : n_tiles2);
    const int cost = region_units(r), uend = ustart + cost * nt_r;
    const int lo = (max(u0, ustart) - ustart + cost - 1) / cost;
    const int hi = (min(u1, uend) - ustart + cost - 1) / cost;
    ustart = uend;
    if (lo >= hi) continue;
    const PageTableView pt = r == 0 ? a.sinks : (r == 1 ? a.history : a.recent);
    const int pbase = pt.indptr[seq];
    const int ntk = static_cast<int>(r == 0 ? n_tok0 : (r == 1 ? n_tok1 : n_tok2));
    const int n_my = (hi - lo - warp + kWarps - 1) / kWarps;  // tiles lo + warp + 4k < hi
    auto tile_of = [&](int k) { return lo + warp + kWarps * k; };

    if (r == 1 && fast_int2) {
      // ---- INT2 history tiles -------------------------------------------------------------
      constexpr int kStage = 2304, NST = kRingBytes / kStage;  // a pair of tiles per stage
      static_assert(kStage * NST <= kRingBytes);
      int pf_cur = 0, pf_nxt = 0;
      if (P % kTileTokens == 0) {
        pf_cur = prefetch_page<kPage>(a, pt, pbase, n_my, lane, tile_of);
        pf_nxt = prefetch_page<kPage>(a, pt, pbase, n_my, 32 + lane, tile_of);
      }
      oscar::cuda::pdl_wait();  // q and the pages: written by earlier kernels
      to_int2(st, convbuf, g, t);
      QInt2 qf;
      const float* qrow_i2 =
          !packed ? qrow
                  : ((g & 3) < nh ? a.q + (static_cast<int64_t>(seq) * a.n_heads_q + head0 +
                                           (g & 3)) * 128
                                  : nullptr);
      // The Q fragments wait on q's loads: in main's kernel (kInt2 1) before the first tiles'
      // copies are issued, otherwise while they are in flight (one memory round trip less
      // before the first tile).
      auto build_q = [&] { make_q_int2(qf, qrow_i2, a.scale_log2, g, t); };
      if constexpr (kInt2 == 1) build_q();
      const int n_pairs = (n_my + 1) / 2;
      // A tile's K and V rows are 576 contiguous bytes each in their page: 72 chunks of 16
      // bytes, staged as [K | V]; lane copies chunks lane, 32 + lane and (lanes < 8) 64 + lane,
      // at byte offsets from the tile's first row fixed for the whole loop.
      // A chunk's source is then one 32 x 32 -> 64-bit multiply-add (page · page bytes + the
      // lane's pool pointer; the host checks the page bytes fit 32 bits), its destination a
      // constant offset from the stage's: a missing tile (past the warp's last) reads page 0 with
      // size 0, i.e. zero-fills, so no pointer is selected per chunk.
      const uint8_t* lane_src[3];
#pragma unroll
      for (int c3 = 0; c3 < 3; ++c3) {
        const int c = 32 * c3 + lane, kv = c >= 36;
        lane_src[c3] = a.hist_pool + (kv ? off_v : off_k) + 16 * (c - 36 * kv);
      }
      const uint32_t hpb32 = static_cast<uint32_t>(hpb);
      const uint32_t lane_dst = ring_s + 16 * lane;
      const bool skip_loads = a.debug_flags & 2;
      if (skip_loads) {  // zero codes and metadata: finite scores, no rescaling after the first
        for (int i = lane; i < kRingBytes / 16; i += 32)
          reinterpret_cast<uint4*>(ring)[i] = make_uint4(0u, 0u, 0u, 0u);
        __syncwarp();
      }
      auto load = [&](int j, int stg) {
        if (skip_loads) return;
        const uint32_t stage_dst = lane_dst + stg * kStage;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int k = 2 * j + i;
          const bool exists = k < n_my;
          const int tile = tile_of(k);
          if (P % kTileTokens == 0) {
            if (i == 0 && (k & 31) == 0 && k > 0) {
              pf_cur = pf_nxt;
              pf_nxt = prefetch_page<kPage>(a, pt, pbase, n_my, k + 32 + lane, tile_of);
            }
            // 0 past the warp's tiles (prefetch_page).
            const uint32_t page = __shfl_sync(0xffffffffu, pf_cur, k & 31);
            const uint32_t slot = kPage == kTileTokens ? 0u
                                  : page_slot<kPage>(a, tile * kTileTokens) * 36u;
#pragma unroll
            for (int c3 = 0; c3 < 3; ++c3)
              if (c3 < 2 || lane < 8)
                cp_async16(stage_dst + i * 1152 + 16 * 32 * c3,
                           lane_src[c3] + (static_cast<uint64_t>(page) * hpb32 + slot), exists);
          } else {  // pages of 8 tokens (or fewer): a tile spans several pages
            const uint32_t dst = ring_s + stg * kStage + i * 1152;
            const int run = P * 36;
#pragma unroll 1
            for (int c = lane; c < 72; c += 32) {
              const int kv = c >= 36, b = 16 * (c - 36 * kv), sub = b / run;
              const int tok = tile * kTileTokens + sub * P;
              const bool valid = exists && tok < ntk;
              const int page = valid ? pt.page_ids[pbase + page_index<kPage>(a, tok)] : 0;
              const uint8_t* src = a.hist_pool + static_cast<uint64_t>(page) * hpb +
                                   (kv ? off_v : off_k) + (b - sub * run);
              cp_async16(dst + 16 * c, valid ? src : a.hist_pool, valid);
            }
          }
        }
      };
      auto n_valid = [&](int k) {
        if (k >= n_my) return 0;
        return min(kTileTokens, ntk - tile_of(k) * kTileTokens);
      };
      const bool skip_compute = a.debug_flags & 1;
      // Only the region's last tile can be short, and it is its warp's last.
      auto valid_keys = [&](int j, int& nv0, int& nv1) {
        nv0 = nv1 = kTileTokens;
        if (2 * j + 2 >= n_my) {
          nv0 = n_valid(2 * j);
          nv1 = n_valid(2 * j + 1);
        }
      };
      // One instance of the loop per pair routine (a warp-uniform choice per block).
      auto run = [&](auto packed_c) {
        auto compute = [&](int j, int stg) {
          if (skip_compute) return;
          int nv0, nv1;
          valid_keys(j, nv0, nv1);
          if constexpr (decltype(packed_c)::value)
            int2_pair_packed(st, qf, ring + stg * kStage, nv0, nv1, lane);
          else
            int2_pair(st, qf, ring + stg * kStage, nv0, nv1, lane);
        };
        auto issued = [&] {
          if constexpr (kInt2 == 0) build_q();
        };
        pipeline<NST>(n_pairs, load, issued, compute);
      };
      if (packed)
        run(std::true_type{});
      else
        run(std::false_type{});
    } else if (r == 1) {
      // ---- generic history tiles: dequantize into a BF16 tile, then the exact path ---------
      oscar::cuda::pdl_wait();
      to_natural(st, convbuf, g, t);
      QExact qf;
      make_q_exact(qf, qrow, a.scale_log2, t);
      const int raw_bytes = 16 * (rb_k + rb_v);
      const int stage_bytes = (raw_bytes + 127) & ~127;
      // Raw stages of <= 16 x (80 + 80) bytes: the widest rows are 4-bit ones, 80 bytes at group
      // 32 (quant/int4_layout.h).
      constexpr int NST = (kRingBytes - 8192) / 2560;
      static_assert(NST >= 2);
      uint8_t* kbf = ring;  // [16][128] bf16, then V
      uint8_t* vbf = ring + 4096;
      uint8_t* raw0 = ring + 8192;
      const int n_chunks_k = rb_k, n_chunks = rb_k + rb_v;  // 16-byte chunks (16 rows each)
      auto load = [&](int k, int stg) {
        const uint32_t dst = smem_addr(raw0 + stg * stage_bytes);
        const int tile = tile_of(k);
#pragma unroll 1
        for (int c = lane; c < n_chunks; c += 32) {
          const int kv = c >= n_chunks_k;
          const int rb = kv ? rb_v : rb_k;
          const int b = 16 * (kv ? c - n_chunks_k : c);
          const int rows = min(P, kTileTokens), run = rows * rb, sub = b / run;
          const int64_t tok = static_cast<int64_t>(tile) * kTileTokens + sub * rows;
          const bool valid = tok < ntk;
          const int page = valid ? pt.page_ids[pbase + static_cast<int>(tok / P)] : 0;
          const uint8_t* src = a.hist_pool + static_cast<uint64_t>(page) * hpb +
                               (kv ? off_v : off_k) + (tok % P) * rb + (b - sub * run);
          cp_async16(dst + (kv ? 16 * rb_k : 0) + (b), valid ? src : a.hist_pool, valid);
        }
      };
      auto compute = [&](int k, int stg) {
        const int tile = tile_of(k);
        const int nv = min(kTileTokens, ntk - tile * kTileTokens);
        dequant_tile(a, raw0 + stg * stage_bytes, rb_k, rb_v, bits_k, bits_v, kbf, vbf, lane);
        __syncwarp();
        exact_tile(st, qf, smem_addr(kbf), smem_addr(vbf), nv, nh, lane);
      };
      pipeline<NST>(n_my, load, compute);
    } else {
      // ---- exact (BF16) tiles: sinks or recent ----------------------------------------------
      constexpr int kStage = 8192, NST = kRingBytes / kStage;
      static_assert(NST >= 1 && kStage * NST <= kRingBytes);
      const uint64_t plane_k = static_cast<uint64_t>(a.layer * 2 * a.n_heads_kv + kvh) * P * 256;
      const uint64_t plane_v = plane_k + static_cast<uint64_t>(a.n_heads_kv) * P * 256;
      int pf_cur = 0, pf_nxt = 0;
      if (P % kTileTokens == 0) {
        pf_cur = prefetch_page<kPage>(a, pt, pbase, n_my, lane, tile_of);
        pf_nxt = prefetch_page<kPage>(a, pt, pbase, n_my, 32 + lane, tile_of);
      }
      oscar::cuda::pdl_wait();
      to_natural(st, convbuf, g, t);
      QExact qf;
      make_q_exact(qf, qrow, a.scale_log2, t);
      auto load = [&](int k, int stg) {
        // Instruction i copies rows 2i, 2i+1 (512 contiguous bytes per plane when a tile lies in
        // one page): lane -> row 2i + lane/16, 16-byte chunk lane%16 (swizzled in the stage).
        const uint32_t dst = ring_s + stg * kStage;
        const int tile = tile_of(k);
        const int c = lane & 15;
        int page_tile = 0;
        if (P % kTileTokens == 0) {
          if ((k & 31) == 0 && k > 0) {
            pf_cur = pf_nxt;
            pf_nxt = prefetch_page<kPage>(a, pt, pbase, n_my, k + 32 + lane, tile_of);
          }
          page_tile = __shfl_sync(0xffffffffu, pf_cur, k & 31);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int row = 2 * i + (lane >> 4);
          const int tok = tile * kTileTokens + row;
          const bool valid = tok < ntk;
          int page = page_tile, slot;
          if (P % kTileTokens == 0) {
            slot = page_slot<kPage>(a, tile * kTileTokens) + row;
          } else {
            page = valid ? pt.page_ids[pbase + page_index<kPage>(a, tok)] : 0;
            slot = page_slot<kPage>(a, tok);
          }
          const uint8_t* base = a.exact_pool + static_cast<uint64_t>(page) * a.exact_page_bytes +
                                slot * 256 + 16 * c;
          const uint32_t so = row * 256 + ((c ^ (row & 7)) << 4);
          cp_async16(dst + so, valid ? base + plane_k : a.exact_pool, valid);
          cp_async16(dst + 4096 + so, valid ? base + plane_v : a.exact_pool, valid);
        }
      };
      auto compute = [&](int k, int stg) {
        const int tile = tile_of(k);
        if (a.debug_flags & 1) return;
        const int nv = min(kTileTokens, ntk - tile * kTileTokens);
        exact_tile(st, qf, ring_s + stg * kStage, ring_s + stg * kStage + 4096, nv, nh, lane);
      };
      pipeline<NST>(n_my, load, compute);
    }
  }
  oscar::cuda::pdl_wait();  // (a no-op after the first; a warp without tiles writes below too)
  to_natural(st, convbuf, g, t);

  // ---- merge the 4 warps, then the output or this split's partial ---------------------------
  float lt[2] = {warp_sum_g(st.l[0]), warp_sum_g(st.l[1])};
  __syncthreads();  // every warp is done with its ring
  constexpr int kWarpFloats = 8 * 128 + 16;
  float* ws = reinterpret_cast<float*>(smem) + warp * kWarpFloats;
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 2; ++j) ws[(2 * t + j) * 128 + d_natural(m, r, g)] = st.o[m][2 * r + j];
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      ws[8 * 128 + 2 * t + j] = st.m[j];
      ws[8 * 128 + 8 + 2 * t + j] = lt[j];
    }
  }
  __syncthreads();
  const int d = threadIdx.x;
  const float* w0 = reinterpret_cast<const float*>(smem);
  // Partial states of head h: column h of every warp, and column h + 4 with packed INT2 tiles.
  const int n_copies = packed ? 2 : 1;
#pragma unroll 1
  for (int h = 0; h < nh; ++h) {
    float M = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      for (int c = 0; c < n_copies; ++c)
        M = fmaxf(M, w0[w * kWarpFloats + 8 * 128 + h + 4 * c]);
    float L = 0.f, O = 0.f;
    if (M != kNegInf) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        for (int c = 0; c < n_copies; ++c) {
          const int col = h + 4 * c;
          const float mw = w0[w * kWarpFloats + 8 * 128 + col];
          if (mw == kNegInf) continue;
          const float f = exp2f(mw - M);
          L += f * w0[w * kWarpFloats + 8 * 128 + 8 + col];
          O += f * w0[w * kWarpFloats + col * 128 + d];
        }
    }
    const int64_t row = static_cast<int64_t>(seq) * a.n_heads_q + head0 + h;
    if (eff == 1) {
      a.out[row * 128 + d] = L > 0.f ? O / L : 0.f;
    } else {
      a.part_o[(row * a.n_splits + split) * 128 + d] = O;
      if (d == 0) {
        a.part_ml[(row * a.n_splits + split) * 2 + 0] = M;
        a.part_ml[(row * a.n_splits + split) * 2 + 1] = L;
      }
    }
  }
}

// Merges the split partials of one (sequence, query head): out = Σ o_i 2^(m_i - M) / Σ ℓ_i 2^(m_i
// - M). One block of 128 threads (head_dim) per row; sequences with one effective split were
// written directly. Every load is independent of the arithmetic: thread i reads split i's (m, ℓ)
// (one round trip for all splits), then warp w sums splits w, w+4, ... of o as float4 rows.
// (The first version walked the splits one dependent L2 load at a time, twice: ~20 µs at 66
// splits, most of a batch-1 call; docs/results/decode_attn_cuda.md, run 6.)
__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ KernelArgs a) {
  static_assert(kMaxSplits <= kThreads, "one thread per split's (m, l)");
  __shared__ float f[kMaxSplits];
  __shared__ float red_m[kWarps], red_l[kWarps];
  __shared__ float4 red_o[kWarps][32];
  oscar::cuda::pdl_trigger();
  oscar::cuda::pdl_wait();  // the partials of decode_attn_kernel
  const int seq = blockIdx.x / a.n_heads_q;
  const int P = a.page_size;
  const int U =
      split_units(ceil_tiles(a.sinks.seq_len(seq, P)), ceil_tiles(a.history.seq_len(seq, P)),
                  ceil_tiles(a.recent.seq_len(seq, P)));
  const int eff = effective_splits(U, a.n_splits);
  if (eff <= 1) return;
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const float* ml = a.part_ml + row * a.n_splits * 2;
  float mi = kNegInf, li = 0.f;
  if (tid < eff) {
    mi = ml[2 * tid];
    li = ml[2 * tid + 1];
  }
  float M = mi;
#pragma unroll
  for (int sh = 16; sh >= 1; sh >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, sh));
  if (lane == 0) red_m[warp] = M;
  __syncthreads();
  M = fmaxf(fmaxf(red_m[0], red_m[1]), fmaxf(red_m[2], red_m[3]));
  const float fi = mi == kNegInf ? 0.f : exp2f(mi - M);  // mi finite => M finite
  if (tid < kMaxSplits) f[tid] = fi;
  float L = fi * li;
#pragma unroll
  for (int sh = 16; sh >= 1; sh >>= 1) L += __shfl_xor_sync(0xffffffffu, L, sh);
  if (lane == 0) red_l[warp] = L;
  __syncthreads();
  L = (red_l[0] + red_l[1]) + (red_l[2] + red_l[3]);
  const float4* po = reinterpret_cast<const float4*>(a.part_o + row * a.n_splits * 128);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int i = warp; i < eff; i += kWarps) {
    const float4 v = po[i * 32 + lane];
    const float w = f[i];
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  red_o[warp][lane] = acc;
  __syncthreads();
  const float* ro = reinterpret_cast<const float*>(red_o);
  const float O = (ro[tid] + ro[128 + tid]) + (ro[256 + tid] + ro[384 + tid]);
  a.out[row * 128 + tid] = L > 0.f ? O / L : 0.f;
}

// ---- naive kernel ------------------------------------------------------------------------------
// One block of 4 warps per (query head, sequence); warp w takes keys w, w+4, ... over the three
// regions in position order, one key at a time; lane holds d = lane + 32i; FP32 throughout,
// every element dequantized by dequant_element. Any head_dim that is a multiple of 32 up to 256,
// any page size, BF16 or F32 exact pages.
__global__ void __launch_bounds__(kThreads) naive_kernel(const __grid_constant__ KernelArgs a) {
  __shared__ float red[kWarps][8 * 32 + 2];
  const int h = blockIdx.x, seq = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int D = a.head_dim, nd = D / 32, P = a.page_size;
  const int kvh = h / a.gqa;
  const float* qp = a.q + (static_cast<int64_t>(seq) * a.n_heads_q + h) * D;
  float qv[8], o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    qv[i] = i < nd ? qp[lane + 32 * i] * a.scale_log2 : 0.f;
    o[i] = 0.f;
  }
  float m = kNegInf, l = 0.f;
  const int64_t n0 = a.sinks.seq_len(seq, P), n1 = a.history.seq_len(seq, P),
                n2 = a.recent.seq_len(seq, P);
  uint32_t off[2];
  int rb[2], bits[2];
  hist_plane(a, 0, kvh, off[0], rb[0], bits[0]);
  hist_plane(a, 1, kvh, off[1], rb[1], bits[1]);
  const int eb = a.exact_elem_bytes;
  const uint64_t hpb = hist_page_bytes(a);
#pragma unroll 1
  for (int64_t pos = warp; pos < n0 + n1 + n2; pos += kWarps) {
    const int r = pos < n0 ? 0 : (pos < n0 + n1 ? 1 : 2);
    const int64_t j = r == 0 ? pos : (r == 1 ? pos - n0 : pos - n0 - n1);
    const PageTableView& pt = r == 0 ? a.sinks : (r == 1 ? a.history : a.recent);
    const int page = pt.page_ids[pt.indptr[seq] + static_cast<int>(j / P)];
    const int slot = static_cast<int>(j % P);
    float x[2][8];
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      if (r == 1) {
        const uint8_t* row = a.hist_pool + static_cast<uint64_t>(page) * hpb +
                             off[kv] + static_cast<uint64_t>(slot) * rb[kv];
#pragma unroll
        for (int i = 0; i < 8; ++i)
          x[kv][i] = i < nd ? dequant_element(row, lane + 32 * i, D, a.group_size, bits[kv],
                                              a.uniform, a.lloyd_levels)
                            : 0.f;
      } else {
        const uint8_t* row =
            a.exact_pool + static_cast<uint64_t>(page) * a.exact_page_bytes +
            ((static_cast<uint64_t>(a.layer * 2 + kv) * a.n_heads_kv + kvh) * P + slot) * D * eb;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (i >= nd) {
            x[kv][i] = 0.f;
          } else if (eb == 2) {
            x[kv][i] = __bfloat162float(
                *reinterpret_cast<const __nv_bfloat16*>(row + 2 * (lane + 32 * i)));
          } else {
            x[kv][i] = *reinterpret_cast<const float*>(row + 4 * (lane + 32 * i));
          }
        }
      }
    }
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) dot += qv[i] * x[0][i];
#pragma unroll
    for (int sh = 16; sh >= 1; sh >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, sh);
    const float mn = fmaxf(m, dot);
    const float alpha = exp2f(m - mn), p = exp2f(dot - mn);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = o[i] * alpha + p * x[1][i];
    m = mn;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (i < nd) red[warp][lane + 32 * i] = o[i];
  if (lane == 0) {
    red[warp][256] = m;
    red[warp][257] = l;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float M = kNegInf;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, red[w][256]);
    float L = 0.f, O = 0.f;
    if (M != kNegInf)
      for (int w = 0; w < kWarps; ++w) {
        if (red[w][256] == kNegInf) continue;
        const float f = exp2f(red[w][256] - M);
        L += f * red[w][257];
        O += f * red[w][d];
      }
    a.out[(static_cast<int64_t>(seq) * a.n_heads_q + h) * D + d] = L > 0.f ? O / L : 0.f;
  }
}

}  // namespace oscar::kernels::cuda_detail
