// CUDA prefill attention (kernels/prefill_attn.h: prefill_attn_cuda): causal attention of the
// prefill chunks of a step over the paged three-region cache, reading the pages in place
// (OSCAR.md §4-§5): key j of sequence s is a sink row (j < sinks.seq_len), a history row
// (dequantized, up to the history's end) or a recent row (exact); query i of s sits at
// pos0[s] + i and sees keys [0, pos0[s] + i]; query head h reads KV head h / gqa. This is the
// serving-prefill reading (deq_end = the history's end, as kernels/cpu/prefill_attn.cpp with
// decode_equivalent == false): in every valid cache state (history present only after full
// sinks) it reads each key exactly as the CPU version does.
//
// Work: one item per (sequence, KV head, tile of qt = 64 / gqa queries), the tile's 64 rows
// being its queries × the KV head's gqa query heads, so each K/V byte is read once per group.
// The host knows neither the chunk sizes nor the sequence lengths (device memory; no host sync),
// so the grid is one wave of resident blocks per KV head and each block walks the items
// (item b, b + gridDim.x, ...; a sequence's tiles are numbered last-first, so the long ones
// start first); the block finds its item's sequence by scanning cu_seqlens.
// Per item: Q (times scale·log2 e) staged in shared memory as float; then for each tile of 32
// keys: the 4 warps stage K and V rows as float (a warp per key: BF16 widened, history rows
// through cuda_detail::dequant_element: uniform or Lloyd-Max INT2, 3- and 1-bit bit-plan rows),
// S = Q Kᵀ on the FP32 units (thread: 4 rows x 4 keys), masked online softmax in float (log2
// units, exp2f), P through shared memory, O += P V (thread: the same 4 rows x d/8 dims). FP32
// throughout: results agree with the CPU's float computation to accumulation rounding.
//
// Not here (return Unimplemented): decode_equivalent on a quantized cache, KIVI history.
// Refused (InvalidArgument): F32 exact pages, head_dim other than 64 / 128, gqa > 64.
// Not yet: tensor cores (mma.sync) for QKᵀ and PV; a faster history unpack (staging raw rows).
#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hist_row.cuh"
#include "kernels/prefill_attn.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"

namespace oscar::kernels {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsM = 64;  // query-head rows per tile: queries x GQA heads
constexpr int kKeys = 32;   // keys per K/V tile
constexpr float kNegInf = -__builtin_inff();

struct Args {
  int n_seqs, n_heads_q, n_heads_kv, gqa, qt, layer, page_size, group_size, n_planes;
  int uniform;  // 1 uniform INT2, 0 Lloyd-Max (2-bit rows)
  int int2_row_bytes;
  float scale_log2;
  float lloyd[4];
  const int32_t* cu;   // [n_seqs + 1]
  const int64_t* pos0; // [n_seqs]
  const float* q;      // [cu[n_seqs], n_heads_q, D]
  float* out;          // [cu[n_seqs], n_heads_q, D]
  const uint8_t* exact_pool;
  const uint8_t* hist_pool;
  uint64_t exact_page_bytes;
  uint64_t hist_page_bytes;  // 0 with a bit plan: page_size · hist_row_prefix[n_planes]
  const int8_t* hist_bits;          // bit plan or null
  const uint32_t* hist_row_prefix;  // bit plan or null
  PageTableView sinks, history, recent;
};

template <int D>
constexpr size_t smem_bytes() {
  return sizeof(float) * (static_cast<size_t>(kRowsM) * (D + 1) + kKeys * (D + 1) + kKeys * D +
                          kRowsM * (kKeys + 1));
}

template <int D>
__global__ void __launch_bounds__(kThreads) prefill_attn_kernel(const __grid_constant__ Args a) {
  extern __shared__ float smem[];
  constexpr int LQ = D + 1, LK = D + 1, LV = D, LP = kKeys + 1, ND = D / 8;
  float* Qs = smem;                 // [kRowsM][LQ]
  float* Ks = Qs + kRowsM * LQ;     // [kKeys][LK]
  float* Vs = Ks + kKeys * LK;      // [kKeys][LV]
  float* Ps = Vs + kKeys * LV;      // [kRowsM][LP]
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tr = tid >> 3;  // rows 4tr .. 4tr+3 (S and PV)
  const int tk = tid & 7;   // keys tk + 8c (S), dims tk + 8jj (PV)
  const int P = a.page_size;
  const int M = a.qt * a.gqa;

  // This KV head's planes: exact rows (byte offset inside a page) and history rows.
  const uint64_t row_bytes = static_cast<uint64_t>(D) * 2;
  uint64_t eplane[2];
  uint64_t hoff[2] = {0, 0};
  int hrb[2] = {0, 0}, hbits[2] = {2, 2};
#pragma unroll
  for (int kv = 0; kv < 2; ++kv) {
    const int p = (a.layer * 2 + kv) * a.n_heads_kv + kvh;
    eplane[kv] = static_cast<uint64_t>(p) * P * row_bytes;
    if (a.hist_row_prefix != nullptr) {
      hoff[kv] = static_cast<uint64_t>(P) * a.hist_row_prefix[p];
      hrb[kv] = static_cast<int>(a.hist_row_prefix[p + 1] - a.hist_row_prefix[p]);
      hbits[kv] = a.hist_bits[p];
    } else {
      hoff[kv] = static_cast<uint64_t>(p) * P * a.int2_row_bytes;
      hrb[kv] = a.int2_row_bytes;
    }
  }
  const uint64_t hpb = a.hist_row_prefix != nullptr
                           ? static_cast<uint64_t>(P) * a.hist_row_prefix[a.n_planes]
                           : a.hist_page_bytes;

#pragma unroll 1
  for (int item = blockIdx.x;; item += gridDim.x) {
    // ---- locate the item: sequence and query tile (tiles numbered last-first) ----------------
    int seq = -1, tile = 0;
    {
      int acc = 0;
      for (int s = 0; s < a.n_seqs; ++s) {
        const int nq = a.cu[s + 1] - a.cu[s];
        const int nt = nq > 0 ? (nq + a.qt - 1) / a.qt : 0;
        if (item < acc + nt) {
          seq = s;
          tile = nt - 1 - (item - acc);
          break;
        }
        acc += nt;
      }
    }
    if (seq < 0) break;
    const int nq = a.cu[seq + 1] - a.cu[seq];
    const int q0 = tile * a.qt;
    const int nqt = min(a.qt, nq - q0);
    const int64_t p0 = a.pos0[seq];
    const int64_t n_sink_tok = a.sinks.seq_len(seq, P);
    const int64_t hist_end = n_sink_tok + a.history.seq_len(seq, P);
    const int64_t kend = p0 + q0 + nqt;  // this tile reads keys [0, kend)
    const int64_t row0 = static_cast<int64_t>(a.cu[seq]) + q0;  // step-wide query row

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
    int64_t rpos[4];
    bool rvalid[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 4 * tr + i, qi = m / a.gqa;
      rvalid[i] = m < M && qi < nqt;
      rpos[i] = p0 + q0 + qi;
      mrow[i] = kNegInf;
      lrow[i] = 0.f;
#pragma unroll
      for (int jj = 0; jj < ND; ++jj) o[i][jj] = 0.f;
    }

#pragma unroll 1
    for (int64_t k0 = 0; k0 < kend; k0 += kKeys) {
      __syncthreads();  // Ks / Vs / Ps free; Qs staged
      // ---- stage K and V of keys [k0, k0 + kKeys): a warp per key --------------------------
#pragma unroll 1
      for (int kk = warp; kk < kKeys; kk += kWarps) {
        const int64_t j = k0 + kk;
        float* kd = Ks + kk * LK;
        float* vd = Vs + kk * LV;
        if (j >= kend) {
          for (int e = lane; e < D; e += 32) kd[e] = vd[e] = 0.f;
        } else if (j < n_sink_tok || j >= hist_end) {
          const bool sink = j < n_sink_tok;
          const int64_t t = sink ? j : j - hist_end;
          const PageTableView& pt = sink ? a.sinks : a.recent;
          const int page = pt.page_ids[pt.indptr[seq] + static_cast<int>(t / P)];
          const uint8_t* base = a.exact_pool + static_cast<uint64_t>(page) * a.exact_page_bytes +
                                static_cast<uint64_t>(t % P) * row_bytes;
          const __nv_bfloat16* kr = reinterpret_cast<const __nv_bfloat16*>(base + eplane[0]);
          const __nv_bfloat16* vr = reinterpret_cast<const __nv_bfloat16*>(base + eplane[1]);
          for (int e = lane; e < D; e += 32) {
            kd[e] = __bfloat162float(kr[e]);
            vd[e] = __bfloat162float(vr[e]);
          }
        } else {
          const int64_t t = j - n_sink_tok;
          const int page = a.history.page_ids[a.history.indptr[seq] + static_cast<int>(t / P)];
          const uint8_t* pg = a.hist_pool + static_cast<uint64_t>(page) * hpb;
          const uint64_t slot = static_cast<uint64_t>(t % P);
          const uint8_t* rk = pg + hoff[0] + slot * hrb[0];
          const uint8_t* rv = pg + hoff[1] + slot * hrb[1];
          for (int e = lane; e < D; e += 32) {
            kd[e] = cuda_detail::dequant_element(rk, e, D, a.group_size, hbits[0], a.uniform,
                                                 a.lloyd);
            vd[e] = cuda_detail::dequant_element(rv, e, D, a.group_size, hbits[1], a.uniform,
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
          if (!rvalid[i] || j > rpos[i]) s[i][c] = kNegInf;
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

#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (!rvalid[i]) continue;
      const int m = 4 * tr + i, qi = m / a.gqa, hh = m % a.gqa;
      const float inv = lrow[i] > 0.f ? 1.f / lrow[i] : 0.f;
      float* dst = a.out + ((row0 + qi) * a.n_heads_q + kvh * a.gqa + hh) * D;
#pragma unroll
      for (int jj = 0; jj < ND; ++jj) dst[tk + 8 * jj] = o[i][jj] * inv;
    }
  }
}

// Resident blocks per SM of each instantiation and the SM count, per device, read once.
struct DeviceFacts {
  int sms = 0;
  int blocks64 = 0, blocks128 = 0;
};

template <int D>
Status kernel_setup(int* blocks) {
  const int smem = static_cast<int>(smem_bytes<D>());
  OSCAR_CUDA_CHECK(cudaFuncSetAttribute(prefill_attn_kernel<D>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  OSCAR_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, prefill_attn_kernel<D>, kThreads, smem));
  *blocks = std::max(1, *blocks);
  return Status();
}

Status device_facts(DeviceFacts* out) {
  static std::mutex mu;
  static DeviceFacts facts[64];
  static bool ready[64] = {};
  int dev = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return internal_error("prefill_attn_cuda: device %d", dev);
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[dev]) {
    DeviceFacts f;
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev));
    OSCAR_RETURN_IF_ERROR(kernel_setup<64>(&f.blocks64));
    OSCAR_RETURN_IF_ERROR(kernel_setup<128>(&f.blocks128));
    facts[dev] = f;
    ready[dev] = true;
  }
  *out = facts[dev];
  return Status();
}

Status validate_cuda(const PrefillAttnParams& p) {
  const KvPageLayout& L = p.layout;
  const int H = L.n_heads_kv;
  if (p.n_seqs < 0 || p.n_heads_q <= 0 || H <= 0 || p.n_heads_q % H != 0 || p.layer < 0 ||
      p.layer >= L.n_layers || L.page_size <= 0)
    return invalid_argument("prefill_attn_cuda: bad shape (%d seqs, %d q heads, %d kv heads, "
                            "layer %d of %d, page_size %d)", p.n_seqs, p.n_heads_q, H, p.layer,
                            L.n_layers, L.page_size);
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
  if (p.decode_equivalent && p.quantized)
    return unimplemented("prefill_attn_cuda: decode_equivalent reading (on-the-fly quantization "
                         "of recent rows) is not implemented on CUDA");
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
      return invalid_argument("prefill_attn_cuda: a bit plan needs both hist_bits and "
                              "hist_row_prefix");
    if (L.hist_bits == nullptr &&
        L.int2_row_bytes != quant::int2_row_bytes(L.head_dim, p.codec.group_size))
      return invalid_argument("prefill_attn_cuda: layout int2_row_bytes %d != %d",
                              L.int2_row_bytes,
                              quant::int2_row_bytes(L.head_dim, p.codec.group_size));
    if (p.hist_pool == nullptr)
      return invalid_argument("prefill_attn_cuda: quantized cache without a history pool");
  }
  return Status();
}

}  // namespace

Status prefill_attn_cuda(const PrefillAttnParams& p, void* stream_ptr) {
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
  a.qt = kRowsM / a.gqa;
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

  // One wave of resident blocks over all KV heads; each block walks its items.
  const int per_sm = L.head_dim == 64 ? facts.blocks64 : facts.blocks128;
  const int gx = std::max(1, (facts.sms * per_sm + L.n_heads_kv - 1) / L.n_heads_kv);
  if (L.n_heads_kv > 65535) return invalid_argument("prefill_attn_cuda: too many KV heads");
  const dim3 grid(gx, L.n_heads_kv);
  if (L.head_dim == 64)
    prefill_attn_kernel<64><<<grid, kThreads, smem_bytes<64>(), stream>>>(a);
  else
    prefill_attn_kernel<128><<<grid, kThreads, smem_bytes<128>(), stream>>>(a);
  OSCAR_CUDA_LAUNCH_CHECK("prefill_attn_kernel");
  return Status();
}

}  // namespace oscar::kernels
