#include "kv/sequence_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "core/check.h"
#include "kernels/chunk_attn.h"
#include "kernels/decode_attn.h"
#include "quant/bit_plan_quant.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"
#include "quant/kivi.h"

namespace oscar::kv {

int64_t history_end(const RegionConfig& r, int64_t n_tokens) {
  const int64_t beyond_sinks = n_tokens - r.n_sink;
  if (beyond_sinks - r.n_recent < r.page_size) return r.n_sink;
  return r.n_sink + r.page_size * ((beyond_sinks - r.n_recent) / r.page_size);
}

bool KvCacheSpec::quantized() const {
  return mode != quant::CacheMode::kBF16 && mode != quant::CacheMode::kF32;
}

kernels::KvPageLayout KvCacheSpec::layout() const {
  kernels::KvPageLayout l;
  l.n_layers = n_layers;
  l.n_heads_kv = n_heads_kv;
  l.head_dim = head_dim;
  l.page_size = regions.page_size;
  l.exact_elem_bytes = mode == quant::CacheMode::kF32 ? 4 : 2;
  // kivi2: value rows with groups of 32; a key block of 32 tokens takes as many bytes as 32 of
  // them (kernels/kv_layout.h "KIVI page"). group_size does not apply.
  l.int2_row_bytes = static_cast<int32_t>(mode == quant::CacheMode::kKivi2
                                              ? quant::kivi_value_row_bytes(head_dim)
                                              : quant::int2_row_bytes(head_dim, group_size));
  if (bit_plan) {
    l.hist_bits = bit_plan->plane_bits();
    l.hist_row_prefix = bit_plan->row_prefix();
  }
  return l;
}

const float* KvCacheSpec::query_rotation(int layer, int head) const {
  const std::vector<float>& m = q_rotation.empty() ? k_rotation : q_rotation;
  if (m.empty()) return nullptr;
  return m.data() + (static_cast<size_t>(layer) * n_heads_kv + head) * head_dim * head_dim;
}

Status KvCacheSpec::validate() const {
  if (n_layers <= 0 || n_heads_kv <= 0 || head_dim <= 0)
    return invalid_argument("kv cache: bad model shape (%d layers, %d kv heads, head_dim %d)",
                            n_layers, n_heads_kv, head_dim);
  const RegionConfig& r = regions;
  if (r.page_size <= 0 || (r.page_size & (r.page_size - 1)) != 0)
    return invalid_argument("kv cache: page_size %d is not a power of two", r.page_size);
  if (r.n_sink < 0 || r.n_sink % r.page_size != 0)
    return invalid_argument("kv cache: n_sink %d is not a multiple of page_size %d", r.n_sink,
                            r.page_size);
  if (r.n_recent < 0 || r.n_recent % r.page_size != 0)
    return invalid_argument("kv cache: n_recent %d is not a multiple of page_size %d", r.n_recent,
                            r.page_size);
  if (mode == quant::CacheMode::kKivi2) {
    constexpr int kBlock = quant::kKiviKeyBlockTokens;
    static_assert(kBlock == kernels::KvPageLayout::kKiviKeyBlockTokens);
    if (head_dim % quant::kKiviValueGroup != 0)
      return invalid_argument("kv cache: kivi2 needs head_dim a multiple of %d, got %d",
                              quant::kKiviValueGroup, head_dim);
    if (r.page_size % kBlock != 0)
      return invalid_argument(
          "kv cache: kivi2 quantizes keys in blocks of %d tokens and needs page_size a multiple "
          "of %d, got %d (pass --page-size 32)",
          kBlock, kBlock, r.page_size);
    if (!k_rotation.empty() || !v_rotation.empty() || !k_clip.empty() || !v_clip.empty())
      return invalid_argument("kv cache: kivi2 takes no rotation and no clipping");
  } else if (quantized()) {
    if (group_size <= 0 || head_dim % group_size != 0 || group_size % 4 != 0)
      return invalid_argument("kv cache: group_size %d does not divide head_dim %d in quarters",
                              group_size, head_dim);
  }
  if (bit_plan) {
    if (mode != quant::CacheMode::kOscar && mode != quant::CacheMode::kInt2Naive &&
        mode != quant::CacheMode::kInt2Hadamard)
      return invalid_argument("kv cache: a bit plan needs a uniform INT2 mode (oscar, int2-naive, "
                              "int2-hadamard), not %s", quant::cache_mode_name(mode));
    if (bit_plan->n_layers() != n_layers || bit_plan->n_heads_kv() != n_heads_kv ||
        bit_plan->head_dim() != head_dim || bit_plan->group_size() != group_size)
      return invalid_argument("kv cache: bit plan for %d layers x %d kv heads, head_dim %d, "
                              "group %d; the cache has %d x %d, %d, %d", bit_plan->n_layers(),
                              bit_plan->n_heads_kv(), bit_plan->head_dim(),
                              bit_plan->group_size(), n_layers, n_heads_kv, head_dim, group_size);
  }
  const size_t rot = static_cast<size_t>(n_layers) * n_heads_kv * head_dim * head_dim;
  if (!k_rotation.empty() && k_rotation.size() != rot)
    return invalid_argument("kv cache: k_rotation has %zu values, expected %zu", k_rotation.size(),
                            rot);
  if (!v_rotation.empty() && v_rotation.size() != rot)
    return invalid_argument("kv cache: v_rotation has %zu values, expected %zu", v_rotation.size(),
                            rot);
  if (!q_rotation.empty() && (q_rotation.size() != rot || k_rotation.empty()))
    return invalid_argument("kv cache: q_rotation has %zu values, expected %zu with a k_rotation",
                            q_rotation.size(), rot);
  const size_t vec = static_cast<size_t>(n_layers) * n_heads_kv * head_dim;
  if (!k_mean.empty() && k_mean.size() != vec)
    return invalid_argument("kv cache: k_mean has %zu values, expected %zu", k_mean.size(), vec);
  const size_t heads = static_cast<size_t>(n_layers) * n_heads_kv;
  if ((!k_clip.empty() && k_clip.size() != heads) || (!v_clip.empty() && v_clip.size() != heads))
    return invalid_argument("kv cache: clip ratios must have n_layers * n_heads_kv = %zu values",
                            heads);
  return Status();
}

std::string KvCacheSpec::describe() const {
  return str_format("mode=%s n_sink=%d n_recent=%d page_size=%d group_size=%d k_rotation=%s "
                "key_scaling=%s v_rotation=%s clip=%s bit_plan=%s",
                quant::cache_mode_name(mode), regions.n_sink, regions.n_recent,
                regions.page_size,
                mode == quant::CacheMode::kKivi2 ? quant::kKiviValueGroup : group_size,
                k_rotation.empty() ? "no" : "yes", q_rotation.empty() ? "no" : "yes",
                v_rotation.empty() ? "no" : "yes", k_clip.empty() ? "no" : "yes",
                bit_plan ? bit_plan->describe().c_str() : "uniform");
}

SequenceCache::SequenceCache(const KvCacheSpec* spec, PagePool* exact_pool, PagePool* int2_pool)
    : spec_(spec), layout_(spec->layout()), exact_pool_(exact_pool), int2_pool_(int2_pool) {
  OSCAR_CHECK(exact_pool_ != nullptr);
  OSCAR_CHECK(exact_pool_->page_bytes() == layout_.exact_page_bytes(),
              "exact pool page %zu bytes != layout %zu", exact_pool_->page_bytes(),
              layout_.exact_page_bytes());
  OSCAR_CHECK(!spec_->quantized() ||
              (int2_pool_ != nullptr && int2_pool_->page_bytes() == layout_.int2_page_bytes()));
  hist_end_ = spec_->regions.n_sink;
}

SequenceCache::~SequenceCache() { clear(); }

void SequenceCache::clear() {
  for (PageId p : sink_pages_) exact_pool_->release(p);
  for (PageId p : recent_pages_) exact_pool_->release(p);
  for (PageId p : hist_pages_) int2_pool_->release(p);
  for (PageId p : int2_reserved_) int2_pool_->release(p);
  sink_pages_.clear();
  recent_pages_.clear();
  hist_pages_.clear();
  int2_reserved_.clear();
  n_tokens_ = 0;
  n_staged_ = 0;
  hist_end_ = spec_->regions.n_sink;
}

Status SequenceCache::reserve(int64_t n) {
  OSCAR_CHECK(n_staged_ == 0, "reserve() while %lld tokens are staged",
              static_cast<long long>(n_staged_));
  const RegionConfig& r = spec_->regions;
  const int64_t end = n_tokens_ + n;
  const int64_t P = r.page_size;
  int64_t sink_need = (std::min<int64_t>(end, r.n_sink) + P - 1) / P -
                      static_cast<int64_t>(sink_pages_.size());
  int64_t recent_need = 0;
  if (end > hist_end_)
    recent_need = (end - hist_end_ + P - 1) / P - static_cast<int64_t>(recent_pages_.size());
  int64_t int2_need = 0;
  // After adopt_prefix() the history may already reach past history_end(end): no demotion then.
  if (spec_->quantized()) int2_need = std::max<int64_t>(0, (history_end(r, end) - hist_end_) / P);
  sink_need = std::max<int64_t>(0, sink_need);
  recent_need = std::max<int64_t>(0, recent_need);

  auto exact = exact_pool_->alloc_n(sink_need + recent_need);
  if (!exact.ok())
    return exact.status().with_context(
        str_format("kv cache: %lld more tokens need %lld %s pages",
               static_cast<long long>(n), static_cast<long long>(sink_need + recent_need),
               exact_pool_->name().c_str()));
  std::vector<PageId> int2_pages;
  if (int2_need > 0) {
    auto q = int2_pool_->alloc_n(int2_need);
    if (!q.ok()) {
      for (PageId p : exact.value()) exact_pool_->release(p);
      return q.status().with_context(str_format("kv cache: demotion needs %lld %s pages",
                                            static_cast<long long>(int2_need),
                                            int2_pool_->name().c_str()));
    }
    int2_pages = std::move(q).value();
  }
  const auto& pages = exact.value();
  sink_pages_.insert(sink_pages_.end(), pages.begin(), pages.begin() + sink_need);
  recent_pages_.insert(recent_pages_.end(), pages.begin() + sink_need, pages.end());
  int2_reserved_.insert(int2_reserved_.end(), int2_pages.begin(), int2_pages.end());
  staged_sink_pages_ = sink_need;
  staged_recent_pages_ = recent_need;
  n_staged_ = n;
  return Status();
}

int64_t SequenceCache::shareable_tokens() const {
  const RegionConfig& r = spec_->regions;
  if (spec_->quantized() && n_tokens_ >= r.n_sink) return hist_end_;
  return (n_tokens_ / r.page_size) * r.page_size;
}

std::vector<CachedPage> SequenceCache::shareable_pages() const {
  const RegionConfig& r = spec_->regions;
  const int64_t n_pages = shareable_tokens() / r.page_size;
  std::vector<CachedPage> pages;
  pages.reserve(n_pages);
  for (PageId p : sink_pages_) {
    if (static_cast<int64_t>(pages.size()) == n_pages) break;
    pages.push_back({p, kPoolBf16});
  }
  const auto& rest = spec_->quantized() ? hist_pages_ : recent_pages_;
  const uint8_t pool = spec_->quantized() ? kPoolInt2 : kPoolBf16;
  for (PageId p : rest) {
    if (static_cast<int64_t>(pages.size()) == n_pages) break;
    pages.push_back({p, pool});
  }
  OSCAR_CHECK(static_cast<int64_t>(pages.size()) == n_pages);
  return pages;
}

Status SequenceCache::adopt_prefix(std::span<const CachedPage> pages) {
  OSCAR_CHECK(n_tokens_ == 0 && n_staged_ == 0 && sink_pages_.empty(),
              "adopt_prefix() on a cache that holds tokens");
  const RegionConfig& r = spec_->regions;
  const int64_t n_sink_pages = r.n_sink / r.page_size;
  for (size_t i = 0; i < pages.size(); ++i) {
    const bool sink = static_cast<int64_t>(i) < n_sink_pages;
    const uint8_t want = sink || !spec_->quantized() ? kPoolBf16 : kPoolInt2;
    if (pages[i].pool != want)
      return invalid_argument("adopt_prefix: page %zu is in pool %d, expected %d", i,
                              pages[i].pool, want);
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (static_cast<int64_t>(i) < n_sink_pages) sink_pages_.push_back(pages[i].page);
    else if (spec_->quantized()) hist_pages_.push_back(pages[i].page);
    else recent_pages_.push_back(pages[i].page);
  }
  n_tokens_ = static_cast<int64_t>(pages.size()) * r.page_size;
  hist_end_ = spec_->quantized() ? std::max<int64_t>(r.n_sink, n_tokens_) : r.n_sink;
  return Status();
}

void SequenceCache::unreserve() {
  for (int64_t i = 0; i < staged_sink_pages_; ++i) {
    exact_pool_->release(sink_pages_.back());
    sink_pages_.pop_back();
  }
  for (int64_t i = 0; i < staged_recent_pages_; ++i) {
    exact_pool_->release(recent_pages_.back());
    recent_pages_.pop_back();
  }
  for (PageId p : int2_reserved_) int2_pool_->release(p);
  int2_reserved_.clear();
  staged_sink_pages_ = staged_recent_pages_ = 0;
  n_staged_ = 0;
}

const uint8_t* SequenceCache::exact_row(int layer, int kv, int head, int64_t pos) const {
  const RegionConfig& r = spec_->regions;
  const int slot = static_cast<int>(pos % r.page_size);
  PageId page;
  if (pos < r.n_sink) {
    page = sink_pages_[pos / r.page_size];
  } else {
    OSCAR_DCHECK(pos >= hist_end_, "pos %lld is in the history", static_cast<long long>(pos));
    page = recent_pages_[(pos - hist_end_) / r.page_size];
  }
  return exact_pool_->data(page) + layout_.exact_row_offset(layer, kv, head, slot);
}

uint8_t* SequenceCache::exact_row_mut(int layer, int kv, int head, int64_t pos) {
  return const_cast<uint8_t*>(exact_row(layer, kv, head, pos));
}

namespace {

void load_exact(const uint8_t* src, int elem_bytes, int d, float* out) {
  if (elem_bytes == 4) {
    std::memcpy(out, src, sizeof(float) * d);
  } else {
    const bf16_t* h = reinterpret_cast<const bf16_t*>(src);
    for (int c = 0; c < d; ++c) out[c] = bf16_to_f32(h[c]);
  }
}

void store_exact(const float* x, int elem_bytes, int d, uint8_t* dst) {
  if (elem_bytes == 4) {
    std::memcpy(dst, x, sizeof(float) * d);
  } else {
    bf16_t* h = reinterpret_cast<bf16_t*>(dst);
    for (int c = 0; c < d; ++c) h[c] = f32_to_bf16(x[c]);
  }
}

// out[c] = sum_r x[r] * R[r, c]  (row vector times d x d matrix)
void rotate_row(const float* x, const float* R, int d, float* out) {
  for (int c = 0; c < d; ++c) out[c] = 0.f;
  for (int r = 0; r < d; ++r) {
    const float xr = x[r];
    const float* row = R + static_cast<size_t>(r) * d;
    for (int c = 0; c < d; ++c) out[c] += xr * row[c];
  }
}

}  // namespace

void SequenceCache::write(int layer, const float* k, const float* v, int64_t n) {
  OSCAR_CHECK(n == n_staged_, "write() of %lld tokens, %lld staged", static_cast<long long>(n),
              static_cast<long long>(n_staged_));
  const int d = spec_->head_dim;
  const int H = spec_->n_heads_kv;
  std::vector<float> rotated(d), centred(d);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = n_tokens_ + i;
    for (int h = 0; h < H; ++h) {
      const float* krow = k + (i * H + h) * d;
      if (!spec_->k_mean.empty()) {
        const float* mu = spec_->k_mean.data() + (static_cast<size_t>(layer) * H + h) * d;
        for (int c = 0; c < d; ++c) centred[c] = krow[c] - mu[c];
        krow = centred.data();
      }
      if (!spec_->k_rotation.empty()) {
        const float* R = spec_->k_rotation.data() + (static_cast<size_t>(layer) * H + h) * d * d;
        rotate_row(krow, R, d, rotated.data());
        krow = rotated.data();
      }
      store_exact(krow, layout_.exact_elem_bytes, d, exact_row_mut(layer, 0, h, pos));
      store_exact(v + (i * H + h) * d, layout_.exact_elem_bytes, d,
                  exact_row_mut(layer, 1, h, pos));
    }
  }
}

void SequenceCache::quantize_row(int layer, int kv, int head, const float* x,
                                 uint8_t* row) const {
  if (kivi()) {
    OSCAR_CHECK(kv == 1, "kivi2 keys are quantized in blocks (quantize_key_block)");
    const Status st = quant::quantize_kivi_value_row_ref(x, spec_->head_dim, row);
    OSCAR_CHECK(st.ok(), "layer %d V head %d: %s", layer, head, st.to_string().c_str());
    return;
  }
  const auto& clips = kv == 0 ? spec_->k_clip : spec_->v_clip;
  const float clip = clips.empty() ? 1.0f : clips[static_cast<size_t>(layer) * spec_->n_heads_kv + head];
  const int d = spec_->head_dim, G = spec_->group_size;
  Status st;
  switch (layout_.hist_row_bits(layer, kv, head)) {
    case 3: st = quant::quantize_row_int3_ref(x, d, G, clip, row); break;
    // The 1-bit row takes no clip: its two levels are the group's own Lloyd-Max levels.
    case 1: st = quant::quantize_row_int1_ref(x, d, G, row); break;
    default:
      st = spec_->mode == quant::CacheMode::kOscarLloyd
               ? quant::quantize_rows_lloyd(x, 1, d, G, clip, row)
               : quant::quantize_rows_int2(x, 1, d, G, clip, row);
  }
  // Non-finite K/V means the forward pass itself broke; there is nothing sane to store.
  OSCAR_CHECK(st.ok(), "layer %d %s head %d: %s", layer, kv == 0 ? "K" : "V", head,
              st.to_string().c_str());
}

void SequenceCache::quantize_key_block(int layer, int head, const float* k,
                                       uint8_t* block) const {
  const Status st = quant::quantize_kivi_key_block_ref(k, spec_->head_dim, block);
  // Non-finite K means the forward pass itself broke; there is nothing sane to store.
  OSCAR_CHECK(st.ok(), "layer %d K head %d: %s", layer, head, st.to_string().c_str());
}

const uint8_t* SequenceCache::hist_key_block(int layer, int head, int64_t pos) const {
  const RegionConfig& r = spec_->regions;
  OSCAR_DCHECK(pos >= r.n_sink && pos < hist_end_);
  const PageId page = hist_pages_[(pos - r.n_sink) / r.page_size];
  const int block = static_cast<int>(pos % r.page_size) / quant::kKiviKeyBlockTokens;
  return int2_pool_->data(page) + layout_.kivi_key_block_offset(layer, head, block);
}

void SequenceCache::dequantize_row(int layer, int kv, int head, const uint8_t* row,
                                   float* out) const {
  const int bits = layout_.hist_row_bits(layer, kv, head);
  if (kivi()) {
    quant::dequantize_kivi_value_row_ref(row, spec_->head_dim, out);
  } else if (bits == 3) {
    quant::dequantize_row_int3_ref(row, spec_->head_dim, spec_->group_size, out);
  } else if (bits == 1) {
    quant::dequantize_row_int1_ref(row, spec_->head_dim, spec_->group_size, out);
  } else if (spec_->mode == quant::CacheMode::kOscarLloyd) {
    quant::dequantize_rows_lloyd(row, 1, spec_->head_dim, spec_->group_size, out);
  } else {
    quant::dequantize_rows_int2(row, 1, spec_->head_dim, spec_->group_size, out);
  }
}

void SequenceCache::read_row(int layer, int kv, int head, int64_t pos, float* out) const {
  OSCAR_CHECK(pos >= 0 && pos < n_tokens_ + n_staged_);
  const RegionConfig& r = spec_->regions;
  if (pos >= r.n_sink && pos < hist_end_ && kivi() && kv == 0) {
    const int t = static_cast<int>((pos - r.n_sink) % quant::kKiviKeyBlockTokens);
    quant::dequantize_kivi_key_token(hist_key_block(layer, head, pos), spec_->head_dim, t, out);
  } else if (pos >= r.n_sink && pos < hist_end_) {
    const PageId page = hist_pages_[(pos - r.n_sink) / r.page_size];
    const int slot = static_cast<int>(pos % r.page_size);
    dequantize_row(layer, kv, head,
                   int2_pool_->data(page) + layout_.int2_row_offset(layer, kv, head, slot), out);
  } else {
    load_exact(exact_row(layer, kv, head, pos), layout_.exact_elem_bytes, spec_->head_dim, out);
  }
}

Status SequenceCache::attend(int layer, const float* q, int n_heads_q, int64_t n, float* out,
                             AttendMode mode, AttendScratch& s) const {
  OSCAR_CHECK(n == n_staged_ && n > 0);
  const int d = spec_->head_dim;
  const int H = spec_->n_heads_kv;
  const int gqa = n_heads_q / H;
  const RegionConfig& r = spec_->regions;
  const int64_t n_keys = n_tokens_ + n;

  // Queries in the key rotation's basis.
  const float* q_used = q;
  if (!spec_->k_rotation.empty()) {
    s.q_rot.resize(static_cast<size_t>(n) * n_heads_q * d);
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < n_heads_q; ++h) {
        const float* R = spec_->query_rotation(layer, h / gqa);
        rotate_row(q + (i * n_heads_q + h) * d, R, d, s.q_rot.data() + (i * n_heads_q + h) * d);
      }
    q_used = s.q_rot.data();
  }

  // A decode step reads the pages directly (OSCAR.md §5). With one query both attend modes read
  // the same zones: history_end(n_tokens_) == hist_end_ after the last commit.
  // kivi2 has no packed-page decode kernel: its single-token steps take the materialising path
  // below (chunk_attn over the dequantized cache), which reads the same zones.
  if (n == 1 && !kivi()) return attend_decode(layer, q_used, n_heads_q, out);

  // Per-query boundary of the dequantized zone.
  s.deq_end.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t b = hist_end_;
    if (mode == AttendMode::kDecodeEquivalent && spec_->quantized())
      b = std::max(b, history_end(r, n_tokens_ + i));
    s.deq_end[i] = static_cast<int32_t>(b);
  }
  const int64_t deq_hi = std::min<int64_t>(s.deq_end[n - 1], n_keys);

  // Materialise this layer's keys and values as float: exact rows where they exist, the
  // dequantized zone [n_sink, deq_hi) separately.
  const size_t plane = static_cast<size_t>(n_keys) * d;
  s.k_exact.resize(plane * H);
  s.v_exact.resize(plane * H);
  const bool has_deq = deq_hi > r.n_sink;
  if (has_deq) {
    s.k_deq.resize(plane * H);
    s.v_deq.resize(plane * H);
  }
  std::vector<float> tmp(d);
  for (int kv = 0; kv < 2; ++kv) {
    for (int h = 0; h < H; ++h) {
      float* ex = (kv == 0 ? s.k_exact : s.v_exact).data() + h * plane;
      float* dq = has_deq ? (kv == 0 ? s.k_deq : s.v_deq).data() + h * plane : nullptr;
      for (int64_t j = 0; j < std::min<int64_t>(r.n_sink, n_keys); ++j)
        load_exact(exact_row(layer, kv, h, j), layout_.exact_elem_bytes, d, ex + j * d);
      for (int64_t j = hist_end_; j < n_keys; ++j)
        load_exact(exact_row(layer, kv, h, j), layout_.exact_elem_bytes, d, ex + j * d);
      constexpr int kBlock = quant::kKiviKeyBlockTokens;
      if (kivi() && kv == 0) {
        // History keys: whole 32-token blocks ([32, d] rows, contiguous in dq).
        for (int64_t j = r.n_sink; j < hist_end_; j += kBlock)
          quant::dequantize_kivi_key_block_ref(hist_key_block(layer, h, j), d, dq + j * d);
        // Decode-equivalent: the blocks decode would already read quantized, quantized here
        // exactly as demote_front_page() will (whole pages, hence whole blocks).
        if (deq_hi > hist_end_) {
          OSCAR_CHECK((deq_hi - hist_end_) % kBlock == 0, "kivi2 zone [%lld, %lld) not in blocks",
                      static_cast<long long>(hist_end_), static_cast<long long>(deq_hi));
          std::vector<uint8_t> block(quant::kivi_key_block_bytes(d));
          for (int64_t j = hist_end_; j < deq_hi; j += kBlock) {
            quantize_key_block(layer, h, ex + j * d, block.data());
            quant::dequantize_kivi_key_block_ref(block.data(), d, dq + j * d);
          }
        }
        continue;
      }
      for (int64_t j = r.n_sink; j < hist_end_; ++j) {
        const PageId page = hist_pages_[(j - r.n_sink) / r.page_size];
        const int slot = static_cast<int>(j % r.page_size);
        dequantize_row(layer, kv, h,
                       int2_pool_->data(page) + layout_.int2_row_offset(layer, kv, h, slot),
                       dq + j * d);
      }
      // Decode-equivalent: rows still in the recent pages that decode would already read as
      // INT2 go through the same quantizer the demotion uses.
      std::vector<uint8_t> row(layout_.hist_row_bytes(layer, kv, h));
      for (int64_t j = hist_end_; j < deq_hi; ++j) {
        quantize_row(layer, kv, h, ex + j * d, row.data());
        dequantize_row(layer, kv, h, row.data(), dq + j * d);
      }
    }
  }

  kernels::ChunkAttnParams p;
  p.n_queries = static_cast<int32_t>(n);
  p.n_heads_q = n_heads_q;
  p.n_heads_kv = H;
  p.head_dim = d;
  p.pos0 = static_cast<int32_t>(n_tokens_);
  p.n_sink = r.n_sink;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.q = q_used;
  p.k_exact = s.k_exact.data();
  p.v_exact = s.v_exact.data();
  p.k_deq = has_deq ? s.k_deq.data() : nullptr;
  p.v_deq = has_deq ? s.v_deq.data() : nullptr;
  p.ld_keys = n_keys;
  p.deq_end = s.deq_end.data();
  p.out = out;
  return kernels::chunk_attn(p);
}

Status SequenceCache::attend_decode(int layer, const float* q, int n_heads_q, float* out) const {
  const RegionConfig& r = spec_->regions;
  const int64_t n_keys = n_tokens_ + n_staged_;
  kernels::DecodeAttnParams p;
  p.n_heads_q = n_heads_q;
  p.group_size = spec_->group_size;
  p.quantizer = spec_->mode == quant::CacheMode::kOscarLloyd ? kernels::Int2Quantizer::kLloyd
                                                             : kernels::Int2Quantizer::kUniform;
  p.layer = layer;
  p.scale = 1.0f / std::sqrt(static_cast<float>(spec_->head_dim));
  p.layout = layout_;
  p.q = q;
  p.out = out;
  // One-sequence CSR tables over this cache's page lists.
  const int32_t P = r.page_size;
  auto table = [P](const std::vector<PageId>& pages, int64_t n, int32_t* indptr, int32_t* last) {
    indptr[0] = 0;
    indptr[1] = static_cast<int32_t>((n + P - 1) / P);
    last[0] = n == 0 ? 0 : static_cast<int32_t>(n - static_cast<int64_t>(indptr[1] - 1) * P);
    return kernels::PageTableView{indptr, pages.data(), last, 1};
  };
  int32_t indptr[3][2], last[3];
  p.sinks = table(sink_pages_, std::min<int64_t>(r.n_sink, n_keys), indptr[0], &last[0]);
  p.history = table(hist_pages_, hist_end_ - r.n_sink, indptr[1], &last[1]);
  p.recent = table(recent_pages_, std::max<int64_t>(0, n_keys - hist_end_), indptr[2], &last[2]);
  // The kernels address pages as pool base + id * page_bytes. PagePool stores its pages in one
  // array ([n_pages, page_bytes]) but exposes only data(id) of allocated pages, so the base is
  // recovered from a page this sequence holds.
  auto pool_base = [](const PagePool* pool, const std::vector<PageId>& pages) -> const uint8_t* {
    if (pages.empty()) return nullptr;
    return pool->data(pages.front()) - static_cast<size_t>(pages.front()) * pool->page_bytes();
  };
  p.exact_pool = pool_base(exact_pool_, sink_pages_.empty() ? recent_pages_ : sink_pages_);
  if (!hist_pages_.empty()) p.hist_pool = pool_base(int2_pool_, hist_pages_);
  return kernels::decode_attn(p);
}

void SequenceCache::demote_front_page() {
  OSCAR_CHECK(!recent_pages_.empty() && !int2_reserved_.empty());
  const PageId src = recent_pages_.front();
  const PageId dst = int2_reserved_.back();
  int2_reserved_.pop_back();
  const int d = spec_->head_dim;
  constexpr int kBlock = quant::kKiviKeyBlockTokens;
  std::vector<float> x(kivi() ? static_cast<size_t>(kBlock) * d : d);
  const uint8_t* src_data = exact_pool_->data(src);
  uint8_t* dst_data = int2_pool_->data(dst);
  // One pass over all layers, K and V, heads and slots of the page (OSCAR.md §4 demotion).
  for (int layer = 0; layer < spec_->n_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < spec_->n_heads_kv; ++h) {
        if (kivi() && kv == 0) {
          // kivi2 keys: per channel over each 32-token block of the page (kernels/kv_layout.h).
          for (int b = 0; b < spec_->regions.page_size / kBlock; ++b) {
            for (int t = 0; t < kBlock; ++t)
              load_exact(src_data + layout_.exact_row_offset(layer, 0, h, b * kBlock + t),
                         layout_.exact_elem_bytes, d, x.data() + static_cast<size_t>(t) * d);
            quantize_key_block(layer, h, x.data(),
                               dst_data + layout_.kivi_key_block_offset(layer, h, b));
          }
          continue;
        }
        for (int slot = 0; slot < spec_->regions.page_size; ++slot) {
          load_exact(src_data + layout_.exact_row_offset(layer, kv, h, slot),
                     layout_.exact_elem_bytes, d, x.data());
          quantize_row(layer, kv, h, x.data(),
                       dst_data + layout_.int2_row_offset(layer, kv, h, slot));
        }
      }
    }
  }
  exact_pool_->release(src);
  recent_pages_.erase(recent_pages_.begin());
  hist_pages_.push_back(dst);
  hist_end_ += spec_->regions.page_size;
}

void SequenceCache::commit(int64_t n) {
  OSCAR_CHECK(n == n_staged_, "commit(%lld) with %lld staged", static_cast<long long>(n),
              static_cast<long long>(n_staged_));
  n_tokens_ += n;
  n_staged_ = 0;
  staged_sink_pages_ = staged_recent_pages_ = 0;
  if (!spec_->quantized()) return;
  const int64_t target = history_end(spec_->regions, n_tokens_);
  while (hist_end_ < target) demote_front_page();
  OSCAR_CHECK(int2_reserved_.empty(), "%zu reserved INT2 pages left", int2_reserved_.size());
}

CacheBytes SequenceCache::bytes() const {
  CacheBytes b;
  b.sink = static_cast<int64_t>(sink_pages_.size() * exact_pool_->page_bytes());
  b.recent = static_cast<int64_t>(recent_pages_.size() * exact_pool_->page_bytes());
  if (int2_pool_ != nullptr)
    b.history = static_cast<int64_t>(hist_pages_.size() * int2_pool_->page_bytes());
  return b;
}

}  // namespace oscar::kv
