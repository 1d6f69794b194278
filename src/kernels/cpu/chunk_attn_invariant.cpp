// Batch-invariant CPU chunk attention (ChunkAttnParams::batch_invariant): every value a query
// reads is computed the same way whatever chunk, block or thread it falls in, so a query's output
// does not depend on how its prompt was cut into chunks or on the other queries of the call.
//   scores  s[i, j] = one FMA chain over c = 0..head_dim-1 of q_i[c]·K[j, c] (keys in the 8
//           lanes; K transposed once per call, in groups of 16 keys), the dequantized or exact copy of key j as query
//           i reads it; four queries share each load of K;
//   softmax over j = 0..pos0+i: max, exp of 8 keys at a time (Eigen's packet exp), the sum in 8
//           lanes by j % 8 over ascending j and a fixed tree;
//   output  out_i = one FMA chain per element over ascending j of p_ij·V[j] (head_dim in lanes;
//           the same four queries, p = 0 past each one's last key, which leaves a chain as it is).
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
constexpr int kGroup = 2 * kLanes;  // keys per group of the transposed K
constexpr int kQueryBlock = 64;  // queries per task
constexpr int kQTile = 4;        // queries that share each load of K and V

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// s[a, j] (rows lds apart) for the NQ queries q[a] and j in [j0, j1) (multiples of kGroup): one
// FMA chain per (query, key) over c = 0..d-1 of q[a][c]·K[j, c]. kt: K in groups of kGroup keys,
// [n_groups, d, kGroup] (transpose_rows), so each group's loads are one contiguous run.
template <int NQ>
void scores(const float* const* q, int d, const float* kt, int64_t j0, int64_t j1, float* s,
            int64_t lds) {
  for (int64_t j = j0; j < j1; j += kGroup) {
    const float* kg = kt + j / kGroup * d * kGroup;
#ifdef OSCAR_CHUNK_AVX2
    __m256 acc[NQ][2];
    for (int a = 0; a < NQ; ++a) acc[a][0] = acc[a][1] = _mm256_setzero_ps();
    for (int c = 0; c < d; ++c) {
      const __m256 k0 = _mm256_loadu_ps(kg + c * kGroup);
      const __m256 k1 = _mm256_loadu_ps(kg + c * kGroup + kLanes);
      for (int a = 0; a < NQ; ++a) {
        const __m256 qa = _mm256_broadcast_ss(q[a] + c);
        acc[a][0] = _mm256_fmadd_ps(qa, k0, acc[a][0]);
        acc[a][1] = _mm256_fmadd_ps(qa, k1, acc[a][1]);
      }
    }
    for (int a = 0; a < NQ; ++a) {
      _mm256_storeu_ps(s + a * lds + j, acc[a][0]);
      _mm256_storeu_ps(s + a * lds + j + kLanes, acc[a][1]);
    }
#else
    for (int a = 0; a < NQ; ++a)
      for (int l = 0; l < kGroup; ++l) {
        float acc = 0.f;
        for (int c = 0; c < d; ++c) acc += q[a][c] * kg[c * kGroup + l];
        s[a * lds + j + l] = acc;
      }
#endif
  }
}

// o[a][c] = Σ_{j < n} p[a, j]·row_of(a, j)[c], j ascending (one FMA chain per element), for the
// NQ queries; p rows lds apart, 0 past a query's last key (fma(0, v, acc) == acc).
template <int NQ, class RowOf>
void values(const float* p, int64_t lds, int64_t n, int d, RowOf&& row_of, float* const* o) {
  for (int c0 = 0; c0 < d; c0 += 2 * kLanes) {
    const int w = std::min(2 * kLanes, d - c0);
#ifdef OSCAR_CHUNK_AVX2
    if (w == 2 * kLanes) {
      __m256 acc[NQ][2];
      for (int a = 0; a < NQ; ++a) acc[a][0] = acc[a][1] = _mm256_setzero_ps();
      for (int64_t j = 0; j < n; ++j)
        for (int a = 0; a < NQ; ++a) {
          const float* v = row_of(a, j) + c0;
          const __m256 pa = _mm256_broadcast_ss(p + a * lds + j);
          acc[a][0] = _mm256_fmadd_ps(pa, _mm256_loadu_ps(v), acc[a][0]);
          acc[a][1] = _mm256_fmadd_ps(pa, _mm256_loadu_ps(v + kLanes), acc[a][1]);
        }
      for (int a = 0; a < NQ; ++a) {
        _mm256_storeu_ps(o[a] + c0, acc[a][0]);
        _mm256_storeu_ps(o[a] + c0 + kLanes, acc[a][1]);
      }
      continue;
    }
#endif
    for (int a = 0; a < NQ; ++a)
      for (int c = c0; c < c0 + w; ++c) o[a][c] = 0.f;
    for (int64_t j = 0; j < n; ++j)
      for (int a = 0; a < NQ; ++a) {
        const float* v = row_of(a, j);
        for (int c = c0; c < c0 + w; ++c) o[a][c] = std::fma(p[a * lds + j], v[c], o[a][c]);
      }
  }
}

// [n_heads_kv, ld_keys, d] rows [j0, j1) of KV head g -> its [ldt / kGroup, d, kGroup] groups
// in dst ([n_heads_kv, ...], ldt keys per head; other keys untouched).
void transpose_rows(const float* src, int64_t ld_keys, int d, int64_t j0, int64_t j1, int64_t ldt,
                    int g, float* dst) {
  const float* s = src + static_cast<int64_t>(g) * ld_keys * d;
  float* t = dst + static_cast<int64_t>(g) * d * ldt;
  for (int64_t j = j0; j < j1; ++j)
    for (int c = 0; c < d; ++c) t[(j / kGroup * d + c) * kGroup + j % kGroup] = s[j * d + c];
}

}  // namespace

Status chunk_attn_invariant(const ChunkAttnParams& p) {
  if (p.n_queries == 0) return Status();
  const int d = p.head_dim, H = p.n_heads_kv;
  const int gqa = p.n_heads_q / H;
  const int64_t n_keys = static_cast<int64_t>(p.pos0) + p.n_queries;
  const int64_t ldt = round_up(n_keys, kGroup);
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
    // Scores of a tile of queries: [kQTile, ldt] read exactly, and dequantized.
    std::vector<float> s_ex(static_cast<size_t>(kQTile) * ldt);
    std::vector<float> s_deq(has_deq ? s_ex.size() : 0);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int blk = n_blocks - 1 - task / p.n_heads_q;  // later blocks are longer: first
      const int h = task % p.n_heads_q;
      const int g = h / gqa;
      const float* kt_e = kt_ex.data() + static_cast<int64_t>(g) * d * ldt;
      const float* kt_d = has_deq ? kt_deq.data() + static_cast<int64_t>(g) * d * ldt : nullptr;
      const int64_t head_off = static_cast<int64_t>(g) * p.ld_keys * d;
      const float* v_ex = p.v_exact + head_off;
      const float* v_dq = has_deq ? p.v_deq + head_off : nullptr;
      const int qa = blk * kQueryBlock, qb = std::min(p.n_queries, qa + kQueryBlock);
      for (int i0 = qa; i0 < qb; i0 += kQTile) {
        const int nq = std::min(kQTile, qb - i0);
        const float* q[kQTile];
        float* out[kQTile];
        int64_t n_vis[kQTile], de[kQTile];  // keys [0, n_vis); dequantized [n_sink, de)
        int64_t ex_lo = ldt, de_hi = 0;     // exact groups from ex_lo; dequantized up to de_hi
        for (int a = 0; a < nq; ++a) {
          const int64_t row = static_cast<int64_t>(i0 + a) * p.n_heads_q + h;
          q[a] = p.q + row * d;
          out[a] = p.out + row * d;
          n_vis[a] = static_cast<int64_t>(p.pos0) + i0 + a + 1;
          de[a] = kt_d != nullptr ? std::clamp<int64_t>(p.deq_end[i0 + a], n_sink, n_vis[a]) : n_sink;
          ex_lo = std::min(ex_lo, de[a] > n_sink ? de[a] / kGroup * kGroup : 0);
          de_hi = std::max(de_hi, de[a]);
        }
        const int64_t n8 = round_up(n_vis[nq - 1], kLanes);  // the tile's last query sees most
        const int64_t n16 = round_up(n8, kGroup);
        // Each lane's chain is the same whichever group range or tile computes it: the ranges
        // only skip groups no query of the tile reads from that copy.
        auto run_scores = [&](auto nqc) {
          constexpr int NQ = decltype(nqc)::value;
          const int64_t sink16 = std::min(n16, round_up(n_sink, kGroup));
          if (ex_lo > sink16) {  // the sinks, then the exact keys past the dequantized zone
            scores<NQ>(q, d, kt_e, 0, sink16, s_ex.data(), ldt);
            scores<NQ>(q, d, kt_e, ex_lo, n16, s_ex.data(), ldt);
          } else {
            scores<NQ>(q, d, kt_e, 0, n16, s_ex.data(), ldt);
          }
          if (de_hi > n_sink)
            scores<NQ>(q, d, kt_d, n_sink / kGroup * kGroup, round_up(de_hi, kGroup),
                       s_deq.data(), ldt);
        };
        switch (nq) {
          case 1: run_scores(std::integral_constant<int, 1>{}); break;
          case 2: run_scores(std::integral_constant<int, 2>{}); break;
          case 3: run_scores(std::integral_constant<int, 3>{}); break;
          default: run_scores(std::integral_constant<int, 4>{}); break;
        }
        for (int a = 0; a < nq; ++a) {
          float* s = s_ex.data() + a * ldt;
          if (de[a] > n_sink)
            std::copy(s_deq.begin() + a * ldt + n_sink, s_deq.begin() + a * ldt + de[a], s + n_sink);
          float m = neg_inf;
          for (int64_t j = 0; j < n_vis[a]; ++j) m = std::max(m, s[j] *= p.scale);
          Eigen::Array<float, kLanes, 1> lanes = Eigen::Array<float, kLanes, 1>::Zero();
          const int64_t na8 = round_up(n_vis[a], kLanes);
          for (int64_t j = 0; j < na8; j += kLanes) {
            Eigen::Map<Eigen::Array<float, kLanes, 1>> e(s + j);
            e = (e - m).exp();
            for (int64_t k = std::max(j, n_vis[a]); k < j + kLanes; ++k) s[k] = 0.f;  // masked
            lanes += e;
          }
          std::fill(s + na8, s + n8, 0.f);  // keys only later queries of the tile see
          const float l = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                          ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
          const float inv = 1.f / l;
          for (int64_t j = 0; j < n_vis[a]; ++j) s[j] *= inv;
        }
        auto row_of = [&](int a, int64_t j) {
          return (j >= n_sink && j < de[a] ? v_dq : v_ex) + j * d;
        };
        const int64_t n = n_vis[nq - 1];
        switch (nq) {
          case 1: values<1>(s_ex.data(), ldt, n, d, row_of, out); break;
          case 2: values<2>(s_ex.data(), ldt, n, d, row_of, out); break;
          case 3: values<3>(s_ex.data(), ldt, n, d, row_of, out); break;
          default: values<4>(s_ex.data(), ldt, n, d, row_of, out); break;
        }
      }
    }
  }
  return Status();
}

}  // namespace oscar::kernels
