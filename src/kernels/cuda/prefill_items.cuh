// Internal to the CUDA prefill attention (prefill_attn.cu, prefill_attn_tc.cu): the kernels'
// arguments and the work items they share. An item is a tile of queries of one sequence for one
// KV head; its rows are the tile's queries x the head's GQA query heads, so every K/V byte is read
// once per group. find_item numbers a sequence's tiles last-first (the long ones start first);
// key_rows says where key j lives (a BF16 sink or recent row, or a history row). The
// decode-equivalent helpers (row_deq_end, n_passes, pass_masked, deq_row) serve the staged
// kernels of prefill_attn.cu; the tiled kernels (prefill_attn_tc.cu, prefill_attn_ws.cu) run
// serving prefill only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "kernels/cuda/prefill_deq_zone.cuh"
#include "kernels/page_table.h"

namespace oscar::kernels::prefill_detail {


constexpr float kNegInf = -__builtin_inff();

struct Args {
  int n_seqs, n_heads_q, n_heads_kv, gqa, qt, layer, page_size, group_size, n_planes;
  int page_shift;  // the tiled kernel: log2(page_size) when a power of two, else -1
  int uniform;  // 1 uniform INT2, 0 Lloyd-Max (2-bit rows)
  int int2_row_bytes;
  float scale_log2;
  float lloyd[4];
  const int32_t* cu;    // [n_seqs + 1]
  const int64_t* pos0;  // [n_seqs]
  const float* q;       // [cu[n_seqs], n_heads_q, D]
  float* out;           // [cu[n_seqs], n_heads_q, D]
  const uint8_t* exact_pool;
  const uint8_t* hist_pool;
  uint64_t exact_page_bytes;
  uint64_t hist_page_bytes;         // 0 with a bit plan: page_size · hist_row_prefix[n_planes]
  const int8_t* hist_bits;          // bit plan or null
  const uint32_t* hist_row_prefix;  // bit plan or null
  PageTableView sinks, history, recent;
  // Decode-equivalent on a quantized cache (prefill_deq_zone.cuh); de == 0: serving prefill.
  int de, n_sink, n_recent;
  const float* deq;  // [cap_rows, 2, n_heads_kv, D] the pre-pass's rows, or null
  int64_t cap_rows;
  // The warp-specialised kernel over a quantized cache: the call's distinct history pages
  // expanded to BF16 for this layer (expand_history_launch), [page][2 · n_heads_kv planes: K
  // heads, then V heads][page_size][D], and each history table entry's page among them (null
  // with a BF16 cache).
  const uint8_t* hist_bf16;
  const int32_t* hist_slot;
  int invariant;  // PrefillAttnParams::batch_invariant: passes split per query (n_passes)
  // The warp-specialised kernel's split of an item's key tiles across n_split works (1: none;
  // 0 counts as 1), each writing its rows' normalised partial O and log2-sum-exp to `part`
  // ([n_split][part_rows][n_heads_q][D], then [n_split][part_rows][n_heads_q]; rows counted from
  // cu[0]), which prefill_attn_ws's merge folds into out.
  int n_split, part_rows;
  float* part;
};


// This KV head's planes: exact rows (byte offset inside a page) and history rows.
struct Planes {
  uint64_t eplane[2];  // exact_row_offset(layer, kv, head, 0)
  uint64_t hoff[2];    // int2_row_offset(layer, kv, head, 0)
  int hrb[2], hbits[2];
  uint64_t hpb;  // history page bytes
};

__device__ __forceinline__ Planes make_planes(const Args& a, int kvh, int head_dim) {
  Planes pl;
  const int P = a.page_size;
#pragma unroll
  for (int kv = 0; kv < 2; ++kv) {
    const int p = (a.layer * 2 + kv) * a.n_heads_kv + kvh;
    pl.eplane[kv] = static_cast<uint64_t>(p) * P * head_dim * 2;
    if (a.hist_row_prefix != nullptr) {
      pl.hoff[kv] = static_cast<uint64_t>(P) * a.hist_row_prefix[p];
      pl.hrb[kv] = static_cast<int>(a.hist_row_prefix[p + 1] - a.hist_row_prefix[p]);
      pl.hbits[kv] = a.hist_bits[p];
    } else {
      pl.hoff[kv] = static_cast<uint64_t>(p) * P * a.int2_row_bytes;
      pl.hrb[kv] = a.int2_row_bytes;
      pl.hbits[kv] = 2;
    }
  }
  pl.hpb = a.hist_row_prefix != nullptr ? static_cast<uint64_t>(P) * a.hist_row_prefix[a.n_planes]
                                        : a.hist_page_bytes;
  return pl;
}

// One work item: a tile of queries of one sequence.
struct Item {
  int seq, q0, nqt;
  int split;  // which of Args::n_split parts of the item's key tiles (find_work)
  int64_t p0, n_sink_tok, hist_end;
  int64_t kend;  // the tile reads keys [0, kend)
  int64_t row0;  // step-wide row of query q0
  cuda_detail::DeqZone z;
  // deq_end of the tile's first and last query: keys [n_sink, d_first) are read quantized by
  // every query of the tile, keys >= d_last exactly by every query, [d_first, d_last) both ways.
  int64_t d_first, d_last;
};

__device__ __forceinline__ int64_t row_deq_end(const Args& a, const Item& it, int64_t pos) {
  return cuda_detail::deq_end(it.z, a.de != 0, a.n_sink, a.n_recent, a.page_size, pos);
}

// Key tiles [k0, k0 + n) that hold keys of [d_first, d_last) take two passes: pass 0 stages those
// keys quantized (the scratch) and masks them for the queries that read them exactly, pass 1
// stages them exactly and masks them for the queries that read them quantized (and every key
// outside). Other tiles take pass 0 alone, which is then the plain causal pass.
// Batch-invariant (a.invariant): which of a query's keys go in which pass must follow from the
// query alone, not from the tile's other queries (a chunk boundary moves d_first and d_last):
// every tile that some query's deq_end cuts (k0 < de < k0 + n for a de in [d_first, d_last])
// takes two passes, pass 0 holding each query's keys below its deq_end and pass 1 those above.
// A query's online softmax then always takes such a tile in two updates and any other tile in
// one (the other pass masks all its keys: alpha = 1, p = 0, an exact no-op).
__device__ __forceinline__ int n_passes(const Args& a, const Item& it, int64_t k0, int n) {
  if (a.invariant) return k0 < it.d_last && k0 + n > it.d_first ? 2 : 1;
  return it.d_first < it.d_last && k0 < it.d_last && k0 + n > it.d_first ? 2 : 1;
}

// The pass's mask of key j for the query at pos with deq_end de (on top of causality), in a tile
// of npass passes.
__device__ __forceinline__ bool pass_masked(const Args& a, const Item& it, int pass, int npass,
                                            int64_t j, int64_t de) {
  if (a.invariant) return npass == 2 && (pass == 0) == (j >= de);
  const bool both_ways = j >= it.d_first && j < it.d_last && j >= de;  // the query reads it exact
  return pass == 0 ? both_ways : !both_ways;
}

// Key j's rows in the scratch when this pass stages it quantized from there (null otherwise).
__device__ __forceinline__ const float* deq_row(const Args& a, const Item& it, int pass, int kvh,
                                                int64_t j, int head_dim) {
  const int64_t dend = pass == 0 ? it.d_last : it.d_first;
  if (!it.z.ok || j < it.z.lo || j >= dend) return nullptr;
  return a.deq + ((static_cast<size_t>(it.z.base + (j - it.z.lo)) * 2) * a.n_heads_kv + kvh) *
                     static_cast<size_t>(head_dim);
}

// Item `item` in the order (sequence, tile last-first); false past the last one.
__device__ __forceinline__ bool find_item(const Args& a, int item, Item& it) {
  int acc = 0;
  for (int s = 0; s < a.n_seqs; ++s) {
    const int nq = a.cu[s + 1] - a.cu[s];
    const int nt = nq > 0 ? (nq + a.qt - 1) / a.qt : 0;
    if (item < acc + nt) {
      const int tile = nt - 1 - (item - acc);
      const int P = a.page_size;
      it.seq = s;
      it.q0 = tile * a.qt;
      it.nqt = min(a.qt, nq - it.q0);
      it.p0 = a.pos0[s];
      it.n_sink_tok = a.sinks.seq_len(s, P);
      it.hist_end = it.n_sink_tok + a.history.seq_len(s, P);
      it.kend = it.p0 + it.q0 + it.nqt;
      it.row0 = static_cast<int64_t>(a.cu[s]) + it.q0;
      it.z = cuda_detail::deq_zone(a.cu, a.pos0, a.sinks, a.history, s, a.de != 0, a.n_sink,
                                   a.n_recent, P, a.cap_rows);
      it.d_first = row_deq_end(a, it, it.p0 + it.q0);
      it.d_last = row_deq_end(a, it, it.kend - 1);
      return true;
    }
    acc += nt;
  }
  return false;
}

// Work w: KV head w % n_heads_kv, then part (w / n_heads_kv) % n_split of item
// w / n_heads_kv / n_split.
__device__ __forceinline__ bool find_work(const Args& a, int w, Item& it, int& kvh) {
  const int n_split = max(1, a.n_split);
  kvh = w % a.n_heads_kv;
  const int rest = w / a.n_heads_kv;
  it.split = rest % n_split;
  return find_item(a, rest / n_split, it);
}

// Runs f(it, kvh) for each of the block's (item, KV head) pairs in turn, the opening of every
// prefill kernel's work loop (and of the warp-specialised kernel's producer and consumers). The
// grid is exactly one wave of resident blocks (a partial second wave would start only when the
// first ends and double the time: 136 blocks on 132 SMs did); round k gives the blocks works
// kG .. kG + G - 1 (G = gridDim.x), in block order on even rounds and reversed on odd ones. Works
// come longest first, so a block that takes a round's longest takes the next round's shortest:
// in block order every round, block 0 would take the longest each time.
template <class F>
__device__ __forceinline__ void for_each_work(const Args& a, F&& f) {
  const int G = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
#pragma unroll 1
  for (int k = 0;; ++k) {
    Item it;
    int kvh;
    // Past the last work in round k, the block is past it in every later round too.
    if (!find_work(a, k * G + ((k & 1) ? G - 1 - b : b), it, kvh)) return;
    f(it, kvh);
  }
}

// Where key j (< kend) of the item lives: its K and V rows, exact (BF16) or history.
struct KeyRows {
  const uint8_t* k;
  const uint8_t* v;
  bool hist;
};

__device__ __forceinline__ KeyRows key_rows(const Args& a, const Planes& pl, const Item& it,
                                            int64_t j, int head_dim) {
  const int P = a.page_size;
  KeyRows r;
  if (j < it.n_sink_tok || j >= it.hist_end) {
    const bool sink = j < it.n_sink_tok;
    const int64_t t = sink ? j : j - it.hist_end;
    const PageTableView& pt = sink ? a.sinks : a.recent;
    const int page = pt.page_ids[pt.indptr[it.seq] + static_cast<int>(t / P)];
    const uint8_t* base = a.exact_pool + static_cast<uint64_t>(page) * a.exact_page_bytes +
                          static_cast<uint64_t>(t % P) * head_dim * 2;
    r.k = base + pl.eplane[0];
    r.v = base + pl.eplane[1];
    r.hist = false;
  } else {
    const int64_t t = j - it.n_sink_tok;
    const int page = a.history.page_ids[a.history.indptr[it.seq] + static_cast<int>(t / P)];
    const uint8_t* pg = a.hist_pool + static_cast<uint64_t>(page) * pl.hpb;
    const uint64_t slot = static_cast<uint64_t>(t % P);
    r.k = pg + pl.hoff[0] + slot * pl.hrb[0];
    r.v = pg + pl.hoff[1] + slot * pl.hrb[1];
    r.hist = true;
  }
  return r;
}

// Two floats rounded to a packed BF16 pair (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The tiled tensor-core kernel (prefill_attn_tc.cu): serving prefill (a.de == 0), head_dim 64 or
// 128, any history width; wgmma (sm_90a) or mma.sync. Grid as prefill_attn.cu's kernels (one wave
// of resident blocks walking find_work). Asynchronous on `stream`.
Status prefill_attn_tc_launch(const Args& a, int head_dim, bool wgmma, cudaStream_t stream);

// The warp-specialised kernel (prefill_attn_ws.cu): serving prefill, head_dim 128, sm_90a, over a
// BF16 cache or (quantized) over history expanded to BF16 pages (a.hist_slot and, when the call
// has history pages, a.hist_bf16), which only its TMA producer reads: prefill_attn_ws_tma says
// whether it loads by TMA at a page size.
// With a.n_split > 1 (and a.part, a.part_rows for its scratch), each item's key tiles are cut
// into that many works and a second kernel merges their parts into a.out.
Status prefill_attn_ws_launch(const Args& a, int head_dim, bool quantized, cudaStream_t stream);
// How many parts to cut each item's keys into (1: none), so that a call of few items (a short
// chunk at depth) still fills the GPU: as many as one wave of blocks holds, each of at least 2048
// keys, at most 16; 1 for batch-invariant calls (a query's result would depend on the call's
// other rows). max_rows / max_keys: PrefillAttnParams' bounds (0: unknown, no split).
int prefill_attn_ws_split(const Args& a, int max_rows, int64_t max_keys);
Status prefill_attn_ws_tma(int page_size, bool* tma);

// Dequantizes history pages pages[0, n_pages) (device ids) of layer a.layer to BF16 into dst,
// [n_pages][2 · n_heads_kv][page_size][D] (prefill_hist_bf16.cu): the values the tiled kernel
// stages (int2_word_bf16; other widths rounded from dequant_element). Asynchronous on `stream`.
Status expand_history_launch(const Args& a, int head_dim, const int32_t* pages, int32_t n_pages,
                             uint8_t* dst, cudaStream_t stream);

}  // namespace oscar::kernels::prefill_detail
