// CUDA decode attention (kernels/decode_attn.h: decode_attn_cuda; internal paths in
// kernels/cuda/decode_attn_cuda.h) against the float64 CPU reference decode_attn_ref, on the
// same batched params filled once with host and once with device pointers. Fresh random inputs
// per case: K with outlier channels, V Gaussian plus a bias; history rows quantized by quant's
// quantizers; page ids shuffled; every byte no kernel may read (other layers, spare pages, slots
// past a sequence's last token) is 0xFF (NaN in bf16 and in fp16 metadata), and the outputs are
// 0xFF (NaN) before each call, so a wrong address or an unwritten output shows up as NaN.
// Each case runs every path: the default launch (the dense configuration: the test's history
// pool is never null; INT2 tiles packed two per softmax fragment where a group has <= 4 heads),
// forced split counts (1, 2, 7, 128: many empty and short splits, so the log-sum-exp combine is
// exercised), the wide configuration, the generic history path, the kernel before (v3,
// DecodeAttnCudaOptions::int2_kernel = 1) and the naive kernel. GQA 1-16 (3 and 12: groups of
// 3 and 8 + 4 heads, packed with empty columns).
//
// Tolerance of the tensor-core kernel (bf16 operands), per (sequence, query head), with Vmax the
// largest |v| the head sees and S = scale · max_t Σ_c |q_c k_tc| (natural-log units):
//   q (and, on the generic path, K) rounded to bf16 (2^-9 relative each) moves every score by at
//   most 2^-8·S; perturbing the softmax weights by a factor e^{±δ} moves a convex combination
//   of values by at most 2(e^{2δ} − 1)·Vmax ≈ 4δ·Vmax → 2^-6·S·Vmax;
//   P rounded to bf16 (exact tiles) or p·s to fp16 (INT2 tiles), and V to bf16 on the generic
//   path: 2^-8·Vmax; FP32 accumulation (with the 1024-offset cancellation): 2^-12·Vmax.
//   tol_mma = Vmax·(2^-6·S + 2^-8 + 2^-12)       (first-order worst case)
// plus a relative L2 error per case below 2e-2 and a cosine similarity per head >= 1 - 5e-4
// (>= 1 - 2e-3 on the generic path, where K and V are rounded to BF16 too, so the score error
// grows with S: 0.99911 measured with q x 6). Measured on the H200, 2026-12-01: rel_l2 ~6e-4 on
// the INT2 tiles (fp16 operands), ~3e-3 with BF16 P, up to 9.4e-3 on the generic path; the
// attention output is an average, so its norm is well below Vmax and relative errors look
// larger than the per-operand 2^-9. The max-error bound above is the one derived; the measured
// max error stays below 2.2% of it. The naive kernel is FP32 throughout:
//   tol_naive = Vmax·u·(4·(d + 2)·S + 4·L + 128), u = 2^-24 (the CPU fast path's bound, doubled).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cuda_test_util.h"
#include "kernels/cuda/decode_attn_cuda.h"
#include "kernels/decode_attn.h"
#include "paged_cache_builder.h"
#include "quant/bit_plan_layout.h"
#include "quant/bit_plan_quant.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"

namespace oscar::kernels {
namespace {

struct SeqSpec {
  int64_t sink = 0, hist = 0, recent = 0;
};

struct Case {
  int n_heads_q = 8;
  int n_heads_kv = 2;
  int head_dim = 128;
  int page_size = 16;
  int group_size = 128;
  quant::HistQuantizer quantizer = quant::HistQuantizer::kInt2Uniform;
  int n_layers = 2;
  int layer = 1;
  bool bit_plan = false;
  int uniform_bits = 0;  // with bit_plan: every plane at this width (oscar4 / oscar3)
  float q_gain = 1.f;
  bool naive_too = true;  // also run the naive kernel (slow at long context)
  std::vector<SeqSpec> seqs;
  uint32_t seed = 1;

  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "hq=%d hkv=%d d=%d P=%d G=%d %s plan=%d/%d gain=%g seed=%u seqs=", n_heads_q,
                  n_heads_kv, head_dim, page_size, group_size,
                  quantizer == quant::HistQuantizer::kInt2Lloyd ? "lloyd" : "uniform",
                  bit_plan ? 1 : 0, uniform_bits, q_gain, seed);
    std::string s = buf;
    for (const SeqSpec& q : seqs) {
      std::snprintf(buf, sizeof buf, "(%lld,%lld,%lld)", static_cast<long long>(q.sink),
                    static_cast<long long>(q.hist), static_cast<long long>(q.recent));
      s += buf;
    }
    return s;
  }
};

// Host-side cache and what the tolerances need.
struct Host : PagedCacheHost {
  std::vector<float> q;
  std::vector<double> vmax, S;  // [n_seqs * n_heads_q]
  std::vector<int64_t> len;     // [n_seqs]
  DecodeAttnParams params;
};

void build(const Case& c, Host& h) {
  set_layout(h, c.n_layers, c.n_heads_kv, c.head_dim, c.page_size, c.group_size);
  const KvPageLayout& L = h.layout;
  const int d = c.head_dim;
  const int ns = static_cast<int>(c.seqs.size());
  const int gqa = c.n_heads_q / c.n_heads_kv;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  if (c.bit_plan) draw_bit_plan(h, c.layer, c.group_size, rng);
  if (c.bit_plan && c.uniform_bits > 0) set_uniform_bits(h, c.group_size, c.uniform_bits);
  build_page_tables(c.seqs, true, rng, h);
  h.q.resize(static_cast<size_t>(ns) * c.n_heads_q * d);
  for (float& e : h.q) e = c.q_gain * normal(rng);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  h.vmax.assign(static_cast<size_t>(ns) * c.n_heads_q, 0.0);
  h.S.assign(h.vmax.size(), 0.0);
  h.len.assign(ns, 0);

  std::vector<float> x(d), seen(d);
  for (int sq = 0; sq < ns; ++sq) {
    const SeqSpec& s = c.seqs[sq];
    const int64_t T = s.sink + s.hist + s.recent;
    h.len[sq] = T;
    for (int64_t t = 0; t < T; ++t) {
      const RowPlace at = place_row(h, s, sq, t);
      const int r = at.region;
      for (int kv = 0; kv < 2; ++kv)
        for (int g = 0; g < c.n_heads_kv; ++g) {
          draw_kv_row(kv, normal, rng, x);
          if (r == 1) {
            uint8_t* dst = hist_row(h, c.layer, kv, g, at);
            const int bits = L.hist_row_bits(c.layer, kv, g);
            const Status st =
                bits == 4   ? quant::quantize_row_int4_ref(x.data(), d, c.group_size, 0.97f, dst)
                : bits == 3 ? quant::quantize_row_int3_ref(x.data(), d, c.group_size, 0.95f, dst)
                : bits == 1 ? quant::quantize_row_int1_ref(x.data(), d, c.group_size, dst)
                : c.quantizer == quant::HistQuantizer::kInt2Lloyd
                    ? quant::quantize_rows_lloyd(x.data(), 1, d, c.group_size, 1.f, dst)
                    : quant::quantize_rows_int2(x.data(), 1, d, c.group_size, 1.f, dst);
            ASSERT_TRUE(st.ok()) << st.to_string();
            if (bits == 4)
              quant::dequantize_row_int4_ref(dst, d, c.group_size, seen.data());
            else if (bits == 3)
              quant::dequantize_row_int3_ref(dst, d, c.group_size, seen.data());
            else if (bits == 1)
              quant::dequantize_row_int1_ref(dst, d, c.group_size, seen.data());
            else if (c.quantizer == quant::HistQuantizer::kInt2Lloyd)
              quant::dequantize_row_lloyd_ref(dst, d, c.group_size, seen.data());
            else
              quant::dequantize_row_int2_ref(dst, d, c.group_size, seen.data());
          } else {
            write_exact_row(h, c.layer, kv, g, at, x.data(), seen.data());
          }
          for (int hq = g * gqa; hq < (g + 1) * gqa; ++hq) {
            const size_t row = static_cast<size_t>(sq) * c.n_heads_q + hq;
            if (kv == 0) {
              double a = 0;
              for (int i = 0; i < d; ++i) a += std::fabs(double(h.q[row * d + i]) * seen[i]);
              h.S[row] = std::max(h.S[row], a * scale);
            } else {
              for (int i = 0; i < d; ++i) h.vmax[row] = std::max(h.vmax[row], double(std::fabs(seen[i])));
            }
          }
        }
    }
  }
  DecodeAttnParams& p = h.params;
  p.n_seqs = ns;
  p.n_heads_q = c.n_heads_q;
  p.group_size = c.group_size;
  p.quantizer = c.quantizer;
  p.layer = c.layer;
  p.scale = scale;
  p.layout = L;
  p.q = h.q.data();
  p.exact_pool = h.exact_pool.data();
  p.hist_pool = h.hist_pool.data();
  PageTableView* const tabs[3] = {&p.sinks, &p.history, &p.recent};
  point_page_tables(h, ns, tabs);
}

// Device copies of everything the params point to.
struct Device : DeviceUploads {
  DecodeAttnParams params;
  float* out = nullptr;
};

void upload(const Host& h, Device& dv) {
  dv.params = h.params;
  DecodeAttnParams& p = dv.params;
  p.q = dv.up(h.q);
  p.exact_pool = dv.up(h.exact_pool);
  p.hist_pool = dv.up(h.hist_pool);
  PageTableView* const tabs[3] = {&p.sinks, &p.history, &p.recent};
  upload_page_tables(h, dv, tabs);
  upload_bit_plan(h, dv, p.layout);
  dv.out = dv.up(std::vector<float>(h.q.size()));
  p.out = dv.out;
}

struct Cmp {
  double max_err = 0, max_ratio = 0, rel_l2 = 0, min_cos = 1;
};

Cmp compare(const std::string& what, const Case& c, const Host& h, const std::vector<float>& got,
            const std::vector<float>& want, bool mma, bool generic) {
  const int d = c.head_dim;
  Cmp r;
  double num = 0, den = 0;
  bool reported = false;
  const size_t rows = h.vmax.size();
  for (size_t row = 0; row < rows; ++row) {
    const int sq = static_cast<int>(row / c.n_heads_q);
    const double u = 1.0 / (1 << 24);
    const double vm = h.vmax[row], S = h.S[row];
    const double tol = mma ? vm * (S / 64 + 1.0 / 256 + 1.0 / 4096) + 1e-30
                           : vm * u * (4.0 * (d + 2) * S + 4.0 * h.len[sq] + 128) + 1e-30;
    double dp = 0, ng = 0, nw = 0;
    for (int i = 0; i < d; ++i) {
      const double gv = got[row * d + i], wv = want[row * d + i];
      if (!std::isfinite(gv)) {
        ADD_FAILURE() << what << " " << c.name() << ": non-finite output at seq " << sq
                      << " head " << row % c.n_heads_q << " dim " << i;
        return r;
      }
      const double err = std::fabs(gv - wv);
      r.max_err = std::max(r.max_err, err);
      r.max_ratio = std::max(r.max_ratio, err / tol);
      if (err > tol && !reported) {
        ADD_FAILURE() << what << " " << c.name() << ": first mismatch at seq " << sq << " head "
                      << row % c.n_heads_q << " dim " << i << ": got " << gv << " want " << wv
                      << " err " << err << " > tol " << tol;
        reported = true;
      }
      num += (gv - wv) * (gv - wv);
      den += wv * wv;
      dp += gv * wv;
      ng += gv * gv;
      nw += wv * wv;
    }
    const double cs = (ng == 0 && nw == 0) ? 1.0 : dp / std::sqrt(ng * nw);
    r.min_cos = std::min(r.min_cos, cs);
  }
  r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (reported) ADD_FAILURE() << what << " max error " << r.max_err;
  if (mma) {
    EXPECT_LE(r.rel_l2, 2e-2) << what << " " << c.name();
    EXPECT_GE(r.min_cos, 1.0 - (generic ? 2e-3 : 5e-4)) << what << " " << c.name();
  }
  return r;
}

// Runs the reference and every CUDA path on one case.
void run_case(const Case& c) {
  Host h;
  build(c, h);
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<float> want(h.q.size(), std::nanf(""));
  h.params.out = want.data();
  ASSERT_TRUE(validate_decode_attn(h.params).ok()) << validate_decode_attn(h.params).to_string();
  const Status rs = decode_attn_ref(h.params);
  ASSERT_TRUE(rs.ok()) << rs.to_string();

  Device dv;
  upload(h, dv);
  ASSERT_NE(dv.out, nullptr);
  struct Variant {
    const char* name;
    DecodeAttnCudaOptions opts;
  };
  std::vector<Variant> vars = {
      {"auto", {DecodeAttnCudaPath::kAuto, 0}},  {"splits=1", {DecodeAttnCudaPath::kAuto, 1}},
      {"splits=2", {DecodeAttnCudaPath::kAuto, 2}}, {"splits=7", {DecodeAttnCudaPath::kAuto, 7}},
      {"splits=128", {DecodeAttnCudaPath::kAuto, 128}},
      {"wide", {DecodeAttnCudaPath::kAuto, 0, 0, 1}},
      {"wide,s=7", {DecodeAttnCudaPath::kAuto, 7, 0, 1}},
      {"generic", {DecodeAttnCudaPath::kGeneric, 0}},
      {"generic,w", {DecodeAttnCudaPath::kGeneric, 0, 0, 1}},
      {"v3", {DecodeAttnCudaPath::kAuto, 0, 0, 0, 1}},
      {"v3,s=7", {DecodeAttnCudaPath::kAuto, 7, 0, 0, 1}}};
  if (c.naive_too) vars.push_back({"naive", {DecodeAttnCudaPath::kNaive, 0}});
  std::vector<float> got(h.q.size());
  for (const Variant& v : vars) {
    CUDA_OK(cudaMemset(dv.out, 0xFF, got.size() * sizeof(float)));
    const Status st = decode_attn_cuda_ex(dv.params, v.opts, nullptr);
    ASSERT_TRUE(st.ok()) << v.name << ": " << st.to_string();
    CUDA_OK(cudaDeviceSynchronize());
    const DecodeAttnCudaLaunchInfo info = decode_attn_cuda_last_launch();
    CUDA_OK(cudaMemcpy(got.data(), dv.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const bool mma = info.path == 0;
    const bool generic = v.opts.path == DecodeAttnCudaPath::kGeneric || c.bit_plan ||
                         c.quantizer == quant::HistQuantizer::kInt2Lloyd || c.group_size != 128;
    const Cmp r = compare(std::string("decode_attn_cuda[") + v.name + "]", c, h, got, want, mma,
                          generic);
    std::printf("  %-10s path=%d cfg=%d splits=%-3d max_err=%.3g err/tol=%.3g rel_l2=%.3g "
                "min_cos=%.9f  %s\n", v.name, info.path, info.config, info.n_splits, r.max_err,
                r.max_ratio, r.rel_l2, r.min_cos, c.name().c_str());
  }
}

class DecodeAttnCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// A batch mixing every region shape: empty, one token, sinks only, no recent, no sinks, tiny
// history, long history, partial last pages.
std::vector<SeqSpec> mixed_batch(int P) {
  return {{0, 0, 0},          {1, 0, 0},          {64, 0, 0},
          {64, 2 * P, 0},     {0, 3 * P, 17},     {16, P, 1},
          {64, 32 * P, 256},  {64, 64 * P, 37}};
}

TEST_F(DecodeAttnCuda, MixedBatchEveryGqa) {
  uint32_t seed = 10;
  for (int gqa : {1, 2, 3, 4, 6, 8, 12, 16}) {
    Case c;
    c.n_heads_kv = gqa == 16 ? 1 : 2;
    c.n_heads_q = c.n_heads_kv * gqa;
    c.seqs = mixed_batch(16);
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(DecodeAttnCuda, BatchSizesOneThreeEight) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> tok(0, 300), pages(0, 80);
  uint32_t seed = 40;
  for (int b : {1, 3, 8}) {
    Case c;
    c.n_heads_q = 32;
    c.n_heads_kv = 8;
    for (int i = 0; i < b; ++i)
      c.seqs.push_back({64 * (tok(rng) % 2), 16 * pages(rng), 1 + tok(rng)});
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(DecodeAttnCuda, PageBoundaries) {
  uint32_t seed = 100;
  for (int P : {8, 16, 32}) {
    Case c;
    c.page_size = P;
    for (int k : {1, 2, 5})
      for (int delta : {-1, 0, 1}) {
        c.seqs.push_back({P, int64_t(k) * P, 2 * P + delta});
        c.seqs.push_back({int64_t(k) * P + delta, 0, 0});  // sinks only, edge inside the sinks
      }
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(DecodeAttnCuda, BitPlanRowsOfEveryWidth) {
  uint32_t seed = 200;
  for (int G : {32, 64, 128}) {
    Case c;
    c.group_size = G;
    c.bit_plan = true;
    c.n_layers = 3;
    c.layer = 2;
    c.n_heads_kv = 4;
    c.n_heads_q = 16;
    c.seqs = {{64, 48 * 16, 100}, {0, 16, 0}, {16, 5 * 16, 3}};
    c.seed = seed++;
    run_case(c);
  }
}

// oscar4 / oscar3: every history row 4- (or 3-) bit, so both planes of every tile take the
// generic path with the widest raw stages (16 x (80 + 80) bytes at G 32); head_dim 64 goes to
// the naive kernel.
TEST_F(DecodeAttnCuda, Int4AndInt3Rows) {
  uint32_t seed = 260;
  for (int bits : {4, 3})
    for (int d : {64, 128})
      for (int G : {32, 64, 128}) {
        if (G > d) continue;
        Case c;
        c.head_dim = d;
        c.group_size = G;
        c.bit_plan = true;
        c.uniform_bits = bits;
        c.n_heads_kv = 2;
        c.n_heads_q = 8;
        c.seqs = {{64, 40 * 16, 37}, {16, 16, 0}, {0, 3 * 16, 5}};
        c.seed = seed++;
        run_case(c);
      }
}

TEST_F(DecodeAttnCuda, LloydAndSmallGroupsAndHeadDim64) {
  uint32_t seed = 300;
  for (int d : {64, 128})
    for (int G : {32, 64, 128}) {
      if (G > d) continue;
      for (auto qz : {quant::HistQuantizer::kInt2Uniform, quant::HistQuantizer::kInt2Lloyd}) {
        Case c;
        c.head_dim = d;
        c.group_size = G;
        c.quantizer = qz;
        c.seqs = {{64, 40 * 16, 77}, {16, 16, 16}};
        c.seed = seed++;
        run_case(c);
      }
    }
}

TEST_F(DecodeAttnCuda, PeakySoftmax) {
  Case c;
  c.q_gain = 6.f;
  c.seqs = mixed_batch(16);
  c.seed = 400;
  run_case(c);
}

TEST_F(DecodeAttnCuda, LongContextQwen3Layout) {
  // Qwen3-8B heads; 32K at batch 1 (many splits), 8K x 3.
  Case c;
  c.n_heads_q = 32;
  c.n_heads_kv = 8;
  c.n_layers = 1;
  c.layer = 0;
  c.naive_too = false;
  c.seqs = {{64, 32768 - 320, 256}};
  c.seed = 500;
  run_case(c);
  c.seqs = {{64, 8192 - 320, 256}, {64, 8192 - 320 - 16 * 7, 200}, {64, 4096, 256}};
  c.seed = 501;
  run_case(c);
  // The bf16 mode: everything in the exact pool.
  c.seqs = {{64, 0, 8192 - 64}, {64, 0, 3000}};
  c.seed = 502;
  run_case(c);
}

// Batch invariance (DecodeAttnParams::batch_invariant, README "Deterministic results"): each
// sequence's output is bitwise the same in the whole batch, alone, and in sub-batches of 2 and 5,
// while the default would cap the splits by the batch (here 12 sequences x 8 KV heads: a few
// splits, against ~66 for a sequence alone on the H200), with long, short and empty sequences,
// INT2 history and the bf16 mode (no history). The whole batch is also checked against the
// float64 reference (compare(): the tensor-core bound).
TEST_F(DecodeAttnCuda, BatchInvariantSequenceEqualsItselfAlone) {
  for (bool history : {true, false}) {
    Case c;
    c.n_heads_q = 32;
    c.n_heads_kv = 8;
    c.n_layers = 1;
    c.layer = 0;
    std::mt19937 rng(history ? 71 : 72);
    std::uniform_int_distribution<int> tok(1, 300), pages(0, 250);
    for (int i = 0; i < 12; ++i) {
      const int64_t hist = history ? 16 * pages(rng) : 0;
      const int64_t recent = history ? tok(rng) : 16 * pages(rng) + tok(rng);
      c.seqs.push_back({64, hist, recent});
    }
    c.seqs[3] = {0, 0, 0};
    c.seqs[7] = {5, 0, 0};
    c.seed = history ? 900 : 901;
    SCOPED_TRACE(c.name());
    Host h;
    build(c, h);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<float> want(h.q.size());
    h.params.out = want.data();
    ASSERT_TRUE(decode_attn_ref(h.params).ok());
    Device dv;
    upload(h, dv);
    ASSERT_NE(dv.out, nullptr);
    const int ns = static_cast<int>(c.seqs.size());
    const size_t row = static_cast<size_t>(c.n_heads_q) * c.head_dim;  // floats per sequence
    auto run = [&](int s0, int s1, std::vector<float>& got) {
      DecodeAttnParams p = dv.params;
      p.batch_invariant = true;
      p.n_seqs = s1 - s0;
      p.q += s0 * row;
      p.out += s0 * row;
      for (PageTableView* t : {&p.sinks, &p.history, &p.recent}) {
        t->indptr += s0;
        t->last_page_len += s0;
        t->n_seqs = s1 - s0;
      }
      CUDA_OK(cudaMemset(dv.out, 0xFF, h.q.size() * sizeof(float)));
      const Status st = decode_attn_cuda(p, nullptr);
      ASSERT_TRUE(st.ok()) << st.to_string();
      CUDA_OK(cudaDeviceSynchronize());
      got.resize(h.q.size());
      CUDA_OK(cudaMemcpy(got.data(), dv.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    };
    std::vector<float> whole, part;
    run(0, ns, whole);
    const DecodeAttnCudaLaunchInfo info = decode_attn_cuda_last_launch();
    const Cmp r = compare("batch-invariant", c, h, whole, want, info.path == 0, false);
    std::printf("  batch-invariant splits=%d err/tol=%.3g rel_l2=%.3g history=%d\n", info.n_splits,
                r.max_ratio, r.rel_l2, history ? 1 : 0);
    for (int width : {1, 2, 5})
      for (int s0 = 0; s0 + width <= ns; s0 += width) {
        run(s0, s0 + width, part);
        for (int s = s0; s < s0 + width; ++s)
          ASSERT_EQ(0, std::memcmp(&part[s * row], &whole[s * row], row * sizeof(float)))
              << "sequence " << s << " (" << c.seqs[s].sink << "," << c.seqs[s].hist << ","
              << c.seqs[s].recent << ") in a call of " << width << " from " << s0
              << " differs from the whole batch's";
      }
  }
}

TEST_F(DecodeAttnCuda, RejectsBadParams) {
  Case c;
  c.seqs = {{16, 16, 16}};
  Host h;
  build(c, h);
  Device dv;
  upload(h, dv);
  DecodeAttnParams p = dv.params;
  p.layout.exact_elem_bytes = 4;
  EXPECT_FALSE(decode_attn_cuda(p, nullptr).ok());
  p = dv.params;
  p.n_heads_q = 7;
  EXPECT_FALSE(decode_attn_cuda(p, nullptr).ok());
  p = dv.params;
  p.out = nullptr;
  EXPECT_FALSE(decode_attn_cuda(p, nullptr).ok());
  p = dv.params;
  p.recent.n_seqs = 2;
  EXPECT_FALSE(decode_attn_cuda(p, nullptr).ok());
  // Zero sequences: nothing to do.
  p = dv.params;
  p.n_seqs = p.sinks.n_seqs = p.history.n_seqs = p.recent.n_seqs = 0;
  EXPECT_TRUE(decode_attn_cuda(p, nullptr).ok());
}

}  // namespace
}  // namespace oscar::kernels
