// The host-side paged KV cache that the CUDA attention tests (test_decode_attn_cuda.cpp,
// test_prefill_attn_cuda.cpp) build and upload: the layout, an optional bit plan, the exact and
// history pools (0xFF, i.e. NaN, wherever no row is written), shuffled page ids and the three
// page tables (sinks, history, recent), the K/V row draws and the BF16 exact-row writes. Each
// step draws from the caller's generator in the order the tests always did, so a seed gives the
// same cache as before. How history rows are quantized, the queries and the tolerances stay in
// each test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "cuda_test_util.h"
#include "kernels/kv_layout.h"
#include "kernels/page_table.h"
#include "quant/bit_plan_layout.h"
#include "quant/int2_layout.h"

namespace oscar::kernels {

// Host copy of a paged cache. Owns its vectors; layout.hist_bits / hist_row_prefix point into
// bits / prefix when a bit plan is drawn.
struct PagedCacheHost {
  KvPageLayout layout;
  std::vector<int8_t> bits;      // [n_planes] history row widths (bit plan), else empty
  std::vector<uint32_t> prefix;  // [n_planes + 1] history row-byte prefix sums, else empty
  std::vector<uint8_t> exact_pool, hist_pool;       // [n_pages * page bytes]
  std::vector<int32_t> indptr[3], ids[3], last[3];  // page tables: sinks, history, recent
};

inline int64_t pages_for(int64_t n, int P) { return (n + P - 1) / P; }

// BF16 exact pages, INT2 history rows of quant_group `group_size`.
inline void set_layout(PagedCacheHost& h, int n_layers, int n_heads_kv, int head_dim, int page_size,
                       int group_size) {
  KvPageLayout& L = h.layout;
  L.n_layers = n_layers;
  L.n_heads_kv = n_heads_kv;
  L.head_dim = head_dim;
  L.page_size = page_size;
  L.exact_elem_bytes = 2;
  L.int2_row_bytes = quant::int2_row_bytes(head_dim, group_size);
}

// Random history row widths in 1..4, with layer `layer` holding a 3-bit K plane (head 0), a
// 1-bit V plane (last head) and, with two heads or more, a 2-bit K plane (head 1) and a 4-bit V
// plane (head 0).
inline void draw_bit_plan(PagedCacheHost& h, int layer, int group_size, std::mt19937& rng) {
  KvPageLayout& L = h.layout;
  const int np = L.n_planes();
  std::uniform_int_distribution<int> width(1, 4);
  h.bits.resize(np);
  for (int p = 0; p < np; ++p) h.bits[p] = static_cast<int8_t>(width(rng));
  h.bits[L.plane(layer, 0, 0)] = 3;
  h.bits[L.plane(layer, 1, L.n_heads_kv - 1)] = 1;
  if (L.n_heads_kv > 1) {
    h.bits[L.plane(layer, 0, 1)] = 2;
    h.bits[L.plane(layer, 1, 0)] = 4;
  }
  h.prefix.assign(np + 1, 0);
  for (int p = 0; p < np; ++p)
    h.prefix[p + 1] = h.prefix[p] + quant::bit_plan_row_bytes(h.bits[p], L.head_dim, group_size);
  L.hist_bits = h.bits.data();
  L.hist_row_prefix = h.prefix.data();
}

// Every history plane at `bits` (the oscar4 / oscar3 modes' uniform plans).
inline void set_uniform_bits(PagedCacheHost& h, int group_size, int bits) {
  KvPageLayout& L = h.layout;
  const int np = L.n_planes();
  h.bits.assign(np, static_cast<int8_t>(bits));
  h.prefix.assign(np + 1, 0);
  for (int p = 0; p < np; ++p)
    h.prefix[p + 1] = h.prefix[p] + quant::bit_plan_row_bytes(bits, L.head_dim, group_size);
  L.hist_bits = h.bits.data();
  L.hist_row_prefix = h.prefix.data();
}

// Pools with two spare pages each (the history pool left empty when !history), all 0xFF; page
// ids shuffled; one page-table entry per sequence of `seqs` (each with sink, hist, recent token
// counts).
template <class Seq>
void build_page_tables(const std::vector<Seq>& seqs, bool history, std::mt19937& rng,
                       PagedCacheHost& h) {
  const KvPageLayout& L = h.layout;
  const int P = L.page_size;
  int64_t n_exact = 2, n_hist = 2;
  for (const Seq& s : seqs) {
    n_exact += pages_for(s.sink, P) + pages_for(s.recent, P);
    n_hist += pages_for(s.hist, P);
  }
  h.exact_pool.assign(static_cast<size_t>(n_exact) * L.exact_page_bytes(), 0xFF);
  if (history) h.hist_pool.assign(static_cast<size_t>(n_hist) * L.int2_page_bytes(), 0xFF);
  std::vector<int32_t> eids(n_exact), hids(n_hist);
  std::iota(eids.begin(), eids.end(), 0);
  std::iota(hids.begin(), hids.end(), 0);
  std::shuffle(eids.begin(), eids.end(), rng);
  std::shuffle(hids.begin(), hids.end(), rng);
  size_t ei = 0, hi = 0;
  for (int r = 0; r < 3; ++r) {
    h.indptr[r].assign(1, 0);
    h.ids[r].clear();
    h.last[r].clear();
  }
  for (const Seq& s : seqs) {
    const int64_t n[3] = {s.sink, s.hist, s.recent};
    for (int r = 0; r < 3; ++r) {
      for (int64_t i = 0; i < pages_for(n[r], P); ++i)
        h.ids[r].push_back(r == 1 ? hids[hi++] : eids[ei++]);
      h.indptr[r].push_back(static_cast<int32_t>(h.ids[r].size()));
      h.last[r].push_back(n[r] == 0 ? 0 : static_cast<int32_t>((n[r] - 1) % P + 1));
    }
  }
}

// Where token t of sequence sq lies: region (0 sinks, 1 history, 2 recent), page id, slot.
struct RowPlace {
  int region;
  int32_t page;
  int slot;
};

template <class Seq>
RowPlace place_row(const PagedCacheHost& h, const Seq& s, int sq, int64_t t) {
  const int P = h.layout.page_size;
  const int r = t < s.sink ? 0 : (t < s.sink + s.hist ? 1 : 2);
  const int64_t j = r == 0 ? t : (r == 1 ? t - s.sink : t - s.sink - s.hist);
  return {r, h.ids[r][h.indptr[r][sq] + j / P], static_cast<int>(j % P)};
}

// One K row (kv 0: outlier channels 3 mod 29 at 6x, plus 0.2) or V row (kv 1: Gaussian plus a
// sine bias) of x.size() values.
inline void draw_kv_row(int kv, std::normal_distribution<float>& normal, std::mt19937& rng,
                        std::vector<float>& x) {
  const int d = static_cast<int>(x.size());
  for (int i = 0; i < d; ++i)
    x[i] = kv == 0 ? ((i % 29 == 3) ? 6.f : 1.f) * normal(rng) + 0.2f
                   : normal(rng) + 0.5f * std::sin(0.1f * static_cast<float>(i));
}

// The history row (layer, kv, head g) at `at`: int2_row_offset bytes into its page.
inline uint8_t* hist_row(PagedCacheHost& h, int layer, int kv, int g, RowPlace at) {
  const KvPageLayout& L = h.layout;
  return h.hist_pool.data() + static_cast<size_t>(at.page) * L.int2_page_bytes() +
         L.int2_row_offset(layer, kv, g, at.slot);
}

// Writes x [head_dim] rounded to BF16 as the exact row (layer, kv, head g) at `at`; seen gets
// the rounded values.
inline void write_exact_row(PagedCacheHost& h, int layer, int kv, int g, RowPlace at,
                            const float* x, float* seen) {
  const KvPageLayout& L = h.layout;
  uint8_t* dst = h.exact_pool.data() + static_cast<size_t>(at.page) * L.exact_page_bytes() +
                 L.exact_row_offset(layer, kv, g, at.slot);
  for (int i = 0; i < L.head_dim; ++i) {
    const bf16_t b = f32_to_bf16(x[i]);
    std::memcpy(dst + 2 * i, &b, 2);
    seen[i] = bf16_to_f32(b);
  }
}

// Points the three page-table views (sinks, history, recent) at h's host tables.
inline void point_page_tables(PagedCacheHost& h, int n_seqs, PageTableView* const tabs[3]) {
  for (int r = 0; r < 3; ++r) {
    tabs[r]->indptr = h.indptr[r].data();
    tabs[r]->page_ids = h.ids[r].data();
    tabs[r]->last_page_len = h.last[r].data();
    tabs[r]->n_seqs = n_seqs;
  }
}

// Points the three page-table views at device copies of h's tables.
inline void upload_page_tables(const PagedCacheHost& h, DeviceUploads& dv,
                               PageTableView* const tabs[3]) {
  for (int r = 0; r < 3; ++r) {
    tabs[r]->indptr = dv.up(h.indptr[r]);
    tabs[r]->page_ids = dv.up(h.ids[r]);
    tabs[r]->last_page_len = dv.up(h.last[r]);
  }
}

// Points layout's bit plan at device copies of h's, when h has one.
inline void upload_bit_plan(const PagedCacheHost& h, DeviceUploads& dv, KvPageLayout& layout) {
  if (!h.bits.empty()) {
    layout.hist_bits = dv.up(h.bits);
    layout.hist_row_prefix = dv.up(h.prefix);
  }
}

}  // namespace oscar::kernels
