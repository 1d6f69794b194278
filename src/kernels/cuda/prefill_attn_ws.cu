// The warp-specialised prefill attention for sm_90a (prefill_detail::prefill_attn_ws_launch), the
// default kernel of prefill_attn_cuda for serving prefill and extend at head_dim 128: causal
// attention of a step's prefill chunks over the paged cache, FlashAttention-3 style.
//
// Work: the items of prefill_items.cuh (a tile of 128 / gqa queries of one sequence x the gqa
// query heads of one KV head = up to 128 rows), so every K/V tile is read once per KV group and
// used by all its query heads. A block has three warpgroups:
//   warpgroup 0, the producer (its registers given to the others by setmaxnreg): fills a ring of
//     three K/V tiles of 128 keys. By TMA (the default): one warp, each lane one page of the tile,
//     a [page_size][64] box per page plane and 64-dim atom straight from the exact pool into the
//     swizzled tile, completing on the slot's full mbarrier; a page cut by the sequence's end
//     goes by cp.async with its rows past the end zero-filled. By cp.async (page sizes TMA boxes
//     do not fit, or OSCAR_PREFILL_WS_TMA=0): all 128 threads, signalling a slot full one tile
//     later, once its copies have landed, so two tiles' copies are in flight;
//   warpgroups 1 and 2, the consumers, 64 rows each: S = Q·Kᵀ by wgmma with Q (BF16, pre-scaled
//     by scale·log2 e) and K both in shared memory, the causal mask on tiles that reach past the
//     item's first query only, online softmax in exp2 on the accumulators, P as BF16 A fragments
//     in registers, O += P·V by wgmma (V MN-major); then they signal the slot empty.
//     With the TMA producer they run FA3's schedule: tile t's QKᵀ issued with tile t-1's P·V,
//     tile t's softmax while P·V is in flight (P double-buffered in registers), and the two
//     consumers taking turns to issue (ping-pong: one's softmax under the other's MMAs).
//
// Quantized history: read as BF16 pages that expand_history_launch (prefill_hist_bf16.cu) wrote for
// the layer, through a second tensor map (TMA producer only). Unpacking here measured slower:
// 79-97 TFLOP/s with the TMA producer unpacking, 121-137 with the cp.async one.
//
// Not here: head_dim 64 (prefill_attn_tc.cu); the decode-equivalent reading (prefill_attn.cu).
// Not yet: head_dim 256.
#include <cuda.h>  // CUtensorMap (the driver's encoder is fetched at run time: no libcuda link)
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/prefill_items.cuh"
#include "kernels/cuda/prefill_tile.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace oscar::kernels::prefill_detail {

namespace {

using namespace oscar::cuda;

constexpr int kWsConsumers = 2;                       // consumer warpgroups, 64 rows each
constexpr int kWsThreads = 128 * (1 + kWsConsumers);  // warpgroup 0 produces
constexpr int kWsRows = 64 * kWsConsumers;            // rows of an item
constexpr int kWsKeys = 128;                          // keys per K/V tile
// Registers per thread after reallocation: 128·P + 256·C within the launch's 384 x 168. The
// TMA producer spilled at 40; the consumers need no more than 224 (ptxas -v: no spills).
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
constexpr int kWsStages = 3;  // ring slots: 224 KiB of shared memory with Q
// Splitting an item's keys (prefill_attn_ws_split): parts of at least this many keys (a part's
// first and last tiles do not overlap with others), at most this many parts.
constexpr int64_t kWsMinPartKeys = 16 * kWsKeys;
constexpr int kWsMaxSplit = 16;
// Named barriers: 1 + c consumer c's own, kSchedBar + c its turn (ping-pong), kProducerBar the
// producer warpgroup's.
constexpr int kSchedBar = 3, kProducerBar = 5;
// The consumers' setmaxnreg.inc waits until the registers the producer gave back cover it: the
// split must stay within what the launch allocated (384 x 168), not the SM's 64K (an increase
// counting on the rest never completed: a hang on the H200).
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kWsThreads * 168);

template <int D, int kStages>
struct WsShape {
  using T = TileShape<D, kWsKeys>;
  static constexpr int kQAtomBytes = 64 * 128;     // [64 rows][64] BF16
  static constexpr int kQHalfBytes = 64 * D * 2;   // one consumer's rows
  static constexpr int kQBytes = kWsConsumers * kQHalfBytes;
  static constexpr int kStageBytes = 2 * T::kTileBytes;  // K, then V
  static constexpr int kBarOff = kQBytes + kStages * kStageBytes;
  static constexpr size_t kSmemBytes = kBarOff + 2 * kStages * 8 + 1024;  // + 1024-alignment
};

// The block's tiles in order (items, then their key tiles): the ring slot and phase of tile n.
struct Ring {
  uint32_t full0, empty0;  // mbarrier addresses of slot 0 (slot s: + 8s)
  template <int kStages>
  __device__ __forceinline__ uint32_t full(uint32_t n) const {
    return full0 + 8 * (n % kStages);
  }
  template <int kStages>
  __device__ __forceinline__ uint32_t empty(uint32_t n) const {
    return empty0 + 8 * (n % kStages);
  }
  template <int kStages>
  __device__ __forceinline__ static uint32_t parity(uint32_t n) {
    return (n / kStages) & 1;
  }
};

// Key tiles [t0, t1) of the item's part it.split: its tiles cut into n_split runs of
// ceil(tiles / n_split) (all of them without a split); the last parts may be empty.
__device__ __forceinline__ void part_tiles(const Args& a, const Item& it, int& t0, int& t1) {
  const int n_tiles = static_cast<int>((it.kend + kWsKeys - 1) / kWsKeys);
  const int n_split = max(1, a.n_split);
  const int per = (n_tiles + n_split - 1) / n_split;
  t0 = min(n_tiles, it.split * per);
  t1 = min(n_tiles, t0 + per);
}

// How the producer fills a slot: by cp.async from 128 threads, or by TMA (one box per page plane
// and 64-dim atom, issued by one warp).
enum WsLoad { kLoadCpAsync, kLoadTma };

template <int D, int kStages>
__device__ __forceinline__ void ws_produce(const Args& a, uint32_t tiles_addr, const Ring& ring) {
  using S = WsShape<D, kStages>;
  using T = TileShape<D, kWsKeys>;
  const int tid = threadIdx.x;  // 0 .. 127
  uint32_t n = 0;
  for_each_work(a, [&](const Item& it, int kvh) {
    const Planes pl = make_planes(a, kvh, D);
    const SeqPages sp = seq_pages(a, it);
    int t0, t1;
    part_tiles(a, it, t0, t1);
#pragma unroll 1
    for (int tile = t0; tile < t1; ++tile, ++n) {
      mbar_wait(ring.empty<kStages>(n), Ring::parity<kStages>(n) ^ 1);
      const uint32_t slot = tiles_addr + (n % kStages) * S::kStageBytes;
      load_exact<D, kWsKeys, 128>(a, pl, sp, tile * kWsKeys, false, slot, slot + T::kTileBytes,
                                  tid);
      cp_async_commit();
      // The previous tile's copies have landed (this one's stay in flight): visible to wgmma
      // (the async proxy), then its slot is signalled full.
      if (n > 0) {
        cp_async_wait<1>();
        fence_proxy_async_smem();
        mbar_arrive(ring.full<kStages>(n - 1));
      }
    }
  });
  if (n > 0) {
    cp_async_wait<0>();
    fence_proxy_async_smem();
    mbar_arrive(ring.full<kStages>(n - 1));
  }
}

// The TMA producer (BF16 caches, page_size a power of two in [8, 128]): lane g of warp 0 copies
// page group g of a tile (keys 16g .. 16g + 15 at page_size 16), K and V, as boxes of
// [page_size][64] BF16 from the pool's tensor map (dims: 64-dim atom, slot, plane, page) straight
// into the swizzled tile; lane 0 posts the tile's bytes on its full barrier. The page that kend
// cuts goes by cp.async with its rows past kend zero-filled (a page's unused rows may hold
// anything, NaN in the tests); groups wholly past kend are not copied, leaving the slot's earlier
// contents (zeros at first, then rows of earlier tiles). Either way the softmax gives those keys
// p = 0, and 0 times a finite V is 0.
template <int D, int kStages>
__device__ __forceinline__ void ws_produce_tma(const Args& a, const void* map, const void* hmap,
                                               uint32_t tiles_addr, const Ring& ring) {
  using S = WsShape<D, kStages>;
  using T = TileShape<D, kWsKeys>;
  // The ring starts zeroed (groups never copied must not hold NaN patterns), visible to wgmma
  // before lane 0's first arrival.
  for (uint32_t off = 16 * threadIdx.x; off < kStages * S::kStageBytes; off += 16 * 128)
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(tiles_addr + off), "r"(0)
                 : "memory");
  fence_proxy_async_smem();
  named_barrier(kProducerBar, 128);
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  const int P = a.page_size, shift = a.page_shift;
  const int groups = kWsKeys >> shift;
  const uint32_t box_bytes = static_cast<uint32_t>(P) * 64 * 2;
  uint32_t n = 0;
  for_each_work(a, [&](const Item& it, int kvh) {
    const SeqPages sp = seq_pages(a, it);
    const Planes pl = make_planes(a, kvh, D);
    const int plane_k = (a.layer * 2) * a.n_heads_kv + kvh, plane_v = plane_k + a.n_heads_kv;
    const int32_t* hslot =
        a.hist_slot != nullptr ? a.hist_slot + a.history.indptr[it.seq] : nullptr;
    int t0, t1;
    part_tiles(a, it, t0, t1);
#pragma unroll 1
    for (int tile = t0; tile < t1; ++tile, ++n) {
      const int k0 = tile * kWsKeys;
      // Whole page groups by TMA; a group cut by kend by cp.async, below.
      const int whole = min(groups, (sp.kend - k0) >> shift);
      const bool cut = whole < groups && k0 + (whole << shift) < sp.kend;
      mbar_wait(ring.empty<kStages>(n), Ring::parity<kStages>(n) ^ 1);
      const uint32_t slot = tiles_addr + (n % kStages) * S::kStageBytes;
      const uint32_t full = ring.full<kStages>(n);
      if (cut) {
        // The page's rows past the sequence hold whatever was there (NaN in the tests): they are
        // zero-filled, and the copies waited for before the slot is signalled.
        constexpr int kChunks = D / 8;
        const int kk0 = whole << shift;
#pragma unroll 1
        for (int i = lane; i < (kChunks << shift); i += 32) {
          const int kk = kk0 + i / kChunks, c = i % kChunks, j = k0 + kk;
          const uint32_t off = sw128_off(kk, 8 * c, T::kAtomBytes);
          const uint8_t* row = j < sp.kend ? exact_row<D>(a, sp, j) + 16 * c : a.exact_pool;
          cp_async16(slot + off, row + (j < sp.kend ? pl.eplane[0] : 0), j < sp.kend);
          cp_async16(slot + T::kTileBytes + off, row + (j < sp.kend ? pl.eplane[1] : 0),
                     j < sp.kend);
        }
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncwarp();
      }
      if (lane == 0) mbar_arrive_expect_tx(full, whole * 2 * (D / 64) * box_bytes);
      if (lane < whole) {
        // Region boundaries fall on pages: a group is a sink, history or recent page. History
        // pages come from their BF16 expansion (planes: this layer's K heads, then V heads).
        const int j = k0 + (lane << shift);
        const bool sink = j < sp.n_sink_tok, hist = !sink && j < sp.hist_end;
        const int id = sink   ? sp.sink[j >> shift]
                       : hist ? hslot[(j - sp.n_sink_tok) >> shift]
                              : sp.recent[(j - sp.hist_end) >> shift];
        const void* m = hist ? hmap : map;
        const int pk = hist ? kvh : plane_k, pv = hist ? kvh + a.n_heads_kv : plane_v;
        const uint32_t row_off = static_cast<uint32_t>(lane << shift) * 128;
#pragma unroll
        for (int at = 0; at < D / 64; ++at) {
          tma_load_4d(slot + at * T::kAtomBytes + row_off, m, full, 64 * at, 0, pk, id);
          tma_load_4d(slot + T::kTileBytes + at * T::kAtomBytes + row_off, m, full, 64 * at, 0,
                      pv, id);
        }
      }
    }
  });
}

// Writes this consumer's 64 rows of Q as BF16 (pre-scaled) into its swizzled [64][D] half.
template <int D>
__device__ __forceinline__ void ws_stage_q(const Args& a, const Item& it, int kvh, int cw, int tid,
                                           uint8_t* qs) {
  const int r = tid >> 1, half = tid & 1;  // row r, values half·D/2 .. +D/2
  const int m = 64 * cw + r, qi = m / a.gqa, hh = m % a.gqa;
  const bool valid = m < a.qt * a.gqa && qi < it.nqt;
  const float* src =
      valid ? a.q + ((it.row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D : nullptr;
#pragma unroll
  for (int c = 0; c < D / 16; ++c) {
    const int e = half * (D / 2) + 8 * c;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (src != nullptr) {
      const float4 x0 = *reinterpret_cast<const float4*>(src + e);
      const float4 x1 = *reinterpret_cast<const float4*>(src + e + 4);
      const float sc = a.scale_log2;
      v = make_uint4(pack_bf16(x0.x * sc, x0.y * sc), pack_bf16(x0.z * sc, x0.w * sc),
                     pack_bf16(x1.x * sc, x1.y * sc), pack_bf16(x1.z * sc, x1.w * sc));
    }
    *reinterpret_cast<uint4*>(qs + sw128_off(r, e, 64 * 128)) = v;
  }
}

// 2^x on the SFU (ex2.approx.ftz: 2^-inf = +0), the softmax's exponential.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

constexpr int kNB = kWsKeys / 8;    // 8-key blocks of S
constexpr int kNKP = kWsKeys / 16;  // k-steps of P·V

// A consumer warpgroup's online-softmax state for this lane's two rows (r = 0: row 16·warp + g,
// r = 1: + 8).
struct RowState {
  float m[2] = {kNegInf, kNegInf};  // running maxima (log2 units)
  float l[2] = {0.f, 0.f};          // this lane's part of the running sums
  int64_t pos[2];                   // the rows' query positions (causal limit)
};

// Softmax of tile k0's scores s (causally masked when kMask): P as BF16 A fragments, this tile's
// row sums, and the factor alpha by which the running O and l must be scaled. Updates the running
// maxima only. Only the item's last tile or two reach past its first query and take the mask:
// masking every tile (an int64 compare and select per score) had the softmax outlast the other
// warpgroup's MMAs.
template <bool kMask>
__device__ __forceinline__ void tile_softmax(const float (&s_in)[kNB][4], int64_t k0, int t,
                                             RowState& st, uint32_t (&pa)[kNKP][4],
                                             float (&sum)[2], float (&alpha)[2]) {
  // The scores are only read here, never written: in the pipelined loop they are the
  // accumulators of a wgmma stage still open (P·V in flight), where ptxas would serialise the
  // wgmmas on any other instruction defining them.
  float s[kNB][4];
  // Key k0 + 8nb + 2t + (c & 1) is past row r's query when 8nb + (c & 1) > lim[r].
  int lim[2] = {0, 0};
  if constexpr (kMask) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      lim[r] = static_cast<int>(min(st.pos[r] - k0, static_cast<int64_t>(kWsKeys))) - 2 * t;
  }
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      s[nb][c] = kMask && 8 * nb + (c & 1) > lim[c >> 1] ? kNegInf : s_in[nb][c];
  // Row maxima over the tile: four independent chains per row, then the quad's lanes.
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m4[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) m4[q] = fmaxf(s[q][2 * r], s[q][2 * r + 1]);
#pragma unroll
    for (int nb = 4; nb < kNB; ++nb)
      m4[nb & 3] = fmaxf(m4[nb & 3], fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
    mx[r] = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
  }
  // No branch or vote here: in the pipelined loop this runs inside an open wgmma stage, where
  // ptxas serialises the wgmmas around one (measured by its C7513 warning).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mnew = fmaxf(st.m[r], mx[r]);
    alpha[r] = mnew == st.m[r] ? 1.f : fast_exp2(st.m[r] - mnew);  // 2^-inf = 0
    st.m[r] = mnew;
  }
  // P as BF16 A fragments: k-step kp = keys 16kp .. +15 = S blocks 2kp, 2kp + 1.
  const float mb[2] = {st.m[0] == kNegInf ? 0.f : st.m[0],
                       st.m[1] == kNegInf ? 0.f : st.m[1]};  // nothing visible yet: p = 0
  float l4[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb) {
    float p[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      p[c] = fast_exp2(s[nb][c] - mb[c >> 1]);
      l4[c >> 1][nb & 1] += p[c];
    }
    pa[nb >> 1][2 * (nb & 1)] = pack_bf16(p[0], p[1]);
    pa[nb >> 1][2 * (nb & 1) + 1] = pack_bf16(p[2], p[3]);
  }
  sum[0] = l4[0][0] + l4[0][1];
  sum[1] = l4[1][0] + l4[1][1];
}

// O and l scaled by alpha, then l += this tile's sums. Always: skipping alpha = 1 by a vote and a
// branch made ptxas serialise the pipelined loop's wgmmas (its C7513 warning).
template <int NDB>
__device__ __forceinline__ void apply_tile(float (&o)[NDB][4], RowState& st, const float (&sum)[2],
                                           const float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st.l[r] = st.l[r] * alpha[r] + sum[r];
#pragma unroll
    for (int db = 0; db < NDB; ++db) {
      o[db][2 * r] *= alpha[r];
      o[db][2 * r + 1] *= alpha[r];
    }
  }
}

// S = Q·Kᵀ of the warpgroup's 64 rows over a 128-key tile (issued, not waited for).
template <int D, int kStages>
__device__ __forceinline__ void issue_scores(uint32_t qs_addr, uint32_t ks, float (&s)[kNB][4]) {
  using S = WsShape<D, kStages>;
  using T = TileShape<D, kWsKeys>;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    // K-major A and B: 16 dims = 32 bytes of each row inside atom k / 4; 8-row groups 1024 bytes
    // apart.
    const uint64_t qd =
        wgmma_desc_sw128(qs_addr + (k / 4) * S::kQAtomBytes + (k % 4) * 32, 16, 1024);
    const uint64_t kd = wgmma_desc_sw128(ks + (k / 4) * T::kAtomBytes + (k % 4) * 32, 16, 1024);
    wgmma_m64n128k16_ss<0>(s, qd, kd, k > 0);
  }
  wgmma_commit();
}

// O += P·V over a 128-key tile (issued, not waited for).
template <int D>
__device__ __forceinline__ void issue_pv(const uint32_t (&pa)[kNKP][4], uint32_t vs,
                                         float (&o)[D / 8][4]) {
  using T = TileShape<D, kWsKeys>;
#pragma unroll
  for (int kp = 0; kp < kNKP; ++kp) {
    // MN-major B: 16 keys = two 8-row groups (1024 bytes apart) from key 16kp; 64-dim atoms
    // kAtomBytes apart.
    const uint64_t vd = wgmma_desc_sw128(vs + kp * 2048, T::kAtomBytes, 1024);
    wgmma_m64n128k16_rs<1>(o, pa[kp], vd, 1);
  }
  wgmma_commit();
}

// Ping-pong (FA3's warp-scheduler barrier): the two consumers take turns issuing wgmmas, so that
// one's softmax runs while the other's MMAs do. Consumer c waits at barrier kSchedBar + c, then
// passes the turn to the other; consumer 0 holds the first turn.
__device__ __forceinline__ void turn_wait(int cw) { named_barrier(kSchedBar + cw, 256); }
__device__ __forceinline__ void turn_pass(int cw) { named_barrier_arrive(kSchedBar + (cw ^ 1), 256); }

// A split item's partials (Args::part): row m of the item's rows (query m / gqa, head m % gqa)
// as an index of [n_split][part_rows][n_heads_q]; O at that index times D, the log2-sum-exp after
// all of O.
__device__ __forceinline__ size_t part_index(const Args& a, const Item& it, int kvh, int m) {
  const int64_t row = it.row0 + m / a.gqa - a.cu[0];
  return (static_cast<size_t>(it.split) * a.part_rows + row) * a.n_heads_q + kvh * a.gqa +
         m % a.gqa;
}
template <int D>
__device__ __forceinline__ float* part_lse(const Args& a) {
  return a.part + static_cast<size_t>(max(1, a.n_split)) * a.part_rows * a.n_heads_q * D;
}
// Row m of an empty part: weight 0 in the merge (its O is never read).
template <int D>
__device__ __forceinline__ void write_empty_part(const Args& a, const Item& it, int kvh, int m) {
  if (m < a.qt * a.gqa && m / a.gqa < it.nqt) part_lse<D>(a)[part_index(a, it, kvh, m)] = kNegInf;
}

// kFa3: FA3's schedule (the intra-warpgroup overlap, with ping-pong), which pays only with the TMA
// producer; otherwise one tile at a time: scores, softmax, P·V.
template <int D, int kStages, bool kFa3>
__device__ __forceinline__ void ws_consume(const Args& a, int cw, uint8_t* smem,
                                           uint32_t smem_addr_, const Ring& ring) {
  using S = WsShape<D, kStages>;
  using T = TileShape<D, kWsKeys>;
  constexpr int NDB = D / 8;  // 8-dim blocks of O
  static_assert(D == 128, "O += P·V is one m64n128 wgmma per k-step");
  const int tid = threadIdx.x - 128 * (1 + cw);  // 0 .. 127 in this warpgroup
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  uint8_t* qs = smem + cw * S::kQHalfBytes;
  const uint32_t qs_addr = smem_addr_ + cw * S::kQHalfBytes;
  const uint32_t tiles_addr = smem_addr_ + S::kQBytes;
  const int bar = 1 + cw;  // this warpgroup's named barrier
  if (kFa3 && cw == 0) named_barrier_arrive(kSchedBar, 256);
  uint32_t n = 0;
  for_each_work(a, [&](const Item& it, int kvh) {
    const int64_t first_pos = it.p0 + it.q0;  // the item's smallest query position
    int t0, t1;
    part_tiles(a, it, t0, t1);
    if (t0 == t1) {  // an empty part (a split item shorter than the parts): nothing to add
      if (tid < 64) write_empty_part<D>(a, it, kvh, 64 * cw + tid);
      return;
    }
    named_barrier(bar, 128);  // the previous item's reads of Q are done in every warp
    ws_stage_q<D>(a, it, kvh, cw, tid, qs);
    fence_proxy_async_smem();
    named_barrier(bar, 128);

    RowState st;
#pragma unroll
    for (int r = 0; r < 2; ++r) st.pos[r] = first_pos + (64 * cw + 16 * warp + g + 8 * r) / a.gqa;
    float o[NDB][4];
#pragma unroll
    for (int db = 0; db < NDB; ++db)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[db][c] = 0.f;

    const auto ks_of = [&](uint32_t m) { return tiles_addr + (m % kStages) * S::kStageBytes; };
    float s[kNB][4], sum[2], alpha[2];
    uint32_t pa[kNKP][4];
    // Tiles below n_free lie wholly below the item's first query: no causal mask.
    const int n_free = static_cast<int>(min(static_cast<int64_t>(t1), (first_pos + 1) / kWsKeys));
    const auto softmax = [&](int tile, uint32_t (&p)[kNKP][4]) {
      const int64_t k0 = static_cast<int64_t>(tile) * kWsKeys;
      if (tile < n_free)
        tile_softmax<false>(s, k0, t, st, p, sum, alpha);
      else
        tile_softmax<true>(s, k0, t, st, p, sum, alpha);
    };
    if constexpr (kFa3) {
      // The first tile: scores, softmax (O is still zero: nothing to rescale).
      mbar_wait(ring.full<kStages>(n), Ring::parity<kStages>(n));
      wgmma_fence();
      issue_scores<D, kStages>(qs_addr, ks_of(n), s);
      wgmma_wait<0>();
      softmax(t0, pa);
      apply_tile(o, st, sum, alpha);
      // Each later tile: its QKᵀ with the previous tile's P·V. The unmasked tiles and the masked
      // ones run as two loops, each with no branch inside the wgmma stage it keeps open (where
      // ptxas would serialise the wgmmas).
      const auto step = [&](int tile, auto masked) {
        const uint32_t cur = n + (tile - t0);
        mbar_wait(ring.full<kStages>(cur), Ring::parity<kStages>(cur));
        // Tile t's QKᵀ and tile t-1's P·V in flight together; tile t's softmax then overlaps
        // the P·V, into a second set of P registers.
        // Every descriptor computed before the stage opens: an instruction defining a wgmma
        // input inside it would make ptxas serialise the stage's wgmmas.
        uint64_t qd[D / 16], kd[D / 16], vd[kNKP];
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
          qd[k] = wgmma_desc_sw128(qs_addr + (k / 4) * S::kQAtomBytes + (k % 4) * 32, 16, 1024);
          kd[k] = wgmma_desc_sw128(ks_of(cur) + (k / 4) * T::kAtomBytes + (k % 4) * 32, 16, 1024);
        }
#pragma unroll
        for (int kp = 0; kp < kNKP; ++kp)
          vd[kp] = wgmma_desc_sw128(ks_of(cur - 1) + T::kTileBytes + kp * 2048, T::kAtomBytes, 1024);
        fence_operands(o);
        fence_operands(pa);
        turn_wait(cw);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
          if (k == 0)
            wgmma_m64n128k16_ss_zero<0>(s, qd[k], kd[k]);
          else
            wgmma_m64n128k16_ss<0>(s, qd[k], kd[k], 1);
        }
        wgmma_commit();
#pragma unroll
        for (int kp = 0; kp < kNKP; ++kp) wgmma_m64n128k16_rs<1>(o, pa[kp], vd[kp], 1);
        wgmma_commit();
        turn_pass(cw);
        wgmma_wait<1>();  // the scores (committed first) are in
        uint32_t pa_next[kNKP][4];
        tile_softmax<decltype(masked)::value>(s, static_cast<int64_t>(tile) * kWsKeys, t, st,
                                              pa_next, sum, alpha);
        wgmma_wait<0>();  // P·V of tile t-1 is in O
        fence_operands(o);
        fence_operands(pa);
        mbar_arrive(ring.empty<kStages>(cur - 1));
        apply_tile(o, st, sum, alpha);
#pragma unroll
        for (int kp = 0; kp < kNKP; ++kp)
#pragma unroll
          for (int c = 0; c < 4; ++c) pa[kp][c] = pa_next[kp][c];
      };
      int tile = t0 + 1;
#pragma unroll 1
      for (; tile < n_free; ++tile) step(tile, std::false_type{});
#pragma unroll 1
      for (; tile < t1; ++tile) step(tile, std::true_type{});
      const uint32_t last = n + (t1 - t0 - 1);
      wgmma_fence();
      issue_pv<D>(pa, ks_of(last) + T::kTileBytes, o);
      wgmma_wait<0>();
      mbar_arrive(ring.empty<kStages>(last));
      n = last + 1;
    } else {
#pragma unroll 1
      for (int tile = t0; tile < t1; ++tile, ++n) {
        mbar_wait(ring.full<kStages>(n), Ring::parity<kStages>(n));
        wgmma_fence();
        issue_scores<D, kStages>(qs_addr, ks_of(n), s);
        wgmma_wait<0>();
        softmax(tile, pa);
        apply_tile(o, st, sum, alpha);
        wgmma_fence();
        issue_pv<D>(pa, ks_of(n) + T::kTileBytes, o);
        wgmma_wait<0>();
        mbar_arrive(ring.empty<kStages>(n));  // this thread is done with the slot
      }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = st.l[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int m = 64 * cw + 16 * warp + g + 8 * r, qi = m / a.gqa, hh = m % a.gqa;
      if (m >= a.qt * a.gqa || qi >= it.nqt) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      float* dst = a.out + ((it.row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D;
      if (a.n_split > 1) {  // this part's normalised O and log2-sum-exp, for the merge
        const size_t ph = part_index(a, it, kvh, m);
        dst = a.part + ph * D;
        if (t == 0) part_lse<D>(a)[ph] = l > 0.f ? st.m[r] + __log2f(l) : kNegInf;
      }
#pragma unroll
      for (int db = 0; db < NDB; ++db)
        *reinterpret_cast<float2*>(dst + 8 * db + 2 * t) =
            make_float2(o[db][2 * r] * inv, o[db][2 * r + 1] * inv);
    }
  });
  // Consumer 1's last pass is still pending at consumer 0's barrier: take it, so that every
  // arrival has its wait.
  if (kFa3 && cw == 0) turn_wait(0);
}

template <int D, int kStages, int kLoad>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_attn_ws_kernel(const __grid_constant__ Args a, const __grid_constant__ CUtensorMap map,
                           const __grid_constant__ CUtensorMap hmap) {
  using S = WsShape<D, kStages>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // [Q of consumer 0, 1][slot][K, V][full barriers][empty barriers], 1024-aligned (the swizzle
  // pattern follows address bits 4-9).
  const uint32_t raw_addr = smem_addr(smem_raw);
  uint8_t* smem = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
  const uint32_t base = smem_addr(smem);
  const Ring ring{base + S::kBarOff, base + S::kBarOff + 8 * kStages};
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(ring.full0 + 8 * s, kLoad == kLoadTma ? 1 : 128);  // lane 0 / every producer
      mbar_init(ring.empty0 + 8 * s, 2 * 128);  // every consumer thread
    }
  }
  __syncthreads();
  if (threadIdx.x / 128 == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if constexpr (kLoad == kLoadTma)
      ws_produce_tma<D, kStages>(a, &map, &hmap, base + S::kQBytes, ring);
    else
      ws_produce<D, kStages>(a, base + S::kQBytes, ring);
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    ws_consume<D, kStages, kLoad == kLoadTma>(a, threadIdx.x / 128 - 1, smem, base, ring);
  }
}

// Folds a split call's parts into out: per (row, query head) pair, one warp, each lane four
// dimensions; parts weighted by 2^(lse - max lse), empty parts (lse = -inf) skipped.
template <int D>
__global__ void __launch_bounds__(256) prefill_ws_merge_kernel(const __grid_constant__ Args a) {
  static_assert(D == 128, "a lane per four dimensions");
  const int rows = a.cu[a.n_seqs] - a.cu[0], lane = threadIdx.x & 31;
  const size_t stride = static_cast<size_t>(a.part_rows) * a.n_heads_q;
  const float* lse = part_lse<D>(a);
  const int64_t pairs = static_cast<int64_t>(rows) * a.n_heads_q;
#pragma unroll 1
  for (int64_t p = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; p < pairs;
       p += (gridDim.x * blockDim.x) >> 5) {
    float mx = kNegInf;
    for (int sp = 0; sp < a.n_split; ++sp) mx = fmaxf(mx, lse[sp * stride + p]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
    for (int sp = 0; sp < a.n_split; ++sp) {
      const float l = lse[sp * stride + p];
      if (l == kNegInf) continue;
      const float w = exp2f(l - mx);
      const float4 x = *reinterpret_cast<const float4*>(a.part + (sp * stride + p) * D + 4 * lane);
      wsum += w;
      acc = make_float4(acc.x + w * x.x, acc.y + w * x.y, acc.z + w * x.z, acc.w + w * x.w);
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    *reinterpret_cast<float4*>(a.out + (static_cast<size_t>(a.cu[0]) * a.n_heads_q + p) * D +
                               4 * lane) =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  }
}

struct WsFacts {
  int sms = 0, blocks = 0;
  bool tma = true;
};

// The two variants: the default (TMA producer; consumers with the intra-warpgroup overlap, taking
// turns), and the cp.async producer with plain consumers, for page sizes TMA boxes do not fit and
// as a knob (OSCAR_PREFILL_WS_TMA=0). Measured on the H200 (docs/results/prefill_cuda.md, session
// 12): 485-564 TFLOP/s against 329-364; with a cp.async producer the overlap and the turns were
// slower (283-304), the consumers waiting on the copies.
using WsKernel = void (*)(Args, CUtensorMap, CUtensorMap);
WsKernel ws_kernel(bool tma) {
  return tma ? prefill_attn_ws_kernel<128, kWsStages, kLoadTma>
             : prefill_attn_ws_kernel<128, kWsStages, kLoadCpAsync>;
}

Status ws_facts(WsFacts* out) {
  return facts_per_device(out, [](WsFacts* f, int dev) {
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&f->sms, cudaDevAttrMultiProcessorCount, dev));
    const char* env = std::getenv("OSCAR_PREFILL_WS_TMA");
    f->tma = env == nullptr || std::atoi(env) != 0;
    // Both variants have the same footprint (one block per SM); each needs its shared-memory limit.
    for (const WsKernel k : {ws_kernel(true), ws_kernel(false)})
      OSCAR_RETURN_IF_ERROR(kernel_resident_blocks(k, kWsThreads,
                                                   WsShape<128, kWsStages>::kSmemBytes, &f->blocks));
    return Status();
  });
}

// A pool of BF16 pages ([page][plane][page_size][head_dim]: the exact pool, or the history's
// expansion) as a 4-D tensor for TMA: (dim within a 64-dim atom, slot, plane, page), boxes of
// [page_size][64] with the 128-byte swizzle of the tiles. The page extent is a bound, not the
// pool's size (the kernel reads only the pages of its tables).
Status bf16_pool_map(const uint8_t* pool, int n_planes, int page_size, int head_dim,
                     CUtensorMap* map) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return internal_error("prefill_attn_ws: no cuTensorMapEncodeTiled");
  const uint64_t row = static_cast<uint64_t>(head_dim) * 2, plane = row * page_size,
                 page = plane * n_planes;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim),
                              static_cast<cuuint64_t>(page_size),
                              static_cast<cuuint64_t>(n_planes),
                              std::max<cuuint64_t>(1, (cuuint64_t{1} << 39) / page)};
  const cuuint64_t strides[3] = {row, plane, page};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(page_size), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint8_t*>(pool),
                            dims, strides, box, estr,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return internal_error("prefill_attn_ws: cuTensorMapEncodeTiled: %d", r);
  return Status();
}

}  // namespace

Status prefill_attn_ws_tma(int page_size, bool* tma) {
  WsFacts f;
  OSCAR_RETURN_IF_ERROR(ws_facts(&f));
  // TMA boxes of [page_size][64]: page sizes 8 to 128, powers of two.
  *tma = f.tma && page_size >= 8 && page_size <= 128 && (page_size & (page_size - 1)) == 0;
  return Status();
}

int prefill_attn_ws_split(const Args& a, int max_rows, int64_t max_keys) {
  WsFacts f;
  if (a.invariant || a.de != 0 || max_rows <= 0 || max_keys <= 0 || a.gqa > kWsRows ||
      !ws_facts(&f).ok())
    return 1;
  // Works without a split, at most: each sequence adds at most one partial item.
  const int64_t qt = kWsRows / a.gqa;
  const int64_t works = ((max_rows + qt - 1) / qt + a.n_seqs) * a.n_heads_kv;
  const int64_t by_blocks = static_cast<int64_t>(f.sms) * f.blocks / works;
  const int64_t by_keys = max_keys / kWsMinPartKeys;
  return static_cast<int>(std::clamp<int64_t>(std::min(by_blocks, by_keys), 1, kWsMaxSplit));
}

Status prefill_attn_ws_launch(const Args& a_in, int head_dim, bool quantized,
                              cudaStream_t stream) {
  if (a_in.de != 0) return internal_error("prefill_attn_ws: serving prefill only");
  if (head_dim != 128) return invalid_argument("prefill_attn_ws: head_dim %d (128)", head_dim);
  if (a_in.gqa > kWsRows)
    return invalid_argument("prefill_attn_ws: gqa %d > %d", a_in.gqa, kWsRows);
  WsFacts f;
  OSCAR_RETURN_IF_ERROR(ws_facts(&f));
  Args a = a_in;
  a.qt = kWsRows / a.gqa;  // queries per item: up to 128 rows
  a.page_shift = -1;
  for (int sh = 0; sh < 31; ++sh)
    if (a.page_size == 1 << sh) a.page_shift = sh;
  // One wave of resident blocks; each block walks its (item, KV head) pairs.
  const dim3 grid(std::max(1, f.sms * f.blocks));
  constexpr size_t kSmem = WsShape<128, kWsStages>::kSmemBytes;
  bool tma = false;
  OSCAR_RETURN_IF_ERROR(prefill_attn_ws_tma(a.page_size, &tma));
  if (quantized && (!tma || a.hist_slot == nullptr))
    return internal_error("prefill_attn_ws: quantized history needs its BF16 expansion and TMA");
  CUtensorMap map{}, hmap{};
  if (tma) {
    OSCAR_RETURN_IF_ERROR(bf16_pool_map(a.exact_pool, a.n_planes, a.page_size, head_dim, &map));
    hmap = map;  // read only for history pages, which exist only with an expansion
    if (a.hist_bf16 != nullptr)
      OSCAR_RETURN_IF_ERROR(
          bf16_pool_map(a.hist_bf16, 2 * a.n_heads_kv, a.page_size, head_dim, &hmap));
  }
  if (a.n_split > 1 && (a.part == nullptr || a.part_rows <= 0))
    return internal_error("prefill_attn_ws: %d parts without their scratch", a.n_split);
  ws_kernel(tma)<<<grid, kWsThreads, kSmem, stream>>>(a, map, hmap);
  OSCAR_CUDA_LAUNCH_CHECK("prefill_attn_ws_kernel");
  if (a.n_split > 1) {
    const int64_t warps = static_cast<int64_t>(a.part_rows) * a.n_heads_q;
    const unsigned blocks =
        static_cast<unsigned>(std::clamp<int64_t>((warps + 7) / 8, 1, 8ll * f.sms));
    prefill_ws_merge_kernel<128><<<blocks, 256, 0, stream>>>(a);
    OSCAR_CUDA_LAUNCH_CHECK("prefill_ws_merge_kernel");
  }
  return Status();
}

}  // namespace oscar::kernels::prefill_detail
