// CUDA prefill attention (kernels/prefill_attn.h: prefill_attn_cuda): causal attention of the
// prefill chunks of a step over the paged three-region cache, reading the pages in place
// (OSCAR.md §4-§5): key j of sequence s is a sink row (j < sinks.seq_len), a history row
// (dequantized, up to the history's end) or a recent row (exact); query i of s sits at
// pos0[s] + i and sees keys [0, pos0[s] + i]; query head h reads KV head h / gqa. Both readings
// of kernels/cpu/prefill_attn.cpp, which in every valid cache state (history present only after
// full sinks) read each key as the CPU version does:
//   serving prefill: deq_end = the history's end;
//   decode-equivalent on a quantized cache: a pre-pass (prefill_deq_rows.cu, the demotion's
//     quantizer) writes the dequantized version of the recent rows that some query reads as
//     history into a per-device scratch (prefill_deq_zone.cuh); query i then reads key j in
//     [n_sink, deq_end(i)) from the history or the scratch. The choice is per (query, key): a
//     key tile holding keys that some queries of the item read quantized and others exactly is
//     run twice, once per version, each pass masking the other version's (query, key) pairs.
//
// Work: one item per (sequence, KV head, tile of qt = 128 / gqa queries on tensor cores, 64 /
// gqa in FP32), the tile's rows being its queries × the KV head's gqa query heads, so each K/V
// byte is read once per group.
// The host knows neither the chunk sizes nor the sequence lengths (device memory; no host sync),
// so the grid is one wave of resident blocks and each block walks (item, KV head) pairs
// (for_each_work: a snake over rounds of gridDim.x works; a sequence's tiles are numbered
// last-first, so the long ones start first); the block finds its item's sequence by scanning
// cu_seqlens.
// Serving prefill (kAuto) runs the warp-specialised kernel of prefill_attn_ws.cu at head_dim 128
// on sm_90a, else the tiled kernel of prefill_attn_tc.cu (cp.async double-buffered tiles, history
// dequantized once per tile, wgmma or mma.sync). This file holds the two earlier kernels over the
// same items (prefill_items.cuh: key addressing and history unpacking, cuda_detail::dequant_element:
// uniform or Lloyd-Max INT2, the bit plan's 4-, 3- and 1-bit rows), which the decode-equivalent
// reading still uses and tests compare against:
//   staged tensor cores (prefill_attn_mma_kernel; kStaged, and decode-equivalent under kAuto):
//     64-key tiles staged in shared memory as BF16 by 8 warps with synchronous loads, mma.sync
//     m16n8k16 with FP32 accumulation for Q·Kᵀ and P·V, FlashAttention-2 layout (a warp per 16
//     rows, P kept in registers); q, P and dequantized history rounded to BF16.
//   FP32 SIMT (PrefillAttnCudaPath::kSimt, prefill_attn_kernel): 32-key tiles staged as float,
//     thread = 4 rows x 4 keys of S and the same 4 rows x d/8 dims of O, P through shared memory;
//     agrees with the CPU's float computation to accumulation rounding (the test's tight check).
// Both: Q pre-scaled by scale·log2 e, masked online softmax in float (exp2f).
//
// Not here (return Unimplemented): KIVI history (either reading).
// Refused (InvalidArgument): F32 exact pages, head_dim other than 64 / 128, gqa > 64.
// Not yet: the decode-equivalent reading in the tiled kernel, splitting long sequences' keys
// across blocks.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hist_row.cuh"
#include "kernels/cuda/prefill_attn_cuda.h"
#include "kernels/cuda/prefill_deq_rows.h"
#include "kernels/cuda/prefill_deq_zone.cuh"
#include "kernels/cuda/prefill_items.cuh"
#include "kernels/prefill_attn.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"

namespace oscar::kernels {

namespace {

constexpr int kThreads = 128;  // the SIMT kernel
constexpr int kWarps = kThreads / 32;
constexpr int kRowsM = 64;  // query-head rows per tile: queries x GQA heads
// The tensor-core kernel: 8 warps of 16 rows. Its staging of a key tile (loads, history
// dequantization, the V transpose) is shared by all the item's rows, and at 64 rows it cost more
// than the MMAs (measured 15 TFLOP/s with an INT2 history, 39 without; cuda_backend.md).
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaRowsM = 16 * kMmaWarps;
constexpr int kKeys = 32;   // keys per K/V tile (the SIMT kernel)
using namespace prefill_detail;

template <int D>
constexpr size_t smem_bytes() {
  return sizeof(float) * (static_cast<size_t>(kRowsM) * (D + 1) + kKeys * (D + 1) + kKeys * D +
                          kRowsM * (kKeys + 1));
}

template <int D>
__global__ void __launch_bounds__(kThreads) prefill_attn_kernel(const __grid_constant__ Args a) {
  extern __shared__ float smem[];
  constexpr int LQ = D + 1, LK = D + 1, LV = D, LP = kKeys + 1, ND = D / 8;
  float* Qs = smem;              // [kRowsM][LQ]
  float* Ks = Qs + kRowsM * LQ;  // [kKeys][LK]
  float* Vs = Ks + kKeys * LK;   // [kKeys][LV]
  float* Ps = Vs + kKeys * LV;   // [kRowsM][LP]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tr = tid >> 3;  // rows 4tr .. 4tr+3 (S and PV)
  const int tk = tid & 7;   // keys tk + 8c (S), dims tk + 8jj (PV)
  const int M = a.qt * a.gqa;

  for_each_work(a, [&](const Item& it, int kvh) {
    const Planes pl = make_planes(a, kvh, D);
    const int nqt = it.nqt;
    const int64_t kend = it.kend, row0 = it.row0;

    __syncthreads();  // the previous item is done with Qs
    for (int idx = tid; idx < kRowsM * D; idx += kThreads) {
      const int m = idx / D, e = idx % D;
      float v = 0.f;
      if (m < M) {
        const int qi = m / a.gqa, hh = m % a.gqa;
        if (qi < nqt)
          v = a.q[((row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D + e] * a.scale_log2;
      }
      Qs[m * LQ + e] = v;
    }

    float mrow[4], lrow[4], o[4][ND];
    int64_t rpos[4], rde[4];
    bool rvalid[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 4 * tr + i, qi = m / a.gqa;
      rvalid[i] = m < M && qi < nqt;
      rpos[i] = it.p0 + it.q0 + qi;
      rde[i] = row_deq_end(a, it, rpos[i]);
      mrow[i] = kNegInf;
      lrow[i] = 0.f;
#pragma unroll
      for (int jj = 0; jj < ND; ++jj) o[i][jj] = 0.f;
    }

#pragma unroll 1
    for (int64_t k0 = 0; k0 < kend; k0 += kKeys) {
#pragma unroll 1
      for (int pass = 0, npass = n_passes(a, it, k0, kKeys); pass < npass; ++pass) {
        __syncthreads();  // Ks / Vs / Ps free; Qs staged
        // ---- stage K and V of keys [k0, k0 + kKeys) as float: a warp per key ------------------
#pragma unroll 1
        for (int kk = warp; kk < kKeys; kk += kWarps) {
          const int64_t j = k0 + kk;
          float* kd = Ks + kk * LK;
          float* vd = Vs + kk * LV;
          if (j >= kend) {
            for (int e = lane; e < D; e += 32) kd[e] = vd[e] = 0.f;
            continue;
          }
          if (const float* dk = deq_row(a, it, pass, kvh, j, D)) {
            const float* dv = dk + a.n_heads_kv * D;
            for (int e = lane; e < D; e += 32) {
              kd[e] = dk[e];
              vd[e] = dv[e];
            }
            continue;
          }
          const KeyRows r = key_rows(a, pl, it, j, D);
          if (!r.hist) {
            const __nv_bfloat16* kr = reinterpret_cast<const __nv_bfloat16*>(r.k);
            const __nv_bfloat16* vr = reinterpret_cast<const __nv_bfloat16*>(r.v);
            for (int e = lane; e < D; e += 32) {
              kd[e] = __bfloat162float(kr[e]);
              vd[e] = __bfloat162float(vr[e]);
            }
          } else {
            for (int e = lane; e < D; e += 32) {
              kd[e] = cuda_detail::dequant_element(r.k, e, D, a.group_size, pl.hbits[0], a.uniform,
                                                   a.lloyd);
              vd[e] = cuda_detail::dequant_element(r.v, e, D, a.group_size, pl.hbits[1], a.uniform,
                                                   a.lloyd);
            }
          }
        }
        __syncthreads();

        // ---- S = Q Kᵀ (log2 units): rows 4tr + i, keys tk + 8c --------------------------------
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[i][c] = 0.f;
#pragma unroll 8
        for (int e = 0; e < D; ++e) {
          float qv[4], kv[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) qv[i] = Qs[(4 * tr + i) * LQ + e];
#pragma unroll
          for (int c = 0; c < 4; ++c) kv[c] = Ks[(tk + 8 * c) * LK + e];
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c) s[i][c] = fmaf(qv[i], kv[c], s[i][c]);
        }

        // ---- masked online softmax; a row's 32 keys live in 8 consecutive lanes --------------
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float mx = kNegInf;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int64_t j = k0 + tk + 8 * c;
            if (!rvalid[i] || j > rpos[i] || pass_masked(a, it, pass, npass, j, rde[i]))
              s[i][c] = kNegInf;
            mx = fmaxf(mx, s[i][c]);
          }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
          const float mnew = fmaxf(mrow[i], mx);
          const float alpha = mnew == kNegInf ? 1.f : exp2f(mrow[i] - mnew);
          float ls = 0.f;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float pv = s[i][c] == kNegInf ? 0.f : exp2f(s[i][c] - mnew);
            Ps[(4 * tr + i) * LP + tk + 8 * c] = pv;
            ls += pv;
          }
          ls += __shfl_xor_sync(0xffffffffu, ls, 1);
          ls += __shfl_xor_sync(0xffffffffu, ls, 2);
          ls += __shfl_xor_sync(0xffffffffu, ls, 4);
          lrow[i] = lrow[i] * alpha + ls;
          mrow[i] = mnew;
#pragma unroll
          for (int jj = 0; jj < ND; ++jj) o[i][jj] *= alpha;
        }
        __syncwarp();  // P rows 4tr.. are written and read by this warp only

        // ---- O += P V: rows 4tr + i, dims tk + 8jj ---------------------------------------------
        const int kn = kend - k0 < kKeys ? static_cast<int>(kend - k0) : kKeys;
#pragma unroll 4
        for (int kk = 0; kk < kn; ++kk) {
          float pv[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) pv[i] = Ps[(4 * tr + i) * LP + kk];
#pragma unroll
          for (int jj = 0; jj < ND; ++jj) {
            const float v = Vs[kk * LV + tk + 8 * jj];
#pragma unroll
            for (int i = 0; i < 4; ++i) o[i][jj] = fmaf(pv[i], v, o[i][jj]);
          }
        }
      }
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (!rvalid[i]) continue;
      const int m = 4 * tr + i, qi = m / a.gqa, hh = m % a.gqa;
      const float inv = !it.z.ok ? __int_as_float(0x7fc00000) : lrow[i] > 0.f ? 1.f / lrow[i] : 0.f;
      float* dst = a.out + ((row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D;
#pragma unroll
      for (int jj = 0; jj < ND; ++jj) dst[tk + 8 * jj] = o[i][jj] * inv;
    }
  });
}

// ---- tensor-core kernel -----------------------------------------------------------------------
// Same items and key addressing as above, but 64-key tiles staged as BF16 with 16-byte loads
// (exact rows copied, history rows dequantized 8 elements at a time, then rounded) with K row-major
// [key][d] and V transposed [d][key], so that every MMA operand is one 32-bit shared load. Warp w
// owns rows 16w .. 16w+15 of the item (FlashAttention-2 layout): S[16 rows, 64 keys] = Q·Kᵀ with
// Q's A fragments in registers (BF16, pre-scaled by scale·log2 e), the masked online softmax on the
// accumulator fragments (lane (g, t) holds rows g and g+8, keys 2t, 2t+1 of each 8-key block: a
// row's max and sum over its 4 lanes), P re-packed as BF16 A fragments straight from the S
// accumulators, and O[16 rows, d] += P·V. FP32 accumulation; the operand rounding sets the
// tolerance (test).
constexpr int kKeysT = 64;  // keys per tile of the tensor-core kernel


// Elements e0 .. e0+7 (e0 a multiple of 8) of a history row: cuda_detail::dequant_element's
// arithmetic, with the group's metadata read once (8 divides G, so they share a group).
__device__ __forceinline__ void dequant8(const uint8_t* row, int e0, int head_dim, int G, int bits,
                                         int uniform, const float* lloyd, float (&out)[8]) {
  const int gi = e0 / G, i0 = e0 % G;
  const int meta_off = bits == 1   ? head_dim / 8 + 4 * gi
                       : bits == 3 ? head_dim / 4 + head_dim / 8 + 4 * gi
                       : bits == 4 ? head_dim / 2 + 4 * gi
                                   : head_dim / 4 + 4 * gi;
  const uint8_t* m = row + meta_off;
  const uint32_t meta = m[0] | (m[1] << 8) | (m[2] << 16) | (m[3] << 24);
  const float s0 = cuda_detail::fp16_bits_to_f32(meta);
  const float s1 = cuda_detail::fp16_bits_to_f32(meta >> 16);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int i = i0 + k;
    if (bits == 1) {
      const int b = row[gi * (G / 8) + i % (G / 8)] >> (i / (G / 8)) & 1;
      out[k] = b ? s1 : s0;
      continue;
    }
    if (bits == 4) {  // quant/int4_layout.h, "by halves"
      const int q4 = row[gi * (G / 2) + i % (G / 2)] >> (4 * (i / (G / 2))) & 15;
      out[k] = s1 + static_cast<float>(q4) * s0;
      continue;
    }
    int q = row[gi * (G / 4) + i % (G / 4)] >> (2 * (i / (G / 4))) & 3;
    if (bits == 3) q |= (row[head_dim / 4 + gi * (G / 8) + i % (G / 8)] >> (i / (G / 8)) & 1) << 2;
    out[k] = (bits == 2 && !uniform) ? s1 + lloyd[q] * s0 : s1 + static_cast<float>(q) * s0;
  }
}

template <int D>
constexpr size_t mma_smem_bytes() {
  return 2 * (static_cast<size_t>(kKeysT) * (D + 8) + static_cast<size_t>(D) * (kKeysT + 8));
}

template <int D>
__global__ void __launch_bounds__(kMmaThreads)
    prefill_attn_mma_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  constexpr int LKS = D + 8;           // Ks row stride (bf16): 4-lane groups hit distinct banks
  constexpr int LVT = kKeysT + 8;      // Vt row stride (bf16)
  constexpr int NKS = D / 16;          // k-steps of S
  constexpr int NB = kKeysT / 8;       // 8-key blocks of S
  constexpr int NDB = D / 8;           // 8-dim blocks of O
  constexpr int NKP = kKeysT / 16;     // k-steps of PV
  constexpr int kLanesPerKey = D / 8;  // 16-byte chunks of a BF16 row
  constexpr int kKeysPerIter = 32 / kLanesPerKey;  // keys a warp stages per step
  static_assert(kKeysT % (kMmaWarps * kKeysPerIter) == 0);
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kKeysT][LKS]
  __nv_bfloat16* Vt = Ks + kKeysT * LKS;                           // [D][LVT]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int sub = lane / kLanesPerKey, chunk = lane % kLanesPerKey;
  const int M = a.qt * a.gqa;

  for_each_work(a, [&](const Item& it, int kvh) {
    const Planes pl = make_planes(a, kvh, D);
    const int64_t kend = it.kend;

    // This lane's rows: r = 0 -> row 16w + g, r = 1 -> row 16w + g + 8.
    bool rvalid[2];
    int64_t rpos[2], rde[2];
    const float* qrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int m = 16 * warp + g + 8 * r, qi = m / a.gqa, hh = m % a.gqa;
      rvalid[r] = m < M && qi < it.nqt;
      rpos[r] = it.p0 + it.q0 + qi;
      rde[r] = row_deq_end(a, it, rpos[r]);
      qrow[r] = rvalid[r] ? a.q + ((it.row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D : nullptr;
    }
    uint32_t qa[NKS][4];
#pragma unroll
    for (int ks = 0; ks < NKS; ++ks)
#pragma unroll
      for (int half = 0; half < 2; ++half)  // a0/a1: dims 16ks + 2t; a2/a3: + 8
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int d = 16 * ks + 2 * t + 8 * half;
          qa[ks][2 * half + r] =
              qrow[r] ? pack_bf16(qrow[r][d] * a.scale_log2, qrow[r][d + 1] * a.scale_log2) : 0u;
        }
    float o[NDB][4];
#pragma unroll
    for (int db = 0; db < NDB; ++db)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[db][c] = 0.f;
    float mrow[2] = {kNegInf, kNegInf}, lrow[2] = {0.f, 0.f};  // l: this lane's partial sum

#pragma unroll 1
    for (int64_t k0 = 0; k0 < kend; k0 += kKeysT) {
#pragma unroll 1
      for (int pass = 0, npass = n_passes(a, it, k0, kKeysT); pass < npass; ++pass) {
        __syncthreads();  // the previous tile (or item) is done with Ks / Vt
        // Stage: lane (sub, c) copies 16-byte chunk c (elements 8c .. 8c+7) of key kk0 + sub; K
        // with one 16-byte store, V transposed with 8 two-byte stores.
#pragma unroll 1
        for (int kk0 = warp * kKeysPerIter; kk0 < kKeysT; kk0 += kMmaWarps * kKeysPerIter) {
          const int kk = kk0 + sub;
          const int64_t j = k0 + kk;
          uint4 kq = make_uint4(0, 0, 0, 0), vq = make_uint4(0, 0, 0, 0);
          const float* dk = j < kend ? deq_row(a, it, pass, kvh, j, D) : nullptr;
          if (dk != nullptr) {
            const float4* k4 = reinterpret_cast<const float4*>(dk + 8 * chunk);
            const float4* v4 = reinterpret_cast<const float4*>(dk + a.n_heads_kv * D + 8 * chunk);
            const float4 k_lo = k4[0], k_hi = k4[1], v_lo = v4[0], v_hi = v4[1];
            kq = make_uint4(pack_bf16(k_lo.x, k_lo.y), pack_bf16(k_lo.z, k_lo.w),
                            pack_bf16(k_hi.x, k_hi.y), pack_bf16(k_hi.z, k_hi.w));
            vq = make_uint4(pack_bf16(v_lo.x, v_lo.y), pack_bf16(v_lo.z, v_lo.w),
                            pack_bf16(v_hi.x, v_hi.y), pack_bf16(v_hi.z, v_hi.w));
          } else if (j < kend) {
            const KeyRows r = key_rows(a, pl, it, j, D);
            if (!r.hist) {
              kq = *reinterpret_cast<const uint4*>(r.k + 16 * chunk);
              vq = *reinterpret_cast<const uint4*>(r.v + 16 * chunk);
            } else {
              float kf[8], vf[8];
              dequant8(r.k, 8 * chunk, D, a.group_size, pl.hbits[0], a.uniform, a.lloyd, kf);
              dequant8(r.v, 8 * chunk, D, a.group_size, pl.hbits[1], a.uniform, a.lloyd, vf);
              kq = make_uint4(pack_bf16(kf[0], kf[1]), pack_bf16(kf[2], kf[3]),
                              pack_bf16(kf[4], kf[5]), pack_bf16(kf[6], kf[7]));
              vq = make_uint4(pack_bf16(vf[0], vf[1]), pack_bf16(vf[2], vf[3]),
                              pack_bf16(vf[4], vf[5]), pack_bf16(vf[6], vf[7]));
            }
          }
          *reinterpret_cast<uint4*>(Ks + kk * LKS + 8 * chunk) = kq;
          const uint32_t vw[4] = {vq.x, vq.y, vq.z, vq.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            Vt[(8 * chunk + 2 * i) * LVT + kk] =
                __ushort_as_bfloat16(static_cast<unsigned short>(vw[i] & 0xffffu));
            Vt[(8 * chunk + 2 * i + 1) * LVT + kk] =
                __ushort_as_bfloat16(static_cast<unsigned short>(vw[i] >> 16));
          }
        }
        __syncthreads();

        // ---- S = Q·Kᵀ: block nb covers keys k0 + 8nb .. +7 -------------------------------------
        float s[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
          for (int c = 0; c < 4; ++c) s[nb][c] = 0.f;
          const __nv_bfloat16* kr = Ks + (8 * nb + g) * LKS + 2 * t;
#pragma unroll
          for (int ks = 0; ks < NKS; ++ks) {
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * ks);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * ks + 8);
            oscar::cuda::mma_bf16(s[nb], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
          }
        }
        // ---- mask and online softmax (c0, c1: row g; c2, c3: row g + 8) ------------------------
        float mx[2] = {kNegInf, kNegInf};
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int r = c >> 1;
            const int64_t j = k0 + 8 * nb + 2 * t + (c & 1);
            if (!rvalid[r] || j > rpos[r] || pass_masked(a, it, pass, npass, j, rde[r]))
              s[nb][c] = kNegInf;
            mx[r] = fmaxf(mx[r], s[nb][c]);
          }
        float alpha[2], mnew[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          mnew[r] = fmaxf(mrow[r], mx[r]);
          alpha[r] = mnew[r] == kNegInf ? 1.f : exp2f(mrow[r] - mnew[r]);
          mrow[r] = mnew[r];
          lrow[r] *= alpha[r];
        }
#pragma unroll
        for (int db = 0; db < NDB; ++db) {
          o[db][0] *= alpha[0];
          o[db][1] *= alpha[0];
          o[db][2] *= alpha[1];
          o[db][3] *= alpha[1];
        }
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int r = c >> 1;
            const float pv = s[nb][c] == kNegInf ? 0.f : exp2f(s[nb][c] - mnew[r]);
            s[nb][c] = pv;
            lrow[r] += pv;
          }
          // ---- O += P·V: k-step kp covers keys 16kp .. +15 = blocks 2kp, 2kp + 1 ----------------
#pragma unroll
        for (int kp = 0; kp < NKP; ++kp) {
          const uint32_t a0 = pack_bf16(s[2 * kp][0], s[2 * kp][1]);
          const uint32_t a1 = pack_bf16(s[2 * kp][2], s[2 * kp][3]);
          const uint32_t a2 = pack_bf16(s[2 * kp + 1][0], s[2 * kp + 1][1]);
          const uint32_t a3 = pack_bf16(s[2 * kp + 1][2], s[2 * kp + 1][3]);
#pragma unroll
          for (int db = 0; db < NDB; ++db) {
            const __nv_bfloat16* vr = Vt + (8 * db + g) * LVT + 16 * kp + 2 * t;
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(vr);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(vr + 8);
            oscar::cuda::mma_bf16(o[db], a0, a1, a2, a3, b0, b1);
          }
        }
      }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = lrow[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (!rvalid[r]) continue;
      const int m = 16 * warp + g + 8 * r, qi = m / a.gqa, hh = m % a.gqa;
      const float inv = !it.z.ok ? __int_as_float(0x7fc00000) : l > 0.f ? 1.f / l : 0.f;
      float* dst = a.out + ((it.row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D;
#pragma unroll
      for (int db = 0; db < NDB; ++db) {
        dst[8 * db + 2 * t] = o[db][2 * r] * inv;
        dst[8 * db + 2 * t + 1] = o[db][2 * r + 1] * inv;
      }
    }
  });
}

// Resident blocks per SM of each kernel (0 SIMT, 1 tensor cores; head_dim 64, 128) and the SM
// count, per device, read once.
struct DeviceFacts {
  int sms = 0;
  bool wgmma = false;  // compute capability 9.0 (this library's sm_90a code)
  // The warp-specialised kernel for serving prefill at head_dim 128 (OSCAR_PREFILL_WS=0: the tiled
  // one instead, to compare the two inside the whole model).
  bool ws = true;
  int blocks[2][2] = {{0, 0}, {0, 0}};
};

Status device_facts(DeviceFacts* out) {
  return oscar::cuda::facts_per_device(out, [](DeviceFacts* f, int dev) {
    using oscar::cuda::kernel_resident_blocks;
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&f->sms, cudaDevAttrMultiProcessorCount, dev));
    int major = 0, minor = 0;
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    f->wgmma = major == 9 && minor == 0;
    const char* ws = std::getenv("OSCAR_PREFILL_WS");
    f->ws = f->wgmma && !(ws != nullptr && std::strcmp(ws, "0") == 0);
    OSCAR_RETURN_IF_ERROR(kernel_resident_blocks(prefill_attn_kernel<64>, kThreads,
                                                 smem_bytes<64>(), &f->blocks[0][0]));
    OSCAR_RETURN_IF_ERROR(kernel_resident_blocks(prefill_attn_kernel<128>, kThreads,
                                                 smem_bytes<128>(), &f->blocks[0][1]));
    OSCAR_RETURN_IF_ERROR(kernel_resident_blocks(prefill_attn_mma_kernel<64>, kMmaThreads,
                                                 mma_smem_bytes<64>(), &f->blocks[1][0]));
    OSCAR_RETURN_IF_ERROR(kernel_resident_blocks(prefill_attn_mma_kernel<128>, kMmaThreads,
                                                 mma_smem_bytes<128>(), &f->blocks[1][1]));
    return Status();
  });
}

// The scratches of each device, grown on demand and never shrunk: the decode-equivalent rows
// (prefill_deq_zone.cuh) or a split call's parts (prefill_attn_ws.cu), and the history expanded
// to BF16 (prefill_hist_bf16.cu); g_scratch_mu is
// held from the growth to the launches. Like linear_cuda's workspace, calls on one device are
// assumed to be ordered on one stream.
std::mutex g_scratch_mu;
cuda::GrownBuffer g_scratch[64];
cuda::GrownBuffer g_hist_bf16[64];

Status validate_cuda(const PrefillAttnParams& p) {
  const KvPageLayout& L = p.layout;
  const int H = L.n_heads_kv;
  if (p.n_seqs < 0 || p.n_heads_q <= 0 || H <= 0 || p.n_heads_q % H != 0 || p.layer < 0 ||
      p.layer >= L.n_layers || L.page_size <= 0)
    return invalid_argument(
        "prefill_attn_cuda: bad shape (%d seqs, %d q heads, %d kv heads, "
        "layer %d of %d, page_size %d)",
        p.n_seqs, p.n_heads_q, H, p.layer, L.n_layers, L.page_size);
  for (const PageTableView* t : {&p.sinks, &p.history, &p.recent}) {
    if (t->n_seqs != p.n_seqs)
      return invalid_argument("prefill_attn_cuda: a page table has %d sequences, the batch %d",
                              t->n_seqs, p.n_seqs);
    if (p.n_seqs > 0 && (t->indptr == nullptr || t->last_page_len == nullptr))
      return invalid_argument("prefill_attn_cuda: a page table has no indptr or last_page_len");
  }
  if (L.exact_elem_bytes != 2)
    return invalid_argument("prefill_attn_cuda: exact pages must be BF16 (exact_elem_bytes %d)",
                            L.exact_elem_bytes);
  if (L.head_dim != 64 && L.head_dim != 128)
    return invalid_argument("prefill_attn_cuda: head_dim %d (64 or 128)", L.head_dim);
  if (p.n_heads_q / H > kRowsM)
    return invalid_argument("prefill_attn_cuda: gqa %d > %d", p.n_heads_q / H, kRowsM);
  if (p.n_seqs > 0 && (p.q == nullptr || p.out == nullptr || p.cu_seqlens == nullptr ||
                       p.pos0 == nullptr || p.exact_pool == nullptr))
    return invalid_argument("prefill_attn_cuda: null q, out, cu_seqlens, pos0 or exact_pool");
  if (p.n_seqs > 0 && (reinterpret_cast<uintptr_t>(p.exact_pool) & 15) != 0)
    return invalid_argument("prefill_attn_cuda: exact_pool must be 16-byte aligned");
  if (p.decode_equivalent && p.quantized) {
    if (p.max_rows <= 0)
      return invalid_argument(
          "prefill_attn_cuda: decode_equivalent needs max_rows (the call's query rows), got %d",
          p.max_rows);
    if (p.n_sink < 0 || p.n_recent < 0)
      return invalid_argument("prefill_attn_cuda: n_sink %d, n_recent %d", p.n_sink, p.n_recent);
  }
  if (p.quantized || p.hist_pool != nullptr) {
    if (p.codec.quantizer == quant::HistQuantizer::kKivi)
      return unimplemented("prefill_attn_cuda: KIVI history rows are not implemented on CUDA");
    if (p.codec.quantizer != quant::HistQuantizer::kInt2Uniform &&
        p.codec.quantizer != quant::HistQuantizer::kInt2Lloyd)
      return invalid_argument("prefill_attn_cuda: unknown quantizer %d",
                              static_cast<int>(p.codec.quantizer));
    if (!quant::int2_valid_group(L.head_dim, p.codec.group_size))
      return invalid_argument("prefill_attn_cuda: group_size %d invalid for head_dim %d",
                              p.codec.group_size, L.head_dim);
    if ((L.hist_bits == nullptr) != (L.hist_row_prefix == nullptr))
      return invalid_argument(
          "prefill_attn_cuda: a bit plan needs both hist_bits and "
          "hist_row_prefix");
    if (L.hist_bits == nullptr &&
        L.int2_row_bytes != quant::int2_row_bytes(L.head_dim, p.codec.group_size))
      return invalid_argument("prefill_attn_cuda: layout int2_row_bytes %d != %d", L.int2_row_bytes,
                              quant::int2_row_bytes(L.head_dim, p.codec.group_size));
    if (p.hist_pool == nullptr)
      return invalid_argument("prefill_attn_cuda: quantized cache without a history pool");
  }
  return Status();
}

}  // namespace

Status prefill_attn_cuda_ex(const PrefillAttnParams& p, PrefillAttnCudaPath path,
                            void* stream_ptr) {
  OSCAR_RETURN_IF_ERROR(validate_cuda(p));
  if (p.n_seqs == 0) return Status();
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const KvPageLayout& L = p.layout;
  DeviceFacts facts;
  OSCAR_RETURN_IF_ERROR(device_facts(&facts));

  Args a{};
  a.n_seqs = p.n_seqs;
  a.n_heads_q = p.n_heads_q;
  a.n_heads_kv = L.n_heads_kv;
  a.gqa = p.n_heads_q / L.n_heads_kv;
  const bool mma = path != PrefillAttnCudaPath::kSimt;
  a.qt = (mma ? kMmaRowsM : kRowsM) / a.gqa;
  a.layer = p.layer;
  a.page_size = L.page_size;
  a.group_size = p.codec.group_size;
  a.n_planes = L.n_planes();
  a.uniform = p.codec.quantizer == quant::HistQuantizer::kInt2Lloyd ? 0 : 1;
  a.int2_row_bytes = L.int2_row_bytes;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  for (int i = 0; i < 4; ++i) a.lloyd[i] = quant::kLloydDequantLevels[i];
  a.cu = p.cu_seqlens;
  a.pos0 = p.pos0;
  a.q = p.q;
  a.out = p.out;
  a.exact_pool = p.exact_pool;
  a.hist_pool = p.hist_pool;
  a.exact_page_bytes = L.exact_page_bytes();
  // With a bit plan, int2_page_bytes() would read hist_row_prefix (a device pointer) on the host.
  a.hist_page_bytes = L.hist_row_prefix != nullptr
                          ? 0
                          : static_cast<uint64_t>(L.n_planes()) * L.page_size * L.int2_row_bytes;
  a.hist_bits = L.hist_bits;
  a.hist_row_prefix = L.hist_row_prefix;
  a.sinks = p.sinks;
  a.history = p.history;
  a.recent = p.recent;
  a.de = p.decode_equivalent && p.quantized ? 1 : 0;
  a.n_sink = p.n_sink;
  a.n_recent = p.n_recent;
  a.deq = nullptr;
  a.cap_rows = 0;
  a.invariant = p.batch_invariant ? 1 : 0;

  a.hist_bf16 = nullptr;
  a.hist_slot = nullptr;
  a.n_split = 1;
  a.part_rows = 0;
  a.part = nullptr;

  std::unique_lock<std::mutex> lock(g_scratch_mu, std::defer_lock);
  int dev = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return internal_error("prefill_attn_cuda: device %d", dev);
  if (a.de) {
    // Decode-equivalent: the pre-pass quantizes and dequantizes the zone's rows into the scratch.
    a.cap_rows = static_cast<int64_t>(p.max_rows) + static_cast<int64_t>(p.n_seqs) * L.page_size;
    const size_t bytes =
        static_cast<size_t>(a.cap_rows) * 2 * L.n_heads_kv * L.head_dim * sizeof(float);
    lock.lock();
    cuda::GrownBuffer& sc = g_scratch[dev];
    OSCAR_RETURN_IF_ERROR(
        sc.reserve(bytes, std::max<size_t>(bytes + bytes / 4, size_t{1} << 20), stream));
    float* deq = static_cast<float*>(sc.ptr);
    a.deq = deq;
    OSCAR_RETURN_IF_ERROR(cuda_detail::prefill_deq_rows_cuda(p, deq, a.cap_rows, stream));
  }

  // Serving prefill: the warp-specialised kernel (prefill_attn_ws.cu) at head_dim 128 on sm_90a,
  // else the tiled one (prefill_attn_tc.cu), on wgmma where the device has it. Over quantized
  // history the warp-specialised kernel reads the history expanded to BF16 once per call
  // (prefill_hist_bf16.cu), which needs the caller's distinct pages (p.hist_slot) and the TMA
  // producer; without them, or when the expansion's memory cannot be had, the tiled kernel
  // unpacks in its tiles (slower: 160-175 TFLOP/s against 475-564, H200, 2026-12-03).
  // Batch-invariant calls under kAuto: the warp-specialised kernel where it runs, else the staged
  // one (the tiled kernel, on mma.sync or wgmma, gave some queries other bits when their item's
  // other queries changed, on the H200; not understood yet: docs/results/determinism.md).
  if (a.de == 0) {
    if (path == PrefillAttnCudaPath::kAuto && facts.ws && L.head_dim == 128) {
      // A call of few items over long keys (a short chunk at depth) splits each item's keys
      // across blocks; without the scratch for the parts, it runs unsplit.
      a.n_split = prefill_attn_ws_split(a, p.max_rows, p.max_keys);
      if (a.n_split > 1) {
        const size_t bytes = static_cast<size_t>(a.n_split) * p.max_rows * p.n_heads_q *
                             (L.head_dim + 1) * sizeof(float);
        lock.lock();
        cuda::GrownBuffer& sc = g_scratch[dev];
        if (sc.reserve(bytes, bytes + bytes / 4, stream).ok()) {
          a.part = static_cast<float*>(sc.ptr);
          a.part_rows = p.max_rows;
        } else {
          (void)cudaGetLastError();
          a.n_split = 1;
        }
      }
      if (!p.quantized) return prefill_attn_ws_launch(a, L.head_dim, false, stream);
      bool tma = false;
      OSCAR_RETURN_IF_ERROR(prefill_attn_ws_tma(L.page_size, &tma));
      if (tma && p.hist_slot != nullptr) {
        const size_t bytes = static_cast<size_t>(std::max(p.n_hist_unique, 0)) * 2 *
                             L.n_heads_kv * L.page_size * L.head_dim * 2;
        if (!lock.owns_lock()) lock.lock();
        cuda::GrownBuffer& hb = g_hist_bf16[dev];
        Status got = bytes == 0 ? Status() : hb.reserve(bytes, bytes + bytes / 4, stream);
        if (!got.ok()) {
          (void)cudaGetLastError();  // an out-of-memory cudaMalloc: the tiled kernel instead
        } else {
          a.hist_slot = p.hist_slot;
          if (bytes > 0) {
            a.hist_bf16 = static_cast<const uint8_t*>(hb.ptr);
            OSCAR_RETURN_IF_ERROR(expand_history_launch(a, L.head_dim, p.hist_unique,
                                                        p.n_hist_unique,
                                                        static_cast<uint8_t*>(hb.ptr), stream));
          }
          return prefill_attn_ws_launch(a, L.head_dim, true, stream);
        }
      }
    }
    // The other kernels walk unsplit works (find_work would hand them each item n_split times).
    a.n_split = 1;
    a.part_rows = 0;
    a.part = nullptr;
    if ((path == PrefillAttnCudaPath::kAuto && !p.batch_invariant) ||
        path == PrefillAttnCudaPath::kTiledMma || path == PrefillAttnCudaPath::kTiledWgmma)
      return prefill_attn_tc_launch(a, L.head_dim,
                                    path != PrefillAttnCudaPath::kTiledMma && facts.wgmma, stream);
  }

  // One wave of resident blocks; each block walks its (item, KV head) pairs.
  const bool d64 = L.head_dim == 64;
  const int per_sm = facts.blocks[mma ? 1 : 0][d64 ? 0 : 1];
  const dim3 grid(std::max(1, facts.sms * per_sm));
  if (mma) {
    if (d64)
      prefill_attn_mma_kernel<64><<<grid, kMmaThreads, mma_smem_bytes<64>(), stream>>>(a);
    else
      prefill_attn_mma_kernel<128><<<grid, kMmaThreads, mma_smem_bytes<128>(), stream>>>(a);
    OSCAR_CUDA_LAUNCH_CHECK("prefill_attn_mma_kernel");
  } else {
    if (d64)
      prefill_attn_kernel<64><<<grid, kThreads, smem_bytes<64>(), stream>>>(a);
    else
      prefill_attn_kernel<128><<<grid, kThreads, smem_bytes<128>(), stream>>>(a);
    OSCAR_CUDA_LAUNCH_CHECK("prefill_attn_kernel");
  }
  return Status();
}

Status prefill_attn_cuda(const PrefillAttnParams& p, void* stream) {
  return prefill_attn_cuda_ex(p, PrefillAttnCudaPath::kAuto, stream);
}

}  // namespace oscar::kernels
