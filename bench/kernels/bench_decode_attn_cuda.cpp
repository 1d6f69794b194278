// Benchmark of the CUDA decode attention (kernels/decode_attn.h: decode_attn_cuda) on one layer
// of Qwen3-8B's head layout (32 query heads, 8 KV heads, head_dim 128), page 16, quant_group 128:
//   int2: 64 BF16 sinks + INT2 history + 256 BF16 recent tokens (OSCAR's cache)
//   int2v3: the same cache through the kernel before (int2_kernel = 1), measured beside int2
//         in the same run
//   bf16: 64 sinks + everything else in the BF16 recent window (the bf16 mode: same kernel,
//         no history)
// for contexts × batches (defaults 8K/32K/128K × 1/8/32). Pages: 2 layers per page (layer 1 is
// read, so a layer's planes are not contiguous across pages), page ids shuffled, contents random
// (valid fp16 metadata). Timing: CUDA events around each decode_attn_cuda call (the attention and
// its combine kernel) captured once into a CUDA graph and replayed, as the peers do; the L2
// flushed before each call by reading 256 MiB (4x the H200's L2; reads, so no dirty lines are
// left to write back during the timed call); 5 warm-up calls, median (and p10/p90) of --iters
// replays (default 50); "direct us" = the same call launched without a graph. Reported: bytes
// that must be read (every K/V byte of the layer once, metadata included, plus q and out), TB/s
// (from the graph median), and the device-to-device copy bandwidth (read + write) measured in
// the same run.
//
// Run: bench_decode_attn_cuda [--ctx 8192,32768,131072] [--batch 1,8,32] [--iters 50]
//                             [--csv FILE] [--order shuffled|contiguous] [--modes int2,int2v3,bf16]
//                             [--debug 1|2] [--splits n] [--path auto|generic|naive] [--config c]
//                             [--sink 64] [--recent 256]   (int2 mode's BF16 tokens, multiples of 16)
// Not Google Benchmark: a plain program, so that one device call prints one table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/decode_attn_cuda.h"
#include "kernels/cuda/device_util.h"
#include "kernels/decode_attn.h"
#include "quant/int2_layout.h"

namespace {

using namespace oscar;
using namespace oscar::kernels;
using namespace oscar::bench;

constexpr int kHq = 32, kHkv = 8, kD = 128, kP = 16, kG = 128, kLayers = 2, kLayer = 1;
constexpr int64_t kSinkDefault = 64, kRecentDefault = 256;

// Fills n bytes with a hash of the index (a cheap stand-in for random data, on the device).
std::vector<uint32_t> host_random(size_t n_words, uint32_t seed) {
  std::vector<uint32_t> v(n_words);
  std::mt19937 rng(seed);
  for (auto& x : v) x = rng();
  return v;
}

// Device buffer filled by copying a random host block repeatedly (no kernel needed here).
void fill_random(uint8_t* dev, size_t bytes, const std::vector<uint8_t>& block) {
  size_t done = 0;
  while (done < bytes) {
    const size_t n = std::min(block.size(), bytes - done);
    CK(cudaMemcpy(dev + done, block.data(), n, cudaMemcpyHostToDevice));
    done += n;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ctxs = {8192, 32768, 131072}, batches = {1, 8, 32};
  int iters = 50;
  const char* csv = nullptr;
  bool shuffled = true;
  DecodeAttnCudaOptions opts;
  std::vector<std::string> modes = {"int2", "int2v3", "bf16"};
  int64_t sink_tokens = kSinkDefault, recent_tokens = kRecentDefault;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ctx") && i + 1 < argc) ctxs = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batches = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!std::strcmp(argv[i], "--debug") && i + 1 < argc) opts.debug_flags = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--splits") && i + 1 < argc) opts.n_splits = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--config") && i + 1 < argc) opts.config = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--sink") && i + 1 < argc) sink_tokens = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--recent") && i + 1 < argc) recent_tokens = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--path") && i + 1 < argc) {
      const char* v = argv[++i];
      opts.path = !std::strcmp(v, "generic") ? DecodeAttnCudaPath::kGeneric
                  : !std::strcmp(v, "naive") ? DecodeAttnCudaPath::kNaive
                                             : DecodeAttnCudaPath::kAuto;
    }
    else if (!std::strcmp(argv[i], "--order") && i + 1 < argc)
      shuffled = std::strcmp(argv[++i], "contiguous") != 0;
    else if (!std::strcmp(argv[i], "--modes") && i + 1 < argc) {
      modes.clear();
      for (const char* m = argv[++i]; *m;) {
        const char* e = std::strchr(m, ',');
        modes.emplace_back(m, e ? e - m : std::strlen(m));
        m = e ? e + 1 : m + std::strlen(m);
      }
    }
    else {
      std::fprintf(stderr, "usage: %s [--ctx a,b] [--batch a,b] [--iters n] [--csv file] "
                           "[--order shuffled|contiguous] [--modes int2,int2v3,bf16] [--debug 1|2] [--splits n] [--path auto|generic|naive] [--config 0|1|2] [--sink n] [--recent n]\n",
                   argv[0]);
      return 2;
    }
  }
  print_device_facts(DeviceFacts::kNameSmsL2Memory);
  const StreamTimer timer;
  const cudaStream_t stream = timer.stream;

  // Copy bandwidth: 2 GiB device-to-device, median of 20.
  const double copy_tbs = copy_bandwidth_tbs(timer, 20, median);

  const L2Flush flush;

  KvPageLayout L;
  L.n_layers = kLayers;
  L.n_heads_kv = kHkv;
  L.head_dim = kD;
  L.page_size = kP;
  L.exact_elem_bytes = 2;
  L.int2_row_bytes = quant::int2_row_bytes(kD, kG);

  const int max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
  const int max_b = *std::max_element(batches.begin(), batches.end());
  const int64_t max_pages = static_cast<int64_t>(max_b) * (max_ctx / kP + 2) + 4;

  // Exact pool big enough for the bf16 mode's largest case; history pool for the int2 mode's.
  uint8_t *exact_pool = nullptr, *hist_pool = nullptr;
  const size_t exact_bytes = static_cast<size_t>(max_pages) * L.exact_page_bytes();
  const size_t hist_bytes = static_cast<size_t>(max_pages) * L.int2_page_bytes();
  CK(cudaMalloc(&exact_pool, exact_bytes));
  CK(cudaMalloc(&hist_pool, hist_bytes));
  {
    // BF16: random values in about [-2, 2] (exponent bits bounded).
    std::vector<uint32_t> w = host_random(size_t{8} << 20, 1);
    for (auto& x : w) x &= 0xBFFFBFFFu;  // clear bit 14 of each bf16: |x| < 2
    std::vector<uint8_t> blk(w.size() * 4);
    std::memcpy(blk.data(), w.data(), blk.size());
    fill_random(exact_pool, exact_bytes, blk);
    // INT2 rows of 36 bytes: 8 words of codes, then fp16 (scale, min) in [0.25, 1) x [-2, -1).
    std::vector<uint32_t> r = host_random(9 * (size_t{1} << 20), 2);
    for (size_t i = 8; i < r.size(); i += 9) {
      const uint32_t s = 0x3400u | (r[i] & 0x3ffu);           // 0.25 .. 0.5
      const uint32_t m = 0xBC00u | ((r[i] >> 16) & 0x3ffu);   // -1 .. -2
      r[i] = s | (m << 16);
    }
    std::vector<uint8_t> blk2(r.size() * 4);
    std::memcpy(blk2.data(), r.data(), blk2.size());
    fill_random(hist_pool, hist_bytes, blk2);
  }
  std::vector<int32_t> perm(max_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(7);
  if (shuffled) std::shuffle(perm.begin(), perm.end(), rng);
  std::printf("page order: %s%s; path %d; config %d; splits %s\n",
              shuffled ? "shuffled" : "contiguous",
              opts.debug_flags & 1   ? "; LOADS ONLY (debug 1: compute skipped)"
              : opts.debug_flags & 2 ? "; INT2 COMPUTE ONLY (debug 2: INT2 loads skipped)"
                                     : "",
              static_cast<int>(opts.path), opts.config,
              opts.n_splits > 0 ? std::to_string(opts.n_splits).c_str() : "auto");

  float *q = nullptr, *out = nullptr;
  CK(cudaMalloc(&q, sizeof(float) * max_b * kHq * kD));
  CK(cudaMalloc(&out, sizeof(float) * max_b * kHq * kD));
  {
    std::vector<float> hq(static_cast<size_t>(max_b) * kHq * kD);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : hq) x = nd(rng);
    CK(cudaMemcpy(q, hq.data(), hq.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  int32_t* tab = nullptr;  // indptr/ids/last for 3 regions
  CK(cudaMalloc(&tab, sizeof(int32_t) * (3 * (max_pages + 2 * max_b + 2))));

  FILE* fcsv = csv ? std::fopen(csv, "w") : nullptr;
  if (fcsv)
    std::fprintf(fcsv, "mode,ctx,batch,splits,blocks,median_us,p10_us,p90_us,direct_us,bytes,tbs,"
                       "copy_tbs\n");
  std::printf("\n| mode | ctx | batch | config | splits | blocks | graph median us | p10 | p90 | "
              "direct us | MB read | TB/s | %% of copy |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& mode_s : modes) {
    const char* mode = mode_s.c_str();
    const bool int2 = mode[0] == 'i';
    opts.int2_kernel = mode_s == "int2v3" ? 1 : 0;
    for (int ctx : ctxs)
      for (int b : batches) {
        const int64_t n_sink = sink_tokens;
        const int64_t n_recent = int2 ? recent_tokens : ctx - sink_tokens;
        const int64_t n_hist = int2 ? ctx - sink_tokens - recent_tokens : 0;
        std::vector<int32_t> host;
        std::vector<int32_t> indptr[3], ids[3], last[3];
        size_t pe = 0, ph = 0;
        for (int r = 0; r < 3; ++r) indptr[r] = {0};
        for (int s = 0; s < b; ++s) {
          const int64_t n[3] = {n_sink, n_hist, n_recent};
          for (int r = 0; r < 3; ++r) {
            for (int64_t i = 0; i < (n[r] + kP - 1) / kP; ++i)
              ids[r].push_back(r == 1 ? perm[ph++] : perm[pe++]);
            indptr[r].push_back(static_cast<int32_t>(ids[r].size()));
            last[r].push_back(n[r] == 0 ? 0 : static_cast<int32_t>((n[r] - 1) % kP + 1));
          }
        }
        DecodeAttnParams p;
        p.n_seqs = b;
        p.n_heads_q = kHq;
        p.group_size = kG;
        p.layer = kLayer;
        p.scale = 1.f / std::sqrt(float(kD));
        p.layout = L;
        p.q = q;
        p.exact_pool = exact_pool;
        p.hist_pool = int2 ? hist_pool : nullptr;
        p.out = out;
        PageTableView* tabs[3] = {&p.sinks, &p.history, &p.recent};
        size_t off = 0;
        for (int r = 0; r < 3; ++r) {
          for (auto* v : {&indptr[r], &ids[r], &last[r]}) {
            CK(cudaMemcpy(tab + off, v->data(), v->size() * 4, cudaMemcpyHostToDevice));
            const int32_t* dptr = tab + off;
            if (v == &indptr[r]) tabs[r]->indptr = dptr;
            else if (v == &ids[r]) tabs[r]->page_ids = dptr;
            else tabs[r]->last_page_len = dptr;
            off += v->size() + 1;
          }
          tabs[r]->n_seqs = b;
        }
        const double bytes =
            double(b) * ((n_sink + n_recent) * kHkv * 2.0 * kD * 2 + n_hist * kHkv * 2.0 * 36 +
                         2.0 * kHq * kD * 4);
        for (int i = 0; i < 5; ++i) {
          const Status st = decode_attn_cuda_ex(p, opts, stream);
          if (!st.ok()) {
            std::fprintf(stderr, "decode_attn_cuda: %s\n", st.to_string().c_str());
            return 1;
          }
        }
        CK(cudaStreamSynchronize(stream));
        const DecodeAttnCudaLaunchInfo info = decode_attn_cuda_last_launch();
        // The call captured once into a CUDA graph (both kernels), replayed: the figure a
        // decode step sees (the peers time graph replays too).
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        if (!decode_attn_cuda_ex(p, opts, stream).ok()) return 1;
        CK(cudaStreamEndCapture(stream, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        std::vector<double> ts, ts_direct;
        const auto graph_call = [&] {
          CK(cudaGraphLaunch(exec, stream));
          return true;
        };
        const auto direct_call = [&] { return decode_attn_cuda_ex(p, opts, stream).ok(); };
        if (!time_flushed_us(timer, flush, 3, iters, graph_call, &ts)) return 1;
        if (!time_flushed_us(timer, flush, 3, iters, direct_call, &ts_direct)) return 1;
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        const double med = median(ts), tbs = bytes / (med * 1e-6) / 1e12;
        std::printf("| %s | %dK | %d | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f%% |\n",
                    mode, ctx / 1024, b, info.config == 1 ? "dense" : "wide", info.n_splits,
                    info.blocks, med, pct(ts, 0.1),
                    pct(ts, 0.9), median(ts_direct), bytes / 1e6, tbs, 100 * tbs / copy_tbs);
        std::fflush(stdout);
        if (fcsv)
          std::fprintf(fcsv, "%s,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.0f,%.4f,%.4f\n", mode, ctx, b,
                       info.n_splits, info.blocks, med, pct(ts, 0.1), pct(ts, 0.9),
                       median(ts_direct), bytes, tbs, copy_tbs);
      }
  }
  if (fcsv) std::fclose(fcsv);
  return 0;
}
