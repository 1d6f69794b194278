// Batch-invariant CPU chunk attention (ChunkAttnParams::batch_invariant): every value a query
// reads is computed the same way whatever chunk, block or thread it falls in, so a query's output
// does not depend on how its prompt was cut into chunks or on the other queries of the call.
//   scores  s[i, j] = one FMA chain over c = 0..head_dim-1 of q_i[c]·K[j, c] (keys in the 8
//           lanes; K transposed once per call), the dequantized or exact copy of key j as query
//           i reads it;
//   softmax over j = 0..pos0+i: max, exp of 8 keys at a time (Eigen's packet exp), the sum in 8
//           lanes by j % 8 over ascending j and a fixed tree;
//   output  out_i = one FMA chain per element over ascending j of p_ij·V[j] (head_dim in lanes).
// The Eigen path (chunk_attn.cpp) is faster; its products' and softmax's summation orders
// depend on the query block.
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define OSCAR_CHUNK_AVX2 1
#endif

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/chunk_attn.h"

namespace oscar::kernels {

namespace {

constexpr int kLanes = 8;
constexpr int kQueryBlock = 64;
constexpr int kKeyTile = 64;  // keys per pass of the score kernel: 8 accumulators
constexpr int kDimTile = 64;  // output elements per pass of the value kernel

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// s[j] for j in [j0, j1) (multiples of 8) = Σ_c q[c]·kt[c, j], c ascending. kt: [d, ldt].
void scores(const float* q, int d, const float* kt, int64_t ldt, int64_t j0, int64_t j1, float* s) {
  for (int64_t j = j0; j < j1; j += kKeyTile) {
    const int nv = static_cast<int>(std::min<int64_t>(kKeyTile, j1 - j) / kLanes);
#ifdef OSCAR_CHUNK_AVX2
    __m256 acc[kKeyTile / kLanes];
    for (int v = 0; v < nv; ++v) acc[v] = _mm256_setzero_ps();
    for (int c = 0; c < d; ++c) {
      const __m256 qc = _mm256_set1_ps(q[c]);
      const float* row = kt + c * ldt + j;
      for (int v = 0; v < nv; ++v)
        acc[v] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(row + v * kLanes), acc[v]);
    }
    for (int v = 0; v < nv; ++v) _mm256_storeu_ps(s + j + v * kLanes, acc[v]);
#else
    float acc[kKeyTile] = {};
    for (int c = 0; c < d; ++c)
      for (int l = 0; l < nv * kLanes; ++l) acc[l] += q[c] * kt[c * ldt + j + l];
    for (int l = 0; l < nv * kLanes; ++l) s[j + l] = acc[l];
#endif
  }
}

// o[c] = Σ_{j < n} p[j]·v_j[c], j ascending, v_j the row query i reads (exact or dequantized).
template <class RowOf>
void values(const float* p, int64_t n, int d, RowOf&& row_of, float* o) {
  for (int c0 = 0; c0 < d; c0 += kDimTile) {
    const int w = std::min(kDimTile, d - c0);
#ifdef OSCAR_CHUNK_AVX2
    if (w == kDimTile) {
      __m256 acc[kDimTile / kLanes];
      for (__m256& a : acc) a = _mm256_setzero_ps();
      for (int64_t j = 0; j < n; ++j) {
        const __m256 pj = _mm256_set1_ps(p[j]);
        const float* v = row_of(j) + c0;
        for (int l = 0; l < kDimTile / kLanes; ++l)
          acc[l] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + l * kLanes), acc[l]);
      }
      for (int l = 0; l < kDimTile / kLanes; ++l) _mm256_storeu_ps(o + c0 + l * kLanes, acc[l]);
      continue;
    }
#endif
    for (int c = c0; c < c0 + w; ++c) o[c] = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      const float* v = row_of(j);
      for (int c = c0; c < c0 + w; ++c) o[c] = std::fma(p[j], v[c], o[c]);
    }
  }
}

// [n_heads_kv, ld_keys, d] rows [j0, j1) -> [n_heads_kv, d, ldt] (other columns untouched).
void transpose_rows(const float* src, int64_t ld_keys, int d, int64_t j0, int64_t j1, int64_t ldt,
                    int g, float* dst) {
  const float* s = src + static_cast<int64_t>(g) * ld_keys * d;
  float* t = dst + static_cast<int64_t>(g) * d * ldt;
  for (int64_t j = j0; j < j1; ++j)
    for (int c = 0; c < d; ++c) t[c * ldt + j] = s[j * d + c];
}

}  // namespace

Status chunk_attn_invariant(const ChunkAttnParams& p) {
  if (p.n_queries == 0) return Status();
  const int d = p.head_dim, H = p.n_heads_kv;
  const int gqa = p.n_heads_q / H;
  const int64_t n_keys = static_cast<int64_t>(p.pos0) + p.n_queries;
  const int64_t ldt = round_up(n_keys, kLanes);
  const int64_t n_sink = std::min<int64_t>(p.n_sink, n_keys);
  // Keys read exactly: [0, n_sink) and [deq_end[0], n_keys); dequantized: [n_sink, deq_end[last]).
  const int64_t ex_from = std::min<int64_t>(std::max<int64_t>(p.n_sink, p.deq_end[0]), n_keys);
  const int64_t deq_to = std::min<int64_t>(p.deq_end[p.n_queries - 1], n_keys);
  const bool has_deq = deq_to > n_sink;
  // Zero-filled, so that the padding and the rows a copy does not hold score 0.
  std::vector<float> kt_ex(static_cast<size_t>(H) * d * ldt, 0.f);
  std::vector<float> kt_deq(has_deq ? kt_ex.size() : 0, 0.f);
  const int n_blocks = (p.n_queries + kQueryBlock - 1) / kQueryBlock;
  const int n_tasks = n_blocks * p.n_heads_q;
  const float neg_inf = -std::numeric_limits<float>::infinity();

#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int g = 0; g < H; ++g) {
      transpose_rows(p.k_exact, p.ld_keys, d, 0, n_sink, ldt, g, kt_ex.data());
      transpose_rows(p.k_exact, p.ld_keys, d, ex_from, n_keys, ldt, g, kt_ex.data());
      if (has_deq) transpose_rows(p.k_deq, p.ld_keys, d, n_sink, deq_to, ldt, g, kt_deq.data());
    }
    std::vector<float> s_ex(static_cast<size_t>(ldt)), s_deq(static_cast<size_t>(ldt));
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int blk = n_blocks - 1 - task / p.n_heads_q;  // later blocks are longer: first
      const int h = task % p.n_heads_q;
      const int g = h / gqa;
      const float* kt_e = kt_ex.data() + static_cast<int64_t>(g) * d * ldt;
      const float* kt_d = has_deq ? kt_deq.data() + static_cast<int64_t>(g) * d * ldt : nullptr;
      const int64_t head_off = static_cast<int64_t>(g) * p.ld_keys * d;
      const int qa = blk * kQueryBlock, qb = std::min(p.n_queries, qa + kQueryBlock);
      for (int i = qa; i < qb; ++i) {
        const int64_t t = static_cast<int64_t>(p.pos0) + i;  // the query sees keys [0, t]
        const int64_t de = std::min<int64_t>(p.deq_end[i], t + 1);
        const int64_t n_vis = t + 1, n8 = round_up(n_vis, kLanes);
        const float* q = p.q + (static_cast<int64_t>(i) * p.n_heads_q + h) * d;
        // Each lane's chain is the same whichever group range computes it: the ranges only skip
        // the groups a query does not read from that copy.
        const bool reads_deq = kt_d != nullptr && de > n_sink;
        if (!reads_deq) {
          scores(q, d, kt_e, ldt, 0, n8, s_ex.data());
        } else {
          scores(q, d, kt_e, ldt, 0, std::min(n8, round_up(n_sink, kLanes)), s_ex.data());
          scores(q, d, kt_e, ldt, de / kLanes * kLanes, n8, s_ex.data());
          scores(q, d, kt_d, ldt, n_sink / kLanes * kLanes, round_up(de, kLanes), s_deq.data());
        }
        float* s = s_ex.data();
        if (reads_deq) std::copy(s_deq.begin() + n_sink, s_deq.begin() + de, s + n_sink);
        float m = neg_inf;
        for (int64_t j = 0; j < n_vis; ++j) m = std::max(m, s[j] *= p.scale);
        Eigen::Array<float, kLanes, 1> lanes = Eigen::Array<float, kLanes, 1>::Zero();
        for (int64_t j = 0; j < n8; j += kLanes) {
          Eigen::Map<Eigen::Array<float, kLanes, 1>> e(s + j);
          e = (e - m).exp();
          for (int64_t k = std::max(j, n_vis); k < j + kLanes; ++k) s[k] = 0.f;  // masked keys
          lanes += e;
        }
        const float l = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                        ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        const float inv = 1.f / l;
        for (int64_t j = 0; j < n_vis; ++j) s[j] *= inv;
        const float* v_ex = p.v_exact + head_off;
        const float* v_dq = reads_deq ? p.v_deq + head_off : nullptr;
        values(s, n_vis, d,
               [&](int64_t j) {
                 return (j >= n_sink && j < de ? v_dq : v_ex) + j * d;
               },
               p.out + (static_cast<int64_t>(i) * p.n_heads_q + h) * d);
      }
    }
  }
  return Status();
}

}  // namespace oscar::kernels
