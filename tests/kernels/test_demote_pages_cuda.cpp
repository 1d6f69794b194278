// CUDA demote_pages (kernels/demote_pages.h: demote_pages_cuda) against the CPU demote_pages on
// the same inputs, byte for byte: the same params filled once with host and once with device
// pointers (pools, page lists, clips, the bit plan's hist_bits / hist_row_prefix). Fresh random
// exact pages per case (K with outlier channels and a bias, V Gaussian plus a bias; BF16, or F32
// with full 24-bit mantissas), several pages per call with shuffled source and destination ids,
// every history page 0xFF before the call (pages not listed must stay 0xFF, and the test
// compares the whole pool), with and without per-(layer, head) clips, with and without a bit
// plan (INT3 / INT2 / INT1 planes), uniform and Lloyd-Max INT2, the KIVI baseline, group sizes
// 32/64/128, head_dim 64/128/256, and pages that fail: a NaN, an Inf, a value beyond fp16
// (flagged exactly where the CPU flags it). The status arrays must be equal; a failing page's
// history bytes are unspecified (the CPU stops mid-page), every other byte must be equal.
// Data modes beyond plain random: ties and signed zeros (the −0/+0 choice of std::min and the
// quantile's order statistics), and a wide dynamic range (values near 2^-60 beside O(1)) that
// makes float64 sums inexact, so the kernel's sequential fallback for the Lloyd and INT1 sums
// runs. Skipped when no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cuda_test_util.h"
#include "kernels/demote_pages.h"
#include "quant/bit_plan_layout.h"
#include "quant/int2_layout.h"
#include "quant/kivi.h"

namespace oscar::kernels {
namespace {

enum class Data { kRandom, kTies, kWideRange };

struct Case {
  const char* name;
  quant::HistQuantizer quantizer = quant::HistQuantizer::kInt2Uniform;
  int group_size = 128;
  bool clips = false;
  bool bit_plan = false;
  int head_dim = 128;
  int page_size = 16;
  int n_layers = 3;
  int n_heads_kv = 2;
  int elem_bytes = 2;
  int n_pages = 5;
  Data data = Data::kRandom;
  int nan_page = -1;  // index in the page list of a page given a NaN (and the next one an Inf)
  int big_page = -1;  // index of a page given a value beyond fp16 (flagged only where unclipped)
  uint32_t seed = 1;
  int uniform_bits = 0;  // with bit_plan: every plane at this width (oscar4 / oscar3), 0 = mixed
};

// Device buffer, freed on scope exit.
struct Dev {
  void* p = nullptr;
  ~Dev() {
    if (p != nullptr) cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <typename T>
::testing::AssertionResult upload(const std::vector<T>& h, Dev* d) {
  if (h.empty()) return ::testing::AssertionSuccess();
  if (cudaMalloc(&d->p, h.size() * sizeof(T)) != cudaSuccess ||
      cudaMemcpy(d->p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    return ::testing::AssertionFailure() << "upload of " << h.size() * sizeof(T) << " bytes";
  return ::testing::AssertionSuccess();
}

// Where byte `off` of a history page lies: "layer l kv k head h slot s byte b (of n)".
std::string where(const KvPageLayout& L, size_t off) {
  for (int layer = 0; layer < L.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < L.n_heads_kv; ++h) {
        const size_t start = L.int2_row_offset(layer, kv, h, 0);
        const size_t rb = L.hist_row_bytes(layer, kv, h);
        if (off >= start && off < start + rb * L.page_size) {
          char buf[160];
          std::snprintf(buf, sizeof buf,
                        "layer %d kv %d head %d (bits %d) slot %zu byte %zu of %zu", layer, kv, h,
                        L.hist_row_bits(layer, kv, h), (off - start) / rb, (off - start) % rb, rb);
          return buf;
        }
      }
  return "outside every plane";
}

float draw(const Case& c, std::mt19937& rng, int kv, int ch) {
  std::normal_distribution<float> normal(0.f, 1.f);
  float v;
  if (kv == 0) {
    const float gain = (ch % 17 == 5) ? 9.f : (ch % 29 == 11 ? 4.f : 1.f);
    v = gain * normal(rng) + 0.25f;
  } else {
    v = normal(rng) - 0.1f;
  }
  switch (c.data) {
    case Data::kRandom:
      break;
    case Data::kTies: {  // few distinct values, ±0 among them
      v = std::round(v * 1.5f) / 2.f;
      if (v == 0.f && (rng() & 1u)) v = -0.f;
      break;
    }
    case Data::kWideRange:
      if (rng() % 5 == 0) v = std::ldexp(v, -60);
      break;
  }
  return v;
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  KvPageLayout L;
  L.n_layers = c.n_layers;
  L.n_heads_kv = c.n_heads_kv;
  L.head_dim = c.head_dim;
  L.page_size = c.page_size;
  L.exact_elem_bytes = c.elem_bytes;
  const bool kivi = c.quantizer == quant::HistQuantizer::kKivi;
  L.int2_row_bytes =
      quant::int2_row_bytes(c.head_dim, kivi ? quant::kKiviValueGroup : c.group_size);
  std::mt19937 rng(c.seed);

  std::vector<int8_t> bits;
  std::vector<uint32_t> prefix;
  if (c.bit_plan) {
    const int np = L.n_planes();
    bits.resize(np);
    for (int p = 0; p < np; ++p) bits[p] = static_cast<int8_t>(1 + rng() % 4);
    bits[L.plane(0, 0, 0)] = 3;
    bits[L.plane(0, 1, 0)] = 1;
    bits[L.plane(0, 0, 1 % c.n_heads_kv)] = 2;
    if (c.n_layers > 1) bits[L.plane(c.n_layers - 1, 1, 0)] = 4;
    if (c.uniform_bits > 0) bits.assign(np, static_cast<int8_t>(c.uniform_bits));
    prefix.assign(np + 1, 0);
    for (int p = 0; p < np; ++p)
      prefix[p + 1] = prefix[p] + quant::bit_plan_row_bytes(bits[p], c.head_dim, c.group_size);
  }
  std::vector<float> k_clip, v_clip;
  if (c.clips) {
    std::uniform_real_distribution<float> u(0.8f, 1.0f);
    for (int i = 0; i < c.n_layers * c.n_heads_kv; ++i) {
      k_clip.push_back(u(rng));
      v_clip.push_back(u(rng));
    }
    k_clip[0] = 0.96f;
    v_clip[0] = 0.92f;
    if (k_clip.size() > 1) k_clip[1] = 1.0f;  // "no clip" inside a clipped codec
  }

  // Host params (the CPU reference reads the same layout through host pointers).
  KvPageLayout Lh = L;
  Lh.hist_bits = c.bit_plan ? bits.data() : nullptr;
  Lh.hist_row_prefix = c.bit_plan ? prefix.data() : nullptr;
  const size_t exact_page = L.exact_page_bytes();
  const size_t hist_page = Lh.int2_page_bytes();
  const int n_exact = c.n_pages + 3, n_hist = c.n_pages + 3;

  std::vector<uint8_t> exact(static_cast<size_t>(n_exact) * exact_page);
  for (int pg = 0; pg < n_exact; ++pg)
    for (int layer = 0; layer < c.n_layers; ++layer)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < c.n_heads_kv; ++h)
          for (int s = 0; s < c.page_size; ++s) {
            uint8_t* row = exact.data() + pg * exact_page + L.exact_row_offset(layer, kv, h, s);
            for (int ch = 0; ch < c.head_dim; ++ch) {
              const float v = draw(c, rng, kv, ch);
              if (c.elem_bytes == 4) {
                std::memcpy(row + 4 * ch, &v, 4);
              } else {
                const bf16_t b = f32_to_bf16(v);
                std::memcpy(row + 2 * ch, &b, 2);
              }
            }
          }
  std::vector<int32_t> src(n_exact), dst(n_hist);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  src.resize(c.n_pages);
  dst.resize(c.n_pages);

  auto poke = [&](int list_index, int layer, int kv, int h, int s, int ch, float v) {
    uint8_t* row =
        exact.data() + src[list_index] * exact_page + L.exact_row_offset(layer, kv, h, s);
    if (c.elem_bytes == 4) {
      std::memcpy(row + 4 * ch, &v, 4);
    } else {
      const bf16_t b = f32_to_bf16(v);
      std::memcpy(row + 2 * ch, &b, 2);
    }
  };
  if (c.nan_page >= 0) {
    poke(c.nan_page, c.n_layers - 1, 1, 0, 3, 7, std::numeric_limits<float>::quiet_NaN());
    if (c.nan_page + 1 < c.n_pages)
      poke(c.nan_page + 1, 0, 0, c.n_heads_kv - 1, c.page_size - 1, 0,
           -std::numeric_limits<float>::infinity());
  }
  if (c.big_page >= 0) {
    poke(c.big_page, 0, 0, 1 % c.n_heads_kv, 0, 2, 1.0e6f);  // K: clipped where ρ < 1
    poke(c.big_page, c.n_layers - 1, 1, 0, 1, 5, -3.0e5f);   // V
  }

  // CPU reference.
  std::vector<uint8_t> hist_cpu(static_cast<size_t>(n_hist) * hist_page, 0xFF);
  std::vector<int32_t> status_cpu(c.n_pages, -1);
  DemotePagesParams p;
  p.layout = Lh;
  p.codec.quantizer = c.quantizer;
  p.codec.group_size = c.group_size;
  p.codec.k_clip = c.clips ? k_clip.data() : nullptr;
  p.codec.v_clip = c.clips ? v_clip.data() : nullptr;
  p.exact_pool = exact.data();
  p.hist_pool = hist_cpu.data();
  p.n_pages = c.n_pages;
  p.src_pages = src.data();
  p.dst_pages = dst.data();
  p.status = status_cpu.data();
  ASSERT_TRUE(demote_pages(p).ok());

  // Device.
  Dev d_exact, d_hist, d_src, d_dst, d_status, d_bits, d_prefix, d_kc, d_vc;
  std::vector<uint8_t> hist_gpu(hist_cpu.size(), 0xFF);
  ASSERT_TRUE(upload(exact, &d_exact));
  ASSERT_TRUE(upload(hist_gpu, &d_hist));
  ASSERT_TRUE(upload(src, &d_src));
  ASSERT_TRUE(upload(dst, &d_dst));
  ASSERT_TRUE(upload(std::vector<int32_t>(c.n_pages, 0x7777), &d_status));
  ASSERT_TRUE(upload(bits, &d_bits));
  ASSERT_TRUE(upload(prefix, &d_prefix));
  ASSERT_TRUE(upload(k_clip, &d_kc));
  ASSERT_TRUE(upload(v_clip, &d_vc));
  DemotePagesParams q = p;
  q.layout.hist_bits = d_bits.as<int8_t>();
  q.layout.hist_row_prefix = d_prefix.as<uint32_t>();
  q.codec.k_clip = d_kc.as<float>();
  q.codec.v_clip = d_vc.as<float>();
  q.exact_pool = d_exact.as<uint8_t>();
  q.hist_pool = d_hist.as<uint8_t>();
  q.src_pages = d_src.as<int32_t>();
  q.dst_pages = d_dst.as<int32_t>();
  q.status = d_status.as<int32_t>();
  const Status st = demote_pages_cuda(q, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<int32_t> status_gpu(c.n_pages);
  CUDA_OK(cudaMemcpy(hist_gpu.data(), d_hist.p, hist_gpu.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(status_gpu.data(), d_status.p, c.n_pages * sizeof(int32_t),
                     cudaMemcpyDeviceToHost));

  EXPECT_EQ(status_gpu, status_cpu);
  for (int i = 0; i < c.n_pages; ++i) {
    const bool bad = i == c.nan_page || (c.nan_page >= 0 && i == c.nan_page + 1);
    if (bad) {
      EXPECT_EQ(status_cpu[i], kDemoteNonFinite) << "page " << i << " (test input)";
    } else if (i != c.big_page) {
      EXPECT_EQ(status_cpu[i], kDemoteOk) << "page " << i;
    }
  }
  // Every history page but those of failing demotions, byte for byte.
  std::vector<bool> skip(n_hist, false);
  for (int i = 0; i < c.n_pages; ++i)
    if (status_cpu[i] != kDemoteOk) skip[dst[i]] = true;
  int bad_pages = 0;
  for (int pg = 0; pg < n_hist; ++pg) {
    if (skip[pg]) continue;
    const uint8_t* a = hist_cpu.data() + pg * hist_page;
    const uint8_t* b = hist_gpu.data() + pg * hist_page;
    size_t n_diff = 0, first = 0;
    for (size_t o = 0; o < hist_page; ++o)
      if (a[o] != b[o] && n_diff++ == 0) first = o;
    if (n_diff != 0) {
      ++bad_pages;
      ADD_FAILURE() << "history page " << pg << ": " << n_diff << " bytes differ; first at "
                    << first << " (" << where(Lh, first) << "): cpu 0x" << std::hex << int{a[first]}
                    << " gpu 0x" << int{b[first]} << std::dec;
      if (bad_pages >= 3) break;
    }
  }
}

class DemotePagesCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(DemotePagesCuda, UniformInt2) {
  Case c{"uniform G128"};
  run_case(c);
  c = Case{"uniform G128 clips", quant::HistQuantizer::kInt2Uniform, 128, true};
  c.seed = 2;
  run_case(c);
  c = Case{"uniform G64 clips", quant::HistQuantizer::kInt2Uniform, 64, true};
  c.seed = 3;
  run_case(c);
  c = Case{"uniform G32 clips", quant::HistQuantizer::kInt2Uniform, 32, true};
  c.seed = 4;
  run_case(c);
}

TEST_F(DemotePagesCuda, LloydInt2) {
  Case c{"lloyd G128 clips", quant::HistQuantizer::kInt2Lloyd, 128, true};
  c.seed = 5;
  run_case(c);
  c = Case{"lloyd G32", quant::HistQuantizer::kInt2Lloyd, 32, false};
  c.seed = 6;
  run_case(c);
  c = Case{"lloyd G64 clips wide range", quant::HistQuantizer::kInt2Lloyd, 64, true};
  c.data = Data::kWideRange;
  c.seed = 7;
  run_case(c);
}

TEST_F(DemotePagesCuda, BitPlan) {
  Case c{"plan uniform G128 clips", quant::HistQuantizer::kInt2Uniform, 128, true, true};
  c.seed = 8;
  run_case(c);
  c = Case{"plan uniform G128", quant::HistQuantizer::kInt2Uniform, 128, false, true};
  c.seed = 9;
  run_case(c);
  c = Case{"plan lloyd G64 clips", quant::HistQuantizer::kInt2Lloyd, 64, true, true};
  c.seed = 10;
  run_case(c);
  c = Case{"plan uniform G32 clips", quant::HistQuantizer::kInt2Uniform, 32, true, true};
  c.seed = 11;
  run_case(c);
  c = Case{"plan G128 clips wide range", quant::HistQuantizer::kInt2Uniform, 128, true, true};
  c.data = Data::kWideRange;
  c.seed = 12;
  run_case(c);
}

// The precision ladder: every plane 4-bit (oscar4) or 3-bit (oscar3), each group size, clips,
// ties and a wide range (the 4-bit rows' packing by halves differs for G 32 and G >= 64).
TEST_F(DemotePagesCuda, Int4AndInt3Rows) {
  uint32_t seed = 40;
  for (int bits : {4, 3})
    for (int G : {32, 64, 128})
      for (Data data : {Data::kRandom, Data::kTies, Data::kWideRange}) {
        Case c{"uniform-width plan", quant::HistQuantizer::kInt2Uniform, G, true, true};
        c.uniform_bits = bits;
        c.data = data;
        c.seed = seed++;
        run_case(c);
      }
  Case c{"int4 head_dim 64 G32 no clip", quant::HistQuantizer::kInt2Uniform, 32, false, true};
  c.uniform_bits = 4;
  c.head_dim = 64;
  c.seed = seed++;
  run_case(c);
  c = Case{"int4 head_dim 256, nan page", quant::HistQuantizer::kInt2Uniform, 128, true, true};
  c.uniform_bits = 4;
  c.head_dim = 256;
  c.n_heads_kv = 1;
  c.nan_page = 1;
  c.seed = seed++;
  run_case(c);
}

TEST_F(DemotePagesCuda, Kivi) {
  Case c{"kivi P32", quant::HistQuantizer::kKivi};
  c.page_size = 32;
  c.n_pages = 3;
  c.seed = 13;
  run_case(c);
  c.name = "kivi P64 nan";
  c.page_size = 64;
  c.nan_page = 1;
  c.seed = 14;
  run_case(c);
}

TEST_F(DemotePagesCuda, TiesAndSignedZeros) {
  for (const auto qz : {quant::HistQuantizer::kInt2Uniform, quant::HistQuantizer::kInt2Lloyd}) {
    Case c{"ties", qz, 128, true, true};
    c.data = Data::kTies;
    c.seed = 15 + static_cast<uint32_t>(qz);
    run_case(c);
    c.name = "ties G32";
    c.group_size = 32;
    run_case(c);
  }
}

TEST_F(DemotePagesCuda, FailingPages) {
  Case c{"nan + inf, plan, clips", quant::HistQuantizer::kInt2Uniform, 128, true, true};
  c.nan_page = 2;
  c.seed = 20;
  run_case(c);
  c = Case{"nan, lloyd", quant::HistQuantizer::kInt2Lloyd, 64, true};
  c.nan_page = 0;
  c.seed = 21;
  run_case(c);
  c = Case{"beyond fp16, no clip", quant::HistQuantizer::kInt2Uniform, 128, false, true};
  c.big_page = 3;
  c.seed = 22;
  run_case(c);
  c = Case{"beyond fp16, clips", quant::HistQuantizer::kInt2Lloyd, 128, true};
  c.big_page = 1;
  c.seed = 23;
  run_case(c);
}

TEST_F(DemotePagesCuda, ShapesAndF32) {
  Case c{"f32 exact, plan, clips", quant::HistQuantizer::kInt2Uniform, 128, true, true};
  c.elem_bytes = 4;
  c.seed = 24;
  run_case(c);
  c = Case{"f32 exact lloyd G32", quant::HistQuantizer::kInt2Lloyd, 32, true};
  c.elem_bytes = 4;
  c.seed = 25;
  run_case(c);
  c = Case{"head_dim 64 G64 plan", quant::HistQuantizer::kInt2Uniform, 64, true, true};
  c.head_dim = 64;
  c.seed = 26;
  run_case(c);
  c = Case{"head_dim 256 G128 plan lloyd", quant::HistQuantizer::kInt2Lloyd, 128, true, true};
  c.head_dim = 256;
  c.n_heads_kv = 1;
  c.page_size = 32;
  c.seed = 27;
  run_case(c);
  c = Case{"one page, 8 heads", quant::HistQuantizer::kInt2Uniform, 128, true};
  c.n_pages = 1;
  c.n_heads_kv = 8;
  c.n_layers = 2;
  c.seed = 28;
  run_case(c);
}

TEST_F(DemotePagesCuda, NoPagesIsANoOp) {
  DemotePagesParams p;  // null pools: nothing may be touched
  p.n_pages = 0;
  EXPECT_TRUE(demote_pages_cuda(p, nullptr).ok());
}

// Parameter errors are reported before any device memory is touched (no GPU needed).
TEST(DemotePagesCudaParams, RefusesBadParams) {
  uint8_t byte = 0;
  int32_t id = 0;
  DemotePagesParams p;
  p.layout.n_layers = 1;
  p.layout.n_heads_kv = 1;
  p.layout.head_dim = 128;
  p.layout.page_size = 16;
  p.layout.int2_row_bytes = quant::int2_row_bytes(128, 128);
  p.exact_pool = &byte;
  p.hist_pool = &byte;
  p.n_pages = 1;
  p.src_pages = &id;
  p.dst_pages = &id;
  p.status = &id;
  DemotePagesParams b = p;
  b.codec.group_size = 48;
  EXPECT_FALSE(demote_pages_cuda(b, nullptr).ok());
  b = p;
  b.layout.head_dim = 96;
  b.layout.int2_row_bytes = quant::int2_row_bytes(96, 32);
  b.codec.group_size = 32;
  EXPECT_EQ(demote_pages_cuda(b, nullptr).code(), StatusCode::kUnimplemented);
  b = p;
  b.layout.int2_row_bytes = 40;
  EXPECT_FALSE(demote_pages_cuda(b, nullptr).ok());
  b = p;
  b.codec.quantizer = quant::HistQuantizer::kKivi;
  EXPECT_FALSE(demote_pages_cuda(b, nullptr).ok());  // page_size 16 splits a key block
  b = p;
  b.status = nullptr;
  EXPECT_FALSE(demote_pages_cuda(b, nullptr).ok());
}

}  // namespace
}  // namespace oscar::kernels
