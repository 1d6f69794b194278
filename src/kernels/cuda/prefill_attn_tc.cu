// The tiled tensor-core prefill attention (prefill_detail::prefill_attn_tc_launch): the kernel of
// prefill_attn_cuda for serving prefill and extend over quantized history, at head_dim 64, and off
// sm_90a (kernels/prefill_attn.h; over BF16 caches at head_dim 128 on sm_90a prefill_attn_ws.cu
// runs): causal attention of a step's prefill chunks over the paged three-region cache,
// FlashAttention-2 style.
//
// Work: the items of prefill_items.cuh (a tile of 128 / gqa queries of one sequence x the gqa
// query heads of one KV head = up to 128 rows), so every K/V tile is read once per KV group and
// used by all its query heads. 8 warps of 16 rows; Q as BF16 A fragments in registers, pre-scaled
// by scale·log2 e.
//
// Per 64-key tile, double-buffered in shared memory in the 128-byte swizzled layout
// (prefill_tile.cuh):
//   BF16 rows (sinks, recent, the chunk's own) arrive by cp.async, 16 bytes a thread, straight
//     from their pages, issued one tile ahead;
//   history rows are dequantized once per tile into the same BF16 tile, for all 128 rows, by all
//     eight warps: a 2-bit row (uniform or Lloyd-Max INT2, and the bit plan's 2-bit rows) is read
//     as 32-bit code words, loaded before the current tile's MMAs and unpacked after them (the
//     group's four levels computed once per word, then a byte permutation per pair of values);
//     other widths (the bit plan's 1-, 3- and 4-bit rows) through cuda_detail::dequant_element.
// S = Q·Kᵀ and O += P·V by wgmma on sm_90a at head_dim 128 (Q and P from registers, K and V from
// shared memory), else mma.sync m16n8k16 with K fragments by ldmatrix and V by ldmatrix.trans; the
// causal mask only on tiles that reach past the item's first query; online softmax in exp2 on the
// accumulator fragments, P re-packed as BF16 A fragments in registers.
//
// Not here: the decode-equivalent reading (prefill_attn.cu's staged kernels), KIVI history,
// head_dim 256 (register budget: needs Q from shared memory), splitting one sequence's keys across
// blocks (a short chunk over a long prefix with few sequences leaves SMs idle).
#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hist_row.cuh"
#include "kernels/cuda/prefill_items.cuh"
#include "kernels/cuda/prefill_tile.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "quant/int2_layout.h"

namespace oscar::kernels::prefill_detail {

namespace {

constexpr int kTcWarps = 8;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcKeys = 64;  // keys per tile

template <int D>
struct TcShape : TileShape<D, kTcKeys> {
  static constexpr size_t kSmemBytes = 2 * 2 * TileShape<D, kTcKeys>::kTileBytes + 1024;  // 2 stages x (K, V), aligned
};

template <int D>
__device__ __forceinline__ uint32_t tile_off(int r, int e) {
  return sw128_off(r, e, TcShape<D>::kAtomBytes);
}

template <int D>
using TcHist = HistUnits<D, kTcKeys, kTcThreads>;

// S = Q·Kᵀ of a warp's 16 rows over the tile's 64 keys (log2 units): s[nb] = keys 8nb .. 8nb+7.
// kWg: one warpgroup-wide wgmma per 16 dims (K from shared memory through a descriptor); else
// mma.sync with K fragments by ldmatrix.
template <int D, bool kWg>
__device__ __forceinline__ void tile_scores(const uint32_t (&qa)[D / 16][4], uint32_t ks,
                                            float (&s)[kTcKeys / 8][4]) {
  constexpr int NKS = D / 16, NB = kTcKeys / 8;
  if constexpr (kWg) {
    oscar::cuda::wgmma_fence();
#pragma unroll
    for (int k = 0; k < NKS; ++k) {
      // K-major B: 16 dims = 32 bytes of each key row, inside atom k / 4; 8-row groups 1024 apart.
      const uint64_t desc = oscar::cuda::wgmma_desc_sw128(
          ks + (k / 4) * TcShape<D>::kAtomBytes + (k % 4) * 32, 16, 1024);
      oscar::cuda::wgmma_m64n64k16_rs<0>(s, qa[k], desc, k > 0);
    }
    oscar::cuda::wgmma_commit();
    oscar::cuda::wgmma_wait<0>();
  } else {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[nb][c] = 0.f;
#pragma unroll
    for (int k2 = 0; k2 < NKS / 2; ++k2)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        // Matrices: dims 32k2 + 8m .. +7 of keys 8nb .. 8nb+7 (m = lane / 8 supplies the rows).
        uint32_t kb[4];
        oscar::cuda::ldmatrix_x4(kb, ks + tile_off<D>(8 * nb + (lane & 7), 32 * k2 + 8 * (lane >> 3)));
        const uint32_t(&q0)[4] = qa[2 * k2];
        const uint32_t(&q1)[4] = qa[2 * k2 + 1];
        oscar::cuda::mma_bf16(s[nb], q0[0], q0[1], q0[2], q0[3], kb[0], kb[1]);
        oscar::cuda::mma_bf16(s[nb], q1[0], q1[1], q1[2], q1[3], kb[2], kb[3]);
      }
  }
}

// O += P·V of a warp's 16 rows: P as BF16 A fragments (pa[kp] = keys 16kp .. 16kp+15).
template <int D, bool kWg>
__device__ __forceinline__ void tile_pv(const uint32_t (&pa)[kTcKeys / 16][4], uint32_t vs,
                                        float (&o)[D / 8][4]) {
  constexpr int NKP = kTcKeys / 16, NDB = D / 8;
  if constexpr (kWg) {
    oscar::cuda::wgmma_fence();
#pragma unroll
    for (int kp = 0; kp < NKP; ++kp) {
      // MN-major B: 16 keys = two 8-row groups (1024 bytes apart) from key 16kp; 64-dim atoms
      // kAtomBytes apart.
      const uint64_t desc =
          oscar::cuda::wgmma_desc_sw128(vs + kp * 2048, TcShape<D>::kAtomBytes, 1024);
      if constexpr (D == 128)
        oscar::cuda::wgmma_m64n128k16_rs<1>(o, pa[kp], desc, 1);
      else
        oscar::cuda::wgmma_m64n64k16_rs<1>(o, pa[kp], desc, 1);
    }
    oscar::cuda::wgmma_commit();
    oscar::cuda::wgmma_wait<0>();
  } else {
    const int lane = threadIdx.x & 31;
    // Matrices (.trans): keys 16kp + 8(m & 1) .. +7, dims 16dp + 8(m >> 1) .. +7.
    const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1), v_col = 8 * (lane >> 4);
#pragma unroll
    for (int kp = 0; kp < NKP; ++kp)
#pragma unroll
      for (int dp = 0; dp < NDB / 2; ++dp) {
        uint32_t vb[4];
        oscar::cuda::ldmatrix_x4_trans(vb, vs + tile_off<D>(16 * kp + v_row, 16 * dp + v_col));
        const uint32_t(&a)[4] = pa[kp];
        oscar::cuda::mma_bf16(o[2 * dp], a[0], a[1], a[2], a[3], vb[0], vb[1]);
        oscar::cuda::mma_bf16(o[2 * dp + 1], a[0], a[1], a[2], a[3], vb[2], vb[3]);
      }
  }
}

template <int D, bool kWg>
__global__ void __launch_bounds__(kTcThreads, 1)
    prefill_attn_tc_kernel(const __grid_constant__ Args a) {
  using S = TcShape<D>;
  constexpr int NKS = D / 16;        // k-steps of S = Q·Kᵀ
  constexpr int NB = kTcKeys / 8;    // 8-key blocks of S
  constexpr int NDB = D / 8;         // 8-dim blocks of O
  constexpr int NKP = kTcKeys / 16;  // k-steps of P·V
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // [stage][K, V] tiles, 1024-aligned (the swizzle pattern follows address bits 4-9).
  const uint32_t raw_addr = oscar::cuda::smem_addr(smem_raw);
  uint8_t* tiles = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
  const uint32_t tiles_addr = oscar::cuda::smem_addr(tiles);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int M = a.qt * a.gqa;

  for_each_work(a, [&](const Item& it, int kvh) {
    const Planes pl = make_planes(a, kvh, D);
    const int64_t kend = it.kend;
    const int64_t first_pos = it.p0 + it.q0;  // the item's smallest query position

    // This lane's rows: r = 0 -> row 16·warp + g, r = 1 -> row 16·warp + g + 8 (warpgroup w / 4
    // holds rows 64·(w / 4) ..).
    int64_t rpos[2];
    bool rvalid[2];
    uint32_t qa[NKS][4];
    {
      const float* qrow[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int m = 16 * warp + g + 8 * r, qi = m / a.gqa, hh = m % a.gqa;
        rvalid[r] = m < M && qi < it.nqt;
        rpos[r] = first_pos + qi;
        qrow[r] = rvalid[r] ? a.q + ((it.row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D : nullptr;
      }
#pragma unroll
      for (int ks = 0; ks < NKS; ++ks)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int d = 16 * ks + 2 * t + 8 * half;
            float2 qv = make_float2(0.f, 0.f);
            if (qrow[r]) qv = *reinterpret_cast<const float2*>(qrow[r] + d);
            qa[ks][2 * half + r] = pack_bf16(qv.x * a.scale_log2, qv.y * a.scale_log2);
          }
    }
    float o[NDB][4];
#pragma unroll
    for (int db = 0; db < NDB; ++db)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[db][c] = 0.f;
    float mrow[2] = {kNegInf, kNegInf}, lrow[2] = {0.f, 0.f};  // l: this lane's partial sum

    const int n_tiles = static_cast<int>((kend + kTcKeys - 1) / kTcKeys);
    const SeqPages sp = seq_pages(a, it);
    // Prologue: tile 0 into stage 0.
    {
      const bool h0 = tile_has_hist(it, 0, kTcKeys);
      load_exact<D, kTcKeys, kTcThreads>(a, pl, sp, 0, h0, tiles_addr,
                                         tiles_addr + S::kTileBytes, threadIdx.x);
      oscar::cuda::cp_async_commit();
      if (h0) {
        TcHist<D> hk, hv;
        hist_prefetch(a, pl, sp, 0, 0, threadIdx.x, hk);
        hist_prefetch(a, pl, sp, 0, 1, threadIdx.x, hv);
        hist_store(a, pl, sp, 0, 0, threadIdx.x, hk, tiles);
        hist_store(a, pl, sp, 0, 1, threadIdx.x, hv, tiles + S::kTileBytes);
      }
    }
#pragma unroll 1
    for (int tile = 0; tile < n_tiles; ++tile) {
      const int64_t k0 = static_cast<int64_t>(tile) * kTcKeys;
      const uint32_t ks = tiles_addr + (tile & 1) * 2 * S::kTileBytes;
      const uint32_t vs = ks + S::kTileBytes;
      uint8_t* ks_next = tiles + ((tile + 1) & 1) * 2 * S::kTileBytes;
      const uint32_t ks_next_addr = tiles_addr + ((tile + 1) & 1) * 2 * S::kTileBytes;
      const bool next = tile + 1 < n_tiles;
      const bool next_hist = next && tile_has_hist(it, k0 + kTcKeys, kTcKeys);
      TcHist<D> hk, hv;
      if (next) {
        load_exact<D, kTcKeys, kTcThreads>(a, pl, sp, static_cast<int>(k0) + kTcKeys, next_hist,
                                           ks_next_addr, ks_next_addr + S::kTileBytes,
                                           threadIdx.x);
        oscar::cuda::cp_async_commit();
        if (next_hist) {
          hist_prefetch(a, pl, sp, static_cast<int>(k0) + kTcKeys, 0, threadIdx.x, hk);
          hist_prefetch(a, pl, sp, static_cast<int>(k0) + kTcKeys, 1, threadIdx.x, hv);
        }
        oscar::cuda::cp_async_wait<1>();
      } else {
        oscar::cuda::cp_async_wait<0>();
      }
      // This tile's rows (copies and history stores) are in place, and visible to wgmma.
      oscar::cuda::fence_proxy_async_smem();
      __syncthreads();

      float s[NB][4];
      tile_scores<D, kWg>(qa, ks, s);
      // ---- causal mask (tiles reaching past the first query only), online softmax --------------
      if (k0 + kTcKeys - 1 > first_pos) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int64_t j = k0 + 8 * nb + 2 * t + (c & 1);
            if (j > rpos[c >> 1]) s[nb][c] = kNegInf;
          }
      }
      float mx[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int c = 0; c < 4; ++c) mx[c >> 1] = fmaxf(mx[c >> 1], s[nb][c]);
      float mnew[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mnew[r] = fmaxf(mrow[r], mx[r]);
        const float alpha = mnew[r] == kNegInf ? 1.f : exp2f(mrow[r] - mnew[r]);
        mrow[r] = mnew[r];
        lrow[r] *= alpha;
#pragma unroll
        for (int db = 0; db < NDB; ++db) {
          o[db][2 * r] *= alpha;
          o[db][2 * r + 1] *= alpha;
        }
        if (mnew[r] == kNegInf) mnew[r] = 0.f;  // a row with nothing visible yet: p = 0
      }
      // P as BF16 A fragments: k-step kp = keys 16kp .. +15 = S blocks 2kp, 2kp + 1.
      uint32_t pa[NKP][4];
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        float p[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          p[c] = exp2f(s[nb][c] - mnew[c >> 1]);  // exp2(-inf) = 0
          lrow[c >> 1] += p[c];
        }
        pa[nb >> 1][2 * (nb & 1)] = pack_bf16(p[0], p[1]);
        pa[nb >> 1][2 * (nb & 1) + 1] = pack_bf16(p[2], p[3]);
      }
      tile_pv<D, kWg>(pa, vs, o);
      // The next tile's history rows, unpacked now that this tile's MMAs are done (their stage
      // was last read in the previous iteration, before its closing barrier).
      if (next_hist) {
        hist_store(a, pl, sp, static_cast<int>(k0) + kTcKeys, 0, threadIdx.x, hk, ks_next);
        hist_store(a, pl, sp, static_cast<int>(k0) + kTcKeys, 1, threadIdx.x, hv,
                   ks_next + S::kTileBytes);
      }
      __syncthreads();  // every warp is done with this stage before it is refilled
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = lrow[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (!rvalid[r]) continue;
      const int m = 16 * warp + g + 8 * r, qi = m / a.gqa, hh = m % a.gqa;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      float* dst = a.out + ((it.row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D;
#pragma unroll
      for (int db = 0; db < NDB; ++db)
        *reinterpret_cast<float2*>(dst + 8 * db + 2 * t) =
            make_float2(o[db][2 * r] * inv, o[db][2 * r + 1] * inv);
    }
  });
}

// Resident blocks per SM ([head_dim 64, 128][mma.sync, wgmma]) and the SM count, per device,
// read once.
struct TcFacts {
  int sms = 0;
  int blocks[2][2] = {{0, 0}, {0, 0}};
};

template <int D, bool kWg>
Status tc_setup(int* blocks) {
  return oscar::cuda::kernel_resident_blocks(prefill_attn_tc_kernel<D, kWg>, kTcThreads,
                                             TcShape<D>::kSmemBytes, blocks);
}

Status tc_facts(TcFacts* out) {
  return oscar::cuda::facts_per_device(out, [](TcFacts* f, int dev) {
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&f->sms, cudaDevAttrMultiProcessorCount, dev));
    OSCAR_RETURN_IF_ERROR((tc_setup<64, false>(&f->blocks[0][0])));
    OSCAR_RETURN_IF_ERROR((tc_setup<128, false>(&f->blocks[1][0])));
    OSCAR_RETURN_IF_ERROR((tc_setup<128, true>(&f->blocks[1][1])));
    return Status();
  });
}

template <int D, bool kWg>
Status tc_launch(const Args& a, dim3 grid, cudaStream_t stream) {
  prefill_attn_tc_kernel<D, kWg><<<grid, kTcThreads, TcShape<D>::kSmemBytes, stream>>>(a);
  OSCAR_CUDA_LAUNCH_CHECK("prefill_attn_tc_kernel");
  return Status();
}

}  // namespace

Status prefill_attn_tc_launch(const Args& a_in, int head_dim, bool wgmma, cudaStream_t stream) {
  if (a_in.de != 0) return internal_error("prefill_attn_tc: serving prefill only");
  if (head_dim != 64 && head_dim != 128)
    return invalid_argument("prefill_attn_tc: head_dim %d (64 or 128)", head_dim);
  if (a_in.gqa > kTcThreads / 2)
    return invalid_argument("prefill_attn_tc: gqa %d > %d", a_in.gqa, kTcThreads / 2);
  TcFacts f;
  OSCAR_RETURN_IF_ERROR(tc_facts(&f));
  Args a = a_in;
  a.qt = 16 * kTcWarps / a.gqa;  // queries per item: 128 rows
  a.page_shift = -1;
  for (int sh = 0; sh < 31; ++sh)
    if (a.page_size == 1 << sh) a.page_shift = sh;
  // One wave of resident blocks; each block walks its (item, KV head) pairs.
  if (head_dim == 64) wgmma = false;
  const int per_sm = f.blocks[head_dim == 64 ? 0 : 1][wgmma ? 1 : 0];
  const dim3 grid(std::max(1, f.sms * per_sm));
  // head_dim 64 runs on mma.sync: its wgmma variant (one 64-wide atom for V's MN-major operand)
  // disagreed with the CPU on the H200 (test_prefill_attn_cuda, 2026-12-03); not investigated yet.
  if (head_dim == 64) return tc_launch<64, false>(a, grid, stream);
  return wgmma ? tc_launch<128, true>(a, grid, stream) : tc_launch<128, false>(a, grid, stream);
}

}  // namespace oscar::kernels::prefill_detail
