// Decode attention on the CPU (kernels/decode_attn.h, fast path): one layer, one new token,
// INT2 history (64 BF16 sinks + INT2 history + 256..271 BF16 recent) against an all-BF16 cache of
// the same length (mode bf16: 64 sinks + everything else in the recent window, no history).
//
// A third cache, "plan", is the INT2 one with a bit plan (kv/bit_plan.h): KV head 0's keys at 3
// bits and its values at 1 bit, every other row INT2 (the same bytes): it measures the cost of the
// 3- and 1-bit unpacking against INT2 where it is heaviest (half of the rows of the tiny shape).
//
// Shapes: tiny-qwen3 (4 query heads, 2 KV heads, head_dim 128) and a Qwen3-8B-like layer
// (32 / 8, head_dim 128); contexts 1K, 4K, 16K, 32K; page_size 16, quant_group 128, uniform INT2.
// Each iteration first overwrites an 8 MiB buffer (evicting L2; the L3 of the development machine
// is far larger than any cache here, so this measures L3-or-DRAM reads, not DRAM alone), then
// times one decode_attn call with a steady clock (manual time). Reported: time per call and
// bytes of K/V read per second ("bytes_per_second"; kv_bytes = the K and V bytes of every
// token of the layer, metadata included). Median of repetitions in the aggregates.
//
// Run: ./build-<name>/bench/bench_decode_attn --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/decode_attn.h"
#include "quant/bit_plan_layout.h"
#include "quant/int2_layout.h"

namespace {

using namespace oscar;
using namespace oscar::kernels;

constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr int kGroup = 128;
constexpr int64_t kSink = 64;
constexpr int64_t kRecent = 256;

enum Kind { kBf16 = 0, kInt2 = 1, kPlan = 2 };

struct Cache {
  KvPageLayout layout;
  std::vector<int8_t> plane_bits;
  std::vector<uint32_t> row_prefix;
  std::vector<uint8_t> exact_pool, int2_pool;
  std::vector<int32_t> sink_pages, hist_pages, recent_pages;
  // One-sequence CSR tables: indptr {0, n_pages} and the last page's length, per region.
  std::vector<int32_t> indptr[3], last[3];
  std::vector<float> q, out;
  DecodeAttnParams p;
  int64_t kv_bytes = 0;
};

// One layer; pages handed out in shuffled order, as a long-running pool would.
void build(Cache& c, int n_heads_q, int n_heads_kv, int64_t n_tokens, Kind kind) {
  const bool int2 = kind != kBf16;
  KvPageLayout& L = c.layout;
  L.n_layers = 1;
  L.n_heads_kv = n_heads_kv;
  L.head_dim = kHeadDim;
  L.page_size = kPageSize;
  L.exact_elem_bytes = 2;
  L.int2_row_bytes = quant::int2_row_bytes(kHeadDim, kGroup);
  // Planes (kv, head) of the one layer; the plan: K head 0 at 3 bits, V head 0 at 1 bit.
  c.plane_bits.assign(2 * n_heads_kv, 2);
  if (kind == kPlan) {
    c.plane_bits[0] = 3;
    c.plane_bits[n_heads_kv] = 1;
  }
  c.row_prefix.assign(2 * n_heads_kv + 1, 0);
  for (int pl = 0; pl < 2 * n_heads_kv; ++pl)
    c.row_prefix[pl + 1] =
        c.row_prefix[pl] + quant::bit_plan_row_bytes(c.plane_bits[pl], kHeadDim, kGroup);
  if (kind == kPlan) {
    L.hist_bits = c.plane_bits.data();
    L.hist_row_prefix = c.row_prefix.data();
  }
  const int64_t sink = std::min(kSink, n_tokens);
  int64_t hist = 0;
  if (int2 && n_tokens - sink > kRecent) hist = (n_tokens - sink - kRecent) / kPageSize * kPageSize;
  const int64_t recent = n_tokens - sink - hist;
  auto pages = [](int64_t t) { return (t + kPageSize - 1) / kPageSize; };
  std::mt19937 rng(42);
  const int64_t n_exact = pages(sink) + pages(recent);
  c.exact_pool.resize(n_exact * L.exact_page_bytes());
  c.int2_pool.resize(std::max<int64_t>(1, pages(hist)) * L.int2_page_bytes());
  std::normal_distribution<float> normal(0.f, 1.f);
  for (size_t i = 0; i + 1 < c.exact_pool.size(); i += 2) {
    const bf16_t h = f32_to_bf16(normal(rng));
    std::memcpy(&c.exact_pool[i], &h, 2);
  }
  // History rows: random codes, sane metadata (scale 0.5, min -0.75; 1-bit: levels ±0.75),
  // which sits after the codes of each row's width.
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : c.int2_pool) b = static_cast<uint8_t>(byte(rng));
  const int64_t n_hist_pages = static_cast<int64_t>(c.int2_pool.size()) / L.int2_page_bytes();
  for (int64_t pg = 0; pg < n_hist_pages; ++pg)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < n_heads_kv; ++h)
        for (int slot = 0; slot < kPageSize; ++slot) {
          const int bits = L.hist_row_bits(0, kv, h);
          const quant::Int2GroupMeta m =
              bits == 1 ? quant::Int2GroupMeta{f32_to_fp16(-0.75f), f32_to_fp16(0.75f)}
                        : quant::Int2GroupMeta{f32_to_fp16(0.5f), f32_to_fp16(-0.75f)};
          const size_t meta_at = bits == 3   ? quant::int3_group_meta_offset(kHeadDim, 0)
                                 : bits == 1 ? quant::int1_group_meta_offset(kHeadDim, 0)
                                             : quant::int2_group_meta_offset(kHeadDim, 0);
          std::memcpy(&c.int2_pool[pg * L.int2_page_bytes() + L.int2_row_offset(0, kv, h, slot) +
                                   meta_at],
                      &m, sizeof m);
        }
  std::vector<int32_t> ids(n_exact);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.sink_pages.assign(ids.begin(), ids.begin() + pages(sink));
  c.recent_pages.assign(ids.begin() + pages(sink), ids.end());
  c.hist_pages.resize(pages(hist));
  std::iota(c.hist_pages.begin(), c.hist_pages.end(), 0);
  std::shuffle(c.hist_pages.begin(), c.hist_pages.end(), rng);

  c.q.resize(static_cast<size_t>(n_heads_q) * kHeadDim);
  for (float& x : c.q) x = normal(rng);
  c.out.resize(c.q.size());
  DecodeAttnParams& p = c.p;
  p.n_heads_q = n_heads_q;
  p.group_size = kGroup;
  p.layer = 0;
  p.scale = 1.f / std::sqrt(static_cast<float>(kHeadDim));
  p.layout = L;
  p.q = c.q.data();
  p.out = c.out.data();
  p.exact_pool = c.exact_pool.data();
  p.hist_pool = c.int2_pool.data();
  auto table = [&](int r, const std::vector<int32_t>& pages, int64_t n) {
    const int32_t n_pages = static_cast<int32_t>((n + L.page_size - 1) / L.page_size);
    c.indptr[r] = {0, n_pages};
    c.last[r] = {n == 0 ? 0 : static_cast<int32_t>(n - (n_pages - 1) * L.page_size)};
    return PageTableView{c.indptr[r].data(), pages.data(), c.last[r].data(), 1};
  };
  p.sinks = table(0, c.sink_pages, sink);
  p.history = table(1, c.hist_pages, hist);
  p.recent = table(2, c.recent_pages, recent);
  c.kv_bytes = (sink + recent) * n_heads_kv * 2 * static_cast<int64_t>(L.exact_row_bytes()) +
               hist * n_heads_kv * 2 * static_cast<int64_t>(L.int2_row_bytes);
}

void flush_l2() {
  static std::vector<uint8_t> junk(8 << 20);
  static uint8_t v = 0;
  std::memset(junk.data(), ++v, junk.size());
  benchmark::DoNotOptimize(junk.data());
}

// args: n_heads_q, n_heads_kv, context tokens, kind (0 bf16, 1 int2, 2 int2 with a bit plan)
void BM_DecodeAttn(benchmark::State& state) {
  Cache c;
  build(c, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), state.range(2),
        static_cast<Kind>(state.range(3)));
  if (!decode_attn(c.p).ok()) {
    state.SkipWithError("decode_attn failed");
    return;
  }
  for (auto _ : state) {
    flush_l2();
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = decode_attn(c.p);
    benchmark::DoNotOptimize(c.out.data());
    const auto t1 = std::chrono::steady_clock::now();
    if (!st.ok()) state.SkipWithError("decode_attn failed");
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.SetBytesProcessed(state.iterations() * c.kv_bytes);
  state.counters["kv_MB"] = static_cast<double>(c.kv_bytes) / 1e6;
  state.SetLabel(state.range(3) == kPlan ? "plan" : state.range(3) == kInt2 ? "int2" : "bf16");
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"hq", "hkv", "ctx", "kind"});
  for (auto [hq, hkv] : {std::pair{4, 2}, std::pair{32, 8}})
    for (int64_t ctx : {1024, 4096, 16384, 32768})
      for (int kind : {kInt2, kPlan, kBf16}) b->Args({hq, hkv, ctx, kind});
}

BENCHMARK(BM_DecodeAttn)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
