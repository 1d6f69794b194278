// Benchmark of the CUDA prefill attention (kernels/prefill_attn.h: prefill_attn_cuda; the SIMT
// path through kernels/cuda/prefill_attn_cuda.h) on one layer of Qwen3-8B's head layout (32 query
// heads, 8 KV heads, head_dim 128), page 16, quant_group 128, 64 BF16 sinks. Cases (batch x
// history tokens x chunk): a first chunk of 2048 at pos0 = 0 (no history pool, the bf16 mode),
// 512 after 8K of INT2 history, 4 x 256 after 4K, 1024 after 32K. Each sequence's recent pages
// hold 64 tokens plus its chunk. Pages shuffled, contents random (valid fp16 metadata). Timing:
// CUDA events around one call, the L2 flushed before each call by reading 256 MiB; 2 warm-up
// calls, median of --iters (default 10). Reported: causal attention flops (4·d·n_heads_q per
// (query, visible key) pair) / time.
//
// Run: bench_prefill_attn_cuda [--iters n]
// Not Google Benchmark: a plain program, so that one device call prints one table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/prefill_attn_cuda.h"
#include "kernels/prefill_attn.h"
#include "quant/int2_layout.h"

namespace {

using namespace oscar;
using namespace oscar::kernels;
using namespace oscar::bench;

constexpr int kHq = 32, kHkv = 8, kD = 128, kP = 16, kG = 128;
constexpr int64_t kSink = 64, kRecentExtra = 64;

template <class T>
T* upload(const std::vector<T>& v) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(16, v.size() * sizeof(T))));
  if (!v.empty()) CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return static_cast<T*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 10;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--iters n]\n", argv[0]);
      return 2;
    }
  }
  print_device_facts(DeviceFacts::kNameSms);
  const StreamTimer timer;
  const cudaStream_t stream = timer.stream;
  const L2Flush flush;

  KvPageLayout L;
  L.n_layers = 1;
  L.n_heads_kv = kHkv;
  L.head_dim = kD;
  L.page_size = kP;
  L.exact_elem_bytes = 2;
  L.int2_row_bytes = quant::int2_row_bytes(kD, kG);

  struct BenchCase {
    int batch;
    int64_t hist, chunk;
  };
  const BenchCase cases[] = {{1, 0, 2048}, {1, 8192, 512}, {4, 4096, 256}, {1, 32768, 1024}};
  std::mt19937 rng(7);
  std::printf(
      "\n| batch | history | chunk | path | median us | p10 | p90 | TFLOP/s |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const BenchCase& bc : cases) {
    const bool int2 = bc.hist > 0;
    std::vector<int32_t> indptr[3], ids[3], last[3], cu = {0};
    std::vector<int64_t> pos0;
    int64_t n_exact = 0, n_hist = 0;
    double flops = 0;
    for (int s = 0; s < bc.batch; ++s) {
      const int64_t recent = int2 ? kRecentExtra + bc.chunk : bc.chunk - kSink;
      const int64_t n[3] = {kSink, bc.hist, recent};
      for (int r = 0; r < 3; ++r) {
        if (indptr[r].empty()) indptr[r].push_back(0);
        const int64_t np = (n[r] + kP - 1) / kP;
        for (int64_t i = 0; i < np; ++i)
          ids[r].push_back(static_cast<int32_t>(r == 1 ? n_hist++ : n_exact++));
        indptr[r].push_back(static_cast<int32_t>(ids[r].size()));
        last[r].push_back(n[r] == 0 ? 0 : static_cast<int32_t>((n[r] - 1) % kP + 1));
      }
      const int64_t p0 = kSink + bc.hist + recent - bc.chunk;
      pos0.push_back(p0);
      cu.push_back(cu.back() + static_cast<int32_t>(bc.chunk));
      for (int64_t i = 0; i < bc.chunk; ++i)
        flops += 4.0 * kD * kHq * static_cast<double>(p0 + i + 1);
    }
    // Shuffle the page ids of each pool.
    {
      std::vector<int32_t> pe(n_exact), ph(std::max<int64_t>(n_hist, 1));
      std::iota(pe.begin(), pe.end(), 0);
      std::iota(ph.begin(), ph.end(), 0);
      std::shuffle(pe.begin(), pe.end(), rng);
      std::shuffle(ph.begin(), ph.end(), rng);
      for (int r = 0; r < 3; ++r)
        for (int32_t& id : ids[r]) id = r == 1 ? ph[id] : pe[id];
    }
    // Pools: BF16 |x| < 2; INT2 rows with fp16 scale in [0.25, 0.5), min in (-2, -1].
    std::vector<uint8_t> exact(static_cast<size_t>(n_exact) * L.exact_page_bytes());
    for (size_t i = 0; i + 4 <= exact.size(); i += 4) {
      const uint32_t w = static_cast<uint32_t>(rng()) & 0xBFFFBFFFu;
      std::memcpy(&exact[i], &w, 4);
    }
    std::vector<uint8_t> hist(static_cast<size_t>(std::max<int64_t>(n_hist, 1)) *
                              L.int2_page_bytes());
    for (size_t i = 0; i + 36 <= hist.size(); i += 36) {
      for (int b = 0; b < 32; b += 4) {
        const uint32_t w = static_cast<uint32_t>(rng());
        std::memcpy(&hist[i + b], &w, 4);
      }
      const uint32_t r = static_cast<uint32_t>(rng());
      const uint32_t m = (0x3400u | (r & 0x3ffu)) | ((0xBC00u | ((r >> 16) & 0x3ffu)) << 16);
      std::memcpy(&hist[i + 32], &m, 4);
    }
    std::vector<float> q(static_cast<size_t>(cu.back()) * kHq * kD);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& x : q) x = nd(rng);

    PrefillAttnParams p;
    p.n_seqs = bc.batch;
    p.n_heads_q = kHq;
    p.layer = 0;
    p.scale = 1.f / std::sqrt(float(kD));
    p.layout = L;
    p.codec.group_size = kG;
    p.n_sink = static_cast<int32_t>(kSink);
    p.n_recent = 256;
    p.quantized = int2;
    p.cu_seqlens = upload(cu);
    p.pos0 = upload(pos0);
    p.q = upload(q);
    p.exact_pool = upload(exact);
    p.hist_pool = int2 ? upload(hist) : nullptr;
    PageTableView* tabs[3] = {&p.sinks, &p.history, &p.recent};
    for (int r = 0; r < 3; ++r) {
      tabs[r]->indptr = upload(indptr[r]);
      tabs[r]->page_ids = upload(ids[r]);
      tabs[r]->last_page_len = upload(last[r]);
      tabs[r]->n_seqs = bc.batch;
    }
    float* out = nullptr;
    CK(cudaMalloc(&out, q.size() * sizeof(float)));
    p.out = out;
    for (PrefillAttnCudaPath path : {PrefillAttnCudaPath::kAuto, PrefillAttnCudaPath::kSimt}) {
      std::vector<double> ts;
      const auto call = [&] {
        const Status st = prefill_attn_cuda_ex(p, path, stream);
        if (!st.ok()) std::fprintf(stderr, "prefill_attn_cuda: %s\n", st.to_string().c_str());
        return st.ok();
      };
      if (!time_flushed_us(timer, flush, 2, iters, call, &ts)) return 1;
      const double med = pct(ts, 0.5);
      std::printf("| %d | %lld | %lld | %s | %.1f | %.1f | %.1f | %.1f |\n", bc.batch,
                  static_cast<long long>(bc.hist), static_cast<long long>(bc.chunk),
                  path == PrefillAttnCudaPath::kAuto ? "mma" : "simt", med, pct(ts, 0.1),
                  pct(ts, 0.9), flops / (med * 1e-6) / 1e12);
      std::fflush(stdout);
    }
    // Buffers of this case are left to the process exit (a benchmark).
  }
  return 0;
}
