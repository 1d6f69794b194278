#include <cmath>
#include <limits>
#include <vector>

#include "kernels/chunk_attn.h"

namespace oscar::kernels {

Status validate_chunk_attn(const ChunkAttnParams& p) {
  if (p.n_queries < 0 || p.n_heads_q <= 0 || p.n_heads_kv <= 0 || p.head_dim <= 0)
    return invalid_argument("chunk_attn: bad sizes (n_queries %d, n_heads_q %d, n_heads_kv %d, "
                            "head_dim %d)", p.n_queries, p.n_heads_q, p.n_heads_kv, p.head_dim);
  if (p.n_heads_q % p.n_heads_kv != 0)
    return invalid_argument("chunk_attn: n_heads_q %d not a multiple of n_heads_kv %d",
                            p.n_heads_q, p.n_heads_kv);
  if (p.ld_keys < static_cast<int64_t>(p.pos0) + p.n_queries)
    return invalid_argument("chunk_attn: ld_keys %lld < key count %d",
                            static_cast<long long>(p.ld_keys), p.pos0 + p.n_queries);
  if (p.q == nullptr || p.k_exact == nullptr || p.v_exact == nullptr || p.out == nullptr ||
      p.deq_end == nullptr)
    return invalid_argument("chunk_attn: null pointer");
  for (int i = 0; i < p.n_queries; ++i) {
    if (p.deq_end[i] < p.n_sink || (i > 0 && p.deq_end[i] < p.deq_end[i - 1]))
      return invalid_argument("chunk_attn: deq_end[%d] = %d breaks monotonicity or < n_sink %d",
                              i, p.deq_end[i], p.n_sink);
    if (p.deq_end[i] > p.n_sink && (p.k_deq == nullptr || p.v_deq == nullptr))
      return invalid_argument("chunk_attn: dequantized zone without k_deq/v_deq");
  }
  return Status();
}

Status chunk_attn_ref(const ChunkAttnParams& p) {
  OSCAR_RETURN_IF_ERROR(validate_chunk_attn(p));
  const int d = p.head_dim;
  const int gqa = p.n_heads_q / p.n_heads_kv;
  std::vector<double> scores;
  std::vector<double> acc(d);
  for (int i = 0; i < p.n_queries; ++i) {
    const int64_t t = p.pos0 + i;
    for (int h = 0; h < p.n_heads_q; ++h) {
      const int g = h / gqa;
      const float* q = p.q + (static_cast<int64_t>(i) * p.n_heads_q + h) * d;
      auto row = [&](int64_t j, bool value) -> const float* {
        bool deq = j >= p.n_sink && j < p.deq_end[i];
        const float* base = value ? (deq ? p.v_deq : p.v_exact) : (deq ? p.k_deq : p.k_exact);
        return base + (static_cast<int64_t>(g) * p.ld_keys + j) * d;
      };
      scores.assign(t + 1, 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= t; ++j) {
        const float* k = row(j, false);
        double s = 0;
        for (int c = 0; c < d; ++c) s += static_cast<double>(q[c]) * k[c];
        scores[j] = s * p.scale;
        m = std::max(m, scores[j]);
      }
      double l = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j <= t; ++j) {
        double w = std::exp(scores[j] - m);
        l += w;
        const float* v = row(j, true);
        for (int c = 0; c < d; ++c) acc[c] += w * v[c];
      }
      float* o = p.out + (static_cast<int64_t>(i) * p.n_heads_q + h) * d;
      for (int c = 0; c < d; ++c) o[c] = static_cast<float>(acc[c] / l);
    }
  }
  return Status();
}

}  // namespace oscar::kernels
