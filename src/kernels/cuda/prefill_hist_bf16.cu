// Quantized history expanded to BF16 pages once per layer (prefill_detail::expand_history_launch),
// so that serving prefill over a quantized cache runs the warp-specialised BF16 kernel
// (prefill_attn_ws.cu): its TMA producer then loads history pages like exact ones, and every query
// row of the call and every query head of the group reads them from there.
//
// Why a pass of its own: unpacking inside the attention kernel costs per tile per item. The tiled
// kernel, whose eight warps unpack, ran at 160-175 TFLOP/s over INT2 history against 475-564 for
// the warp-specialised kernel over BF16 (docs/results/prefill_cuda.md, session 12), and the
// warp-specialised kernel unpacking in its producer at 79-97. Here each distinct page (pages that
// sequences share through the prefix cache are expanded once) is read once and written once per
// layer: for an 8K chunk over a 24K history about 100 MB, some 35 us at HBM speed, against ~7 ms
// of attention.
//
// Work: a thread per 16-value unit of a row: the 32-bit code word of a 2-bit row, dequantized by
// int2_word_bf16 (the tiled kernel's arithmetic, so both kernels see the same BF16 values), or 16
// values of another width of a bit plan through dequant_element, rounded to BF16 in pairs.
// Indices are 32-bit (the host checks the count): 64-bit division is a software routine.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hist_row.cuh"
#include "kernels/cuda/prefill_items.cuh"
#include "kernels/cuda/prefill_tile.cuh"
#include "quant/int2_layout.h"

namespace oscar::kernels::prefill_detail {

namespace {

constexpr int kThreads = 256;

template <int D>
__global__ void __launch_bounds__(kThreads)
    expand_history_kernel(const __grid_constant__ Args a, const int32_t* pages, uint32_t n_units,
                          uint8_t* dst) {
  constexpr uint32_t kUnits = D / 16;
  const uint32_t P = static_cast<uint32_t>(a.page_size);
  const uint32_t planes = 2 * static_cast<uint32_t>(a.n_heads_kv);
  const int G = a.group_size;
#pragma unroll 1
  for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < n_units; i += gridDim.x * kThreads) {
    const int u = static_cast<int>(i % kUnits);
    const uint32_t row = i / kUnits;  // (page, plane, slot)
    const uint32_t slot = row % P, plane = row / P % planes, page = row / P / planes;
    const int kv = static_cast<int>(plane) / a.n_heads_kv;
    const Planes pl = make_planes(a, static_cast<int>(plane) % a.n_heads_kv, D);
    const uint8_t* src = a.hist_pool + static_cast<uint64_t>(pages[page]) * pl.hpb + pl.hoff[kv] +
                         slot * static_cast<uint32_t>(pl.hrb[kv]);
    uint8_t* out = dst + static_cast<uint64_t>(row) * (D * 2);
    if (pl.hbits[kv] == 2) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(src + 4 * u);
      const uint32_t meta = *reinterpret_cast<const uint32_t*>(
          src + quant::int2_group_meta_offset(D, quant::int2_word_group(u, G)));
      uint2 run[4];
      int2_word_bf16(a, w, meta, run);
#pragma unroll
      for (int qq = 0; qq < 4; ++qq)
        *reinterpret_cast<uint2*>(out + 2 * quant::int2_word_element(u, G, qq)) = run[qq];
    } else {
#pragma unroll 1
      for (int e = 16 * u; e < 16 * u + 16; e += 2)
        *reinterpret_cast<uint32_t*>(out + 2 * e) = pack_bf16(
            cuda_detail::dequant_element(src, e, D, G, pl.hbits[kv], a.uniform, a.lloyd),
            cuda_detail::dequant_element(src, e + 1, D, G, pl.hbits[kv], a.uniform, a.lloyd));
    }
  }
}

}  // namespace

Status expand_history_launch(const Args& a, int head_dim, const int32_t* pages, int32_t n_pages,
                             uint8_t* dst, cudaStream_t stream) {
  if (head_dim != 128) return invalid_argument("expand_history: head_dim %d (128)", head_dim);
  if (n_pages <= 0) return Status();
  const uint64_t units =
      static_cast<uint64_t>(n_pages) * 2 * a.n_heads_kv * a.page_size * (head_dim / 16);
  if (units > UINT32_MAX)
    return invalid_argument("expand_history: %llu units exceed 32-bit indexing",
                            static_cast<unsigned long long>(units));
  int dev = 0, sms = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const uint64_t blocks = std::min<uint64_t>((units + kThreads - 1) / kThreads, 8ull * sms);
  expand_history_kernel<128><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      a, pages, static_cast<uint32_t>(units), dst);
  OSCAR_CUDA_LAUNCH_CHECK("expand_history_kernel");
  return Status();
}

}  // namespace oscar::kernels::prefill_detail
