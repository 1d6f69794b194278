// Host side of demote_pages_cuda (kernels/demote_pages.h): validates the params without reading
// device memory, zeroes the status array and launches one kernel for the whole step (device
// code and the exactness argument: demote_pages.cuh). Compiled with --fmad=false
// (CMakeLists.txt) on top of the explicitly rounded intrinsics.
//
// Formats: uniform INT2 and Lloyd-Max INT2 (any clip), the bit plan's INT4, INT3 and INT1 rows, the
// KIVI baseline's value rows and key blocks; head_dim 64, 128 or 256; group size 32, 64 or 128;
// BF16 or F32 exact pages. Bytes are identical to the CPU demote_pages for every page whose
// status is kDemoteOk (tests/kernels/test_demote_pages_cuda.cpp). A page with status
// kDemoteNonFinite (a non-finite value, or metadata beyond fp16, exactly where the CPU flags it)
// has unspecified history bytes, as on the CPU (which stops mid-page); its failing rows are
// zeroed. No other page is touched: each warp writes only rows of its own destination page.
//
// INT3 note: the CPU converts floor(t + 0.5) to int, with t = (x_c − min)/s. For a finite group
// |t| < 2^31 (s >= 2^-24 when nonzero, x_c − min <= hi − min <= 14 s, and x_c − min >= −16 with
// |lo| <= 65504), so the conversion is defined on both sides and the device's saturating one
// agrees.
//
// Resources (ptxas, sm_90a, nvcc 13, not yet measured on a device): 128 registers for head_dim
// 128 (12 bytes spilled), 8 KB shared memory per block of 8 warps, i.e. 16 resident warps per
// SM. Capping registers with __launch_bounds__(256, 3 or 4) spills 0.5-1.7 KB per thread, so it
// is left uncapped until bench_demote_cuda says otherwise.
//
// Preconditions (the cache's, not checked here): dst_pages are distinct, and no src page is the
// storage of a dst page; clip values are > 0 (the CPU aborts otherwise).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/demote_pages.cuh"
#include "kernels/demote_pages.h"
#include "quant/int2_layout.h"
#include "quant/kivi.h"

namespace oscar::kernels {

static_assert(kDemoteOk == 0, "the status array is zeroed with cudaMemsetAsync");

Status demote_pages_cuda(const DemotePagesParams& p, void* stream_ptr) {
  const KvPageLayout& L = p.layout;
  if (p.n_pages < 0) return invalid_argument("demote_pages_cuda: n_pages %d < 0", p.n_pages);
  if (p.n_pages == 0) return Status();
  if (p.exact_pool == nullptr || p.hist_pool == nullptr || p.src_pages == nullptr ||
      p.dst_pages == nullptr || p.status == nullptr)
    return invalid_argument("demote_pages_cuda: null pool, page list or status");
  if (L.n_layers <= 0 || L.n_heads_kv <= 0 || L.page_size <= 0)
    return invalid_argument("demote_pages_cuda: n_layers %d, n_heads_kv %d, page_size %d",
                            L.n_layers, L.n_heads_kv, L.page_size);
  if (L.exact_elem_bytes != 2 && L.exact_elem_bytes != 4)
    return invalid_argument("demote_pages_cuda: exact_elem_bytes %d (2 = bf16, 4 = f32)",
                            L.exact_elem_bytes);
  if (L.head_dim != 64 && L.head_dim != 128 && L.head_dim != 256)
    return unimplemented("demote_pages_cuda: head_dim %d (64, 128 or 256)", L.head_dim);
  if ((L.hist_bits == nullptr) != (L.hist_row_prefix == nullptr))
    return invalid_argument(
        "demote_pages_cuda: a bit plan needs both hist_bits and hist_row_prefix");
  const bool kivi = p.codec.quantizer == quant::HistQuantizer::kKivi;
  const int G = kivi ? quant::kKiviValueGroup : p.codec.group_size;
  if (kivi) {
    if (L.page_size % quant::kKiviKeyBlockTokens != 0)
      return invalid_argument("demote_pages_cuda: kivi2 needs page_size a multiple of %d, got %d",
                              quant::kKiviKeyBlockTokens, L.page_size);
    if (L.hist_bits != nullptr) return invalid_argument("demote_pages_cuda: kivi2 has no bit plan");
  } else if (!quant::int2_valid_group(L.head_dim, G)) {
    return invalid_argument("demote_pages_cuda: group_size %d for head_dim %d", G, L.head_dim);
  }
  if (L.hist_row_prefix == nullptr && L.int2_row_bytes != quant::int2_row_bytes(L.head_dim, G))
    return invalid_argument("demote_pages_cuda: int2_row_bytes %d != %d (head_dim %d, group %d)",
                            L.int2_row_bytes, quant::int2_row_bytes(L.head_dim, G), L.head_dim, G);

  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  OSCAR_CUDA_CHECK(
      cudaMemsetAsync(p.status, 0, sizeof(int32_t) * static_cast<size_t>(p.n_pages), stream));

  cuda_demote::Args a;
  a.L = L;
  a.quantizer = p.codec.quantizer;
  a.group_size = G;
  a.k_clip = p.codec.k_clip;
  a.v_clip = p.codec.v_clip;
  a.exact_pool = p.exact_pool;
  a.hist_pool = p.hist_pool;
  a.src_pages = p.src_pages;
  a.dst_pages = p.dst_pages;
  a.status = p.status;
  a.n_rows = static_cast<int64_t>(p.n_pages) * L.n_layers * 2 * L.n_heads_kv * L.page_size;
  const int64_t blocks = (a.n_rows + cuda_demote::kWarps - 1) / cuda_demote::kWarps;
  if (blocks > 0x7fffffff)
    return invalid_argument("demote_pages_cuda: %lld rows", static_cast<long long>(a.n_rows));
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (L.head_dim) {
    case 64:
      cuda_demote::demote_pages_kernel<2><<<grid, cuda_demote::kThreads, 0, stream>>>(a);
      break;
    case 128:
      cuda_demote::demote_pages_kernel<4><<<grid, cuda_demote::kThreads, 0, stream>>>(a);
      break;
    default:
      cuda_demote::demote_pages_kernel<8><<<grid, cuda_demote::kThreads, 0, stream>>>(a);
      break;
  }
  OSCAR_CUDA_LAUNCH_CHECK("demote_pages_kernel");
  return Status();
}

}  // namespace oscar::kernels
