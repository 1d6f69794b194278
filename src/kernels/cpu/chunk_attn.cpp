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

      // Masked softmax, row by row; entries a query does not read become 0.
      for (int r = 0; r < nq; ++r) {
        const int i = qa + r;
        const int64_t t = static_cast<int64_t>(p.pos0) + i;
        const int64_t b = p.deq_end[i];
        float m = neg_inf;
        auto scan = [&](RowMat& s, Zone z, int64_t lo, int64_t hi) {
          for (int64_t j = z.begin; j < z.end; ++j) {
            float& v = s(r, j - z.begin);
            if (j >= lo && j < hi) {
              v *= p.scale;
              m = std::max(m, v);
            } else {
              v = neg_inf;
            }
          }
        };
        scan(s_sink, sink, 0, std::min<int64_t>(p.n_sink, t + 1));
        scan(s_deq, deq, p.n_sink, std::min(b, t + 1));
        scan(s_ex, ex, std::max<int64_t>(b, p.n_sink), t + 1);
        float l = 0;
        auto expo = [&](RowMat& s) {
          for (int64_t c = 0; c < s.cols(); ++c) {
            float e = s(r, c) == neg_inf ? 0.f : std::exp(s(r, c) - m);
            s(r, c) = e;
            l += e;
          }
        };
        expo(s_sink);
        expo(s_deq);
        expo(s_ex);
        const float inv = 1.f / l;
        s_sink.row(r) *= inv;
        s_deq.row(r) *= inv;
        s_ex.row(r) *= inv;
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
