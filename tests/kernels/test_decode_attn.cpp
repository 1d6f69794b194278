// Tests of decode attention over paged three-region caches (kernels/decode_attn.h):
// decode_attn_ref and decode_attn against exact float64 softmax attention over the dequantized
// cache, computed here independently of both (no splits, no merges). Pools are built directly:
// random K/V rows, exact rows stored as BF16 (or F32), history rows quantized by quant's fast
// quantizers, page ids shuffled, every byte the kernel must not read (other layers, spare pages)
// filled with 0xFF (NaN in both bf16 and fp16 metadata), so a wrong address shows up as NaN.
// Last, kv::SequenceCache::attend() with one staged token (the decode path) against exact
// attention over what the cache holds, token by token across sinks, demotions and page edges.
//
// Tolerances (u = 2^-24, float unit roundoff):
//   reference (float64 inside, one float rounding at the end): |err| <= 4·u·Vmax.
//   fast path (float everywhere): a score s_j = scale·Σ_c q_c k_jc carries an error up to
//   ≈ d·u·S with S = scale·max_j Σ_c |q_c k_jc|; exp adds a few u; a relative weight error ε
//   moves the normalised output by at most 2ε·Vmax; summing L weighted values (and ℓ) in float
//   adds at most ≈ 2·L·u·Vmax. Dequantizing with a level table may differ from quant's
//   reference by one rounding per element (u·Vmax, u·S). So
//     tol_fast = Vmax·u·(2·(d + 2)·S + 2·L + 64)
//   per query head, a first-order worst-case bound; the measured errors are far below it. Both
//   paths must also have cosine similarity >= 1 − 1e-6 with the exact output, per head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/decode_attn.h"
#include "kv/bit_plan.h"
#include "kv/page_pool.h"
#include "kv/sequence_cache.h"
#include "quant/bit_plan_quant.h"
#include "quant/modes.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"
#include "quant/hadamard.h"
#include "quant/rotation.h"

namespace oscar::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Case {
  int n_heads_q = 4;
  int n_heads_kv = 2;
  int head_dim = 128;
  int page_size = 16;
  int group_size = 128;
  quant::HistQuantizer quantizer = quant::HistQuantizer::kInt2Uniform;
  int exact_elem_bytes = 2;
  int64_t n_sink = 16;
  int64_t n_hist = 64;
  int64_t n_recent = 20;
  int n_layers = 2;
  int layer = 1;
  int chunk_tokens = 0;
  float q_gain = 1.0f;  // larger = peakier softmax
  bool bit_plan = false;  // history rows of random widths (1, 2, 3 bits) per (layer, K/V, head)
  uint32_t seed = 1;

  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "hq=%d hkv=%d d=%d P=%d G=%d %s exact=%dB sink=%lld hist=%lld recent=%lld "
                  "chunk=%d gain=%g plan=%d seed=%u",
                  n_heads_q, n_heads_kv, head_dim, page_size, group_size,
                  quantizer == quant::HistQuantizer::kInt2Lloyd ? "lloyd" : "uniform",
                  exact_elem_bytes, static_cast<long long>(n_sink), static_cast<long long>(n_hist),
                  static_cast<long long>(n_recent), chunk_tokens, q_gain, bit_plan ? 1 : 0, seed);
    return buf;
  }
};

// A one-sequence page table: the CSR arrays (heap-held, so they survive moves of their owner).
struct OneSeqTable {
  std::vector<int32_t> indptr{0, 0}, last{0};
  PageTableView bind(const std::vector<int32_t>& pages, int64_t n_tokens, int page_size) {
    indptr[1] = static_cast<int32_t>((n_tokens + page_size - 1) / page_size);
    last[0] = n_tokens == 0 ? 0 : static_cast<int32_t>(n_tokens - (indptr[1] - 1) * page_size);
    return PageTableView{indptr.data(), pages.data(), last.data(), 1};
  }
};

// A built cache plus what attention must see: K/V per KV head as float, in token order.
struct Built {
  std::shared_ptr<const kv::BitPlan> plan;
  KvPageLayout layout;
  std::vector<uint8_t> exact_pool, int2_pool;
  std::vector<int32_t> sink_pages, hist_pages, recent_pages;
  OneSeqTable sink_t, hist_t, recent_t;  // one-sequence CSR tables over the page lists
  std::vector<float> q;           // [n_heads_q, d]
  std::vector<float> k, v;        // [n_heads_kv, T, d] as attention sees them
  int64_t T = 0;
  DecodeAttnParams params;
};

int64_t pages_for(int64_t tokens, int P) { return (tokens + P - 1) / P; }

Built build(const Case& c) {
  Built b;
  KvPageLayout& L = b.layout;
  L.n_layers = c.n_layers;
  L.n_heads_kv = c.n_heads_kv;
  L.head_dim = c.head_dim;
  L.page_size = c.page_size;
  L.exact_elem_bytes = c.exact_elem_bytes;
  L.int2_row_bytes = quant::int2_row_bytes(c.head_dim, c.group_size);
  const int d = c.head_dim;
  const int P = c.page_size;
  b.T = c.n_sink + c.n_hist + c.n_recent;

  std::mt19937 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  if (c.bit_plan) {
    // Every width in every layer: the layer read gets at least one 4-, one 3- and one 1-bit
    // plane.
    const size_t heads = static_cast<size_t>(c.n_layers) * c.n_heads_kv;
    std::vector<int8_t> kb(heads), vb(heads);
    std::uniform_int_distribution<int> width(1, 4);
    for (size_t i = 0; i < heads; ++i) {
      kb[i] = static_cast<int8_t>(width(rng));
      vb[i] = static_cast<int8_t>(width(rng));
    }
    kb[static_cast<size_t>(c.layer) * c.n_heads_kv] = 3;
    vb[static_cast<size_t>(c.layer) * c.n_heads_kv + c.n_heads_kv - 1] = 1;
    if (c.n_heads_kv > 1)
      vb[static_cast<size_t>(c.layer) * c.n_heads_kv] = 4;
    else
      kb[static_cast<size_t>(c.layer == 0 ? 1 : 0)] = 4;
    auto plan = kv::BitPlan::create(c.n_layers, c.n_heads_kv, c.head_dim, c.group_size, kb, vb);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    b.plan = plan.value();
    L.hist_bits = b.plan->plane_bits();
    L.hist_row_prefix = b.plan->row_prefix();
  }
  // Pools with two spare pages each; page ids handed out in shuffled order.
  const int64_t n_exact = pages_for(c.n_sink, P) + pages_for(c.n_recent, P) + 2;
  const int64_t n_int2 = pages_for(c.n_hist, P) + 2;
  b.exact_pool.assign(n_exact * L.exact_page_bytes(), 0xFF);
  b.int2_pool.assign(n_int2 * L.int2_page_bytes(), 0xFF);
  std::vector<int32_t> exact_ids(n_exact), int2_ids(n_int2);
  std::iota(exact_ids.begin(), exact_ids.end(), 0);
  std::iota(int2_ids.begin(), int2_ids.end(), 0);
  std::shuffle(exact_ids.begin(), exact_ids.end(), rng);
  std::shuffle(int2_ids.begin(), int2_ids.end(), rng);
  size_t ei = 0;
  for (int64_t i = 0; i < pages_for(c.n_sink, P); ++i) b.sink_pages.push_back(exact_ids[ei++]);
  for (int64_t i = 0; i < pages_for(c.n_recent, P); ++i) b.recent_pages.push_back(exact_ids[ei++]);
  for (int64_t i = 0; i < pages_for(c.n_hist, P); ++i) b.hist_pages.push_back(int2_ids[i]);

  b.k.assign(static_cast<size_t>(c.n_heads_kv) * b.T * d, 0.f);
  b.v.assign(b.k.size(), 0.f);
  std::vector<float> x(d);
  for (int kv = 0; kv < 2; ++kv) {
    for (int h = 0; h < c.n_heads_kv; ++h) {
      for (int64_t t = 0; t < b.T; ++t) {
        // K with outlier channels and a per-token offset; V plain Gaussian plus a bias.
        for (int i = 0; i < d; ++i)
          x[i] = kv == 0 ? ((i % 29 == 3) ? 6.f : 1.f) * normal(rng) + 0.2f
                         : normal(rng) + 0.5f * std::sin(0.1f * static_cast<float>(i));
        float* seen = (kv == 0 ? b.k : b.v).data() + (static_cast<size_t>(h) * b.T + t) * d;
        const bool hist = t >= c.n_sink && t < c.n_sink + c.n_hist;
        if (hist) {
          const int64_t j = t - c.n_sink;
          uint8_t* dst = b.int2_pool.data() + b.hist_pages[j / P] * L.int2_page_bytes() +
                         L.int2_row_offset(c.layer, kv, h, static_cast<int>(j % P));
          const int bits = L.hist_row_bits(c.layer, kv, h);
          const Status st =
              bits == 4   ? quant::quantize_row_int4_ref(x.data(), d, c.group_size, 0.97f, dst)
              : bits == 3 ? quant::quantize_row_int3_ref(x.data(), d, c.group_size, 0.95f, dst)
              : bits == 1 ? quant::quantize_row_int1_ref(x.data(), d, c.group_size, dst)
              : c.quantizer == quant::HistQuantizer::kInt2Lloyd
                  ? quant::quantize_rows_lloyd(x.data(), 1, d, c.group_size, 1.f, dst)
                  : quant::quantize_rows_int2(x.data(), 1, d, c.group_size, 1.f, dst);
          EXPECT_TRUE(st.ok()) << st.to_string();
          if (bits == 4)
            quant::dequantize_row_int4_ref(dst, d, c.group_size, seen);
          else if (bits == 3)
            quant::dequantize_row_int3_ref(dst, d, c.group_size, seen);
          else if (bits == 1)
            quant::dequantize_row_int1_ref(dst, d, c.group_size, seen);
          else if (c.quantizer == quant::HistQuantizer::kInt2Lloyd)
            quant::dequantize_row_lloyd_ref(dst, d, c.group_size, seen);
          else
            quant::dequantize_row_int2_ref(dst, d, c.group_size, seen);
        } else {
          const bool sink = t < c.n_sink;
          const int64_t j = sink ? t : t - c.n_sink - c.n_hist;
          const int32_t page = (sink ? b.sink_pages : b.recent_pages)[j / P];
          uint8_t* dst = b.exact_pool.data() + page * L.exact_page_bytes() +
                         L.exact_row_offset(c.layer, kv, h, static_cast<int>(j % P));
          for (int i = 0; i < d; ++i) {
            if (c.exact_elem_bytes == 4) {
              std::memcpy(dst + 4 * i, &x[i], 4);
              seen[i] = x[i];
            } else {
              const bf16_t hb = f32_to_bf16(x[i]);
              std::memcpy(dst + 2 * i, &hb, 2);
              seen[i] = bf16_to_f32(hb);
            }
          }
        }
      }
    }
  }
  b.q.resize(static_cast<size_t>(c.n_heads_q) * d);
  for (float& e : b.q) e = c.q_gain * normal(rng);

  DecodeAttnParams& p = b.params;
  p.n_heads_q = c.n_heads_q;
  p.group_size = c.group_size;
  p.quantizer = c.quantizer;
  p.layer = c.layer;
  p.scale = 1.f / std::sqrt(static_cast<float>(d));
  p.layout = L;
  p.q = b.q.data();
  p.exact_pool = b.exact_pool.data();
  p.hist_pool = b.int2_pool.data();
  p.sinks = b.sink_t.bind(b.sink_pages, c.n_sink, P);
  p.history = b.hist_t.bind(b.hist_pages, c.n_hist, P);
  p.recent = b.recent_t.bind(b.recent_pages, c.n_recent, P);
  p.chunk_tokens = c.chunk_tokens;
  return b;
}

// Exact float64 softmax attention over b.k / b.v, one pass, no splits.
std::vector<double> exact_attention(const Case& c, const Built& b) {
  const int d = c.head_dim;
  const int gqa = c.n_heads_q / c.n_heads_kv;
  std::vector<double> out(static_cast<size_t>(c.n_heads_q) * d, 0.0);
  const double scale = b.params.scale;
  for (int h = 0; h < c.n_heads_q; ++h) {
    const int g = h / gqa;
    if (b.T == 0) continue;
    std::vector<double> s(b.T);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t t = 0; t < b.T; ++t) {
      const float* k = b.k.data() + (static_cast<size_t>(g) * b.T + t) * d;
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += static_cast<double>(b.q[h * d + i]) * k[i];
      s[t] = acc * scale;
      m = std::max(m, s[t]);
    }
    double l = 0;
    for (int64_t t = 0; t < b.T; ++t) {
      const double w = std::exp(s[t] - m);
      l += w;
      const float* v = b.v.data() + (static_cast<size_t>(g) * b.T + t) * d;
      for (int i = 0; i < d; ++i) out[h * d + i] += w * v[i];
    }
    for (int i = 0; i < d; ++i) out[h * d + i] /= l;
  }
  return out;
}

// Per query head: Vmax and S (see the file comment).
struct Bounds {
  std::vector<double> tol_ref, tol_fast;
};

Bounds bounds(const Case& c, const Built& b) {
  const int d = c.head_dim;
  const int gqa = c.n_heads_q / c.n_heads_kv;
  Bounds r;
  for (int h = 0; h < c.n_heads_q; ++h) {
    const int g = h / gqa;
    double vmax = 0, S = 0;
    for (int64_t t = 0; t < b.T; ++t) {
      const float* k = b.k.data() + (static_cast<size_t>(g) * b.T + t) * d;
      const float* v = b.v.data() + (static_cast<size_t>(g) * b.T + t) * d;
      double a = 0;
      for (int i = 0; i < d; ++i) {
        a += std::fabs(static_cast<double>(b.q[h * d + i]) * k[i]);
        vmax = std::max(vmax, std::fabs(static_cast<double>(v[i])));
      }
      S = std::max(S, a * b.params.scale);
    }
    r.tol_ref.push_back(4 * kU * vmax + 1e-30);
    r.tol_fast.push_back(vmax * kU * (2.0 * (d + 2) * S + 2.0 * b.T + 64) + 1e-30);
  }
  return r;
}

struct Cmp {
  double max_err = 0, max_ratio = 0, min_cos = 1;
};

// Compares got against want per head; reports max error, first mismatch and cosine.
Cmp compare(const char* what, const Case& c, const std::vector<float>& got,
            const std::vector<double>& want, const std::vector<double>& tol) {
  const int d = c.head_dim;
  Cmp r;
  bool reported = false;
  for (int h = 0; h < c.n_heads_q; ++h) {
    double dotp = 0, ng = 0, nw = 0;
    for (int i = 0; i < d; ++i) {
      const double g = got[h * d + i], w = want[h * d + i];
      const double err = std::fabs(g - w);
      if (!std::isfinite(g)) {
        ADD_FAILURE() << what << " " << c.name() << ": non-finite output at head " << h
                      << " dim " << i;
        return r;
      }
      r.max_err = std::max(r.max_err, err);
      r.max_ratio = std::max(r.max_ratio, err / tol[h]);
      if (err > tol[h] && !reported) {
        ADD_FAILURE() << what << " " << c.name() << ": first mismatch at head " << h << " dim "
                      << i << ": got " << g << " want " << w << " err " << err << " > tol "
                      << tol[h];
        reported = true;
      }
      dotp += g * w;
      ng += g * g;
      nw += w * w;
    }
    const double cosv = (ng == 0 && nw == 0) ? 1.0 : dotp / std::sqrt(ng * nw);
    r.min_cos = std::min(r.min_cos, cosv);
  }
  if (reported) ADD_FAILURE() << what << " max error " << r.max_err;
  EXPECT_GE(r.min_cos, 1.0 - 1e-6) << what << " " << c.name();
  return r;
}

// Runs both entry points on one case; returns the fast path's comparison.
Cmp run_case(const Case& c) {
  Built b = build(c);
  const std::vector<double> want = exact_attention(c, b);
  const Bounds tol = bounds(c, b);
  std::vector<float> out_ref(want.size(), -7.f), out_fast(want.size(), -7.f);
  b.params.out = out_ref.data();
  Status st = decode_attn_ref(b.params);
  EXPECT_TRUE(st.ok()) << st.to_string();
  compare("decode_attn_ref", c, out_ref, want, tol.tol_ref);
  b.params.out = out_fast.data();
  st = decode_attn(b.params);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return compare("decode_attn", c, out_fast, want, tol.tol_fast);
}

TEST(DecodeAttn, ShapeSweepGqaHeadDimGroupQuantizer) {
  uint32_t seed = 100;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, 90);
  for (int gqa : {1, 2, 4, 8}) {
    for (int d : {64, 128}) {
      for (int G : {32, 64, 128}) {
        if (G > d) continue;
        for (auto quant : {quant::HistQuantizer::kInt2Uniform, quant::HistQuantizer::kInt2Lloyd}) {
          Case c;
          c.n_heads_kv = gqa == 8 ? 1 : 2;
          c.n_heads_q = c.n_heads_kv * gqa;
          c.head_dim = d;
          c.group_size = G;
          c.quantizer = quant;
          c.page_size = 16;
          c.n_sink = 16 * (tok(rng) % 3);
          c.n_hist = 16 * (1 + tok(rng) % 6);
          c.n_recent = 1 + tok(rng);
          c.seed = seed++;
          run_case(c);
        }
      }
    }
  }
}

TEST(DecodeAttn, PageBoundaries) {
  for (int P : {8, 16, 32}) {
    for (int k : {1, 2, 5}) {
      for (int delta : {-1, 0, 1}) {
        Case c;
        c.page_size = P;
        c.n_sink = P;
        c.n_hist = static_cast<int64_t>(k) * P;
        // n_tokens = (k + 3)·P + delta: the recent window ends on either side of a page edge.
        c.n_recent = 2 * P + delta;
        c.seed = 1000 + P * 10 + k * 3 + (delta + 1);
        run_case(c);
        // The same boundary inside the sinks (no history yet) and in the history alone.
        Case s = c;
        s.n_sink = static_cast<int64_t>(k) * P + delta;
        s.n_hist = 0;
        s.n_recent = 0;
        run_case(s);
      }
    }
  }
}

// One call for a batch: sequences of different lengths (one with no keys at all), pages of all of
// them interleaved in two shared pools, page tables in CSR form. Every sequence must get exactly
// what the float64 oracle gives for it alone, within its own bound (fast path and reference).
TEST(DecodeAttn, BatchOfSequencesInOneCall) {
  struct R {
    int64_t sink, hist, recent;
  };
  const std::vector<R> shapes = {{16, 64, 20}, {0, 0, 0}, {16, 0, 3}, {16, 160, 31}, {5, 0, 0},
                                 {16, 16, 1}, {16, 1600, 9}};
  for (bool plan : {false, true}) {
    for (int chunk : {0, 7}) {
      Case base;
      base.bit_plan = plan;
      base.chunk_tokens = chunk;
      std::vector<Case> cases;
      std::vector<Built> built;
      for (size_t i = 0; i < shapes.size(); ++i) {
        Case c = base;
        c.n_sink = shapes[i].sink;
        c.n_hist = shapes[i].hist;
        c.n_recent = shapes[i].recent;
        c.seed = static_cast<uint32_t>(900 + i);
        cases.push_back(c);
        built.push_back(build(c));
      }
      // One pool per kind: each sequence's pages, with ids shifted past the earlier ones. The bit
      // plan differs per case seed, so the batch takes the first case's plan for all (the plan is
      // per engine): rebuild the other cases with that plan's layout.
      const KvPageLayout L = built[0].layout;
      for (size_t i = 1; i < built.size() && plan; ++i) {
        cases[i].seed = cases[0].seed;  // same plan draw
        built[i] = build(cases[i]);
      }
      std::vector<uint8_t> exact_pool, hist_pool;
      std::vector<int32_t> ind[3] = {{0}, {0}, {0}}, ids[3], last[3];
      std::vector<float> q;
      for (Built& b : built) {
        const int32_t e0 = static_cast<int32_t>(exact_pool.size() / L.exact_page_bytes());
        const int32_t h0 = static_cast<int32_t>(hist_pool.size() / L.int2_page_bytes());
        exact_pool.insert(exact_pool.end(), b.exact_pool.begin(), b.exact_pool.end());
        hist_pool.insert(hist_pool.end(), b.int2_pool.begin(), b.int2_pool.end());
        const PageTableView* tabs[3] = {&b.params.sinks, &b.params.history, &b.params.recent};
        for (int r = 0; r < 3; ++r) {
          const int32_t shift = r == 1 ? h0 : e0;
          for (int32_t k = 0; k < tabs[r]->n_pages(0); ++k)
            ids[r].push_back(tabs[r]->page_ids[k] + shift);
          ind[r].push_back(static_cast<int32_t>(ids[r].size()));
          last[r].push_back(tabs[r]->last_page_len[0]);
        }
        q.insert(q.end(), b.q.begin(), b.q.end());
      }
      DecodeAttnParams p = built[0].params;
      p.n_seqs = static_cast<int32_t>(built.size());
      p.layout = L;
      p.q = q.data();
      p.exact_pool = exact_pool.data();
      p.hist_pool = hist_pool.data();
      PageTableView* tabs[3] = {&p.sinks, &p.history, &p.recent};
      for (int r = 0; r < 3; ++r)
        *tabs[r] = PageTableView{ind[r].data(), ids[r].data(), last[r].data(), p.n_seqs};
      const size_t rows = static_cast<size_t>(base.n_heads_q) * base.head_dim;
      for (int fast = 0; fast < 2; ++fast) {
        std::vector<float> out(rows * built.size(), -7.f);
        p.out = out.data();
        const Status st = fast ? decode_attn(p) : decode_attn_ref(p);
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (size_t i = 0; i < built.size(); ++i) {
          const std::vector<double> want = exact_attention(cases[i], built[i]);
          const Bounds tol = bounds(cases[i], built[i]);
          std::vector<float> got(out.begin() + i * rows, out.begin() + (i + 1) * rows);
          compare(fast ? "decode_attn batch" : "decode_attn_ref batch", cases[i], got, want,
                  fast ? tol.tol_fast : tol.tol_ref);
        }
      }
      // Batch invariance: with batch_invariant each sequence's row is bitwise the row of a call
      // with that sequence alone (without it, the long one is cut into other chunks: the batch's
      // total length sets the chunk size, and the check fails).
      if (chunk != 0) continue;
      p.batch_invariant = true;
      std::vector<float> out(rows * built.size(), -7.f);
      p.out = out.data();
      ASSERT_TRUE(decode_attn(p).ok());
      for (size_t i = 0; i < built.size(); ++i) {
        DecodeAttnParams one = built[i].params;
        one.batch_invariant = true;
        std::vector<float> alone(rows, -7.f);
        one.out = alone.data();
        ASSERT_TRUE(decode_attn(one).ok());
        for (size_t e = 0; e < rows; ++e)
          ASSERT_EQ(out[i * rows + e], alone[e]) << "sequence " << i << " element " << e;
      }
    }
  }
}

TEST(DecodeAttn, EdgeRegions) {
  Case base;
  struct R {
    int64_t sink, hist, recent;
  };
  // One token; sinks only; empty recent; empty sinks; history only; recent only.
  for (R r : {R{1, 0, 0}, R{0, 0, 1}, R{64, 0, 0}, R{64, 32, 0}, R{0, 48, 17}, R{0, 64, 0},
              R{0, 0, 300}, R{16, 16, 1}}) {
    for (int chunk : {0, 5}) {
      Case c = base;
      c.n_sink = r.sink;
      c.n_hist = r.hist;
      c.n_recent = r.recent;
      c.chunk_tokens = chunk;
      c.seed = static_cast<uint32_t>(r.sink * 7 + r.hist * 13 + r.recent * 17 + chunk);
      run_case(c);
    }
  }
}

TEST(DecodeAttn, NoKeysGivesZeros) {
  Case c;
  c.n_sink = c.n_hist = c.n_recent = 0;
  Built b = build(c);
  std::vector<float> out(static_cast<size_t>(c.n_heads_q) * c.head_dim, 5.f);
  b.params.out = out.data();
  ASSERT_TRUE(decode_attn(b.params).ok());
  for (float x : out) ASSERT_EQ(x, 0.f);
  std::fill(out.begin(), out.end(), 5.f);
  ASSERT_TRUE(decode_attn_ref(b.params).ok());
  for (float x : out) ASSERT_EQ(x, 0.f);
}

TEST(DecodeAttn, ExactF32PagesAndLayerZero) {
  Case c;
  c.exact_elem_bytes = 4;
  c.layer = 0;
  c.n_layers = 3;
  c.n_sink = 32;
  c.n_hist = 96;
  c.n_recent = 40;
  run_case(c);
}

TEST(DecodeAttn, ManySmallChunksMergeCorrectly) {
  for (int chunk : {1, 3, 16, 33}) {
    for (auto quant : {quant::HistQuantizer::kInt2Uniform, quant::HistQuantizer::kInt2Lloyd}) {
      Case c;
      c.n_heads_q = 8;
      c.n_heads_kv = 2;
      c.n_sink = 32;
      c.n_hist = 160;
      c.n_recent = 45;
      c.quantizer = quant;
      c.chunk_tokens = chunk;
      c.seed = 77 + chunk;
      run_case(c);
    }
  }
}

TEST(DecodeAttn, PeakySoftmax) {
  // Scores spread over tens of units: exp underflows for most keys, the max moves between chunks.
  for (float gain : {8.f, 30.f}) {
    Case c;
    c.q_gain = gain;
    c.n_sink = 16;
    c.n_hist = 256;
    c.n_recent = 37;
    c.chunk_tokens = 32;
    c.seed = 31;
    run_case(c);
  }
}

TEST(DecodeAttn, LongContext8K) {
  for (auto quant : {quant::HistQuantizer::kInt2Uniform, quant::HistQuantizer::kInt2Lloyd}) {
    for (int chunk : {0, 64}) {
      Case c;
      c.n_heads_q = 8;
      c.n_heads_kv = 2;
      c.page_size = 32;
      c.n_sink = 64;
      c.n_recent = 256 + 13;
      c.n_hist = 8192 - 64 - 256 - 32;  // whole pages
      c.quantizer = quant;
      c.chunk_tokens = chunk;
      c.seed = 8192 + chunk;
      const Cmp r = run_case(c);
      std::printf("8K %s chunk=%d: fast max|err| %.3g (%.3g of the bound), min cos %.9f\n",
                  quant == quant::HistQuantizer::kInt2Lloyd ? "lloyd" : "uniform", chunk, r.max_err,
                  r.max_ratio, r.min_cos);
    }
  }
}

// Bit plans: every (layer, K/V, head) plane of the history holds rows of its own width, so the
// kernels must find each plane at its prefix-sum offset and unpack 3-, 2- and 1-bit rows. Every
// byte outside the planes read is 0xFF (NaN), as above.
TEST(DecodeAttn, BitPlanRowsOfEveryWidth) {
  uint32_t seed = 500;
  for (int gqa : {1, 2, 4}) {
    for (int d : {64, 128}) {
      for (int G : {32, 64, 128}) {
        if (G > d) continue;
        for (int chunk : {0, 24}) {
          Case c;
          c.bit_plan = true;
          c.n_heads_kv = 2;
          c.n_heads_q = 2 * gqa;
          c.n_layers = 3;
          c.layer = 1;
          c.head_dim = d;
          c.group_size = G;
          c.n_sink = 16;
          c.n_hist = 16 * (1 + seed % 5);
          c.n_recent = 1 + static_cast<int64_t>(seed % 37);
          c.chunk_tokens = chunk;
          c.seed = seed++;
          run_case(c);
        }
      }
    }
  }
  // A long history and a peaky softmax.
  Case c;
  c.bit_plan = true;
  c.n_heads_q = 8;
  c.page_size = 32;
  c.n_sink = 64;
  c.n_hist = 4096;
  c.n_recent = 300;
  c.q_gain = 8.f;
  c.seed = 4096;
  const Cmp r = run_case(c);
  std::printf("bit plan 4K: fast max|err| %.3g (%.3g of the bound), min cos %.9f\n", r.max_err,
              r.max_ratio, r.min_cos);
}

TEST(DecodeAttn, ValidationErrors) {
  Case c;
  Built b = build(c);
  std::vector<float> out(static_cast<size_t>(c.n_heads_q) * c.head_dim);
  b.params.out = out.data();
  {
    DecodeAttnParams p = b.params;
    p.n_heads_q = 3;
    EXPECT_FALSE(decode_attn(p).ok());
    EXPECT_FALSE(decode_attn_ref(p).ok());
  }
  {
    DecodeAttnParams p = b.params;
    p.group_size = 48;
    const Status st = decode_attn(p);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.to_string().find("group_size 48"), std::string::npos) << st.to_string();
  }
  {
    DecodeAttnParams p = b.params;
    p.hist_pool = nullptr;
    EXPECT_FALSE(decode_attn(p).ok());
    OneSeqTable empty;
    p.history = empty.bind({}, 0, c.page_size);  // no history: the INT2 pool is not needed
    EXPECT_TRUE(decode_attn(p).ok());
  }
  {
    DecodeAttnParams p = b.params;
    p.layer = 2;
    EXPECT_FALSE(decode_attn(p).ok());
  }
  {
    DecodeAttnParams p = b.params;
    p.layout.exact_elem_bytes = 3;
    EXPECT_FALSE(decode_attn(p).ok());
  }
  {
    // A bit plan with the Lloyd quantizer, or with half of its tables, is refused.
    Case pc = c;
    pc.bit_plan = true;
    Built pb = build(pc);
    pb.params.out = out.data();
    ASSERT_TRUE(decode_attn(pb.params).ok());
    DecodeAttnParams p = pb.params;
    p.quantizer = quant::HistQuantizer::kInt2Lloyd;
    EXPECT_NE(decode_attn(p).to_string().find("uniform quantizer"), std::string::npos);
    p = pb.params;
    p.layout.hist_row_prefix = nullptr;
    EXPECT_FALSE(decode_attn_ref(p).ok());
  }
}

// --- merge_attn_states on its own -------------------------------------------------------------

TEST(MergeAttnStates, MatchesOneSoftmaxIncludingEmptyParts) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 3.f);
  const int d = 24, n_rows = 3;
  for (int trial = 0; trial < 20; ++trial) {
    // Split 40 keys into parts at random cut points; some parts end up empty.
    const int n_keys = 40;
    std::vector<float> s(static_cast<size_t>(n_rows) * n_keys), v(static_cast<size_t>(n_keys) * d);
    for (float& x : s) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<int> cuts = {0, n_keys};
    std::uniform_int_distribution<int> cut(0, n_keys);
    for (int i = 0; i < 4; ++i) cuts.push_back(cut(rng));
    cuts.push_back(cuts[2]);  // a guaranteed empty part
    std::sort(cuts.begin(), cuts.end());
    const int n_parts = static_cast<int>(cuts.size()) - 1;
    const int stride = n_rows + 2;  // strided parts
    std::vector<float> o(static_cast<size_t>(n_parts) * stride * d, 0.f);
    std::vector<float> m(static_cast<size_t>(n_parts) * stride, 0.f), l(m.size(), 0.f);
    for (int p = 0; p < n_parts; ++p) {
      for (int r = 0; r < n_rows; ++r) {
        const size_t pr = static_cast<size_t>(p) * stride + r;
        double mm = -std::numeric_limits<double>::infinity();
        for (int j = cuts[p]; j < cuts[p + 1]; ++j) mm = std::max<double>(mm, s[r * n_keys + j]);
        double ll = 0;
        std::vector<double> acc(d, 0.0);
        for (int j = cuts[p]; j < cuts[p + 1]; ++j) {
          const double w = std::exp(s[r * n_keys + j] - mm);
          ll += w;
          for (int i = 0; i < d; ++i) acc[i] += w * v[j * d + i];
        }
        m[pr] = static_cast<float>(mm);
        l[pr] = static_cast<float>(ll);
        for (int i = 0; i < d; ++i) o[pr * d + i] = static_cast<float>(acc[i]);
      }
    }
    std::vector<float> out(static_cast<size_t>(n_rows) * d);
    merge_attn_states(o.data(), m.data(), l.data(), n_parts, n_rows, d, stride, out.data());
    for (int r = 0; r < n_rows; ++r) {
      double mm = -std::numeric_limits<double>::infinity(), ll = 0;
      for (int j = 0; j < n_keys; ++j) mm = std::max<double>(mm, s[r * n_keys + j]);
      std::vector<double> want(d, 0.0);
      double vmax = 0;
      for (int j = 0; j < n_keys; ++j) {
        const double w = std::exp(s[r * n_keys + j] - mm);
        ll += w;
        for (int i = 0; i < d; ++i) {
          want[i] += w * v[j * d + i];
          vmax = std::max(vmax, std::fabs(static_cast<double>(v[j * d + i])));
        }
      }
      // Partials are rounded to float once (m, ℓ, o: relative u each), the merge adds a few
      // roundings per part: 16·n_parts·u·Vmax bounds it.
      const double tol = 16.0 * n_parts * kU * vmax;
      for (int i = 0; i < d; ++i)
        ASSERT_NEAR(out[r * d + i], want[i] / ll, tol)
            << "trial " << trial << " row " << r << " dim " << i << " parts " << n_parts;
    }
  }
}

TEST(MergeAttnStates, AllEmptyGivesZerosAndNoParts) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> o(2 * 4, 0.f), m = {ninf, ninf}, l = {0.f, 0.f}, out(4, 9.f);
  merge_attn_states(o.data(), m.data(), l.data(), 2, 1, 4, 1, out.data());
  for (float x : out) EXPECT_EQ(x, 0.f);
  std::fill(out.begin(), out.end(), 9.f);
  merge_attn_states(nullptr, nullptr, nullptr, 0, 1, 4, 1, out.data());
  for (float x : out) EXPECT_EQ(x, 0.f);
}

TEST(MergeAttnStates, EmptyFirstPartThenOne) {
  // An empty part before a real one must not produce NaN (exp(-inf - M) handled, not inf - inf).
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> o = {0, 0, 2, 4}, m = {ninf, 1.5f}, l = {0.f, 2.f}, out(2);
  merge_attn_states(o.data(), m.data(), l.data(), 2, 1, 2, 1, out.data());
  EXPECT_FLOAT_EQ(out[0], 1.f);
  EXPECT_FLOAT_EQ(out[1], 2.f);
}

// --- Through kv::SequenceCache ------------------------------------------------------------------
// attend() with one staged token takes the decode path (decode_attn over the cache's own page
// lists). Grow a cache token by token across the sink, demotion and page edges and compare every
// step, every layer, with exact float64 attention over what read_row() says the cache holds.
// Same tolerance as above (L = tokens so far).
namespace cache_test {

// Query-aware key scaling (OSCAR.md §1): keys stored as (k − μ)·M_K, queries read as q·M_Q.
void add_key_scaling(kv::KvCacheSpec& spec, uint32_t seed) {
  const int d = spec.head_dim;
  const size_t heads = static_cast<size_t>(spec.n_layers) * spec.n_heads_kv;
  const std::vector<float> R = quant::hadamard_bitrev_rotation(d);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(0.5f, 2.0f);
  for (size_t i = 0; i < heads; ++i) {
    std::vector<float> w(d);
    for (float& x : w) x = uni(rng);
    const std::vector<float> mk = quant::scaled_rotation(R.data(), w.data(), d, false);
    const std::vector<float> mq = quant::scaled_rotation(R.data(), w.data(), d, true);
    spec.k_rotation.insert(spec.k_rotation.end(), mk.begin(), mk.end());
    spec.q_rotation.insert(spec.q_rotation.end(), mq.begin(), mq.end());
    for (int c = 0; c < d; ++c) spec.k_mean.push_back(uni(rng) - 1.25f);
  }
}

void grow_and_compare(quant::CacheMode mode, int group_size, uint32_t seed,
                      bool key_scaling = false, bool bit_plan = false) {
  kv::KvCacheSpec spec;
  spec.n_layers = 2;
  spec.n_heads_kv = 2;
  spec.head_dim = 64;
  spec.group_size = group_size;
  spec.regions.n_sink = 16;
  spec.regions.n_recent = 32;
  spec.regions.page_size = 8;
  spec.mode = mode;
  if (key_scaling) add_key_scaling(spec, seed + 100);
  if (bit_plan) {
    // Layer 1: head 0's keys at 3 bits, head 1's values at 1 bit; layer 0 the other way round.
    auto plan = kv::BitPlan::create(2, 2, 64, group_size, {2, 3, 3, 2}, {2, 1, 1, 2});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    spec.bit_plan = plan.value();
  }
  if (const int fixed = quant::cache_mode_fixed_bits(mode); fixed != 0) {  // oscar4, oscar3
    auto plan = kv::BitPlan::uniform(2, 2, 64, group_size, fixed);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    spec.bit_plan = plan.value();
    spec.k_clip.assign(4, 0.97f);
    spec.v_clip.assign(4, 0.99f);
  }
  const Status valid = spec.validate();
  ASSERT_TRUE(valid.ok()) << valid.to_string();
  const KvPageLayout L = spec.layout();
  kv::PagePool exact("exact", 64, L.exact_page_bytes());
  kv::PagePool int2("int2", 64, spec.quantized() ? L.int2_page_bytes() : 1);
  kv::SequenceCache cache(&spec, &exact, spec.quantized() ? &int2 : nullptr);
  kv::AttendScratch scratch;

  const int Hq = 4, Hkv = 2, d = 64;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  auto randv = [&](size_t n, float gain) {
    std::vector<float> x(n);
    for (float& e : x) e = gain * normal(rng);
    return x;
  };
  // A 5-token prefill (chunk path), then single-token steps (decode path).
  int64_t step_n = 5;
  while (cache.n_tokens() < 130) {
    ASSERT_TRUE(cache.reserve(step_n).ok());
    for (int layer = 0; layer < spec.n_layers; ++layer) {
      const auto k = randv(static_cast<size_t>(step_n) * Hkv * d, 1.f);
      const auto v = randv(k.size(), 1.f);
      const auto q = randv(static_cast<size_t>(step_n) * Hq * d, 1.5f);
      cache.write(layer, k.data(), v.data(), step_n);
      std::vector<float> out(q.size());
      ASSERT_TRUE(cache.attend(layer, q.data(), Hq, step_n, out.data(), kv::AttendMode::kPrefill,
                               scratch).ok());
      if (step_n != 1) continue;
      const int64_t T = cache.n_tokens() + 1;
      std::vector<float> row(d), qh(d);
      for (int h = 0; h < Hq; ++h) {
        const int g = h / (Hq / Hkv);
        // The query in the basis of the stored keys (what read_row returns).
        const float* M = spec.query_rotation(layer, g);
        for (int c = 0; c < d; ++c) {
          double a = 0;
          for (int r = 0; r < d; ++r) a += M ? static_cast<double>(q[h * d + r]) * M[r * d + c] : (r == c ? q[h * d + r] : 0.0);
          qh[c] = static_cast<float>(a);
        }
        std::vector<double> s(T), acc(d, 0.0);
        double m = -std::numeric_limits<double>::infinity(), l = 0, S = 0, vmax = 0;
        for (int64_t t = 0; t < T; ++t) {
          cache.read_row(layer, 0, g, t, row.data());
          double a = 0, aa = 0;
          for (int i = 0; i < d; ++i) {
            a += static_cast<double>(qh[i]) * row[i];
            aa += std::fabs(static_cast<double>(qh[i]) * row[i]);
          }
          s[t] = a * scale;
          S = std::max(S, aa * scale);
          m = std::max(m, s[t]);
        }
        for (int64_t t = 0; t < T; ++t) {
          cache.read_row(layer, 1, g, t, row.data());
          const double w = std::exp(s[t] - m);
          l += w;
          for (int i = 0; i < d; ++i) {
            acc[i] += w * row[i];
            vmax = std::max(vmax, std::fabs(static_cast<double>(row[i])));
          }
        }
        const double tol = vmax * kU * (2.0 * (d + 2) * S + 2.0 * T + 64);
        for (int i = 0; i < d; ++i)
          ASSERT_NEAR(out[h * d + i], acc[i] / l, tol)
              << quant::cache_mode_name(mode) << " G " << group_size << " token " << T - 1
              << " layer " << layer << " head " << h << " dim " << i << " (hist_end "
              << cache.hist_end() << ")";
      }
    }
    ASSERT_TRUE(cache.commit(step_n).ok());
    step_n = 1;
  }
  if (spec.quantized()) {
    EXPECT_GT(cache.bytes().history, 0);
  }
}

}  // namespace cache_test

TEST(DecodeAttnCache, SequenceCacheDecodeStepsMatchExactAttention) {
  cache_test::grow_and_compare(quant::CacheMode::kOscar, 32, 1);
  cache_test::grow_and_compare(quant::CacheMode::kOscarLloyd, 64, 2);
  cache_test::grow_and_compare(quant::CacheMode::kInt2Naive, 64, 3);
  cache_test::grow_and_compare(quant::CacheMode::kBF16, 64, 4);
  cache_test::grow_and_compare(quant::CacheMode::kF32, 64, 5);
  cache_test::grow_and_compare(quant::CacheMode::kOscar, 64, 6, /*key_scaling=*/true);
  cache_test::grow_and_compare(quant::CacheMode::kOscarLloyd, 32, 7, /*key_scaling=*/true);
  cache_test::grow_and_compare(quant::CacheMode::kOscar, 64, 8, /*key_scaling=*/true,
                               /*bit_plan=*/true);
  cache_test::grow_and_compare(quant::CacheMode::kInt2Naive, 32, 9, false, /*bit_plan=*/true);
  cache_test::grow_and_compare(quant::CacheMode::kOscar4, 64, 10, /*key_scaling=*/true);
  cache_test::grow_and_compare(quant::CacheMode::kOscar4, 32, 11);
  cache_test::grow_and_compare(quant::CacheMode::kOscar3, 64, 12, /*key_scaling=*/true);
}

// Key scaling changes what is stored, never what exact attention computes: an f32 cache with
// keys stored as (k − μ)·M_K and queries read as q·M_Q gives the plain f32 cache's outputs (the
// logits move by the per-query constant q·μ, which softmax removes), on the prefill and decode
// paths. Tolerance: outputs are O(1) averages of unit Gaussians; the transforms (w in [0.5, 2])
// add a few float roundings per logit, 1e-4 absolute is far above them.
TEST(DecodeAttnCache, KeyScalingKeepsExactAttention) {
  kv::KvCacheSpec plain;
  plain.n_layers = 2;
  plain.n_heads_kv = 2;
  plain.head_dim = 64;
  plain.regions.n_sink = 16;
  plain.regions.n_recent = 32;
  plain.regions.page_size = 8;
  plain.mode = quant::CacheMode::kF32;
  kv::KvCacheSpec scaled = plain;
  cache_test::add_key_scaling(scaled, 9);
  ASSERT_TRUE(scaled.validate().ok());
  const KvPageLayout L = plain.layout();
  kv::PagePool pool_a("a", 64, L.exact_page_bytes()), pool_b("b", 64, L.exact_page_bytes());
  kv::SequenceCache a(&plain, &pool_a, nullptr), b(&scaled, &pool_b, nullptr);
  kv::AttendScratch sa, sb;
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int Hq = 4, Hkv = 2, d = 64;
  int64_t n = 7;
  while (a.n_tokens() < 60) {
    ASSERT_TRUE(a.reserve(n).ok());
    ASSERT_TRUE(b.reserve(n).ok());
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<float> k(static_cast<size_t>(n) * Hkv * d), v(k.size()), q(static_cast<size_t>(n) * Hq * d);
      for (float& x : k) x = 1.0f + normal(rng);  // a real mean, so centring matters
      for (float& x : v) x = normal(rng);
      for (float& x : q) x = 1.5f * normal(rng);
      a.write(layer, k.data(), v.data(), n);
      b.write(layer, k.data(), v.data(), n);
      std::vector<float> oa(q.size()), ob(q.size());
      ASSERT_TRUE(a.attend(layer, q.data(), Hq, n, oa.data(), kv::AttendMode::kPrefill, sa).ok());
      ASSERT_TRUE(b.attend(layer, q.data(), Hq, n, ob.data(), kv::AttendMode::kPrefill, sb).ok());
      for (size_t i = 0; i < oa.size(); ++i)
        ASSERT_NEAR(ob[i], oa[i], 1e-4) << "tokens " << a.n_tokens() << " layer " << layer << " i " << i;
    }
    ASSERT_TRUE(a.commit(n).ok());
    ASSERT_TRUE(b.commit(n).ok());
    n = 1;
  }
}

}  // namespace
}  // namespace oscar::kernels
