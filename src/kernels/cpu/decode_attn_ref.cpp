// Reference decode attention (kernels/decode_attn.h): plain loops, float64 scores, softmax and
// accumulation; INT2 rows dequantized one at a time by quant's reference dequantizers. Also the
// parameter validation and merge_attn_states shared with the fast path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "kernels/decode_attn.h"
#include "quant/bit_plan_quant.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"

namespace oscar::kernels {

Status validate_decode_attn(const DecodeAttnParams& p) {
  const KvPageLayout& L = p.layout;
  if (p.n_heads_q <= 0 || L.n_heads_kv <= 0 || L.head_dim <= 0 || L.page_size <= 0 ||
      L.n_layers <= 0)
    return invalid_argument("decode_attn: bad sizes (n_heads_q %d, n_heads_kv %d, head_dim %d, "
                            "page_size %d, n_layers %d)", p.n_heads_q, L.n_heads_kv, L.head_dim,
                            L.page_size, L.n_layers);
  if (p.n_heads_q % L.n_heads_kv != 0)
    return invalid_argument("decode_attn: n_heads_q %d not a multiple of n_heads_kv %d",
                            p.n_heads_q, L.n_heads_kv);
  if (p.layer < 0 || p.layer >= L.n_layers)
    return invalid_argument("decode_attn: layer %d outside [0, %d)", p.layer, L.n_layers);
  if (L.exact_elem_bytes != 2 && L.exact_elem_bytes != 4)
    return invalid_argument("decode_attn: exact_elem_bytes %d is neither 2 (bf16) nor 4 (f32)",
                            L.exact_elem_bytes);
  if (p.q == nullptr || p.out == nullptr)
    return invalid_argument("decode_attn: null q or out");
  if (p.chunk_tokens < 0)
    return invalid_argument("decode_attn: chunk_tokens %d < 0", p.chunk_tokens);
  if (p.n_seqs < 0) return invalid_argument("decode_attn: n_seqs %d < 0", p.n_seqs);
  struct Named {
    const char* name;
    const PageTableView* table;
    const uint8_t* pool;
  };
  bool any_history = false;
  for (const Named& s : {Named{"sinks", &p.sinks, p.exact_pool},
                         Named{"history", &p.history, p.hist_pool},
                         Named{"recent", &p.recent, p.exact_pool}}) {
    const PageTableView& t = *s.table;
    if (t.n_seqs != p.n_seqs)
      return invalid_argument("decode_attn: %s table has %d sequences, the batch %d", s.name,
                              t.n_seqs, p.n_seqs);
    if (p.n_seqs == 0) continue;
    if (t.indptr == nullptr || t.last_page_len == nullptr)
      return invalid_argument("decode_attn: %s table has no indptr or last_page_len", s.name);
    if (t.indptr[0] != 0)
      return invalid_argument("decode_attn: %s indptr[0] = %d", s.name, t.indptr[0]);
    for (int32_t q = 0; q < p.n_seqs; ++q) {
      const int32_t n = t.n_pages(q), last = t.last_page_len[q];
      if (n < 0 || (n == 0 ? last != 0 : (last < 1 || last > L.page_size)))
        return invalid_argument("decode_attn: %s seq %d has %d pages, last_page_len %d (page_size "
                                "%d)", s.name, q, n, last, L.page_size);
      if (s.table == &p.history && n > 0 && last != L.page_size)
        return invalid_argument("decode_attn: history of seq %d ends in a partial page (%d of %d)",
                                q, last, L.page_size);
    }
    if (t.indptr[p.n_seqs] > 0 && (t.page_ids == nullptr || s.pool == nullptr))
      return invalid_argument("decode_attn: %s has %d pages but no page ids or pool", s.name,
                              t.indptr[p.n_seqs]);
    if (s.table == &p.history) any_history = t.indptr[p.n_seqs] > 0;
  }
  if (any_history) {
    if (!quant::int2_valid_group(L.head_dim, p.group_size))
      return invalid_argument("decode_attn: group_size %d invalid for head_dim %d", p.group_size,
                              L.head_dim);
    if ((L.hist_bits == nullptr) != (L.hist_row_prefix == nullptr))
      return invalid_argument("decode_attn: a bit plan needs both hist_bits and hist_row_prefix");
    if (L.hist_bits != nullptr) {
      if (p.quantizer != quant::HistQuantizer::kInt2Uniform)
        return invalid_argument("decode_attn: a bit plan needs the uniform quantizer");
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < L.n_heads_kv; ++h) {
          const int bits = L.hist_row_bits(p.layer, kv, h);
          const int want = quant::bit_plan_row_bytes(bits, L.head_dim, p.group_size);
          if (want == 0 || L.hist_row_bytes(p.layer, kv, h) != static_cast<size_t>(want))
            return invalid_argument("decode_attn: layer %d %s head %d: %d bits in rows of %zu "
                                    "bytes (expected %d)", p.layer, kv == 0 ? "K" : "V", h, bits,
                                    L.hist_row_bytes(p.layer, kv, h), want);
        }
    } else if (L.int2_row_bytes != quant::int2_row_bytes(L.head_dim, p.group_size))
      return invalid_argument("decode_attn: layout int2_row_bytes %d != %d for head_dim %d, "
                              "group_size %d", L.int2_row_bytes,
                              quant::int2_row_bytes(L.head_dim, p.group_size), L.head_dim,
                              p.group_size);
    if (p.quantizer != quant::HistQuantizer::kInt2Uniform &&
        p.quantizer != quant::HistQuantizer::kInt2Lloyd)
      return invalid_argument("decode_attn: unknown quantizer %d", static_cast<int>(p.quantizer));
  }
  return Status();
}

void merge_attn_states(const float* o, const float* m, const float* l, int n_parts, int n_rows,
                       int head_dim, int64_t part_stride_rows, float* out) {
  OSCAR_CHECK(n_parts >= 0 && n_rows >= 0 && head_dim > 0 && part_stride_rows >= n_rows);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < n_rows; ++r) {
    float M = neg_inf;
    for (int p = 0; p < n_parts; ++p) M = std::max(M, m[p * part_stride_rows + r]);
    float* dst = out + static_cast<int64_t>(r) * head_dim;
    std::fill(dst, dst + head_dim, 0.f);
    if (M == neg_inf) continue;  // every part empty
    float denom = 0.f;
    for (int p = 0; p < n_parts; ++p) {
      const int64_t pr = p * part_stride_rows + r;
      if (m[pr] == neg_inf) continue;
      const float w = std::exp(m[pr] - M);
      denom += w * l[pr];
      const float* src = o + pr * head_dim;
      for (int c = 0; c < head_dim; ++c) dst[c] += w * src[c];
    }
    const float inv = 1.f / denom;
    for (int c = 0; c < head_dim; ++c) dst[c] *= inv;
  }
}

namespace {

struct PartialD {
  double m = -std::numeric_limits<double>::infinity();
  double l = 0;
  std::vector<double> o;  // [head_dim], unnormalised
};

}  // namespace

Status decode_attn_ref(const DecodeAttnParams& p) {
  OSCAR_RETURN_IF_ERROR(validate_decode_attn(p));
  const KvPageLayout& L = p.layout;
  const int d = L.head_dim;
  const int gqa = p.n_heads_q / L.n_heads_kv;
  std::vector<float> krow(d), vrow(d);

  // Reads row t of sequence `seq` in a region (kv 0 = K, 1 = V, KV head g) as float.
  auto load_exact = [&](const PageTableView& s, int seq, int64_t t, int kv, int g, float* dst) {
    const int64_t page = s.page_of(seq, t, L.page_size);
    const int slot = static_cast<int>(t % L.page_size);
    const uint8_t* src = p.exact_pool + page * L.exact_page_bytes() +
                         L.exact_row_offset(p.layer, kv, g, slot);
    for (int c = 0; c < d; ++c) {
      if (L.exact_elem_bytes == 4) {
        std::memcpy(&dst[c], src + 4 * c, 4);
      } else {
        bf16_t h;
        std::memcpy(&h, src + 2 * c, 2);
        dst[c] = bf16_to_f32(h);
      }
    }
  };
  auto load_hist = [&](const PageTableView& s, int seq, int64_t t, int kv, int g, float* dst) {
    const int64_t page = s.page_of(seq, t, L.page_size);
    const int slot = static_cast<int>(t % L.page_size);
    const uint8_t* row = p.hist_pool + page * L.int2_page_bytes() +
                         L.int2_row_offset(p.layer, kv, g, slot);
    const int bits = L.hist_row_bits(p.layer, kv, g);
    if (bits == 4) {
      quant::dequantize_row_int4_ref(row, d, p.group_size, dst);
    } else if (bits == 3) {
      quant::dequantize_row_int3_ref(row, d, p.group_size, dst);
    } else if (bits == 1) {
      quant::dequantize_row_int1_ref(row, d, p.group_size, dst);
    } else if (p.quantizer == quant::HistQuantizer::kInt2Lloyd) {
      quant::dequantize_row_lloyd_ref(row, d, p.group_size, dst);
    } else {
      quant::dequantize_row_int2_ref(row, d, p.group_size, dst);
    }
  };

  std::vector<double> scores;
  for (int seq = 0; seq < p.n_seqs; ++seq)
  for (int h = 0; h < p.n_heads_q; ++h) {
    const int g = h / gqa;
    const int64_t row = static_cast<int64_t>(seq) * p.n_heads_q + h;
    const float* q = p.q + row * d;
    PartialD parts[3];
    const PageTableView* segs[3] = {&p.sinks, &p.history, &p.recent};
    for (int sidx = 0; sidx < 3; ++sidx) {
      const PageTableView& s = *segs[sidx];
      PartialD& part = parts[sidx];
      part.o.assign(d, 0.0);
      const int64_t n_tokens = s.seq_len(seq, L.page_size);
      if (n_tokens == 0) continue;  // empty partial: m = -inf, l = 0, o = 0
      auto load = [&](int64_t t, int kv, float* dst) {
        if (sidx == 1) load_hist(s, seq, t, kv, g, dst);
        else load_exact(s, seq, t, kv, g, dst);
      };
      scores.assign(n_tokens, 0.0);
      for (int64_t t = 0; t < n_tokens; ++t) {
        load(t, 0, krow.data());
        double acc = 0;
        for (int c = 0; c < d; ++c) acc += static_cast<double>(q[c]) * krow[c];
        scores[t] = acc * p.scale;
        part.m = std::max(part.m, scores[t]);
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        const double w = std::exp(scores[t] - part.m);
        part.l += w;
        load(t, 1, vrow.data());
        for (int c = 0; c < d; ++c) part.o[c] += w * vrow[c];
      }
    }
    // Merge (OSCAR.md §5), float64.
    double M = -std::numeric_limits<double>::infinity();
    for (const PartialD& part : parts) M = std::max(M, part.m);
    float* out = p.out + row * d;
    if (M == -std::numeric_limits<double>::infinity()) {
      std::fill(out, out + d, 0.f);
      continue;
    }
    double denom = 0;
    std::vector<double> acc(d, 0.0);
    for (const PartialD& part : parts) {
      if (part.l == 0) continue;
      const double w = std::exp(part.m - M);
      denom += w * part.l;
      for (int c = 0; c < d; ++c) acc[c] += w * part.o[c];
    }
    for (int c = 0; c < d; ++c) out[c] = static_cast<float>(acc[c] / denom);
  }
  return Status();
}

}  // namespace oscar::kernels
