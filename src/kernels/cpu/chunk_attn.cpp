// Fast CPU chunk attention: for each (query head, block of 64 queries) three matrix products
// (sinks, dequantized zone, exact zone) give the scores, a masked softmax selects per query which
// copy of each key it reads, and three more products accumulate the values. The overlap of the
// dequantized and exact zones (a page or so per block) is computed twice; everything else once.
#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/chunk_attn.h"

namespace oscar::kernels {

Status validate_chunk_attn(const ChunkAttnParams& p);
Status chunk_attn_invariant(const ChunkAttnParams& p);  // cpu/chunk_attn_invariant.cpp

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstStrided = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using Strided = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;

constexpr int kQueryBlock = 64;

struct Zone {
  int64_t begin = 0, end = 0;  // key range [begin, end)
  int64_t size() const { return std::max<int64_t>(0, end - begin); }
};

}  // namespace

Status chunk_attn(const ChunkAttnParams& p) {
  OSCAR_RETURN_IF_ERROR(validate_chunk_attn(p));
  if (p.batch_invariant) return chunk_attn_invariant(p);
  const int d = p.head_dim;
  const int gqa = p.n_heads_q / p.n_heads_kv;
  const int n_blocks = (p.n_queries + kQueryBlock - 1) / kQueryBlock;
  const int n_tasks = n_blocks * p.n_heads_q;
  const float neg_inf = -std::numeric_limits<float>::infinity();

#pragma omp parallel
  {
    RowMat s_sink, s_deq, s_ex, o;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      // Later blocks are longer: hand them out first.
      const int blk = n_blocks - 1 - task / p.n_heads_q;
      const int h = task % p.n_heads_q;
      const int g = h / gqa;
      const int qa = blk * kQueryBlock;
      const int qb = std::min(p.n_queries, qa + kQueryBlock);
      const int nq = qb - qa;
      const int64_t n_keys = static_cast<int64_t>(p.pos0) + qb;

      Zone sink{0, std::min<int64_t>(p.n_sink, n_keys)};
      Zone deq{p.n_sink, std::min<int64_t>(p.deq_end[qb - 1], n_keys)};
      Zone ex{std::min<int64_t>(std::max(p.n_sink, p.deq_end[qa]), n_keys), n_keys};

      ConstStrided q(p.q + (static_cast<int64_t>(qa) * p.n_heads_q + h) * d, nq, d,
                     Eigen::OuterStride<>(static_cast<int64_t>(p.n_heads_q) * d));
      const int64_t head_off = static_cast<int64_t>(g) * p.ld_keys * d;
      auto keys = [&](const float* base, Zone z) {
        return ConstStrided(base + head_off + z.begin * d, z.size(), d, Eigen::OuterStride<>(d));
      };
      s_sink.noalias() = q * keys(p.k_exact, sink).transpose();
      if (deq.size() > 0) s_deq.noalias() = q * keys(p.k_deq, deq).transpose();
      else s_deq.resize(nq, 0);
      s_ex.noalias() = q * keys(p.k_exact, ex).transpose();

      // Masked softmax, row by row: each zone's readable keys form one contiguous segment, so the
      // scaling and exp run vectorised (Eigen) over segments; everything else becomes 0.
      for (int r = 0; r < nq; ++r) {
        const int i = qa + r;
        const int64_t t = static_cast<int64_t>(p.pos0) + i;
        const int64_t b = p.deq_end[i];
        struct Seg {
          RowMat* s;
          int64_t a, len;
        } segs[3];
        auto segment = [&](RowMat& s, Zone z, int64_t lo, int64_t hi) -> Seg {
          const int64_t z_end = z.begin + z.size();  // an empty zone may have end < begin
          const int64_t a = std::clamp(lo, z.begin, z_end) - z.begin;
          const int64_t e = std::clamp(hi, z.begin, z_end) - z.begin;
          const int64_t len = std::max<int64_t>(0, e - a);
          s.row(r).head(a).setZero();
          s.row(r).tail(s.cols() - a - len).setZero();
          return {&s, a, len};
        };
        segs[0] = segment(s_sink, sink, 0, std::min<int64_t>(p.n_sink, t + 1));
        segs[1] = segment(s_deq, deq, p.n_sink, std::min(b, t + 1));
        segs[2] = segment(s_ex, ex, std::max<int64_t>(b, p.n_sink), t + 1);
        float m = neg_inf;
        for (Seg& g : segs)
          if (g.len > 0) {
            auto v = g.s->row(r).segment(g.a, g.len);
            v *= p.scale;
            m = std::max(m, v.maxCoeff());
          }
        float l = 0;
        for (Seg& g : segs)
          if (g.len > 0) {
            auto v = g.s->row(r).segment(g.a, g.len).array();
            v = (v - m).exp();
            l += v.sum();
          }
        const float inv = 1.f / l;
        for (Seg& g : segs)
          if (g.len > 0) g.s->row(r).segment(g.a, g.len) *= inv;
      }

      o.noalias() = s_sink * keys(p.v_exact, sink);
      if (deq.size() > 0) o.noalias() += s_deq * keys(p.v_deq, deq);
      o.noalias() += s_ex * keys(p.v_exact, ex);
      Strided out(p.out + (static_cast<int64_t>(qa) * p.n_heads_q + h) * d, nq, d,
                  Eigen::OuterStride<>(static_cast<int64_t>(p.n_heads_q) * d));
      out = o;
    }
  }
  return Status();
}

}  // namespace oscar::kernels
