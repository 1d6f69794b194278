// CPU prefill_attn (kernels/prefill_attn.h): per sequence, materialise the layer's K/V as float
// (exact rows where they exist, the dequantized zone separately), then kernels::chunk_attn.
#include "kernels/prefill_attn.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "kernels/exact_row.h"
#include "kernels/chunk_attn.h"
#include "quant/kivi.h"

namespace oscar::kernels {

namespace {

// One sequence's scratch: [n_heads_kv, n_keys, head_dim] floats per matrix.
struct Scratch {
  std::vector<float> k_exact, v_exact, k_deq, v_deq;
  std::vector<int32_t> deq_end;
  std::vector<uint8_t> row;
};

}  // namespace

Status prefill_attn(const PrefillAttnParams& p) {
  const KvPageLayout& L = p.layout;
  const int d = L.head_dim, H = L.n_heads_kv, P = L.page_size;
  if (p.n_seqs < 0 || p.n_heads_q <= 0 || H <= 0 || p.n_heads_q % H != 0 || p.layer < 0 ||
      p.layer >= L.n_layers)
    return invalid_argument("prefill_attn: bad shape (%d seqs, %d q heads, %d kv heads, layer %d)",
                            p.n_seqs, p.n_heads_q, H, p.layer);
  for (const PageTableView* t : {&p.sinks, &p.history, &p.recent})
    if (t->n_seqs != p.n_seqs)
      return invalid_argument("prefill_attn: a page table has %d sequences, the batch %d",
                              t->n_seqs, p.n_seqs);
  constexpr int kBlock = quant::kKiviKeyBlockTokens;
  Scratch s;
  for (int32_t seq = 0; seq < p.n_seqs; ++seq) {
    const int64_t n = p.cu_seqlens[seq + 1] - p.cu_seqlens[seq];
    if (n <= 0) continue;
    const int64_t n_keys = p.pos0[seq] + n;
    const int64_t n_sink_tok = p.sinks.seq_len(seq, P);
    const int64_t hist_end = n_sink_tok + p.history.seq_len(seq, P);
    if (hist_end + p.recent.seq_len(seq, P) != n_keys)
      return invalid_argument("prefill_attn: seq %d holds %lld keys in its pages, expected %lld",
                              seq, static_cast<long long>(hist_end + p.recent.seq_len(seq, P)),
                              static_cast<long long>(n_keys));
    // Rows of (layer, kv, head) by position: exact (sinks or recent) and history.
    auto exact_row = [&](int kv, int h, int64_t pos) {
      const bool sink = pos < n_sink_tok;
      const int64_t t = sink ? pos : pos - hist_end;
      const int32_t page = (sink ? p.sinks : p.recent).page_of(seq, t, P);
      return p.exact_pool + static_cast<size_t>(page) * L.exact_page_bytes() +
             L.exact_row_offset(p.layer, kv, h, static_cast<int>(t % P));
    };
    auto hist_page = [&](int64_t pos) {
      const int32_t page = p.history.page_of(seq, pos - n_sink_tok, P);
      return p.hist_pool + static_cast<size_t>(page) * L.int2_page_bytes();
    };

    // Per-query boundary of the dequantized zone (never below n_sink: chunk_attn reads keys
    // under n_sink exactly).
    s.deq_end.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      int64_t b = std::max<int64_t>(hist_end, p.n_sink);
      if (p.decode_equivalent && p.quantized)
        b = std::max(b, history_end(p.n_sink, p.n_recent, P, p.pos0[seq] + i));
      s.deq_end[i] = static_cast<int32_t>(b);
    }
    const int64_t deq_hi = std::min<int64_t>(s.deq_end[n - 1], n_keys);
    const size_t plane = static_cast<size_t>(n_keys) * d;
    s.k_exact.resize(plane * H);
    s.v_exact.resize(plane * H);
    const bool has_deq = deq_hi > p.n_sink;
    if (has_deq) {
      s.k_deq.resize(plane * H);
      s.v_deq.resize(plane * H);
    }
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < H; ++h) {
        float* ex = (kv == 0 ? s.k_exact : s.v_exact).data() + h * plane;
        float* dq = has_deq ? (kv == 0 ? s.k_deq : s.v_deq).data() + h * plane : nullptr;
        for (int64_t j = 0; j < std::min<int64_t>(n_sink_tok, n_keys); ++j)
          load_exact_row(exact_row(kv, h, j), L.exact_elem_bytes, d, ex + j * d);
        for (int64_t j = hist_end; j < n_keys; ++j)
          load_exact_row(exact_row(kv, h, j), L.exact_elem_bytes, d, ex + j * d);
        if (!has_deq) continue;
        const quant::RowFormat f = p.codec.format(L, p.layer, kv, h);
        if (f == quant::RowFormat::kKiviKeyBlock) {
          // History keys: whole 32-token blocks ([32, d] rows, contiguous in dq).
          for (int64_t j = n_sink_tok; j < hist_end; j += kBlock)
            quant::dequantize_kivi_key_block_ref(
                hist_page(j) + L.kivi_key_block_offset(p.layer, h, static_cast<int>(j % P) / kBlock),
                d, dq + j * d);
          // Decode-equivalent: the blocks decode would already read quantized, quantized here
          // exactly as demotion will (whole pages, hence whole blocks).
          if (deq_hi > hist_end) {
            if ((deq_hi - hist_end) % kBlock != 0)
              return internal_error("prefill_attn: kivi2 zone [%lld, %lld) not in whole blocks",
                                    static_cast<long long>(hist_end),
                                    static_cast<long long>(deq_hi));
            s.row.resize(quant::kivi_key_block_bytes(d));
            for (int64_t j = hist_end; j < deq_hi; j += kBlock) {
              OSCAR_RETURN_IF_ERROR(
                  quant::quantize_kivi_key_block_ref(ex + j * d, d, s.row.data()));
              quant::dequantize_kivi_key_block_ref(s.row.data(), d, dq + j * d);
            }
          }
          continue;
        }
        const quant::RowCodec& codec = quant::row_codec(f);
        const int G = p.codec.group_size;
        for (int64_t j = n_sink_tok; j < hist_end; ++j)
          codec.dequantize(hist_page(j) + L.int2_row_offset(p.layer, kv, h, static_cast<int>(j % P)),
                           d, G, dq + j * d);
        // Decode-equivalent: rows still in the recent pages that decode would already read as
        // history go through the quantizer the demotion uses.
        s.row.resize(L.hist_row_bytes(p.layer, kv, h));
        const float clip = p.codec.clip(kv, p.layer, h, H);
        for (int64_t j = hist_end; j < deq_hi; ++j) {
          OSCAR_RETURN_IF_ERROR(codec.quantize(ex + j * d, d, G, clip, s.row.data()));
          codec.dequantize(s.row.data(), d, G, dq + j * d);
        }
      }
    }
    ChunkAttnParams c;
    c.n_queries = static_cast<int32_t>(n);
    c.n_heads_q = p.n_heads_q;
    c.n_heads_kv = H;
    c.head_dim = d;
    c.pos0 = static_cast<int32_t>(p.pos0[seq]);
    c.n_sink = p.n_sink;
    c.scale = p.scale;
    const size_t row0 = static_cast<size_t>(p.cu_seqlens[seq]) * p.n_heads_q * d;
    c.q = p.q + row0;
    c.k_exact = s.k_exact.data();
    c.v_exact = s.v_exact.data();
    c.k_deq = has_deq ? s.k_deq.data() : nullptr;
    c.v_deq = has_deq ? s.v_deq.data() : nullptr;
    c.ld_keys = n_keys;
    c.deq_end = s.deq_end.data();
    c.out = p.out + row0;
    c.batch_invariant = p.batch_invariant;
    OSCAR_RETURN_IF_ERROR(chunk_attn(c));
  }
  return Status();
}

}  // namespace oscar::kernels
