// The decode-equivalent pre-pass of prefill_attn_cuda (prefill_deq_rows.h): for each sequence
// (blockIdx.y), a warp per (row of the zone [lo, hi), K/V, KV head) reads the exact recent row,
// quantizes it exactly as demote_pages_cuda would (cuda_demote::quantize_row: the plane's format,
// clip and bit-plan width; bytes equal to the CPU's, tests/kernels/test_demote_pages_cuda.cpp),
// and writes its dequantization (cuda_detail::dequant_element, evaluated unfused like the CPU's
// dequantizers) as float into the scratch. So the float rows equal the CPU prefill_attn's k_deq /
// v_deq rows bit for bit. A row the CPU could not quantize (non-finite input, metadata beyond
// fp16: the CPU fails the whole call) is written as NaN, which reaches the outputs of the queries
// that read it. Compiled with --fmad=false (CMakeLists.txt).
// Not here: KIVI key blocks (prefill_attn_cuda refuses KIVI), head_dim 256.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/demote_pages.cuh"
#include "kernels/cuda/hist_row.cuh"
#include "kernels/cuda/prefill_deq_rows.h"
#include "kernels/cuda/prefill_deq_zone.cuh"
#include "quant/int2_quant.h"

namespace oscar::kernels::cuda_detail {

namespace {

constexpr int kWarps = cuda_demote::kWarps;
constexpr int kThreads = cuda_demote::kThreads;
constexpr int kRowBytesMax = 128;  // an INT3 row of head_dim 128 is 64 bytes

struct DeqArgs {
  KvPageLayout L;  // device pointers for hist_bits / hist_row_prefix
  quant::HistQuantizer quantizer;
  int group_size, layer, n_sink, n_recent, uniform;
  float lloyd[4];
  const float* k_clip;  // [n_layers * n_heads_kv] device, or null (= 1)
  const float* v_clip;
  const int32_t* cu;    // [n_seqs + 1]
  const int64_t* pos0;  // [n_seqs]
  const uint8_t* exact_pool;
  PageTableView sinks, history, recent;
  float* scratch;  // [cap_rows, 2, n_heads_kv, head_dim]
  int64_t cap_rows;
};

template <int NR>
__global__ void __launch_bounds__(kThreads)
    prefill_deq_rows_kernel(const __grid_constant__ DeqArgs a) {
  constexpr int D = NR * 32;
  __shared__ double s_buf[kWarps][cuda_demote::kMaxGroup];
  __shared__ __align__(16) uint8_t s_row[kWarps][kRowBytesMax];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int s = blockIdx.y;
  const KvPageLayout& L = a.L;
  const int P = L.page_size, H = L.n_heads_kv;
  const DeqZone z =
      deq_zone(a.cu, a.pos0, a.sinks, a.history, s, true, a.n_sink, a.n_recent, P, a.cap_rows);
  if (!z.ok || z.hi <= z.lo) return;
  const int64_t n_work = (z.hi - z.lo) * 2 * H;
  uint8_t* row = s_row[warp];
#pragma unroll 1
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + warp; w < n_work;
       w += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t r = w / (2 * H);
    const int kv = static_cast<int>(w / H % 2), head = static_cast<int>(w % H);
    const int64_t t = z.lo + r - z.hist_end;  // token of the recent region
    const uint8_t* src = a.exact_pool +
                         static_cast<size_t>(a.recent.page_of(s, t, P)) * L.exact_page_bytes() +
                         L.exact_row_offset(a.layer, kv, head, static_cast<int>(t % P));
    float x[NR];
    bool finite = true;
#pragma unroll
    for (int k = 0; k < NR; ++k) {
      x[k] = cuda_demote::load_exact(src, L.exact_elem_bytes, k * 32 + lane);
      finite = finite && cuda_demote::finite_f(x[k]);
    }
    const int bits = L.hist_row_bits(a.layer, kv, head);
    const quant::RowFormat f = cuda_demote::row_format(a.quantizer, kv, bits);
    const float* clips = kv == 0 ? a.k_clip : a.v_clip;
    const float clip = clips == nullptr ? 1.0f : clips[a.layer * H + head];
    bool ok = !__any_sync(cuda_demote::kFull, !finite);  // warp-uniform, like quantize_row's result
    if (ok) {
      if (a.group_size == 32) {
        ok = cuda_demote::quantize_row<NR, 1>(x, f, clip, lane, s_buf[warp], row);
      } else if (a.group_size == 64) {
        ok = cuda_demote::quantize_row<NR, 2>(x, f, clip, lane, s_buf[warp], row);
      } else {
        if constexpr (NR >= 4)
          ok = cuda_demote::quantize_row<NR, 4>(x, f, clip, lane, s_buf[warp], row);
        else
          ok = false;
      }
    }
    __syncwarp();  // the row's bytes (written by some lanes) are visible to the warp
    float* dst = a.scratch + ((static_cast<size_t>(z.base + r) * 2 + kv) * H + head) * D;
#pragma unroll
    for (int k = 0; k < NR; ++k) {
      const int e = k * 32 + lane;
      dst[e] = ok ? dequant_element(row, e, D, a.group_size, bits, a.uniform, a.lloyd)
                  : __int_as_float(0x7fc00000);
    }
    __syncwarp();  // done reading the row before the next one overwrites it
  }
}

}  // namespace

Status prefill_deq_rows_cuda(const PrefillAttnParams& p, float* scratch, int64_t cap_rows,
                             void* stream_ptr) {
  const KvPageLayout& L = p.layout;
  if (p.n_seqs <= 0) return Status();
  if (p.n_seqs > 65535)
    return invalid_argument("prefill_attn_cuda: %d sequences (decode-equivalent: at most 65535)",
                            p.n_seqs);
  DeqArgs a{};
  a.L = L;
  a.quantizer = p.codec.quantizer;
  a.group_size = p.codec.group_size;
  a.layer = p.layer;
  a.n_sink = p.n_sink;
  a.n_recent = p.n_recent;
  a.uniform = p.codec.quantizer == quant::HistQuantizer::kInt2Lloyd ? 0 : 1;
  for (int i = 0; i < 4; ++i) a.lloyd[i] = quant::kLloydDequantLevels[i];
  a.k_clip = p.codec.k_clip;
  a.v_clip = p.codec.v_clip;
  a.cu = p.cu_seqlens;
  a.pos0 = p.pos0;
  a.exact_pool = p.exact_pool;
  a.sinks = p.sinks;
  a.history = p.history;
  a.recent = p.recent;
  a.scratch = scratch;
  a.cap_rows = cap_rows;
  // Rows per sequence <= its query rows + page_size; the host knows only their sum's bound.
  const int64_t work =
      (static_cast<int64_t>(p.max_rows) / p.n_seqs + L.page_size) * 2 * L.n_heads_kv;
  const int gx = static_cast<int>(std::clamp<int64_t>((work + kWarps - 1) / kWarps, 1, 2048));
  const dim3 grid(gx, p.n_seqs);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (L.head_dim == 64)
    prefill_deq_rows_kernel<2><<<grid, kThreads, 0, stream>>>(a);
  else
    prefill_deq_rows_kernel<4><<<grid, kThreads, 0, stream>>>(a);
  OSCAR_CUDA_LAUNCH_CHECK("prefill_deq_rows_kernel");
  return Status();
}

}  // namespace oscar::kernels::cuda_detail
