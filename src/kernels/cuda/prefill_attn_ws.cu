// The warp-specialised prefill attention for sm_90a (prefill_detail::prefill_attn_ws_launch), the
// default kernel of prefill_attn_cuda for serving prefill and extend at head_dim 128: causal
// attention of a step's prefill chunks over the paged three-region cache, FlashAttention-3 style.
//
// Work: the items of prefill_items.cuh (a tile of 128 / gqa queries of one sequence x the gqa
// query heads of one KV head = up to 128 rows), so every K/V tile is read once per KV group and
// used by all its query heads. A block has three warpgroups:
//   warpgroup 0, the producer (its registers given to the others by setmaxnreg): fills a ring of
//     kStages K/V tiles of 128 keys: BF16 rows by cp.async straight from their pages, history rows
//     (INT2 and every bit-plan width) dequantized into the same BF16 tile, once for every query
//     row and head of the item, their code words loaded a tile ahead; it signals a slot full
//     (mbarrier) one tile later, once its copies have landed, so two tiles' copies are in flight;
//   warpgroups 1 and 2, the consumers, 64 rows each: S = Q·Kᵀ by wgmma with Q (BF16, pre-scaled
//     by scale·log2 e) and K both in shared memory, the causal mask on tiles that reach past the
//     item's first query only, online softmax in exp2 on the accumulators (O rescaled only when a
//     row's maximum grew), P as BF16 A fragments in registers, O += P·V by wgmma (V MN-major);
//     then they signal the slot empty.
// The consumers never wait on a load the producer could have issued earlier, and neither waits on
// the other warpgroup's softmax: the two consumers' MMAs and softmaxes interleave on the SM.
//
// Not here (prefill_attn_tc.cu serves them): head_dim 64; the decode-equivalent reading is
// prefill_attn.cu's. Not yet: head_dim 256, explicit ping-pong between the consumers, the next
// tile's QKᵀ overlapped with this tile's softmax inside a warpgroup (FA3's intra-warpgroup
// pipelining), TMA.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>

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
// Registers per thread after reallocation: 128·P + 256·C within the launch's 384 x 168.
constexpr int kProducerRegs = 88, kConsumerRegs = 208;
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

template <int D, int kStages>
__device__ __forceinline__ void ws_produce(const Args& a, uint8_t* tiles, uint32_t tiles_addr,
                                           const Ring& ring) {
  using S = WsShape<D, kStages>;
  using T = TileShape<D, kWsKeys>;
  const int tid = threadIdx.x;  // 0 .. 127
  uint32_t n = 0;
#pragma unroll 1
  for (int w = blockIdx.x;; w += gridDim.x) {
    Item it;
    int kvh;
    if (!find_work(a, w, it, kvh)) break;
    const Planes pl = make_planes(a, kvh, D);
    const SeqPages sp = seq_pages(a, it);
    const int n_tiles = (sp.kend + kWsKeys - 1) / kWsKeys;
    // History code words of K and V: loaded one tile ahead (while this tile's copies land), so
    // the unpacking never waits on memory.
    HistUnits<D, kWsKeys, 128> hk, hv;
    if (tile_has_hist(it, 0, kWsKeys)) {
      hist_prefetch(a, pl, sp, 0, 0, tid, hk);
      hist_prefetch(a, pl, sp, 0, 1, tid, hv);
    }
#pragma unroll 1
    for (int tile = 0; tile < n_tiles; ++tile, ++n) {
      mbar_wait(ring.empty<kStages>(n), Ring::parity<kStages>(n) ^ 1);
      const int k0 = tile * kWsKeys;
      const uint32_t slot = (n % kStages) * S::kStageBytes;
      const bool hist = tile_has_hist(it, k0, kWsKeys);
      load_exact<D, kWsKeys, 128>(a, pl, sp, k0, hist, tiles_addr + slot,
                                  tiles_addr + slot + T::kTileBytes, tid);
      cp_async_commit();
      if (hist) {
        hist_store(a, pl, sp, k0, 0, tid, hk, tiles + slot);
        hist_store(a, pl, sp, k0, 1, tid, hv, tiles + slot + T::kTileBytes);
      }
      if (tile + 1 < n_tiles && tile_has_hist(it, k0 + kWsKeys, kWsKeys)) {
        hist_prefetch(a, pl, sp, k0 + kWsKeys, 0, tid, hk);
        hist_prefetch(a, pl, sp, k0 + kWsKeys, 1, tid, hv);
      }
      // The previous tile's copies have landed (this one's stay in flight): with its stores,
      // visible to wgmma (the async proxy), then its slot is signalled full.
      if (n > 0) {
        cp_async_wait<1>();
        fence_proxy_async_smem();
        mbar_arrive(ring.full<kStages>(n - 1));
      }
    }
  }
  if (n > 0) {
    cp_async_wait<0>();
    fence_proxy_async_smem();
    mbar_arrive(ring.full<kStages>(n - 1));
  }
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

template <int D, int kStages>
__device__ __forceinline__ void ws_consume(const Args& a, int cw, uint8_t* smem,
                                           uint32_t smem_addr_, const Ring& ring) {
  using S = WsShape<D, kStages>;
  using T = TileShape<D, kWsKeys>;
  constexpr int NKS = D / 16;        // k-steps of S = Q·Kᵀ
  constexpr int NB = kWsKeys / 8;    // 8-key blocks of S
  constexpr int NDB = D / 8;         // 8-dim blocks of O
  constexpr int NKP = kWsKeys / 16;  // k-steps of P·V
  static_assert(D == 128, "O += P·V is one m64n128 wgmma per k-step");
  const int tid = threadIdx.x - 128 * (1 + cw);  // 0 .. 127 in this warpgroup
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  uint8_t* qs = smem + cw * S::kQHalfBytes;
  const uint32_t qs_addr = smem_addr_ + cw * S::kQHalfBytes;
  const uint32_t tiles_addr = smem_addr_ + S::kQBytes;
  const int bar = 1 + cw;  // this warpgroup's named barrier
  uint32_t n = 0;
#pragma unroll 1
  for (int w = blockIdx.x;; w += gridDim.x) {
    Item it;
    int kvh;
    if (!find_work(a, w, it, kvh)) break;
    const int64_t first_pos = it.p0 + it.q0;  // the item's smallest query position
    named_barrier(bar, 128);  // the previous item's reads of Q are done in every warp
    ws_stage_q<D>(a, it, kvh, cw, tid, qs);
    fence_proxy_async_smem();
    named_barrier(bar, 128);

    // This lane's rows of the accumulators: r = 0 -> row 16·warp + g, r = 1 -> + 8.
    int64_t rpos[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) rpos[r] = first_pos + (64 * cw + 16 * warp + g + 8 * r) / a.gqa;
    float o[NDB][4];
#pragma unroll
    for (int db = 0; db < NDB; ++db)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[db][c] = 0.f;
    float mrow[2] = {kNegInf, kNegInf}, lrow[2] = {0.f, 0.f};  // l: this lane's partial sum

    const int n_tiles = static_cast<int>((it.kend + kWsKeys - 1) / kWsKeys);
#pragma unroll 1
    for (int tile = 0; tile < n_tiles; ++tile, ++n) {
      const int64_t k0 = static_cast<int64_t>(tile) * kWsKeys;
      const uint32_t ks = tiles_addr + (n % kStages) * S::kStageBytes, vs = ks + T::kTileBytes;
      mbar_wait(ring.full<kStages>(n), Ring::parity<kStages>(n));

      float s[NB][4];
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < NKS; ++k) {
        // K-major A and B: 16 dims = 32 bytes of each row inside atom k / 4; 8-row groups 1024
        // bytes apart.
        const uint64_t qd = wgmma_desc_sw128(qs_addr + (k / 4) * S::kQAtomBytes + (k % 4) * 32,
                                             16, 1024);
        const uint64_t kd =
            wgmma_desc_sw128(ks + (k / 4) * T::kAtomBytes + (k % 4) * 32, 16, 1024);
        wgmma_m64n128k16_ss<0>(s, qd, kd, k > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();

      if (k0 + kWsKeys - 1 > first_pos) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int64_t j = k0 + 8 * nb + 2 * t + (c & 1);
            if (j > rpos[c >> 1]) s[nb][c] = kNegInf;
          }
      }
      // Row maxima over the tile: four independent chains per row, then the quad's lanes.
      float mx[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m4[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) m4[q] = fmaxf(s[q][2 * r], s[q][2 * r + 1]);
#pragma unroll
        for (int nb = 4; nb < NB; ++nb)
          m4[nb & 3] = fmaxf(m4[nb & 3], fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
        mx[r] = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      // O and l are rescaled only when a row's maximum grew (late tiles of a long prompt rarely
      // move it); skipping alpha = 1 exactly changes nothing.
      const bool grew = mx[0] > mrow[0] || mx[1] > mrow[1];
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float mnew = fmaxf(mrow[r], mx[r]);
          const float alpha = mnew == mrow[r] ? 1.f : exp2f(mrow[r] - mnew);  // exp2(-inf) = 0
          mrow[r] = mnew;
          lrow[r] *= alpha;
#pragma unroll
          for (int db = 0; db < NDB; ++db) {
            o[db][2 * r] *= alpha;
            o[db][2 * r + 1] *= alpha;
          }
        }
      }
      // P as BF16 A fragments: k-step kp = keys 16kp .. +15 = S blocks 2kp, 2kp + 1.
      const float mb[2] = {mrow[0] == kNegInf ? 0.f : mrow[0],
                           mrow[1] == kNegInf ? 0.f : mrow[1]};  // nothing visible yet: p = 0
      uint32_t pa[NKP][4];
      float l4[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        float p[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          p[c] = exp2f(s[nb][c] - mb[c >> 1]);  // exp2(-inf) = 0
          l4[c >> 1][nb & 1] += p[c];
        }
        pa[nb >> 1][2 * (nb & 1)] = pack_bf16(p[0], p[1]);
        pa[nb >> 1][2 * (nb & 1) + 1] = pack_bf16(p[2], p[3]);
      }
      lrow[0] += l4[0][0] + l4[0][1];
      lrow[1] += l4[1][0] + l4[1][1];

      wgmma_fence();
#pragma unroll
      for (int kp = 0; kp < NKP; ++kp) {
        // MN-major B: 16 keys = two 8-row groups (1024 bytes apart) from key 16kp; 64-dim atoms
        // kAtomBytes apart.
        const uint64_t vd = wgmma_desc_sw128(vs + kp * 2048, T::kAtomBytes, 1024);
        wgmma_m64n128k16_rs<1>(o, pa[kp], vd, 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      mbar_arrive(ring.empty<kStages>(n));  // this thread is done with the slot
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = lrow[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int m = 64 * cw + 16 * warp + g + 8 * r, qi = m / a.gqa, hh = m % a.gqa;
      if (m >= a.qt * a.gqa || qi >= it.nqt) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      float* dst = a.out + ((it.row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D;
#pragma unroll
      for (int db = 0; db < NDB; ++db)
        *reinterpret_cast<float2*>(dst + 8 * db + 2 * t) =
            make_float2(o[db][2 * r] * inv, o[db][2 * r + 1] * inv);
    }
  }
}

template <int D, int kStages>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_attn_ws_kernel(const __grid_constant__ Args a) {
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
      mbar_init(ring.full0 + 8 * s, 128);      // every producer thread
      mbar_init(ring.empty0 + 8 * s, 2 * 128);  // every consumer thread
    }
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    ws_produce<D, kStages>(a, smem + S::kQBytes, base + S::kQBytes, ring);
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    ws_consume<D, kStages>(a, wg - 1, smem, base, ring);
  }
}

struct WsFacts {
  int sms = 0, blocks = 0, stages = 3;
};

// Ring depth: 3 slots (224 KiB of shared memory with Q: the producer keeps two tiles in flight
// while the consumers work on a third), or 2 (160 KiB) with OSCAR_PREFILL_WS_STAGES=2 (a
// measurement knob, read once).
Status ws_facts(WsFacts* out) {
  return facts_per_device(out, [](WsFacts* f, int dev) {
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&f->sms, cudaDevAttrMultiProcessorCount, dev));
    const char* env = std::getenv("OSCAR_PREFILL_WS_STAGES");
    f->stages = env != nullptr && std::atoi(env) == 2 ? 2 : 3;
    return f->stages == 3 ? kernel_resident_blocks(prefill_attn_ws_kernel<128, 3>, kWsThreads,
                                                   WsShape<128, 3>::kSmemBytes, &f->blocks)
                          : kernel_resident_blocks(prefill_attn_ws_kernel<128, 2>, kWsThreads,
                                                   WsShape<128, 2>::kSmemBytes, &f->blocks);
  });
}

}  // namespace

Status prefill_attn_ws_launch(const Args& a_in, int head_dim, cudaStream_t stream) {
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
  if (f.stages == 3)
    prefill_attn_ws_kernel<128, 3><<<grid, kWsThreads, WsShape<128, 3>::kSmemBytes, stream>>>(a);
  else
    prefill_attn_ws_kernel<128, 2><<<grid, kWsThreads, WsShape<128, 2>::kSmemBytes, stream>>>(a);
  OSCAR_CUDA_LAUNCH_CHECK("prefill_attn_ws_kernel");
  return Status();
}

}  // namespace oscar::kernels::prefill_detail
