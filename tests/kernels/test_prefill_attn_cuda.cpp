// CUDA prefill attention (kernels/prefill_attn.h: prefill_attn_cuda) against the CPU
// prefill_attn (exact float attention over the dequantized rows, kernels/chunk_attn.h), on the
// same batched params filled once with host and once with device pointers. Fresh random inputs
// per case: K with outlier channels, V Gaussian plus a bias; history rows quantized through the
// row-format table (quant/row_codec.h: uniform or Lloyd-Max INT2, the bit plan's 3- and 1-bit
// rows); page ids shuffled; several sequences per call with different pos0 (0, mid-history,
// long), chunk sizes 1..70, sinks / history / recent present or absent; the step's rows start
// at cu_seqlens[0] = 3 (rows keep step-wide numbering). Every byte no kernel may read (other
// layers, spare pages, slots past a sequence's last token, the q rows before cu_seqlens[0]) is
// 0xFF (NaN in bf16, fp16 and float), and the output is 0xFF before each call: a wrong address
// or an unwritten output shows up as NaN, and the rows before cu_seqlens[0] must stay 0xFF.
//
// Every case runs every kernel: the default (kAuto: for serving prefill the warp-specialised
// kernel at head_dim 128 on sm_90a, over quantized caches through the history expanded to BF16
// (given the distinct pages, in reversed order so that an entry's index is not its position),
// else the tiled tensor-core kernel on wgmma; the staged one for decode-equivalent cases), the
// tiled kernel on wgmma and on mma.sync, the staged tensor-core one and the FP32 SIMT one. The
// tensor-core kernels round the same operands to BF16 as the staged one (q, P, dequantized history
// rows; exact rows are BF16 already), so tol_mma below covers them all.
//
// Decode-equivalent cases (perplexity evaluation's reading): caches as the model leaves them at
// a chunk's start (demoted up to history_end(pos0)), chunks of 1..300 crossing one or more
// history_end boundaries, uniform / Lloyd-Max / bit plan, clips on and off, GQA 2 and 4. The
// rows quantized on the fly are quantized by the demotion's device quantizer (bytes equal to the
// CPU's: test_demote_pages_cuda.cpp) and dequantized unfused, so both sides attend over the same
// float values and the tolerances below apply unchanged, with S and Vmax taken over both
// versions (exact and quantized) of every recent row.
//
// Tolerance, per (query row, head), with Vmax the largest |v| it sees, S = scale · max_t Σ_c
// |q_c k_tc| over the keys it sees (natural-log units), L its key count, u = 2^-24.
// FP32 SIMT kernel: both sides compute in float over the same dequantized values (the GPU's
// dequantization may contract min + q·s into one FMA: 1 ulp of each value, a score shift
// <= u·S):
//   scores: float accumulation of d products, the scale (and on the GPU log2 e) folded in:
//     <= (d + 2)·u·S per side, so δ <= 2·(d + 2)·u·S + u·S between the two;
//   perturbing the softmax weights by e^{±δ} moves a convex combination of values by at most
//     2(e^{2δ} − 1)·Vmax ≈ 4δ·Vmax;
//   the value sums: float accumulation over L keys, <= L·u·Vmax per side; normalisation 2u.
//   tol_simt = Vmax·u·(4·(2d + 5)·S + 2·L + 64)
// plus a relative L2 error per case below 1e-5 and a cosine similarity per head >= 1 - 1e-8.
// Tensor-core kernel (BF16 operands; test_decode_attn_cuda.cpp's derivation): q and the
// dequantized history K rounded to BF16 (2^-9 relative each; exact rows are BF16 already) move
// every score by at most 2^-8·S, hence 4·2^-8·S·Vmax = 2^-6·S·Vmax; P and the history V rounded
// to BF16: 2^-8·Vmax; FP32 accumulation: 2^-12·Vmax.
//   tol_mma = Vmax·(2^-6·S + 2^-8 + 2^-12)        (first-order worst case)
// plus a relative L2 error per case below 2e-2 and a cosine similarity per head >= 1 - 2e-3.
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
#include "kernels/cuda/prefill_attn_cuda.h"
#include "kernels/distinct_pages.h"
#include "kernels/prefill_attn.h"
#include "paged_cache_builder.h"
#include "quant/bit_plan_layout.h"
#include "quant/int2_layout.h"
#include "quant/row_codec.h"

namespace oscar::kernels {
namespace {

constexpr int kRow0 = 3;  // cu_seqlens[0]

// One sequence: tokens per region (sinks + history + recent = pos0 + n_q) and its chunk size
// (n_q <= recent, or <= sinks + recent without history: the chunk's rows are the last ones).
struct SeqSpec {
  int64_t sink = 0, hist = 0, recent = 0, n_q = 0;
};

struct Case {
  int n_heads_q = 8;
  int n_heads_kv = 2;
  int head_dim = 128;
  int page_size = 16;
  int group_size = 128;
  int n_sink = 16;  // the sinks region of the cache (PrefillAttnParams::n_sink)
  quant::HistQuantizer quantizer = quant::HistQuantizer::kInt2Uniform;
  bool history = true;  // a history pool (quantized cache); false: the bf16 mode
  int n_layers = 2;
  int layer = 1;
  bool bit_plan = false;
  float q_gain = 1.f;
  std::vector<SeqSpec> seqs;
  uint32_t seed = 1;
  // Decode-equivalent reading (needs history); n_recent is the recent window of the regions.
  bool decode_equivalent = false;
  int n_recent = 64;
  bool clips = false;  // per (layer, head) clip quantiles in the codec (else null = 1)

  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "hq=%d hkv=%d d=%d P=%d G=%d n_sink=%d %s hist=%d plan=%d gain=%g seed=%u "
                  "de=%d n_recent=%d clips=%d seqs=",
                  n_heads_q, n_heads_kv, head_dim, page_size, group_size, n_sink,
                  quantizer == quant::HistQuantizer::kInt2Lloyd ? "lloyd" : "uniform",
                  history ? 1 : 0, bit_plan ? 1 : 0, q_gain, seed, decode_equivalent ? 1 : 0,
                  n_recent, clips ? 1 : 0);
    std::string s = buf;
    for (const SeqSpec& q : seqs) {
      std::snprintf(buf, sizeof buf, "(%lld,%lld,%lld;%lld)", static_cast<long long>(q.sink),
                    static_cast<long long>(q.hist), static_cast<long long>(q.recent),
                    static_cast<long long>(q.n_q));
      s += buf;
    }
    return s;
  }
};

struct Host : PagedCacheHost {
  std::vector<float> k_clip, v_clip;  // [n_layers * n_heads_kv] or empty
  std::vector<int32_t> cu;
  std::vector<int64_t> pos0;
  std::vector<float> q;
  // Per (query row, head): the tolerance's Vmax, S and L.
  std::vector<double> vmax, S, L;
  PrefillAttnParams params;
};

void build(const Case& c, Host& h) {
  set_layout(h, c.n_layers, c.n_heads_kv, c.head_dim, c.page_size, c.group_size);
  const KvPageLayout& L = h.layout;
  const int d = c.head_dim, Hq = c.n_heads_q;
  const int ns = static_cast<int>(c.seqs.size());
  const int gqa = c.n_heads_q / c.n_heads_kv;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  if (c.bit_plan) draw_bit_plan(h, c.layer, c.group_size, rng);
  if (c.clips) {  // some planes unclipped (1), the others in [0.9, 1)
    std::uniform_real_distribution<float> q(0.9f, 1.0f);
    h.k_clip.resize(static_cast<size_t>(c.n_layers) * c.n_heads_kv);
    h.v_clip.resize(h.k_clip.size());
    for (size_t i = 0; i < h.k_clip.size(); ++i) {
      h.k_clip[i] = i % 3 == 1 ? 1.0f : q(rng);
      h.v_clip[i] = i % 3 == 2 ? 1.0f : q(rng);
    }
  }
  build_page_tables(c.seqs, c.history, rng, h);
  h.cu.assign(1, kRow0);
  h.pos0.clear();
  for (const SeqSpec& s : c.seqs) {
    h.pos0.push_back(s.sink + s.hist + s.recent - s.n_q);
    h.cu.push_back(h.cu.back() + static_cast<int32_t>(s.n_q));
  }
  const int64_t n_rows = h.cu.back();
  h.q.assign(static_cast<size_t>(n_rows) * Hq * d, std::nanf(""));
  for (size_t i = static_cast<size_t>(kRow0) * Hq * d; i < h.q.size(); ++i)
    h.q[i] = c.q_gain * normal(rng);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  h.vmax.assign(static_cast<size_t>(n_rows) * Hq, 0.0);
  h.S.assign(h.vmax.size(), 0.0);
  h.L.assign(h.vmax.size(), 0.0);

  std::vector<float> x(d), seen(d), alt(d);
  std::vector<uint8_t> qrow;
  for (int sq = 0; sq < ns; ++sq) {
    const SeqSpec& s = c.seqs[sq];
    const int64_t T = s.sink + s.hist + s.recent;
    for (int64_t t = 0; t < T; ++t) {
      const RowPlace at = place_row(h, s, sq, t);
      const int r = at.region;
      for (int kv = 0; kv < 2; ++kv)
        for (int g = 0; g < c.n_heads_kv; ++g) {
          draw_kv_row(kv, normal, rng, x);
          if (r == 1) {
            ASSERT_TRUE(c.history) << "history rows without a history pool";
            uint8_t* dst = hist_row(h, c.layer, kv, g, at);
            const quant::RowCodec& codec = quant::row_codec(
                quant::hist_row_format(c.quantizer, kv, L.hist_row_bits(c.layer, kv, g)));
            const Status st = codec.quantize(x.data(), d, c.group_size, 0.95f, dst);
            ASSERT_TRUE(st.ok()) << st.to_string();
            codec.dequantize(dst, d, c.group_size, seen.data());
          } else {
            write_exact_row(h, c.layer, kv, g, at, x.data(), seen.data());
          }
          // Decode-equivalent: a recent row may also be read through the quantizer; the
          // tolerance's S and Vmax cover both versions.
          const bool both = c.decode_equivalent && c.history && r == 2;
          if (both) {
            const quant::RowCodec& codec = quant::row_codec(
                quant::hist_row_format(c.quantizer, kv, L.hist_row_bits(c.layer, kv, g)));
            qrow.resize(L.hist_row_bytes(c.layer, kv, g));
            const std::vector<float>& cl = kv == 0 ? h.k_clip : h.v_clip;
            const float clip = cl.empty() ? 1.0f : cl[c.layer * c.n_heads_kv + g];
            const Status st = codec.quantize(seen.data(), d, c.group_size, clip, qrow.data());
            ASSERT_TRUE(st.ok()) << st.to_string();
            codec.dequantize(qrow.data(), d, c.group_size, alt.data());
          }
          // Every query of the chunk that sees key t: positions >= t.
          for (int64_t qi = std::max<int64_t>(0, t - h.pos0[sq]); qi < s.n_q; ++qi)
            for (int hq = g * gqa; hq < (g + 1) * gqa; ++hq) {
              const size_t row = (static_cast<size_t>(h.cu[sq]) + qi) * Hq + hq;
              for (int version = 0; version < (both ? 2 : 1); ++version) {
                const std::vector<float>& v = version == 0 ? seen : alt;
                if (kv == 0) {
                  double a = 0;
                  for (int i = 0; i < d; ++i) a += std::fabs(double(h.q[row * d + i]) * v[i]);
                  h.S[row] = std::max(h.S[row], a * scale);
                } else {
                  for (int i = 0; i < d; ++i)
                    h.vmax[row] = std::max(h.vmax[row], double(std::fabs(v[i])));
                }
              }
              if (kv == 0) h.L[row] += 1;
            }
        }
    }
  }
  PrefillAttnParams& p = h.params;
  p.n_seqs = ns;
  p.n_heads_q = Hq;
  p.layer = c.layer;
  p.scale = scale;
  p.layout = L;
  p.codec.quantizer = c.quantizer;
  p.codec.group_size = c.group_size;
  p.n_sink = c.n_sink;
  p.n_recent = c.n_recent;
  p.quantized = c.history;
  p.decode_equivalent = c.decode_equivalent;
  p.max_rows = h.cu.back() - kRow0;
  p.max_keys = 0;
  for (const SeqSpec& q : c.seqs) p.max_keys = std::max(p.max_keys, q.sink + q.hist + q.recent);
  p.codec.k_clip = h.k_clip.empty() ? nullptr : h.k_clip.data();
  p.codec.v_clip = h.v_clip.empty() ? nullptr : h.v_clip.data();
  p.cu_seqlens = h.cu.data();
  p.pos0 = h.pos0.data();
  p.q = h.q.data();
  p.exact_pool = h.exact_pool.data();
  p.hist_pool = c.history ? h.hist_pool.data() : nullptr;
  PageTableView* const tabs[3] = {&p.sinks, &p.history, &p.recent};
  point_page_tables(h, ns, tabs);
}

struct Device : DeviceUploads {
  PrefillAttnParams params;
  float* out = nullptr;
};

void upload(const Host& h, Device& dv) {
  dv.params = h.params;
  PrefillAttnParams& p = dv.params;
  p.cu_seqlens = dv.up(h.cu);
  p.pos0 = dv.up(h.pos0);
  p.q = dv.up(h.q);
  p.exact_pool = dv.up(h.exact_pool);
  p.hist_pool = h.params.hist_pool != nullptr ? dv.up(h.hist_pool) : nullptr;
  PageTableView* const tabs[3] = {&p.sinks, &p.history, &p.recent};
  upload_page_tables(h, dv, tabs);
  if (h.params.quantized) {
    // The distinct history pages, their order reversed so that an entry's index among them is not
    // its own position (the warp-specialised path must follow hist_slot).
    DistinctPages dp = distinct_pages(h.ids[1]);
    const int32_t n = static_cast<int32_t>(dp.pages.size());
    std::reverse(dp.pages.begin(), dp.pages.end());
    for (int32_t& i : dp.index) i = n - 1 - i;
    p.hist_unique = dv.up(dp.pages);
    p.hist_slot = dv.up(dp.index);
    p.n_hist_unique = n;
  }
  if (!h.k_clip.empty()) {
    p.codec.k_clip = dv.up(h.k_clip);
    p.codec.v_clip = dv.up(h.v_clip);
  }
  upload_bit_plan(h, dv, p.layout);
  dv.out = dv.up(std::vector<float>(h.q.size()));
  p.out = dv.out;
}

void run_case(const Case& c) {
  Host h;
  build(c, h);
  if (::testing::Test::HasFatalFailure()) return;
  const int d = c.head_dim, Hq = c.n_heads_q;
  std::vector<float> want(h.q.size(), 0.f);
  h.params.out = want.data();
  const Status rs = prefill_attn(h.params);
  ASSERT_TRUE(rs.ok()) << rs.to_string();

  Device dv;
  upload(h, dv);
  ASSERT_NE(dv.out, nullptr);
  std::vector<float> got(h.q.size());
  for (PrefillAttnCudaPath path :
       {PrefillAttnCudaPath::kAuto, PrefillAttnCudaPath::kTiledWgmma,
        PrefillAttnCudaPath::kTiledMma, PrefillAttnCudaPath::kStaged, PrefillAttnCudaPath::kSimt}) {
    const bool mma = path != PrefillAttnCudaPath::kSimt;
    const char* what = path == PrefillAttnCudaPath::kAuto         ? "auto"
                       : path == PrefillAttnCudaPath::kTiledWgmma ? "twg"
                       : path == PrefillAttnCudaPath::kTiledMma   ? "tmma"
                       : mma                                      ? "stgd"
                                                                  : "simt";
    CUDA_OK(cudaMemset(dv.out, 0xFF, got.size() * sizeof(float)));
    const Status st = prefill_attn_cuda_ex(dv.params, path, nullptr);
    ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got.data(), dv.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));

    // Rows before cu_seqlens[0] belong to someone else: untouched.
    for (size_t i = 0; i < static_cast<size_t>(kRow0) * Hq * d; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &got[i], 4);
      ASSERT_EQ(bits, 0xFFFFFFFFu) << what << " " << c.name() << ": wrote output row "
                                   << i / (Hq * d) << " before cu_seqlens[0]";
    }
    const double u = 1.0 / (1 << 24);
    double num = 0, den = 0, max_ratio = 0, max_err = 0, min_cos = 1;
    bool reported = false;
    for (size_t row = static_cast<size_t>(kRow0) * Hq; row < h.vmax.size(); ++row) {
      const double tol =
          (mma ? h.vmax[row] * (h.S[row] / 64 + 1.0 / 256 + 1.0 / 4096)
               : h.vmax[row] * u * (4.0 * (2 * d + 5) * h.S[row] + 2.0 * h.L[row] + 64)) +
          1e-30;
      double dp = 0, ng = 0, nw = 0;
      for (int i = 0; i < d; ++i) {
        const double gv = got[row * d + i], wv = want[row * d + i];
        if (!std::isfinite(gv)) {
          ADD_FAILURE() << what << " " << c.name() << ": non-finite output at query row "
                        << row / Hq << " head " << row % Hq << " dim " << i;
          return;
        }
        const double err = std::fabs(gv - wv);
        max_err = std::max(max_err, err);
        max_ratio = std::max(max_ratio, err / tol);
        if (err > tol && !reported) {
          ADD_FAILURE() << what << " " << c.name() << ": first mismatch at query row " << row / Hq
                        << " head " << row % Hq << " dim " << i << ": got " << gv << " want " << wv
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
      min_cos = std::min(min_cos, cs);
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (reported) ADD_FAILURE() << what << " " << c.name() << ": max error " << max_err;
    EXPECT_LE(rel, mma ? 2e-2 : 1e-5) << what << " " << c.name();
    EXPECT_GE(min_cos, 1.0 - (mma ? 2e-3 : 1e-8)) << what << " " << c.name();
    std::printf("  %s max_err=%.3g err/tol=%.3g rel_l2=%.3g min_cos=%.12f  %s\n", what, max_err,
                max_ratio, rel, min_cos, c.name().c_str());
  }
}

class PrefillAttnCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// A batch mixing every shape (n_sink = P = 16): a first chunk at pos0 = 0 that fills the sinks,
// a tiny first chunk (sinks only, partial page), one query after a long history, chunks of 70
// and 33 in mid history, a chunk right after the sinks (no history yet), a partial last page.
std::vector<SeqSpec> mixed_batch() {
  return {{16, 0, 24, 40},      {5, 0, 0, 5},    {16, 32 * 16, 37, 1}, {16, 8 * 16, 70, 70},
          {16, 4 * 16, 50, 33}, {16, 0, 17, 17}, {16, 16, 1, 1},       {16, 2 * 16, 64, 2}};
}

TEST_F(PrefillAttnCuda, MixedBatchGqa2And4) {
  uint32_t seed = 10;
  for (int gqa : {1, 2, 4, 8}) {
    Case c;
    c.n_heads_kv = 2;
    c.n_heads_q = 2 * gqa;
    c.seqs = mixed_batch();
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(PrefillAttnCuda, ChunkSizesOneToSeventy) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> chunk(1, 70), hist_pages(0, 12), extra(0, 40);
  uint32_t seed = 30;
  for (int rep = 0; rep < 4; ++rep) {
    Case c;
    c.n_heads_q = 16;
    c.n_heads_kv = 4;
    for (int i = 0; i < 6; ++i) {
      const int64_t nq = chunk(rng), hist = 16 * hist_pages(rng);
      c.seqs.push_back({16, hist, nq + (hist > 0 ? extra(rng) : 0), nq});
    }
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(PrefillAttnCuda, NoSinksAndNoHistory) {
  Case c;
  c.n_sink = 0;
  c.seqs = {{0, 3 * 16, 20, 20}, {0, 0, 45, 45}, {0, 16, 1, 1}};
  c.seed = 50;
  run_case(c);
  // The bf16 mode: no history pool at all.
  Case b;
  b.history = false;
  b.n_heads_q = 16;
  b.n_heads_kv = 4;
  b.seqs = {{16, 0, 100, 60}, {16, 0, 300, 7}, {3, 0, 0, 3}};
  b.seed = 51;
  run_case(b);
}

TEST_F(PrefillAttnCuda, BitPlanRowsOfEveryWidth) {
  uint32_t seed = 200;
  for (int G : {32, 64, 128}) {
    Case c;
    c.group_size = G;
    c.bit_plan = true;
    c.n_layers = 3;
    c.layer = 2;
    c.n_heads_kv = 4;
    c.n_heads_q = 16;
    c.seqs = {{16, 20 * 16, 70, 70}, {16, 16, 5, 5}, {16, 5 * 16, 3, 1}};
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(PrefillAttnCuda, LloydAndSmallGroupsAndHeadDim64) {
  uint32_t seed = 300;
  for (int d : {64, 128})
    for (int G : {32, 64, 128}) {
      if (G > d) continue;
      for (auto qz : {quant::HistQuantizer::kInt2Uniform, quant::HistQuantizer::kInt2Lloyd}) {
        Case c;
        c.head_dim = d;
        c.group_size = G;
        c.quantizer = qz;
        c.seqs = {{16, 10 * 16, 40, 33}, {16, 16, 16, 16}, {7, 0, 0, 7}};
        c.seed = seed++;
        run_case(c);
      }
    }
}

TEST_F(PrefillAttnCuda, PageSizes) {
  uint32_t seed = 100;
  for (int P : {8, 32}) {
    Case c;
    c.page_size = P;
    c.n_sink = P;
    c.seqs = {
        {P, 5 * int64_t(P), 2 * P + 1, P + 1}, {P, 0, P - 1, P - 1}, {int64_t(P) - 1, 0, 0, 4}};
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(PrefillAttnCuda, PeakySoftmax) {
  Case c;
  c.q_gain = 6.f;
  c.seqs = mixed_batch();
  c.seed = 400;
  run_case(c);
}

TEST_F(PrefillAttnCuda, LongContextQwen3Layout) {
  // Qwen3-8B heads: a chunk of 64 after ~3K of history, beside a short first chunk.
  Case c;
  c.n_heads_q = 32;
  c.n_heads_kv = 8;
  c.n_layers = 1;
  c.layer = 0;
  c.n_sink = 64;
  c.seqs = {{64, 3072, 300, 64}, {64, 0, 36, 100}};
  c.seed = 500;
  run_case(c);
}

TEST_F(PrefillAttnCuda, LongChunksGqa6And12) {
  // Chunks of several 64-key tiles and several query items, with the history ending mid-tile
  // (the tiled kernel's mixed tiles) and GQA groups that do not divide its 128 rows (the models of
  // the next issues: 6-12 query heads per KV head).
  for (int gqa : {6, 12}) {
    Case c;
    c.n_heads_q = 2 * gqa;
    c.n_heads_kv = 2;
    c.n_sink = 16;
    c.seqs = {{16, 1040, 400, 383}, {16, 0, 520, 520}, {16, 48, 70, 70}};
    c.seed = 600 + gqa;
    run_case(c);
  }
}

TEST_F(PrefillAttnCuda, SplitKeysOfShortChunksAtDepth) {
  // Few items over long keys: the warp-specialised kernel cuts each item's key tiles into parts
  // (prefill_attn_ws_split: 4 here on an H100 / H200) and merges them. A 64-query chunk at 16K
  // beside a 40-query chunk at 2K (whose items are shorter than the parts: empty parts) and a
  // 64-query chunk at 300 keys (a part whose keys all lie past some of its rows: those rows'
  // part has no visible key), over BF16 and INT2 history, GQA 2, 4 and 12.
  for (int gqa : {2, 4, 12}) {
    for (bool history : {false, true}) {
      Case c;
      c.n_heads_q = 2 * gqa;
      c.n_heads_kv = 2;
      c.n_layers = 1;
      c.layer = 0;
      c.n_sink = 64;
      c.history = history;
      c.seqs = history ? std::vector<SeqSpec>{{64, 16384, 100, 64}, {64, 1984, 70, 40},
                                              {64, 0, 236, 64}}
                       : std::vector<SeqSpec>{{64, 0, 16484, 64}, {64, 0, 2054, 40},
                                              {64, 0, 236, 64}};
      c.seed = 700 + gqa + (history ? 1 : 0);
      run_case(c);
    }
  }
}

// ---- decode-equivalent (perplexity evaluation) -------------------------------------------------
// The cache as the model leaves it when a chunk of n_q starts at pos0: demoted up to
// history_end(pos0) (sinks full before any history), the rest (and the chunk) in recent pages.
SeqSpec de_seq(const Case& c, int64_t pos0, int64_t n_q) {
  const int64_t T = pos0 + n_q;
  const int64_t he = history_end(c.n_sink, c.n_recent, c.page_size, pos0);
  SeqSpec s;
  s.sink = std::min<int64_t>(T, c.n_sink);
  s.hist = he > c.n_sink ? he - c.n_sink : 0;
  s.recent = T - s.sink - s.hist;
  s.n_q = n_q;
  return s;
}

// n_sink 16, n_recent 64, P 16: the first demotion point (history_end > n_sink) is position 96.
// Chunks of 1..300 starting just before, at, inside and after it, and far beyond (the history
// already holds pages); whole windows from 0 as oscar eval runs them.
TEST_F(PrefillAttnCuda, DecodeEquivalentAcrossDemotionPoints) {
  uint32_t seed = 600;
  const std::vector<std::pair<int64_t, int64_t>> chunks = {
      {0, 300},  {0, 97},  {0, 96},    {80, 1},   {95, 1}, {95, 2},  {90, 40},   {96, 1}, {96, 17},
      {100, 64}, {111, 5}, {112, 200}, {150, 33}, {0, 1},  {17, 70}, {400, 100}, {431, 1}};
  for (int gqa : {2, 4}) {
    Case c;
    c.decode_equivalent = true;
    c.n_heads_kv = 2;
    c.n_heads_q = 2 * gqa;
    // Batches of a few sequences, so several zones share the scratch.
    for (size_t i = 0; i < chunks.size(); i += 4) {
      c.seqs.clear();
      for (size_t k = i; k < std::min(chunks.size(), i + 4); ++k)
        c.seqs.push_back(de_seq(c, chunks[k].first, chunks[k].second));
      c.seed = seed++;
      run_case(c);
    }
  }
}

TEST_F(PrefillAttnCuda, DecodeEquivalentRandomChunks) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> chunk(1, 300), start(0, 500);
  uint32_t seed = 700;
  for (int rep = 0; rep < 6; ++rep) {
    Case c;
    c.decode_equivalent = true;
    c.n_heads_q = rep % 2 == 0 ? 8 : 16;
    c.n_heads_kv = 4;
    c.clips = rep % 3 != 0;
    c.quantizer =
        rep % 2 == 0 ? quant::HistQuantizer::kInt2Uniform : quant::HistQuantizer::kInt2Lloyd;
    for (int i = 0; i < 3; ++i) {
      const int64_t p0 = i == 0 ? 0 : start(rng);
      c.seqs.push_back(de_seq(c, p0, chunk(rng)));
    }
    c.seed = seed++;
    run_case(c);
  }
}

TEST_F(PrefillAttnCuda, DecodeEquivalentBitPlanClipsGroups) {
  uint32_t seed = 800;
  for (int G : {32, 64, 128})
    for (bool clips : {false, true}) {
      Case c;
      c.decode_equivalent = true;
      c.group_size = G;
      c.bit_plan = true;
      c.clips = clips;
      c.n_layers = 3;
      c.layer = 2;
      c.n_heads_kv = 4;
      c.n_heads_q = 16;
      c.seqs = {de_seq(c, 0, 250), de_seq(c, 90, 60), de_seq(c, 300, 1)};
      c.seed = seed++;
      run_case(c);
    }
}

TEST_F(PrefillAttnCuda, DecodeEquivalentHeadDim64PageSizesNoSinks) {
  uint32_t seed = 900;
  for (int P : {8, 32})
    for (int d : {64, 128}) {
      Case c;
      c.decode_equivalent = true;
      c.head_dim = d;
      c.group_size = 64;
      c.page_size = P;
      c.n_sink = P;
      c.n_recent = 2 * P;
      c.clips = true;
      c.quantizer = d == 64 ? quant::HistQuantizer::kInt2Lloyd : quant::HistQuantizer::kInt2Uniform;
      c.seqs = {de_seq(c, 0, 5 * P + 3), de_seq(c, 3 * P, 2 * P), de_seq(c, 4 * P - 1, 1)};
      c.seed = seed++;
      run_case(c);
    }
  Case z;  // no sinks: the zone starts at the history's end
  z.decode_equivalent = true;
  z.n_sink = 0;
  z.seqs = {de_seq(z, 0, 200), de_seq(z, 70, 90)};
  z.seed = 950;
  run_case(z);
}

TEST_F(PrefillAttnCuda, DecodeEquivalentLongContextQwen3Layout) {
  // Qwen3-8B heads and regions (64 sinks, 256 recent), a 300-token chunk after ~3K positions
  // beside a 1K first window.
  Case c;
  c.decode_equivalent = true;
  c.n_heads_q = 32;
  c.n_heads_kv = 8;
  c.n_layers = 1;
  c.layer = 0;
  c.n_sink = 64;
  c.n_recent = 256;
  c.clips = true;
  c.seqs = {de_seq(c, 3000, 300), de_seq(c, 0, 1024)};
  c.seed = 990;
  run_case(c);
}

// Batch invariance (PrefillAttnParams::batch_invariant, README "Deterministic results"): a
// prompt's query rows get bitwise the same output whether the prompt runs as one chunk alone or
// cut into chunks that share their calls with other sequences' chunks (at other places of the
// call), as the scheduler's token budget cuts them. The cache is what the model leaves at each
// chunk's start: every token is stored both as its exact BF16 row and as the history row the
// demotion makes of it (the CPU quantizer, clip 1: the device's bytes, test_demote_pages_cuda),
// and a chunk at pos0 reads the history pages up to history_end(pos0) and the exact pages after
// (decode-equivalent reading, quantized cache), or every exact page (the bf16 mode, serving
// prefill). n_sink 16, n_recent 64, P 16: demotion points every 16 tokens from 96, so the chunks
// below start before, at and past them. The kernels batch-invariant kAuto takes are checked
// (decode-equivalent: the staged tensor-core one and the FP32 one; bf16: the warp-specialised one
// on sm_90a and the staged one). The tiled kernel (kTiledMma / kTiledWgmma) is not invariant:
// on the H200 6 to 21 rows of a chunk differed from the whole prompt's (2026-12-03), so kAuto
// never takes it with the flag. The whole-prompt calls are also compared with the CPU
// prefill_attn (relative L2 and per-row cosine, the bounds above).
struct InvCache : PagedCacheHost {
  std::vector<int64_t> T;            // tokens per sequence
  std::vector<int32_t> first_page;   // sequence s: pages first_page[s] + i of both pools
  std::vector<std::vector<float>> q;  // per sequence [T, n_heads_q, head_dim]
};

void build_inv(const Case& c, const std::vector<int64_t>& T, InvCache& h) {
  set_layout(h, c.n_layers, c.n_heads_kv, c.head_dim, c.page_size, c.group_size);
  const KvPageLayout& L = h.layout;
  const int P = c.page_size, d = c.head_dim;
  h.T = T;
  int64_t pages = 0;
  for (int64_t t : T) {
    h.first_page.push_back(static_cast<int32_t>(pages));
    pages += pages_for(t, P);
  }
  h.exact_pool.assign(static_cast<size_t>(pages) * L.exact_page_bytes(), 0xFF);
  if (c.history) h.hist_pool.assign(static_cast<size_t>(pages) * L.int2_page_bytes(), 0xFF);
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(d), seen(d);
  for (size_t s = 0; s < T.size(); ++s) {
    for (int64_t t = 0; t < T[s]; ++t) {
      const RowPlace at{2, h.first_page[s] + static_cast<int32_t>(t / P), static_cast<int>(t % P)};
      for (int kv = 0; kv < 2; ++kv)
        for (int g = 0; g < c.n_heads_kv; ++g) {
          draw_kv_row(kv, normal, rng, x);
          write_exact_row(h, c.layer, kv, g, at, x.data(), seen.data());
          if (!c.history) continue;
          const quant::RowCodec& codec = quant::row_codec(
              quant::hist_row_format(c.quantizer, kv, L.hist_row_bits(c.layer, kv, g)));
          const Status st =
              codec.quantize(seen.data(), d, c.group_size, 1.0f, hist_row(h, c.layer, kv, g, at));
          ASSERT_TRUE(st.ok()) << st.to_string();
        }
    }
    h.q.emplace_back(static_cast<size_t>(T[s]) * c.n_heads_q * d);
    for (float& v : h.q.back()) v = c.q_gain * normal(rng);
  }
}

struct InvChunk {
  int seq;
  int64_t pos0, n_q;
};

// One call's params over `chunks` (host pointers into `tabs` / `q`, which it fills), the cache of
// each chunk as the model leaves it at the chunk's start.
PrefillAttnParams inv_params(const Case& c, InvCache& h, const std::vector<InvChunk>& chunks,
                             std::vector<int32_t>& cu, std::vector<int64_t>& pos0,
                             std::vector<float>& q, std::vector<int32_t> (&tabs)[3][3]) {
  const int P = c.page_size;
  const size_t row = static_cast<size_t>(c.n_heads_q) * c.head_dim;
  cu.assign(1, 0);
  pos0.clear();
  q.clear();
  for (auto& t : tabs)
    for (auto& v : t) v.clear();
  for (int r = 0; r < 3; ++r) tabs[r][0].push_back(0);
  for (const InvChunk& ch : chunks) {
    const SeqSpec sp = de_seq(c, ch.pos0, ch.n_q);
    const int64_t n[3] = {sp.sink, c.history ? sp.hist : 0, c.history ? sp.recent : sp.recent +
                                                                                     sp.hist};
    int64_t t0 = 0;
    for (int r = 0; r < 3; ++r) {
      for (int64_t i = 0; i < pages_for(n[r], P); ++i)
        tabs[r][1].push_back(h.first_page[ch.seq] + static_cast<int32_t>(t0 / P + i));
      tabs[r][0].push_back(static_cast<int32_t>(tabs[r][1].size()));
      tabs[r][2].push_back(n[r] == 0 ? 0 : static_cast<int32_t>((n[r] - 1) % P + 1));
      t0 += n[r];
    }
    pos0.push_back(ch.pos0);
    cu.push_back(cu.back() + static_cast<int32_t>(ch.n_q));
    const float* qs = h.q[ch.seq].data() + ch.pos0 * row;
    q.insert(q.end(), qs, qs + ch.n_q * row);
  }
  PrefillAttnParams p;
  p.n_seqs = static_cast<int32_t>(chunks.size());
  p.n_heads_q = c.n_heads_q;
  p.layer = c.layer;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  p.layout = h.layout;
  p.codec.quantizer = c.quantizer;
  p.codec.group_size = c.group_size;
  p.n_sink = c.n_sink;
  p.n_recent = c.n_recent;
  p.quantized = c.history;
  p.decode_equivalent = true;  // as the scheduler asks for with the flag (no-op without history)
  p.max_rows = cu.back();
  p.cu_seqlens = cu.data();
  p.pos0 = pos0.data();
  p.q = q.data();
  p.exact_pool = h.exact_pool.data();
  p.hist_pool = c.history ? h.hist_pool.data() : nullptr;
  PageTableView* const views[3] = {&p.sinks, &p.history, &p.recent};
  for (int r = 0; r < 3; ++r)
    *views[r] = PageTableView{tabs[r][0].data(), tabs[r][1].data(), tabs[r][2].data(), p.n_seqs};
  p.batch_invariant = true;
  return p;
}

// Runs one call on the device by `path`; out gets [rows, n_heads_q, head_dim].
// d_exact / d_hist: device copies of h's pools.
void inv_run(const Case& c, InvCache& h, const std::vector<InvChunk>& chunks,
             PrefillAttnCudaPath path, const uint8_t* d_exact, const uint8_t* d_hist,
             std::vector<float>& out) {
  std::vector<int32_t> cu, tabs[3][3];
  std::vector<int64_t> pos0;
  std::vector<float> q;
  PrefillAttnParams p = inv_params(c, h, chunks, cu, pos0, q, tabs);
  DeviceUploads dv;
  p.cu_seqlens = dv.up(cu);
  p.pos0 = dv.up(pos0);
  p.q = dv.up(q);
  PageTableView* const views[3] = {&p.sinks, &p.history, &p.recent};
  for (int r = 0; r < 3; ++r) {
    views[r]->indptr = dv.up(tabs[r][0]);
    views[r]->page_ids = dv.up(tabs[r][1]);
    views[r]->last_page_len = dv.up(tabs[r][2]);
  }
  p.exact_pool = d_exact;
  p.hist_pool = d_hist;
  out.assign(q.size(), 0.f);
  p.out = dv.up(out);
  CUDA_OK(cudaMemset(p.out, 0xFF, out.size() * sizeof(float)));
  const Status st = prefill_attn_cuda_ex(p, path, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(out.data(), p.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

TEST_F(PrefillAttnCuda, BatchInvariantRowsWhateverTheChunking) {
  for (bool history : {true, false}) {
    Case c;
    c.history = history;
    c.n_heads_q = 8;
    c.n_heads_kv = 2;
    c.n_layers = 1;
    c.layer = 0;
    c.seed = history ? 950 : 951;
    SCOPED_TRACE(c.name());
    InvCache h;
    build_inv(c, {300, 200, 77, 130}, h);
    if (::testing::Test::HasFatalFailure()) return;
    const size_t row = static_cast<size_t>(c.n_heads_q) * c.head_dim;
    // Each prompt whole and alone, then the steps of a schedule: prompt 0 in four chunks (cut
    // before, at and past demotion points), beside chunks of the others at other places.
    const std::vector<std::vector<InvChunk>> steps = {
        {{0, 0, 40}, {1, 0, 120}},
        {{2, 0, 77}, {0, 40, 57}},
        {{1, 120, 80}, {3, 0, 1}, {0, 97, 123}},
        {{3, 1, 129}, {0, 220, 80}}};
    const std::vector<PrefillAttnCudaPath> paths =
        history ? std::vector<PrefillAttnCudaPath>{PrefillAttnCudaPath::kAuto,
                                                   PrefillAttnCudaPath::kSimt}
                : std::vector<PrefillAttnCudaPath>{PrefillAttnCudaPath::kAuto,
                                                   PrefillAttnCudaPath::kStaged};
    DeviceUploads pools;
    const uint8_t* d_exact = pools.up(h.exact_pool);
    const uint8_t* d_hist = c.history ? pools.up(h.hist_pool) : nullptr;
    ASSERT_NE(d_exact, nullptr);
    for (PrefillAttnCudaPath path : paths) {
      SCOPED_TRACE("path " + std::to_string(static_cast<int>(path)));
      std::vector<std::vector<float>> alone(h.T.size());
      for (size_t s = 0; s < h.T.size(); ++s) {
        inv_run(c, h, {{static_cast<int>(s), 0, h.T[s]}}, path, d_exact, d_hist, alone[s]);
        if (::testing::Test::HasFatalFailure()) return;
        // Against the CPU (host params of the same call).
        std::vector<int32_t> cu, tabs[3][3];
        std::vector<int64_t> pos0;
        std::vector<float> q;
        PrefillAttnParams hp =
            inv_params(c, h, {{static_cast<int>(s), 0, h.T[s]}}, cu, pos0, q, tabs);
        std::vector<float> want(q.size());
        hp.out = want.data();
        ASSERT_TRUE(prefill_attn(hp).ok());
        double num = 0, den = 0, min_cos = 1;
        for (size_t r = 0; r < want.size() / c.head_dim; ++r) {
          double dp = 0, ng = 0, nw = 0;
          for (int i = 0; i < c.head_dim; ++i) {
            const double g = alone[s][r * c.head_dim + i], w = want[r * c.head_dim + i];
            ASSERT_TRUE(std::isfinite(g)) << "sequence " << s << " row " << r / c.n_heads_q;
            num += (g - w) * (g - w);
            den += w * w;
            dp += g * w;
            ng += g * g;
            nw += w * w;
          }
          min_cos = std::min(min_cos, (ng == 0 && nw == 0) ? 1.0 : dp / std::sqrt(ng * nw));
        }
        const double rel = std::sqrt(num / std::max(den, 1e-300));
        const bool simt = path == PrefillAttnCudaPath::kSimt;
        EXPECT_LE(rel, simt ? 1e-5 : 2e-2) << "sequence " << s;
        EXPECT_GE(min_cos, 1.0 - (simt ? 1e-8 : 2e-3)) << "sequence " << s;
      }
      for (size_t k = 0; k < steps.size(); ++k) {
        std::vector<float> got;
        inv_run(c, h, steps[k], path, d_exact, d_hist, got);
        if (::testing::Test::HasFatalFailure()) return;
        size_t r0 = 0;
        for (const InvChunk& ch : steps[k]) {
          int64_t bad = 0, first = -1;
          for (int64_t i = 0; i < ch.n_q; ++i)
            if (std::memcmp(&got[(r0 + i) * row], &alone[ch.seq][(ch.pos0 + i) * row],
                            row * sizeof(float)) != 0) {
              bad += 1;
              if (first < 0) first = ch.pos0 + i;
            }
          EXPECT_EQ(bad, 0) << "step " << k << ": " << bad << " rows of sequence " << ch.seq
                            << " (chunk at " << ch.pos0 << " of " << ch.n_q << ", first at "
                            << first << ") differ from the prompt run whole and alone";
          r0 += static_cast<size_t>(ch.n_q);
        }
      }
    }
  }
}

TEST_F(PrefillAttnCuda, RejectsBadParams) {
  Case c;
  c.seqs = {{16, 16, 16, 16}};
  Host h;
  build(c, h);
  Device dv;
  upload(h, dv);
  PrefillAttnParams p = dv.params;
  p.layout.exact_elem_bytes = 4;
  EXPECT_EQ(prefill_attn_cuda(p, nullptr).code(), StatusCode::kInvalidArgument);
  p = dv.params;
  p.n_heads_q = 7;
  EXPECT_FALSE(prefill_attn_cuda(p, nullptr).ok());
  p = dv.params;
  p.recent.n_seqs = 2;
  EXPECT_FALSE(prefill_attn_cuda(p, nullptr).ok());
  p = dv.params;
  p.decode_equivalent = true;
  p.max_rows = 0;  // decode-equivalent needs the bound of the scratch
  EXPECT_EQ(prefill_attn_cuda(p, nullptr).code(), StatusCode::kInvalidArgument);
  p = dv.params;
  p.decode_equivalent = true;
  p.codec.quantizer = quant::HistQuantizer::kKivi;
  EXPECT_EQ(prefill_attn_cuda(p, nullptr).code(), StatusCode::kUnimplemented);
  p = dv.params;
  p.codec.quantizer = quant::HistQuantizer::kKivi;
  EXPECT_EQ(prefill_attn_cuda(p, nullptr).code(), StatusCode::kUnimplemented);
  p = dv.params;
  p.layout.head_dim = 96;
  EXPECT_EQ(prefill_attn_cuda(p, nullptr).code(), StatusCode::kInvalidArgument);
  p = dv.params;
  p.n_seqs = p.sinks.n_seqs = p.history.n_seqs = p.recent.n_seqs = 0;
  EXPECT_TRUE(prefill_attn_cuda(p, nullptr).ok());
}

}  // namespace
}  // namespace oscar::kernels
