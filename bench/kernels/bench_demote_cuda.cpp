// Timing of demote_pages_cuda (kernels/demote_pages.h) for Qwen3-8B shapes: 36 layers, 8 KV
// heads, head_dim 128, page_size 16, G 128, BF16 exact pages with random K/V (outlier channels),
// per-(layer, head) clips 0.96 / 0.92 (OSCAR.md §1). Demotes 1, 8 and 32 pages per call, for the
// uniform INT2, the Lloyd-Max INT2 and a bit plan (a quarter of the K planes INT3, as many V
// planes INT1); prints the median µs per call and per page over CUDA-event-timed calls (each call
// also zeroes the status array, as in a step). A plain program: no GPU, it says so and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "cuda_bench_util.h"
#include "kernels/demote_pages.h"
#include "quant/bit_plan_layout.h"
#include "quant/int2_layout.h"

namespace {

using namespace oscar;
using namespace oscar::kernels;
using namespace oscar::bench;

constexpr int kLayers = 36, kHeads = 8, kDim = 128, kPage = 16, kGroup = 128, kPool = 40;

struct Variant {
  const char* name;
  quant::HistQuantizer quantizer;
  bool bit_plan;
};

}  // namespace

int main() {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("bench_demote_cuda: no CUDA device, skipped\n");
    return 0;
  }
  print_device_facts(DeviceFacts::kName);

  KvPageLayout L;
  L.n_layers = kLayers;
  L.n_heads_kv = kHeads;
  L.head_dim = kDim;
  L.page_size = kPage;
  L.exact_elem_bytes = 2;
  L.int2_row_bytes = quant::int2_row_bytes(kDim, kGroup);

  // Exact pool: K with a few outlier channels, V Gaussian; rounded to bf16.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t exact_page = L.exact_page_bytes();
  std::vector<uint16_t> h_exact(kPool * exact_page / 2);
  for (size_t e = 0; e < h_exact.size(); ++e) {
    const int c = static_cast<int>(e % kDim);
    const float gain = (c % 37 == 3) ? 12.f : 1.f;
    h_exact[e] = f32_to_bf16(gain * normal(rng) + 0.1f);
  }
  std::vector<float> h_clip_k(kLayers * kHeads, 0.96f), h_clip_v(kLayers * kHeads, 0.92f);

  // Bit plan: planes p % 8 == 0 of K are INT3, of V INT1 (two INT2 rows' worth each).
  const int n_planes = L.n_planes();
  std::vector<int8_t> bits(n_planes, 2);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int h = 0; h < kHeads; h += 4) {
      bits[L.plane(layer, 0, h)] = 3;
      bits[L.plane(layer, 1, h)] = 1;
    }
  }
  std::vector<uint32_t> prefix(n_planes + 1, 0);
  for (int p = 0; p < n_planes; ++p)
    prefix[p + 1] = prefix[p] + quant::bit_plan_row_bytes(bits[p], kDim, kGroup);

  uint8_t *d_exact = nullptr, *d_hist = nullptr;
  float *d_ck = nullptr, *d_cv = nullptr;
  int8_t* d_bits = nullptr;
  uint32_t* d_prefix = nullptr;
  int32_t *d_src = nullptr, *d_dst = nullptr, *d_status = nullptr;
  const size_t hist_page = std::max<size_t>(L.int2_page_bytes(), size_t{kPage} * prefix[n_planes]);
  CK(cudaMalloc(&d_exact, kPool * exact_page));
  CK(cudaMalloc(&d_hist, kPool * hist_page));
  CK(cudaMalloc(&d_ck, h_clip_k.size() * sizeof(float)));
  CK(cudaMalloc(&d_cv, h_clip_v.size() * sizeof(float)));
  CK(cudaMalloc(&d_bits, bits.size()));
  CK(cudaMalloc(&d_prefix, prefix.size() * sizeof(uint32_t)));
  CK(cudaMalloc(&d_src, kPool * sizeof(int32_t)));
  CK(cudaMalloc(&d_dst, kPool * sizeof(int32_t)));
  CK(cudaMalloc(&d_status, kPool * sizeof(int32_t)));
  CK(cudaMemcpy(d_exact, h_exact.data(), kPool * exact_page, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_ck, h_clip_k.data(), h_clip_k.size() * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_cv, h_clip_v.data(), h_clip_v.size() * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_bits, bits.data(), bits.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_prefix, prefix.data(), prefix.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  std::vector<int32_t> ids(kPool);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  CK(cudaMemcpy(d_src, ids.data(), kPool * sizeof(int32_t), cudaMemcpyHostToDevice));
  std::shuffle(ids.begin(), ids.end(), rng);
  CK(cudaMemcpy(d_dst, ids.data(), kPool * sizeof(int32_t), cudaMemcpyHostToDevice));

  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));

  const Variant variants[] = {{"int2", quant::HistQuantizer::kInt2Uniform, false},
                              {"int2-lloyd", quant::HistQuantizer::kInt2Lloyd, false},
                              {"int2+plan", quant::HistQuantizer::kInt2Uniform, true}};
  std::printf("shape: layers=%d heads_kv=%d head_dim=%d page_size=%d G=%d (%zu exact bytes/page)\n",
              kLayers, kHeads, kDim, kPage, kGroup, exact_page);
  std::printf("%-12s %6s %12s %12s\n", "format", "pages", "us/call", "us/page");
  for (const Variant& v : variants) {
    for (const int n : {1, 8, 32}) {
      DemotePagesParams p;
      p.layout = L;
      if (v.bit_plan) {
        p.layout.hist_bits = d_bits;
        p.layout.hist_row_prefix = d_prefix;
      }
      p.codec.quantizer = v.quantizer;
      p.codec.group_size = kGroup;
      p.codec.k_clip = d_ck;
      p.codec.v_clip = d_cv;
      p.exact_pool = d_exact;
      p.hist_pool = d_hist;
      p.n_pages = n;
      p.src_pages = d_src;
      p.dst_pages = d_dst;
      p.status = d_status;
      for (int w = 0; w < 3; ++w) {
        const Status st = demote_pages_cuda(p, stream);
        if (!st.ok()) {
          std::fprintf(stderr, "demote_pages_cuda: %s\n", st.to_string().c_str());
          return 1;
        }
      }
      constexpr int kIters = 25;
      std::vector<float> ms(kIters);
      for (int it = 0; it < kIters; ++it) {
        CK(cudaEventRecord(t0, stream));
        (void)demote_pages_cuda(p, stream);
        CK(cudaEventRecord(t1, stream));
        CK(cudaEventSynchronize(t1));
        CK(cudaEventElapsedTime(&ms[it], t0, t1));
      }
      std::sort(ms.begin(), ms.end());
      const double us = 1000.0 * ms[kIters / 2];
      std::printf("%-12s %6d %12.1f %12.2f\n", v.name, n, us, us / n);
    }
  }
  std::vector<int32_t> status(kPool);
  CK(cudaMemcpy(status.data(), d_status, kPool * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 32; ++i) {
    if (status[i] != kDemoteOk) {
      std::fprintf(stderr, "page %d: status %d (random finite input must demote)\n", i, status[i]);
      return 1;
    }
  }
  CK(cudaFree(d_exact));
  CK(cudaFree(d_hist));
  CK(cudaFree(d_ck));
  CK(cudaFree(d_cv));
  CK(cudaFree(d_bits));
  CK(cudaFree(d_prefix));
  CK(cudaFree(d_src));
  CK(cudaFree(d_dst));
  CK(cudaFree(d_status));
  return 0;
}
