// Internal to the tiled prefill attention kernels (prefill_attn_tc.cu, prefill_attn_ws.cu): filling
// one K/V tile of shared memory from the paged three-region cache. A tile is kKeys keys x D BF16
// in the 128-byte swizzled layout (wgmma.cuh), as D / 64 atoms of [kKeys][64] one after another:
// the layout wgmma reads K from (K-major) and V from (MN-major), and ldmatrix reads without bank
// conflicts. BF16 rows (sinks, recent, the chunk's own) arrive by cp.async straight from their
// pages; history rows are dequantized into the same tile by the filling threads.
//
// Key arithmetic is 32-bit: a 64-bit division or remainder is a software routine of ~100
// instructions, which per 16-byte copy cost more than the MMAs (measured: 70-76 TFLOP/s with
// 64-bit key_rows per copy, 147 without).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hist_row.cuh"
#include "kernels/cuda/prefill_items.cuh"
#include "quant/int2_layout.h"

namespace oscar::kernels::prefill_detail {

template <int D, int kKeys>
struct TileShape {
  static constexpr int kAtomBytes = kKeys * 128;  // [kKeys][64] BF16
  static constexpr int kTileBytes = kKeys * D * 2;
  static constexpr int kChunks = D / 8;  // 16-byte chunks of a BF16 row
  static constexpr int kUnits = D / 16;  // 16-value units of a history row (a 2-bit code word)
  static_assert(D % 64 == 0);
};

// Byte offset of value e (even) of row r inside a 128-byte swizzled operand whose
// 64-value atoms are atom_bytes apart.
__device__ __forceinline__ uint32_t sw128_off(int r, int e, int atom_bytes) {
  const int c = (e >> 3) & 7;
  return (e >> 6) * atom_bytes + r * 128 + ((c ^ (r & 7)) << 4) + (e & 7) * 2;
}

__device__ __forceinline__ bool tile_has_hist(const Item& it, int64_t k0, int n_keys) {
  return it.hist_end > it.n_sink_tok && k0 < it.hist_end && k0 + n_keys > it.n_sink_tok;
}

// A sequence's page lists for one item.
struct SeqPages {
  const int32_t* sink;
  const int32_t* hist;
  const int32_t* recent;
  int n_sink_tok, hist_end, kend;
};

__device__ __forceinline__ SeqPages seq_pages(const Args& a, const Item& it) {
  SeqPages sp;
  sp.sink = a.sinks.page_ids + a.sinks.indptr[it.seq];
  sp.hist = a.history.page_ids + a.history.indptr[it.seq];
  sp.recent = a.recent.page_ids + a.recent.indptr[it.seq];
  sp.n_sink_tok = static_cast<int>(it.n_sink_tok);
  sp.hist_end = static_cast<int>(it.hist_end);
  sp.kend = static_cast<int>(it.kend);
  return sp;
}

// Token t's page (index into a page list) and slot; a.page_shift >= 0: the page size is 2^shift.
__device__ __forceinline__ void page_slot(const Args& a, int t, int& page, int& slot) {
  if (a.page_shift >= 0) {
    page = t >> a.page_shift;
    slot = t & ((1 << a.page_shift) - 1);
  } else {
    page = t / a.page_size;
    slot = t - page * a.page_size;
  }
}

// Key j's exact row (BF16 sink or recent; plane offset not added).
template <int D>
__device__ __forceinline__ const uint8_t* exact_row(const Args& a, const SeqPages& sp, int j) {
  const bool sink = j < sp.n_sink_tok;
  int page, slot;
  page_slot(a, sink ? j : j - sp.hist_end, page, slot);
  const int id = (sink ? sp.sink : sp.recent)[page];
  return a.exact_pool + static_cast<uint64_t>(id) * a.exact_page_bytes +
         static_cast<uint32_t>(slot * D * 2);
}

// Key j's history page base and slot.
__device__ __forceinline__ const uint8_t* hist_page(const Args& a, const Planes& pl,
                                                    const SeqPages& sp, int j, int& slot) {
  int page;
  page_slot(a, j - sp.n_sink_tok, page, slot);
  return a.hist_pool + static_cast<uint64_t>(sp.hist[page]) * pl.hpb;
}

__device__ __forceinline__ bool key_is_hist(const SeqPages& sp, int j) {
  return j >= sp.n_sink_tok && j < sp.hist_end;
}

// cp.async of the tile's BF16 rows by kThreads threads (tid = this thread's index among them):
// keys past kend zero-filled (P·V must not meet stale NaNs), history rows left alone when `hist`.
// Thread copies 16-byte chunk tid % (D / 8) of its keys' K and V rows, one row lookup per key.
template <int D, int kKeys, int kThreads>
__device__ __forceinline__ void load_exact(const Args& a, const Planes& pl, const SeqPages& sp,
                                           int k0, bool hist, uint32_t ks, uint32_t vs, int tid) {
  using S = TileShape<D, kKeys>;
  constexpr int kKeysPerRound = kThreads / S::kChunks, kRounds = kKeys / kKeysPerRound;
  static_assert(kThreads % S::kChunks == 0 && kKeys % kKeysPerRound == 0);
  const int c = tid % S::kChunks;
  // Four rounds in flight at a time: enough copies to cover the latency, few enough addresses
  // for a producer warpgroup's small register budget.
#pragma unroll 4
  for (int r = 0; r < kRounds; ++r) {
    const int kk = tid / S::kChunks + r * kKeysPerRound, j = k0 + kk;
    const uint32_t off = sw128_off(kk, 8 * c, S::kAtomBytes);
    if (j >= sp.kend) {
      oscar::cuda::cp_async16(ks + off, a.exact_pool, false);
      oscar::cuda::cp_async16(vs + off, a.exact_pool, false);
    } else if (!(hist && key_is_hist(sp, j))) {
      const uint8_t* row = exact_row<D>(a, sp, j) + 16 * c;
      oscar::cuda::cp_async16(ks + off, row + pl.eplane[0], true);
      oscar::cuda::cp_async16(vs + off, row + pl.eplane[1], true);
    }
  }
}

// A thread's history units of a tile for one of K (kv 0) or V (kv 1): round r covers key
// key(tid, r) and unit u = tid % (D / 16): the 32-bit code word u of a 2-bit row (16 values), or
// values 16u .. 16u+15 of another width.
template <int D, int kKeys, int kThreads>
struct HistUnits {
  static constexpr int kKeysPerRound = kThreads / TileShape<D, kKeys>::kUnits;
  static constexpr int kRounds = kKeys / kKeysPerRound;
  static_assert(kThreads % TileShape<D, kKeys>::kUnits == 0 && kKeys % kKeysPerRound == 0);
  static_assert(kKeysPerRound % 8 == 0);
  uint32_t code[kRounds];
  uint32_t meta[kRounds];
  // The tile key of round r: a warp's four keys of a round get rows with bit 2 set in two of
  // them, so that its 8-byte stores of a 64-byte run per row fall on both halves of the banks
  // (swizzle chunk c ^ (row & 7)): two wavefronts a store instead of four.
  __device__ __forceinline__ static int key(int tid, int r) {
    const int rr = tid / TileShape<D, kKeys>::kUnits;
    return (rr ^ ((rr & 1) << 2)) + r * kKeysPerRound;
  }
};

// Loads the 2-bit units' code words and group metadata of K or V (issued early, consumed by
// hist_store once they have arrived).
template <int D, int kKeys, int kThreads>
__device__ __forceinline__ void hist_prefetch(const Args& a, const Planes& pl, const SeqPages& sp,
                                              int k0, int kv, int tid,
                                              HistUnits<D, kKeys, kThreads>& h) {
  using H = HistUnits<D, kKeys, kThreads>;
  const int u = tid % TileShape<D, kKeys>::kUnits;
  const int gi = quant::int2_word_group(u, a.group_size);
#pragma unroll
  for (int r = 0; r < H::kRounds; ++r) {
    const int j = k0 + H::key(tid, r);
    h.code[r] = h.meta[r] = 0;
    if (pl.hbits[kv] != 2 || j >= sp.kend || !key_is_hist(sp, j)) continue;
    int slot;
    const uint8_t* pg = hist_page(a, pl, sp, j, slot);
    const uint8_t* row = pg + pl.hoff[kv] + static_cast<uint32_t>(slot * pl.hrb[kv]);
    h.code[r] = *reinterpret_cast<const uint32_t*>(row + 4 * u);
    h.meta[r] = *reinterpret_cast<const uint32_t*>(row + quant::int2_group_meta_offset(D, gi));
  }
}

// The 16 values of 2-bit code word w of a history row (meta: its group's fp16 scale and min) as
// BF16, in four runs of four: run qq holds values quant::int2_word_element(u, G, qq) .. + 3. The
// group's four levels min + q·scale (or μ + level[q]·σ, Lloyd-Max), one FMA each, go as BF16 into
// two registers (level q in bytes 2q, 2q + 1); each pair of values is then one byte permutation of
// them (quant::int2_run_perm_selector): the same BF16 values as rounding each value, in ~1.5
// instructions a value.
__device__ __forceinline__ void int2_word_bf16(const Args& a, uint32_t w, uint32_t meta,
                                               uint2 (&run)[4]) {
  const float sc = cuda_detail::fp16_bits_to_f32(meta);
  const float mn = cuda_detail::fp16_bits_to_f32(meta >> 16);
  float lv[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) lv[q] = fmaf(a.uniform ? static_cast<float>(q) : a.lloyd[q], sc, mn);
  const uint32_t lo = pack_bf16(lv[0], lv[1]), hi = pack_bf16(lv[2], lv[3]);
#pragma unroll
  for (int qq = 0; qq < 4; ++qq) {
    const uint32_t sel = quant::int2_run_perm_selector(w, qq);
    run[qq] = make_uint2(__byte_perm(lo, hi, sel), __byte_perm(lo, hi, sel >> 16));
  }
}

// Writes the tile's history rows of K or V (dst: that tile) as BF16: 2-bit units from the
// prefetched words, other widths element by element from global memory.
template <int D, int kKeys, int kThreads>
__device__ __forceinline__ void hist_store(const Args& a, const Planes& pl, const SeqPages& sp,
                                           int k0, int kv, int tid,
                                           const HistUnits<D, kKeys, kThreads>& h, uint8_t* dst) {
  using H = HistUnits<D, kKeys, kThreads>;
  using S = TileShape<D, kKeys>;
  const int G = a.group_size;
  const int u = tid % S::kUnits;
  // Word u = code bytes 4u .. 4u+3 of the row: four runs of four values (quant/int2_layout.h).
#pragma unroll
  for (int r = 0; r < H::kRounds; ++r) {
    const int kk = H::key(tid, r), j = k0 + kk;
    if (j >= sp.kend || !key_is_hist(sp, j)) continue;
    if (pl.hbits[kv] == 2) {
      uint2 run[4];
      int2_word_bf16(a, h.code[r], h.meta[r], run);
#pragma unroll
      for (int qq = 0; qq < 4; ++qq)
        *reinterpret_cast<uint2*>(
            dst + sw128_off(kk, quant::int2_word_element(u, G, qq), S::kAtomBytes)) = run[qq];
    } else {
      int slot;
      const uint8_t* pg = hist_page(a, pl, sp, j, slot);
      const uint8_t* row = pg + pl.hoff[kv] + static_cast<uint32_t>(slot * pl.hrb[kv]);
      // Two values at a time, not unrolled: the generic reader is long, and a producer
      // warpgroup's registers are few (the bit plan's 1-, 3- and 4-bit rows are the rare case).
#pragma unroll 1
      for (int e = 16 * u; e < 16 * u + 16; e += 2)
        *reinterpret_cast<uint32_t*>(dst + sw128_off(kk, e, S::kAtomBytes)) = pack_bf16(
            cuda_detail::dequant_element(row, e, D, G, pl.hbits[kv], a.uniform, a.lloyd),
            cuda_detail::dequant_element(row, e + 1, D, G, pl.hbits[kv], a.uniform, a.lloyd));
    }
  }
}

}  // namespace oscar::kernels::prefill_detail
