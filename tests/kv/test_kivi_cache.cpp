// kv::SequenceCache in kivi2 mode (KIVI-style baseline, OSCAR.md §8; quant/kivi.h): the paged
// cache must hold exactly what the KIVI reference quantizers make of the same rows.
//
// A shadow copy of every K/V row written (rounded to bf16, as the exact pages store them) gives
// the expected cache: sinks and recent rows exact; history keys = dequantize(quantize) of each
// complete 32-token block per channel; history values = per-token INT2 rows with groups of 32.
//   - read_row() equals that shadow bit for bit (same quantizers, same inputs);
//   - attend() (prefill, decode-equivalent and single-token decode) equals chunk_attn_ref over the
//     shadow, with the tolerance of tests/kernels/test_chunk_attn.cpp (float accumulation against
//     float64): tol = Vmax·u·(2·(d + 2)·S + 2·L + 64), S = max_j Σ|q·k_j|·scale, u = 2^-24;
//   - the history costs exactly 3.0 bits per element (head_dim 128).
// Seeded normal inputs; keys get a per-channel offset (KIVI's motivating outlier channels).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "kernels/chunk_attn.h"
#include "kv/sequence_cache.h"
#include "quant/kivi.h"

namespace oscar::kv {
namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr int kBlock = quant::kKiviKeyBlockTokens;

KvCacheSpec kivi_spec(int head_dim, int page_size, int n_sink, int n_recent) {
  KvCacheSpec spec;
  spec.n_layers = 2;
  spec.n_heads_kv = 2;
  spec.head_dim = head_dim;
  spec.regions.page_size = page_size;
  spec.regions.n_sink = n_sink;
  spec.regions.n_recent = n_recent;
  spec.mode = quant::CacheMode::kKivi2;
  return spec;
}

// The cache under test plus the shadow of what was written: rows[layer][kv] is
// [n_heads_kv, capacity, head_dim], bf16-rounded.
class KiviHarness {
 public:
  KiviHarness(const KvCacheSpec& spec, int capacity, uint32_t seed)
      : spec_(spec),
        layout_(spec_.layout()),
        exact_("bf16", 64, layout_.exact_page_bytes()),
        int2_("int2", 64, layout_.int2_page_bytes()),
        cache_(&spec_, &exact_, &int2_),
        cap_(capacity),
        rng_(seed) {
    rows_.assign(static_cast<size_t>(spec_.n_layers) * 2,
                 std::vector<float>(static_cast<size_t>(spec_.n_heads_kv) * cap_ * spec_.head_dim));
    channel_offset_.resize(spec_.head_dim);
    for (float& o : channel_offset_) o = 4.f * normal_(rng_);
  }

  SequenceCache& cache() { return cache_; }
  const KvCacheSpec& spec() const { return spec_; }

  float* row(int layer, int kv, int head, int64_t pos) {
    return rows_[layer * 2 + kv].data() +
           (static_cast<size_t>(head) * cap_ + pos) * spec_.head_dim;
  }

  // reserve(n), write random K/V for every layer (recorded in the shadow). Queries are returned
  // per layer: [n_layers][n, n_heads_q, head_dim].
  std::vector<std::vector<float>> stage(int64_t n, int n_heads_q) {
    const int H = spec_.n_heads_kv, d = spec_.head_dim;
    const int64_t pos0 = cache_.n_tokens();
    EXPECT_LE(pos0 + n, cap_);
    const Status st = cache_.reserve(n);
    EXPECT_TRUE(st.ok()) << st.to_string();
    std::vector<std::vector<float>> qs;
    for (int layer = 0; layer < spec_.n_layers; ++layer) {
      std::vector<float> k(static_cast<size_t>(n) * H * d), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = normal_(rng_) + channel_offset_[i % d];
        v[i] = normal_(rng_);
      }
      for (int64_t i = 0; i < n; ++i)
        for (int h = 0; h < H; ++h)
          for (int c = 0; c < d; ++c) {
            row(layer, 0, h, pos0 + i)[c] = round_to_bf16(k[(i * H + h) * d + c]);
            row(layer, 1, h, pos0 + i)[c] = round_to_bf16(v[(i * H + h) * d + c]);
          }
      cache_.write(layer, k.data(), v.data(), n);
      std::vector<float> q(static_cast<size_t>(n) * n_heads_q * d);
      for (float& e : q) e = 0.3f * normal_(rng_);
      qs.push_back(std::move(q));
    }
    return qs;
  }

  // The shadow as attention should see it: exact rows, and the KIVI dequantization of every
  // complete block [n_sink + 32b, n_sink + 32b + 32) below deq_limit. Fills [H, n_keys, d].
  void expected(int layer, int64_t n_keys, int64_t deq_limit, std::vector<float>* k_ex,
                std::vector<float>* v_ex, std::vector<float>* k_dq, std::vector<float>* v_dq) {
    const int H = spec_.n_heads_kv, d = spec_.head_dim;
    const size_t plane = static_cast<size_t>(n_keys) * d;
    for (auto* m : {k_ex, v_ex, k_dq, v_dq}) m->assign(plane * H, 0.f);
    std::vector<uint8_t> kblock(quant::kivi_key_block_bytes(d));
    std::vector<uint8_t> vrow(quant::kivi_value_row_bytes(d));
    for (int h = 0; h < H; ++h) {
      for (int64_t j = 0; j < n_keys; ++j) {
        std::copy_n(row(layer, 0, h, j), d, k_ex->data() + h * plane + j * d);
        std::copy_n(row(layer, 1, h, j), d, v_ex->data() + h * plane + j * d);
      }
      for (int64_t j = spec_.regions.n_sink; j + kBlock <= deq_limit; j += kBlock) {
        ASSERT_TRUE(quant::quantize_kivi_key_block_ref(k_ex->data() + h * plane + j * d, d,
                                                       kblock.data()).ok());
        quant::dequantize_kivi_key_block_ref(kblock.data(), d, k_dq->data() + h * plane + j * d);
        for (int t = 0; t < kBlock; ++t) {
          ASSERT_TRUE(quant::quantize_kivi_value_row_ref(
                          v_ex->data() + h * plane + (j + t) * d, d, vrow.data()).ok());
          quant::dequantize_kivi_value_row_ref(vrow.data(), d,
                                               v_dq->data() + h * plane + (j + t) * d);
        }
      }
    }
  }

  // read_row() of every committed and staged token equals the shadow (bit for bit).
  void check_rows() {
    const int H = spec_.n_heads_kv, d = spec_.head_dim;
    const int64_t n = cache_.n_tokens();
    const int64_t hist_end = cache_.hist_end();
    std::vector<float> k_ex, v_ex, k_dq, v_dq, got(d);
    for (int layer = 0; layer < spec_.n_layers; ++layer) {
      expected(layer, n, hist_end, &k_ex, &v_ex, &k_dq, &v_dq);
      const size_t plane = static_cast<size_t>(n) * d;
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < H; ++h)
          for (int64_t j = 0; j < n; ++j) {
            cache_.read_row(layer, kv, h, j, got.data());
            const bool hist = j >= spec_.regions.n_sink && j < hist_end;
            const std::vector<float>& want =
                hist ? (kv == 0 ? k_dq : v_dq) : (kv == 0 ? k_ex : v_ex);
            for (int c = 0; c < d; ++c)
              ASSERT_EQ(got[c], want[h * plane + j * d + c])
                  << "layer " << layer << (kv == 0 ? " K" : " V") << " head " << h << " token "
                  << j << " channel " << c << " (hist_end " << hist_end << ")";
          }
    }
  }

 private:
  KvCacheSpec spec_;
  kernels::KvPageLayout layout_;
  PagePool exact_, int2_;
  SequenceCache cache_;
  int64_t cap_;
  std::mt19937 rng_;
  std::normal_distribution<float> normal_{0.f, 1.f};
  std::vector<std::vector<float>> rows_;
  std::vector<float> channel_offset_;
};

// attend() of the staged queries against chunk_attn_ref over the shadow.
void check_attend(KiviHarness& hz, const std::vector<std::vector<float>>& qs, int n_heads_q,
                  int64_t n, AttendMode mode) {
  SequenceCache& cache = hz.cache();
  const KvCacheSpec& spec = hz.spec();
  const int H = spec.n_heads_kv, d = spec.head_dim;
  const int64_t pos0 = cache.n_tokens(), n_keys = pos0 + n;
  std::vector<int32_t> deq_end(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t b = cache.hist_end();
    if (mode == AttendMode::kDecodeEquivalent)
      b = std::max(b, history_end(spec.regions, pos0 + i));
    deq_end[i] = static_cast<int32_t>(b);
  }
  AttendScratch scratch;
  std::vector<float> k_ex, v_ex, k_dq, v_dq;
  for (int layer = 0; layer < spec.n_layers; ++layer) {
    const std::vector<float>& q = qs[layer];
    std::vector<float> got(q.size()), want(q.size());
    const Status st = cache.attend(layer, q.data(), n_heads_q, n, got.data(), mode, scratch);
    ASSERT_TRUE(st.ok()) << st.to_string();
    hz.expected(layer, n_keys, deq_end[n - 1], &k_ex, &v_ex, &k_dq, &v_dq);
    kernels::ChunkAttnParams p;
    p.n_queries = static_cast<int32_t>(n);
    p.n_heads_q = n_heads_q;
    p.n_heads_kv = H;
    p.head_dim = d;
    p.pos0 = static_cast<int32_t>(pos0);
    p.n_sink = spec.regions.n_sink;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    p.q = q.data();
    p.k_exact = k_ex.data();
    p.v_exact = v_ex.data();
    p.k_deq = k_dq.data();
    p.v_deq = v_dq.data();
    p.ld_keys = n_keys;
    p.deq_end = deq_end.data();
    p.out = want.data();
    ASSERT_TRUE(kernels::chunk_attn_ref(p).ok());
    // Tolerance (file comment): S and Vmax over everything the query may read.
    double vmax = 0;
    for (size_t i = 0; i < v_ex.size(); ++i)
      vmax = std::max({vmax, std::fabs(static_cast<double>(v_ex[i])),
                       std::fabs(static_cast<double>(v_dq[i]))});
    const size_t plane = static_cast<size_t>(n_keys) * d;
    for (int64_t i = 0; i < n; ++i)
      for (int hq = 0; hq < n_heads_q; ++hq) {
        const int g = hq / (n_heads_q / H);
        const float* qi = q.data() + (i * n_heads_q + hq) * d;
        double S = 0;
        for (int64_t j = 0; j <= pos0 + i; ++j)
          for (const auto* km : {&k_ex, &k_dq}) {
            double a = 0;
            for (int c = 0; c < d; ++c) a += std::fabs(qi[c] * (*km)[g * plane + j * d + c]);
            S = std::max(S, a * p.scale);
          }
        const double tol = vmax * kU * (2.0 * (d + 2) * S + 2.0 * (pos0 + i + 1) + 64);
        for (int c = 0; c < d; ++c) {
          const size_t o = (i * n_heads_q + hq) * d + c;
          ASSERT_NEAR(got[o], want[o], tol)
              << "layer " << layer << " query " << pos0 + i << " head " << hq << " dim " << c
              << " hist_end " << cache.hist_end() << " deq_end " << deq_end[i];
        }
      }
  }
}

// quant::dequantize_kivi_key_token (what read_row uses) is row t of the block reference, bit for
// bit, including constant channels (scale 0).
TEST(KiviCache, KeyTokenDequantizationIsTheBlockReferenceRow) {
  const int d = 128;
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> k(static_cast<size_t>(kBlock) * d), block_deq(k.size()), row(d);
  for (size_t i = 0; i < k.size(); ++i) k[i] = (i % d == 5) ? 0.75f : 3.f * normal(rng);
  std::vector<uint8_t> block(quant::kivi_key_block_bytes(d));
  ASSERT_TRUE(quant::quantize_kivi_key_block_ref(k.data(), d, block.data()).ok());
  quant::dequantize_kivi_key_block_ref(block.data(), d, block_deq.data());
  for (int t = 0; t < kBlock; ++t) {
    quant::dequantize_kivi_key_token(block.data(), d, t, row.data());
    for (int c = 0; c < d; ++c) ASSERT_EQ(row[c], block_deq[t * d + c]) << "token " << t << " ch " << c;
  }
  EXPECT_EQ(block_deq[5], 0.75f);  // constant channel reproduced exactly
}

TEST(KiviCache, ValidateNeedsWholeKeyBlocksAndNoRotation) {
  EXPECT_TRUE(kivi_spec(128, 32, 64, 256).validate().ok());
  EXPECT_TRUE(kivi_spec(64, 64, 64, 128).validate().ok());
  const Status small_page = kivi_spec(128, 16, 64, 256).validate();
  EXPECT_EQ(small_page.code(), StatusCode::kInvalidArgument) << small_page.to_string();
  EXPECT_NE(small_page.to_string().find("page_size"), std::string::npos) << small_page.to_string();
  EXPECT_FALSE(kivi_spec(48, 32, 64, 256).validate().ok());  // head_dim not a multiple of 32
  KvCacheSpec rotated = kivi_spec(128, 32, 64, 256);
  rotated.k_clip.assign(4, 0.9f);
  EXPECT_FALSE(rotated.validate().ok());
  // The history pool's pages: 3·head_dim/8 bytes per token per (layer, K/V, head).
  EXPECT_EQ(kivi_spec(128, 32, 64, 256).layout().int2_page_bytes(),
            static_cast<size_t>(2) * 2 * 2 * 32 * 48);
}

// Token by token: read_row after every commit; decode attention (n == 1, the chunk_attn path in
// kivi2) at every step.
TEST(KiviCache, TokenByTokenRowsAndDecodeMatchKiviReference) {
  const KvCacheSpec spec = kivi_spec(64, 32, 32, 32);
  KiviHarness hz(spec, 260, 11);
  const int Hq = 4;
  while (hz.cache().n_tokens() < 224) {
    const auto qs = hz.stage(1, Hq);
    check_attend(hz, qs, Hq, 1, AttendMode::kPrefill);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(hz.cache().commit(1).ok());
    if (hz.cache().n_tokens() % 8 == 0) {
      hz.check_rows();
      if (HasFatalFailure()) return;
    }
  }
  // 224 tokens: history_end = 32 + 32·floor((224 - 32 - 32) / 32): history [32, 192) = 5
  // blocks, recent [192, 224).
  EXPECT_EQ(hz.cache().hist_end(), 192);
}

// Chunks of uneven sizes (prefill, then decode-equivalent evaluation chunks): read_row after each
// commit, attention of every chunk in both attend modes.
TEST(KiviCache, ChunksRowsAndDecodeEquivalentAttentionMatchKiviReference) {
  const KvCacheSpec spec = kivi_spec(128, 64, 64, 128);
  KiviHarness hz(spec, 1100, 12);
  const int Hq = 4;
  const int64_t sizes[] = {100, 37, 1, 150, 64, 7, 200, 33, 1, 129, 250};
  bool eval = false;
  for (int64_t n : sizes) {
    const auto qs = hz.stage(n, Hq);
    check_attend(hz, qs, Hq, n, eval ? AttendMode::kDecodeEquivalent : AttendMode::kPrefill);
    if (HasFatalFailure()) return;
    if (n > 1 && !eval) {
      // Same staged chunk through the other mode too.
      check_attend(hz, qs, Hq, n, AttendMode::kDecodeEquivalent);
      if (HasFatalFailure()) return;
    }
    ASSERT_TRUE(hz.cache().commit(n).ok());
    hz.check_rows();
    if (HasFatalFailure()) return;
    eval = !eval;
  }
  EXPECT_GT(hz.cache().hist_end(), spec.regions.n_sink + 512);
}

// BPE of the history region alone (OSCAR.md §2 formula restricted to the INT2 region): bytes × 8
// / (2 · tokens · layers · kv heads · head_dim) = 3.0 exactly for head_dim 128.
TEST(KiviCache, HistoryCostsThreeBitsPerElement) {
  const KvCacheSpec spec = kivi_spec(128, 32, 64, 256);
  KiviHarness hz(spec, 1024, 13);
  hz.stage(1000, 4);
  ASSERT_TRUE(hz.cache().commit(1000).ok());
  const int64_t hist_tokens = hz.cache().hist_end() - spec.regions.n_sink;
  ASSERT_EQ(hist_tokens, 672);  // history_end(1000) = 64 + 32·floor((1000 - 64 - 256) / 32)
  const CacheBytes b = hz.cache().bytes();
  const double bits = 8.0 * static_cast<double>(b.history) /
                      (2.0 * hist_tokens * spec.n_layers * spec.n_heads_kv * spec.head_dim);
  EXPECT_EQ(bits, 3.0);
  EXPECT_EQ(b.history, hist_tokens * spec.n_layers * 2 * spec.n_heads_kv *
                           (quant::kivi_key_block_bytes(128) / kBlock));
}

}  // namespace
}  // namespace oscar::kv
