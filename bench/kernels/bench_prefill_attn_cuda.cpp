// Benchmark of the CUDA prefill attention (kernels/prefill_attn.h: prefill_attn_cuda; the other
// kernels through kernels/cuda/prefill_attn_cuda.h) on one layer of Qwen3-8B's head layout (32
// query heads, 8 KV heads, head_dim 128), page 16, quant_group 128, 64 BF16 sinks. Cases (batch x
// prefix tokens x chunk, prefix BF16 or INT2):
//   whole prompts in one chunk (8K, 32K, 100K, 128K; the shape of torch_prefill.py's attention
//     alone, cuDNN SDPA causal), BF16;
//   extend: a chunk of 8K after a 24K prefix, 32 x 64 after 16K each (the shared-prefix load
//     test's shape), 512 after 8K, 4 x 256 after 4K, 1024 after 32K, each with the prefix in BF16
//     pages and as INT2 history (64 sinks, the last 64 prefix tokens and the chunk in recent pages);
//     32 x 64 after 16K also with one history shared by all 32 (a cached prefix: its pages are
//     expanded to BF16 once);
//   short chunks at depth (128 after 48K, 64 after 96K, 4 x 128 after 32K: the chunks a step
//     budget beside running streams allows), where the warp-specialised kernel splits each
//     item's keys across blocks.
// Paths: kAuto (the warp-specialised kernel, for this serving reading) without and with the key
// split ("split": PrefillAttnParams::max_rows / max_keys given, as the model gives them; it
// splits only where few items meet long keys), kTiledWgmma and kTiledMma
// (the tiled kernel on wgmma / mma.sync) and, where it takes under ~20 TFLOP (it runs ~40 TFLOP/s), kStaged (the previous
// tensor-core kernel). Pages shuffled, contents random
// (valid fp16 metadata). Timing: CUDA events around one call, the L2 flushed before each call by
// reading 256 MiB; 2 warm-up calls, median of --iters (default 5). Reported: causal attention
// flops (4·d·n_heads_q per (query, visible key) pair = torch_prefill.py's 2·N²·d·Hq for a whole
// prompt) / time, and the kernel's speed-up over kStaged.
//
// Run: bench_prefill_attn_cuda [--iters n] [--quick] [--case i] [--path staged|mma|wgmma|auto|split]
//   --quick: the cases up to 32K only; --case / --path: one case (0-based, in the table's order)
//   or one path only, e.g. to profile a single kernel under ncu.
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
#include "kernels/distinct_pages.h"
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
  int iters = 5;
  bool quick = false;
  int only_case = -1;
  const char* only_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--case") && i + 1 < argc)
      only_case = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--path") && i + 1 < argc)
      only_path = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--iters n] [--quick] [--case i] [--path staged|mma|wgmma|auto|split]\n",
                   argv[0]);
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
    int64_t prefix, chunk;
    bool int2;  // the prefix (beyond sinks and 64 recent tokens) as INT2 history
    bool shared = false;  // every sequence's history on the same pages (a cached prefix)
  };
  std::vector<BenchCase> cases = {{1, 0, 8192, false},      {1, 0, 32768, false},
                                  {1, 24576, 8192, false},  {1, 24576, 8192, true},
                                  {32, 16384, 64, false},   {32, 16384, 64, true},
                                  {32, 16384, 64, true, true},
                                  {1, 8192, 512, true},     {4, 4096, 256, true},
                                  {1, 32768, 1024, false},  {1, 32768, 1024, true},
                                  // Short chunks at depth (a prefill step beside running
                                  // streams): too few items to fill the GPU without a split.
                                  {1, 49152, 128, false},   {1, 49152, 128, true},
                                  {1, 98304, 64, true},     {4, 32768, 128, false}};
  if (!quick) {
    cases.push_back({1, 0, 102400, false});
    cases.push_back({1, 0, 131072, false});
  }
  uint64_t rs = 0x9E3779B97F4A7C15ull;
  const auto next = [&rs] {  // xorshift64*: random bytes at memory speed
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return static_cast<uint32_t>((rs * 0x2545F4914F6CDD1Dull) >> 32);
  };
  std::mt19937 rng(7);
  std::printf(
      "\n| batch | prefix | chunk | prefix as | path | median us | p10 | p90 | TFLOP/s | vs staged |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    if (only_case >= 0 && static_cast<size_t>(only_case) != ci) continue;
    const BenchCase& bc = cases[ci];
    const bool int2 = bc.int2;
    const int64_t hist = int2 ? bc.prefix - kSink - kRecentExtra : 0;
    std::vector<int32_t> indptr[3], ids[3], last[3], cu = {0};
    std::vector<int64_t> pos0;
    int64_t n_exact = 0, n_hist = 0, max_keys = 0;
    double flops = 0;
    for (int s = 0; s < bc.batch; ++s) {
      const int64_t recent = int2 ? kRecentExtra + bc.chunk : bc.prefix + bc.chunk - kSink;
      const int64_t n[3] = {kSink, hist, recent};
      for (int r = 0; r < 3; ++r) {
        if (indptr[r].empty()) indptr[r].push_back(0);
        const int64_t np = (n[r] + kP - 1) / kP;
        for (int64_t i = 0; i < np; ++i)
          ids[r].push_back(static_cast<int32_t>(r != 1             ? n_exact++
                                                : bc.shared && s > 0 ? ids[1][i]
                                                                     : n_hist++));
        indptr[r].push_back(static_cast<int32_t>(ids[r].size()));
        last[r].push_back(n[r] == 0 ? 0 : static_cast<int32_t>((n[r] - 1) % kP + 1));
      }
      const int64_t p0 = kSink + hist + recent - bc.chunk;
      pos0.push_back(p0);
      max_keys = std::max(max_keys, p0 + bc.chunk);
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
      const uint32_t w = next() & 0xBFFFBFFFu;
      std::memcpy(&exact[i], &w, 4);
    }
    std::vector<uint8_t> hist_bytes(static_cast<size_t>(std::max<int64_t>(n_hist, 1)) *
                                    L.int2_page_bytes());
    for (size_t i = 0; i + 36 <= hist_bytes.size(); i += 36) {
      for (int b = 0; b < 32; b += 4) {
        const uint32_t w = next();
        std::memcpy(&hist_bytes[i + b], &w, 4);
      }
      const uint32_t r = next();
      const uint32_t m = (0x3400u | (r & 0x3ffu)) | ((0xBC00u | ((r >> 16) & 0x3ffu)) << 16);
      std::memcpy(&hist_bytes[i + 32], &m, 4);
    }
    // q ~ N(0, 1): a block of fresh normals, repeated at shifting offsets (large prompts).
    std::vector<float> q(static_cast<size_t>(cu.back()) * kHq * kD);
    {
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> block(std::min<size_t>(q.size(), size_t{1} << 22) + 1);
      for (float& x : block) x = nd(rng);
      for (size_t i = 0; i < q.size(); ++i) q[i] = block[(i + i / (block.size() - 1)) % block.size()];
    }

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
    p.hist_pool = int2 ? upload(hist_bytes) : nullptr;
    PageTableView* tabs[3] = {&p.sinks, &p.history, &p.recent};
    for (int r = 0; r < 3; ++r) {
      tabs[r]->indptr = upload(indptr[r]);
      tabs[r]->page_ids = upload(ids[r]);
      tabs[r]->last_page_len = upload(last[r]);
      tabs[r]->n_seqs = bc.batch;
    }
    const DistinctPages distinct = distinct_pages(ids[1]);
    if (int2) {
      p.hist_unique = upload(distinct.pages);
      p.hist_slot = upload(distinct.index);
      p.n_hist_unique = static_cast<int32_t>(distinct.pages.size());
    }
    float* out = nullptr;
    CK(cudaMalloc(&out, q.size() * sizeof(float)));
    p.out = out;
    double staged_us = 0;
    for (int pi = 0; pi < 5; ++pi) {
      constexpr PrefillAttnCudaPath kPaths[5] = {
          PrefillAttnCudaPath::kStaged, PrefillAttnCudaPath::kTiledMma,
          PrefillAttnCudaPath::kTiledWgmma, PrefillAttnCudaPath::kAuto, PrefillAttnCudaPath::kAuto};
      const PrefillAttnCudaPath path = kPaths[pi];
      const bool staged = path == PrefillAttnCudaPath::kStaged, split = pi == 4;
      const char* path_name = staged                                      ? "staged"
                              : path == PrefillAttnCudaPath::kTiledMma   ? "mma"
                              : path == PrefillAttnCudaPath::kTiledWgmma ? "wgmma"
                              : split                                     ? "split"
                                                                          : "auto";
      // The bounds that let kAuto split an item's keys (0: unknown, no split).
      p.max_rows = split ? cu.back() : 0;
      p.max_keys = split ? max_keys : 0;
      if (only_path != nullptr ? std::strcmp(only_path, path_name) != 0 : staged && flops > 2e13)
        continue;
      std::vector<double> ts;
      const auto call = [&] {
        const Status st = prefill_attn_cuda_ex(p, path, stream);
        if (!st.ok()) std::fprintf(stderr, "prefill_attn_cuda: %s\n", st.to_string().c_str());
        return st.ok();
      };
      if (!time_flushed_us(timer, flush, 2, iters, call, &ts)) return 1;
      const double med = pct(ts, 0.5);
      if (staged) staged_us = med;
      char ratio[32] = "";
      if (!staged && staged_us > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", staged_us / med);
      std::printf("| %d | %lld | %lld | %s | %s | %.1f | %.1f | %.1f | %.1f | %s |\n", bc.batch,
                  static_cast<long long>(bc.prefix), static_cast<long long>(bc.chunk),
                  !int2 ? "bf16" : bc.shared ? "int2, shared" : "int2",
                  staged                                       ? "staged"
                  : path == PrefillAttnCudaPath::kTiledMma   ? "tiled mma.sync"
                  : path == PrefillAttnCudaPath::kTiledWgmma ? "tiled wgmma"
                  : split                                      ? "warp-specialised, split"
                                                               : "warp-specialised",
                  med, pct(ts, 0.1),
                  pct(ts, 0.9), flops / (med * 1e-6) / 1e12, ratio);
      std::fflush(stdout);
    }
    for (void* b : {static_cast<void*>(const_cast<int32_t*>(p.cu_seqlens)),
                    static_cast<void*>(const_cast<int64_t*>(p.pos0)),
                    static_cast<void*>(const_cast<float*>(p.q)),
                    static_cast<void*>(const_cast<uint8_t*>(p.exact_pool)),
                    static_cast<void*>(const_cast<uint8_t*>(p.hist_pool)), static_cast<void*>(out)})
      if (b != nullptr) CK(cudaFree(b));
    // (The page tables' small buffers are left to the process exit.)
  }
  return 0;
}
