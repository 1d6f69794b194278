// Host side of the CUDA decode attention (kernels/decode_attn.h: decode_attn_cuda; internal
// controls in kernels/cuda/decode_attn_cuda.h): validates the params without reading device
// memory, picks the kernel and the split count, owns the split-partial workspace, launches.
// Device code: decode_attn.cuh.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_attn.cuh"
#include "kernels/cuda/decode_attn_cuda.h"
#include "kernels/decode_attn.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"

namespace oscar::kernels {

namespace {

using cuda_detail::KernelArgs;

thread_local DecodeAttnCudaLaunchInfo g_last;

// Per-device facts, read once: multiprocessors and resident blocks per SM of each launch
// configuration of the fast kernel ([0 wide, 1 dense][0 any page size, 1 pages of 16]; see
// decode_attn.cuh).
struct DeviceFacts {
  int sms = 0;
  int blocks_per_sm[2][2] = {};
};

template <int kRing, int kBlocks, int kPage, int kInt2>
Status set_kernel_smem() {
  const int smem = cuda_detail::kWarps * kRing;
  auto* kernel = cuda_detail::decode_attn_kernel<kRing, kBlocks, kPage, kInt2>;
  OSCAR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  OSCAR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  return Status();
}

// Resident blocks of the default instance; the dense configuration's other instance (kInt2
// 1: same launch bounds and shared memory) get their attributes set too.
template <int kRing, int kBlocks, int kPage>
Status kernel_occupancy(int* blocks) {
  OSCAR_RETURN_IF_ERROR((set_kernel_smem<kRing, kBlocks, kPage, 0>()));
  if constexpr (kRing == cuda_detail::kRingDense) {
    OSCAR_RETURN_IF_ERROR((set_kernel_smem<kRing, kBlocks, kPage, 1>()));
  }
  OSCAR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, cuda_detail::decode_attn_kernel<kRing, kBlocks, kPage, 0>, cuda_detail::kThreads,
      cuda_detail::kWarps * kRing));
  *blocks = std::max(1, *blocks);
  return Status();
}

Status device_facts(DeviceFacts* out) {
  static std::mutex mu;
  static DeviceFacts facts[64];
  static bool ready[64] = {};
  int dev = 0;
  OSCAR_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return internal_error("decode_attn_cuda: device %d", dev);
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[dev]) {
    DeviceFacts f;
    OSCAR_CUDA_CHECK(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev));
    using cuda_detail::kBlocksDense;
    using cuda_detail::kBlocksWide;
    using cuda_detail::kRingDense;
    using cuda_detail::kRingWide;
    OSCAR_RETURN_IF_ERROR((kernel_occupancy<kRingWide, kBlocksWide, 0>(&f.blocks_per_sm[0][0])));
    OSCAR_RETURN_IF_ERROR((kernel_occupancy<kRingWide, kBlocksWide, 16>(&f.blocks_per_sm[0][1])));
    OSCAR_RETURN_IF_ERROR((kernel_occupancy<kRingDense, kBlocksDense, 0>(&f.blocks_per_sm[1][0])));
    OSCAR_RETURN_IF_ERROR((kernel_occupancy<kRingDense, kBlocksDense, 16>(&f.blocks_per_sm[1][1])));
    facts[dev] = f;
    ready[dev] = true;
  }
  *out = facts[dev];
  return Status();
}

// Device workspace for split partials: grows, never shrinks; freed at exit by the driver.
Status workspace(size_t bytes, cudaStream_t stream, float** ptr) {
  static std::mutex mu;
  static cuda::GrownBuffer buf;
  std::lock_guard<std::mutex> lock(mu);
  OSCAR_RETURN_IF_ERROR(buf.reserve(bytes, std::max<size_t>(bytes, 1 << 20), stream));
  *ptr = static_cast<float*>(buf.ptr);
  return Status();
}

Status validate_cuda(const DecodeAttnParams& p) {
  const KvPageLayout& L = p.layout;
  if (p.n_seqs < 0) return invalid_argument("decode_attn_cuda: n_seqs %d < 0", p.n_seqs);
  if (p.n_heads_q <= 0 || L.n_heads_kv <= 0 || L.head_dim <= 0 || L.page_size <= 0 ||
      L.n_layers <= 0)
    return invalid_argument("decode_attn_cuda: bad sizes (n_heads_q %d, n_heads_kv %d, head_dim "
                            "%d, page_size %d, n_layers %d)", p.n_heads_q, L.n_heads_kv,
                            L.head_dim, L.page_size, L.n_layers);
  if (p.n_heads_q % L.n_heads_kv != 0)
    return invalid_argument("decode_attn_cuda: n_heads_q %d not a multiple of n_heads_kv %d",
                            p.n_heads_q, L.n_heads_kv);
  if (p.layer < 0 || p.layer >= L.n_layers)
    return invalid_argument("decode_attn_cuda: layer %d outside [0, %d)", p.layer, L.n_layers);
  if (L.exact_elem_bytes != 2)
    return invalid_argument("decode_attn_cuda: exact pages must be BF16 (exact_elem_bytes %d)",
                            L.exact_elem_bytes);
  if (L.head_dim % 32 != 0 || L.head_dim > 256)
    return invalid_argument("decode_attn_cuda: head_dim %d (multiple of 32 up to 256)",
                            L.head_dim);
  if (p.q == nullptr || p.out == nullptr)
    return invalid_argument("decode_attn_cuda: null q or out");
  for (const PageTableView* t : {&p.sinks, &p.history, &p.recent}) {
    if (t->n_seqs != p.n_seqs)
      return invalid_argument("decode_attn_cuda: a page table has %d sequences, the batch %d",
                              t->n_seqs, p.n_seqs);
    if (p.n_seqs > 0 && (t->indptr == nullptr || t->last_page_len == nullptr))
      return invalid_argument("decode_attn_cuda: a page table has no indptr or last_page_len");
  }
  if ((L.hist_bits == nullptr) != (L.hist_row_prefix == nullptr))
    return invalid_argument("decode_attn_cuda: a bit plan needs both hist_bits and "
                            "hist_row_prefix");
  if (p.hist_pool != nullptr) {
    if (!quant::int2_valid_group(L.head_dim, p.group_size))
      return invalid_argument("decode_attn_cuda: group_size %d invalid for head_dim %d",
                              p.group_size, L.head_dim);
    if (p.quantizer != quant::HistQuantizer::kInt2Uniform &&
        p.quantizer != quant::HistQuantizer::kInt2Lloyd)
      return invalid_argument("decode_attn_cuda: unknown quantizer %d",
                              static_cast<int>(p.quantizer));
    if (L.hist_bits != nullptr && p.quantizer != quant::HistQuantizer::kInt2Uniform)
      return invalid_argument("decode_attn_cuda: a bit plan needs the uniform quantizer");
    if (L.hist_bits == nullptr &&
        L.int2_row_bytes != quant::int2_row_bytes(L.head_dim, p.group_size))
      return invalid_argument("decode_attn_cuda: layout int2_row_bytes %d != %d", L.int2_row_bytes,
                              quant::int2_row_bytes(L.head_dim, p.group_size));
  }
  return Status();
}

}  // namespace

DecodeAttnCudaLaunchInfo decode_attn_cuda_last_launch() { return g_last; }

Status decode_attn_cuda_ex(const DecodeAttnParams& p, const DecodeAttnCudaOptions& opts,
                           void* stream_ptr) {
  OSCAR_RETURN_IF_ERROR(validate_cuda(p));
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  g_last = DecodeAttnCudaLaunchInfo{};
  if (opts.int2_kernel != 0 && opts.int2_kernel != 1)
    return invalid_argument("decode_attn_cuda: int2_kernel %d (0 or 1)", opts.int2_kernel);
  if (p.n_seqs == 0) return Status();
  const KvPageLayout& L = p.layout;

  KernelArgs a{};
  a.n_seqs = p.n_seqs;
  a.n_heads_q = p.n_heads_q;
  a.n_heads_kv = L.n_heads_kv;
  a.gqa = p.n_heads_q / L.n_heads_kv;
  a.n_hgroups = (a.gqa + cuda_detail::kGroupHeads - 1) / cuda_detail::kGroupHeads;
  a.layer = p.layer;
  a.page_size = L.page_size;
  a.group_size = p.group_size;
  a.head_dim = L.head_dim;
  a.uniform = p.quantizer == quant::HistQuantizer::kInt2Uniform ? 1 : 0;
  a.exact_elem_bytes = L.exact_elem_bytes;
  a.force_generic = opts.path == DecodeAttnCudaPath::kGeneric ? 1 : 0;
  a.debug_flags = opts.debug_flags;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  for (int i = 0; i < 4; ++i) a.lloyd_levels[i] = quant::kLloydDequantLevels[i];
  a.q = p.q;
  a.exact_pool = p.exact_pool;
  a.hist_pool = p.hist_pool;
  a.exact_page_bytes = L.exact_page_bytes();
  // With a bit plan, int2_page_bytes() would read hist_row_prefix (a device pointer) on the host:
  // the kernels read the total themselves (hist_page_bytes = 0 means "from the bit plan").
  a.n_planes = L.n_planes();
  a.page_shift = -1;
  for (int sh = 0; sh < 31; ++sh)
    if ((1 << sh) == L.page_size) a.page_shift = sh;
  a.hist_page_bytes = L.hist_row_prefix != nullptr
                          ? 0
                          : static_cast<uint64_t>(L.n_planes()) * L.page_size * L.int2_row_bytes;
  // The INT2 tiles' loads take a page's offset as one 32 x 32 -> 64-bit multiply-add.
  if (a.hist_page_bytes > 0xffffffffull)
    return invalid_argument("decode_attn_cuda: a history page of %llu bytes (at most 4 GiB)",
                            static_cast<unsigned long long>(a.hist_page_bytes));
  a.sinks = p.sinks;
  a.history = p.history;
  a.recent = p.recent;
  a.hist_bits = L.hist_bits;
  a.hist_row_prefix = L.hist_row_prefix;
  a.int2_row_bytes = L.int2_row_bytes;
  a.out = p.out;

  const int P = L.page_size;
  const bool fast = opts.path != DecodeAttnCudaPath::kNaive && L.head_dim == 128 &&
                    (P % cuda_detail::kTileTokens == 0 || cuda_detail::kTileTokens % P == 0);
  if (!fast) {
    a.n_splits = 1;
    const dim3 grid(p.n_heads_q, p.n_seqs);
    cuda_detail::naive_kernel<<<grid, cuda_detail::kThreads, 0, stream>>>(a);
    OSCAR_CUDA_LAUNCH_CHECK("decode_attn naive_kernel");
    g_last = DecodeAttnCudaLaunchInfo{2, 1, static_cast<int32_t>(grid.x * grid.y), 0};
    return Status();
  }

  DeviceFacts facts;
  OSCAR_RETURN_IF_ERROR(device_facts(&facts));
  // Dense configuration when there is history (INT2 tiles are issue-bound: more warps), wide
  // otherwise (exact tiles want two stages).
  const int cfg = opts.config == 1 ? 0 : opts.config == 2 ? 1 : (p.hist_pool != nullptr ? 1 : 0);
  const int page16 = P == 16;  // the instance with the page size fixed (the default)
  const int64_t units = static_cast<int64_t>(p.n_seqs) * L.n_heads_kv * a.n_hgroups;
  int n_splits = opts.n_splits;
  if (n_splits <= 0) {
    // Batch-invariant: the cap a sequence alone would get, so that each sequence's split (its
    // effective_splits, from its own length and this cap: decode_attn.cuh) and hence its
    // partials and their merge are the same whatever else is in the batch; in a larger batch
    // the splits a sequence does not use are blocks that return at once.
    const int64_t target = static_cast<int64_t>(facts.sms) * facts.blocks_per_sm[cfg][page16];
    const int64_t per = p.batch_invariant ? units / p.n_seqs : units;
    n_splits = static_cast<int>(std::max<int64_t>(1, target / per));
  }
  n_splits = std::min(n_splits, cuda_detail::kMaxSplits);
  a.n_splits = n_splits;
  if (n_splits > 1) {
    const size_t rows = static_cast<size_t>(p.n_seqs) * p.n_heads_q * n_splits;
    float* ws = nullptr;
    OSCAR_RETURN_IF_ERROR(workspace(rows * (128 + 2) * sizeof(float), stream, &ws));
    a.part_o = ws;
    a.part_ml = ws + rows * 128;
  }
  if (units * n_splits > (int64_t{1} << 31) - 1 || p.n_seqs > 65535)
    return invalid_argument("decode_attn_cuda: batch of %d sequences too large", p.n_seqs);
  const dim3 grid(n_splits, L.n_heads_kv * a.n_hgroups, p.n_seqs);
  using cuda_detail::kBlocksDense;
  using cuda_detail::kBlocksWide;
  using cuda_detail::kRingDense;
  using cuda_detail::kRingWide;
  using cuda_detail::kThreads;
  using cuda_detail::kWarps;
  using Kernel = void (*)(cuda_detail::KernelArgs);
  // [page16][int2_kernel]: the dense configuration's instances (decode_attn_kernel's kInt2).
  static const Kernel kDense[2][2] = {
      {cuda_detail::decode_attn_kernel<kRingDense, kBlocksDense, 0, 0>,
       cuda_detail::decode_attn_kernel<kRingDense, kBlocksDense, 0, 1>},
      {cuda_detail::decode_attn_kernel<kRingDense, kBlocksDense, 16, 0>,
       cuda_detail::decode_attn_kernel<kRingDense, kBlocksDense, 16, 1>}};
  Kernel kernel = cfg == 0 ? (page16 ? cuda_detail::decode_attn_kernel<kRingWide, kBlocksWide, 16, 0>
                                     : cuda_detail::decode_attn_kernel<kRingWide, kBlocksWide, 0, 0>)
                           : kDense[page16][opts.int2_kernel];
  // Launched early (programmatic dependent launch) only when the grid fills every resident slot:
  // with fewer blocks, starting while the previous kernel still holds SMs packed them unevenly
  // (the 43-sequence step of bench_decode_step went from 52.5 to 64.4 ms on the H200).
  const bool full =
      units * n_splits >= static_cast<int64_t>(facts.sms) * facts.blocks_per_sm[cfg][page16];
  OSCAR_CUDA_CHECK(cuda::launch_pdl_if(full, kernel, grid, dim3(kThreads),
                                       kWarps * (cfg == 0 ? kRingWide : kRingDense), stream, a));
  OSCAR_CUDA_LAUNCH_CHECK("decode_attn_kernel");
  if (n_splits > 1) {
    OSCAR_CUDA_CHECK(cuda::launch_pdl(cuda_detail::combine_kernel,
                                      dim3(static_cast<unsigned>(p.n_seqs * p.n_heads_q)),
                                      dim3(kThreads), 0, stream, a));
    OSCAR_CUDA_LAUNCH_CHECK("decode_attn combine_kernel");
  }
  g_last = DecodeAttnCudaLaunchInfo{0, n_splits, static_cast<int32_t>(units * n_splits),
                                    facts.blocks_per_sm[cfg][page16], cfg};
  return Status();
}

Status decode_attn_cuda(const DecodeAttnParams& p, void* stream) {
  return decode_attn_cuda_ex(p, DecodeAttnCudaOptions{}, stream);
}

}  // namespace oscar::kernels
