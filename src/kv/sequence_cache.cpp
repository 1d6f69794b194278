#include "kv/sequence_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "kernels/exact_row.h"
#include "core/check.h"
#include "kernels/decode_attn.h"
#include "kernels/demote_pages.h"
#include "kernels/kv_append.h"
#include "kernels/prefill_attn.h"
#include "kv/kv_op_params.h"
#include "quant/int2_layout.h"
#include "quant/kivi.h"
#include "quant/row_codec.h"

namespace oscar::kv {

int64_t history_end(const RegionConfig& r, int64_t n_tokens) {
  return kernels::history_end(r.n_sink, r.n_recent, r.page_size, n_tokens);
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

kernels::HistCodec KvCacheSpec::codec() const {
  kernels::HistCodec c;
  c.quantizer = mode == quant::CacheMode::kKivi2        ? quant::HistQuantizer::kKivi
                : mode == quant::CacheMode::kOscarLloyd ? quant::HistQuantizer::kInt2Lloyd
                                                        : quant::HistQuantizer::kInt2Uniform;
  c.group_size = group_size;
  c.k_clip = k_clip.empty() ? nullptr : k_clip.data();
  c.v_clip = v_clip.empty() ? nullptr : v_clip.data();
  return c;
}

Status KvCacheSpec::upload_to(kernels::Backend& backend) {
  if (backend.device() == Device::kCpu) {
    device_tensors.reset();
    return Status();
  }
  auto t = std::make_shared<DeviceTensors>();
  auto copy = [&](const void* host, size_t bytes, const char* what, DeviceBuffer* out) -> Status {
    if (bytes == 0) return Status();
    OSCAR_ASSIGN_OR_RETURN(*out, backend.alloc(bytes, what));
    return backend.upload(host, bytes, out->data());
  };
  auto floats = [&](const std::vector<float>& v, const char* what, DeviceBuffer* out) {
    return copy(v.data(), v.size() * sizeof(float), what, out);
  };
  OSCAR_RETURN_IF_ERROR(floats(k_rotation, "key rotations", &t->k_rotation));
  OSCAR_RETURN_IF_ERROR(floats(q_rotation, "query rotations", &t->q_rotation));
  OSCAR_RETURN_IF_ERROR(floats(k_mean, "key means", &t->k_mean));
  OSCAR_RETURN_IF_ERROR(floats(k_clip, "key clips", &t->k_clip));
  OSCAR_RETURN_IF_ERROR(floats(v_clip, "value clips", &t->v_clip));
  if (bit_plan) {
    const kernels::KvPageLayout l = layout();
    const size_t planes = static_cast<size_t>(l.n_planes());
    OSCAR_RETURN_IF_ERROR(copy(bit_plan->plane_bits(), planes, "bit plan widths", &t->hist_bits));
    OSCAR_RETURN_IF_ERROR(copy(bit_plan->row_prefix(), (planes + 1) * sizeof(uint32_t),
                               "bit plan offsets", &t->hist_row_prefix));
  }
  OSCAR_RETURN_IF_ERROR(backend.synchronize());
  device_tensors = std::move(t);
  return Status();
}

namespace {
// The device copy when there is one, else the host vector (nullptr when empty).
template <typename T>
const T* op_ptr(const KvCacheSpec::DeviceTensors* d, DeviceBuffer KvCacheSpec::DeviceTensors::*m,
                const T* host) {
  if (d == nullptr || host == nullptr) return host;
  return (d->*m).template as<const T>();
}
template <typename V>
auto host_ptr(const V& v) -> decltype(v.data()) {
  return v.empty() ? nullptr : v.data();
}
}  // namespace

kernels::KvPageLayout KvCacheSpec::op_layout() const {
  kernels::KvPageLayout l = layout();
  const DeviceTensors* d = device_tensors.get();
  l.hist_bits = op_ptr(d, &DeviceTensors::hist_bits, l.hist_bits);
  l.hist_row_prefix = op_ptr(d, &DeviceTensors::hist_row_prefix, l.hist_row_prefix);
  return l;
}

kernels::HistCodec KvCacheSpec::op_codec() const {
  kernels::HistCodec c = codec();
  const DeviceTensors* d = device_tensors.get();
  c.k_clip = op_ptr(d, &DeviceTensors::k_clip, c.k_clip);
  c.v_clip = op_ptr(d, &DeviceTensors::v_clip, c.v_clip);
  return c;
}

const float* KvCacheSpec::op_query_rotations() const {
  const DeviceTensors* d = device_tensors.get();
  if (!q_rotation.empty()) return op_ptr(d, &DeviceTensors::q_rotation, q_rotation.data());
  return op_k_rotation();
}
const float* KvCacheSpec::op_k_rotation() const {
  return op_ptr(device_tensors.get(), &DeviceTensors::k_rotation, host_ptr(k_rotation));
}
const float* KvCacheSpec::op_k_mean() const {
  return op_ptr(device_tensors.get(), &DeviceTensors::k_mean, host_ptr(k_mean));
}

const float* KvCacheSpec::query_rotations() const {
  const std::vector<float>& m = q_rotation.empty() ? k_rotation : q_rotation;
  return m.empty() ? nullptr : m.data();
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
  OSCAR_RETURN_IF_ERROR(r.validate().with_context("kv cache"));
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
        mode != quant::CacheMode::kInt2Hadamard && quant::cache_mode_fixed_bits(mode) == 0)
      return invalid_argument(
          "kv cache: a bit plan needs a uniform mode (oscar, oscar4, oscar3, "
          "int2-naive, int2-hadamard), not %s",
          quant::cache_mode_name(mode));
    if (bit_plan->n_layers() != n_layers || bit_plan->n_heads_kv() != n_heads_kv ||
        bit_plan->head_dim() != head_dim || bit_plan->group_size() != group_size)
      return invalid_argument("kv cache: bit plan for %d layers x %d kv heads, head_dim %d, "
                              "group %d; the cache has %d x %d, %d, %d", bit_plan->n_layers(),
                              bit_plan->n_heads_kv(), bit_plan->head_dim(),
                              bit_plan->group_size(), n_layers, n_heads_kv, head_dim, group_size);
  }
  // oscar4: every plane at 4 bits. oscar3: every plane at 3 bits, or (planned from the rotation
  // file's statistics, engine/runtime.cpp) a mix of widths within those bytes and less than
  // half a bit below them.
  if (const int fixed = quant::cache_mode_fixed_bits(mode); fixed != 0) {
    const double budget = uniform_plan_bits(fixed, head_dim, group_size);
    bool one_width = bit_plan != nullptr;
    for (int p = 0; one_width && p < 2 * n_layers * n_heads_kv; ++p)
      one_width = bit_plan->plane_bits()[p] == fixed;
    const bool planned = bit_plan != nullptr && mode == quant::CacheMode::kOscar3 &&
                         bit_plan->bits_per_element() <= budget + 1e-9 &&
                         bit_plan->bits_per_element() > budget - 0.5;
    if (!one_width && !planned)
      return invalid_argument(
          "kv cache: %s needs a bit plan of %d bits in every plane%s", quant::cache_mode_name(mode),
          fixed, fixed == 3 ? " or a plan of 2.75-3.25 bits per element (group 128)" : "");
  }
  if (quantized() && !layout().hist_planes_aligned())
    return invalid_argument("kv cache: page_size %d puts history planes off 16-byte boundaries "
                            "(rows of %d bytes); use a page_size of at least 4", r.page_size,
                            quant::int2_row_bytes(head_dim, group_size));
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

SequenceCache::SequenceCache(const KvCacheSpec* spec, PagePool* exact_pool, PagePool* int2_pool,
                             StatePool* state_pool)
    : spec_(spec),
      layout_(spec->layout()),
      exact_pool_(exact_pool),
      int2_pool_(int2_pool),
      state_pool_(state_pool) {
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
  if (state_slot_ >= 0) state_pool_->release(state_slot_);
  state_slot_ = -1;
  if (snapshot_slot_ >= 0) state_pool_->release(snapshot_slot_);
  snapshot_slot_ = -1;
  snapshot_tokens_ = 0;
}

Status SequenceCache::keep_state_snapshot() {
  OSCAR_CHECK(state_pool_ != nullptr && state_slot_ >= 0 && n_staged_ == 0,
              "keep_state_snapshot() without a state or with %lld tokens staged",
              static_cast<long long>(n_staged_));
  if (snapshot_slot_ < 0) {
    OSCAR_ASSIGN_OR_RETURN(snapshot_slot_, state_pool_->acquire());
  }
  state_pool_->copy_slot(snapshot_slot_, state_slot_);
  snapshot_tokens_ = n_tokens_;
  return Status();
}

Status SequenceCache::reserve(int64_t n) {
  OSCAR_CHECK(n_staged_ == 0, "reserve() while %lld tokens are staged",
              static_cast<long long>(n_staged_));
  if (state_pool_ != nullptr && state_slot_ < 0) {
    OSCAR_ASSIGN_OR_RETURN(state_slot_, state_pool_->acquire());
  }
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
  const int64_t p = spec_->regions.page_size;
  return n_tokens_ / p * p;
}

std::vector<CachedPage> SequenceCache::shareable_pages() const {
  const size_t n_pages = static_cast<size_t>(shareable_tokens() / spec_->regions.page_size);
  std::vector<CachedPage> pages;
  pages.reserve(n_pages);
  auto add = [&](const std::vector<PageId>& region, uint8_t pool) {
    for (size_t i = 0; i < region.size() && pages.size() < n_pages; ++i)
      pages.push_back({region[i], pool});
  };
  add(sink_pages_, kPoolBf16);
  add(hist_pages_, kPoolInt2);
  add(recent_pages_, kPoolBf16);
  OSCAR_CHECK(pages.size() == n_pages);
  return pages;
}

Status SequenceCache::adopt_prefix(std::span<const CachedPage> pages, int32_t state_snapshot) {
  OSCAR_CHECK(n_tokens_ == 0 && n_staged_ == 0 && sink_pages_.empty(),
              "adopt_prefix() on a cache that holds tokens");
  if (state_pool_ != nullptr && !pages.empty() && state_snapshot < 0)
    return invalid_argument("adopt_prefix: a hybrid model's prefix of %zu pages needs the "
                            "DeltaNet state after it (no snapshot given)", pages.size());
  const RegionConfig& r = spec_->regions;
  const size_t n_sink_pages = static_cast<size_t>(r.n_sink / r.page_size);
  // Sinks, history (quantized only), recent: the pool of page i may only step from INT2 to BF16.
  size_t n_hist = 0;
  for (size_t i = n_sink_pages; i < pages.size() && pages[i].pool == kPoolInt2; ++i) ++n_hist;
  if (!spec_->quantized()) n_hist = 0;
  for (size_t i = 0; i < pages.size(); ++i) {
    const bool hist = i >= n_sink_pages && i < n_sink_pages + n_hist;
    const uint8_t want = hist ? kPoolInt2 : kPoolBf16;
    if (pages[i].pool != want)
      return invalid_argument("adopt_prefix: page %zu is in pool %d, expected %d", i,
                              pages[i].pool, want);
  }
  if (state_pool_ != nullptr && !pages.empty()) {
    if (state_slot_ < 0) {
      OSCAR_ASSIGN_OR_RETURN(state_slot_, state_pool_->acquire());
    }
    state_pool_->copy_slot(state_slot_, state_snapshot);
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    const bool sink = i < n_sink_pages;
    const bool hist = !sink && i < n_sink_pages + n_hist;
    (sink ? sink_pages_ : hist ? hist_pages_ : recent_pages_).push_back(pages[i].page);
  }
  n_tokens_ = static_cast<int64_t>(pages.size()) * r.page_size;
  hist_end_ = r.n_sink + static_cast<int64_t>(n_hist) * r.page_size;
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

int64_t SequenceCache::exact_slot(int64_t pos) const {
  const RegionConfig& r = spec_->regions;
  PageId page;
  if (pos < r.n_sink) {
    page = sink_pages_[pos / r.page_size];
  } else {
    OSCAR_DCHECK(pos >= hist_end_, "pos %lld is in the history", static_cast<long long>(pos));
    page = recent_pages_[(pos - hist_end_) / r.page_size];
  }
  return static_cast<int64_t>(page) * r.page_size + pos % r.page_size;
}

int64_t SequenceCache::n_pending_demotions() const {
  if (!spec_->quantized()) return 0;
  const int64_t target = history_end(spec_->regions, n_tokens_ + n_staged_);
  return std::max<int64_t>(0, (target - hist_end_) / spec_->regions.page_size);
}

void SequenceCache::pending_demotions(std::vector<PageId>* src, std::vector<PageId>* dst) const {
  const int64_t n = n_pending_demotions();
  OSCAR_CHECK(n <= static_cast<int64_t>(recent_pages_.size()) &&
                  n <= static_cast<int64_t>(int2_reserved_.size()),
              "%lld demotions, %zu recent and %zu reserved pages", static_cast<long long>(n),
              recent_pages_.size(), int2_reserved_.size());
  for (int64_t i = 0; i < n; ++i) {
    src->push_back(recent_pages_[i]);
    dst->push_back(int2_reserved_[int2_reserved_.size() - 1 - i]);
  }
}

void SequenceCache::bind_tables(PageTableBuilder& sinks, PageTableBuilder& history,
                                PageTableBuilder& recent) const {
  const RegionConfig& r = spec_->regions;
  const int64_t n_keys = n_tokens_ + n_staged_;
  sinks.add_sequence(sink_pages_, std::min<int64_t>(r.n_sink, n_keys));
  history.add_sequence(hist_pages_, hist_end_ - r.n_sink);
  recent.add_sequence(recent_pages_, std::max<int64_t>(0, n_keys - hist_end_));
}

kernels::KvAppendParams SequenceCache::append_params(int layer) const {
  kernels::KvAppendParams p = kv_op_params(*spec_, *exact_pool_, int2_pool_, AttendMode::kPrefill).append;
  p.layer = layer;
  return p;
}

void SequenceCache::write(int layer, const float* k, const float* v, int64_t n) {
  OSCAR_CHECK(spec_->device_tensors == nullptr,
              "SequenceCache::%s runs the CPU kernels: host caches only", __func__);
  OSCAR_CHECK(n == n_staged_, "write() of %lld tokens, %lld staged", static_cast<long long>(n),
              static_cast<long long>(n_staged_));
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) slots[i] = exact_slot(n_tokens_ + i);
  kernels::KvAppendParams p = append_params(layer);
  p.n_tokens = n;
  p.k = k;
  p.v = v;
  p.slots = slots.data();
  const Status st = kernels::kv_append(p);
  OSCAR_CHECK(st.ok(), "%s", st.to_string().c_str());
}

void SequenceCache::read_row(int layer, int kv, int head, int64_t pos, float* out) const {
  OSCAR_CHECK(spec_->device_tensors == nullptr,
              "SequenceCache::%s runs the CPU kernels: host caches only", __func__);
  OSCAR_CHECK(pos >= 0 && pos < n_tokens_ + n_staged_);
  const RegionConfig& r = spec_->regions;
  if (pos >= r.n_sink && pos < hist_end_) {
    const PageId page = hist_pages_[(pos - r.n_sink) / r.page_size];
    const int slot = static_cast<int>(pos % r.page_size);
    const uint8_t* data = int2_pool_->data(page);
    const quant::RowFormat f = spec_->codec().format(layout_, layer, kv, head);
    if (f == quant::RowFormat::kKiviKeyBlock) {
      const int block = slot / quant::kKiviKeyBlockTokens;
      quant::dequantize_kivi_key_token(data + layout_.kivi_key_block_offset(layer, head, block),
                                       spec_->head_dim, slot % quant::kKiviKeyBlockTokens, out);
      return;
    }
    quant::row_codec(f).dequantize(data + layout_.int2_row_offset(layer, kv, head, slot),
                                   spec_->head_dim, spec_->group_size, out);
    return;
  }
  const int64_t s = exact_slot(pos);
  kernels::load_exact_row(exact_pool_->data(static_cast<PageId>(s / r.page_size)) +
                 layout_.exact_row_offset(layer, kv, head, static_cast<int>(s % r.page_size)),
             layout_.exact_elem_bytes, spec_->head_dim, out);
}

Status SequenceCache::attend(int layer, const float* q, int n_heads_q, int64_t n, float* out,
                             AttendMode mode, AttendScratch& s) const {
  OSCAR_CHECK(spec_->device_tensors == nullptr,
              "SequenceCache::%s runs the CPU kernels: host caches only", __func__);
  OSCAR_CHECK(n == n_staged_ && n > 0);
  const int d = spec_->head_dim;
  // Queries in the key rotation's basis.
  s.q_rot.resize(static_cast<size_t>(n) * n_heads_q * d);
  kernels::RotateQueriesParams rq;
  rq.layer = layer;
  rq.n_rows = n;
  rq.n_heads_q = n_heads_q;
  rq.n_heads_kv = spec_->n_heads_kv;
  rq.head_dim = d;
  rq.q = q;
  rq.q_rotation = spec_->query_rotations();
  rq.out = s.q_rot.data();
  OSCAR_RETURN_IF_ERROR(kernels::rotate_queries(rq));

  PageTableBuilder sinks(spec_->regions.page_size), history(spec_->regions.page_size),
      recent(spec_->regions.page_size);
  bind_tables(sinks, history, recent);
  // A decode step reads the pages directly (OSCAR.md §5). With one query both attend modes read
  // the same zones: history_end(n_tokens_) == hist_end_ after the last commit. kivi2 has no
  // packed-page decode kernel: its single-token steps take the materialising path, which reads
  // the same zones.
  if (n == 1 && !kivi()) {
    kernels::DecodeAttnParams p = decode_params(layer, n_heads_q);
    p.q = s.q_rot.data();
    p.out = out;
    p.sinks = sinks.view();
    p.history = history.view();
    p.recent = recent.view();
    return kernels::decode_attn(p);
  }
  kernels::PrefillAttnParams p = prefill_params(layer, n_heads_q, mode);
  const int32_t cu[2] = {0, static_cast<int32_t>(n)};
  const int64_t pos0 = n_tokens_;
  p.n_seqs = 1;
  p.cu_seqlens = cu;
  p.pos0 = &pos0;
  p.q = s.q_rot.data();
  p.sinks = sinks.view();
  p.history = history.view();
  p.recent = recent.view();
  p.out = out;
  return kernels::prefill_attn(p);
}

kernels::DecodeAttnParams SequenceCache::decode_params(int layer, int n_heads_q) const {
  kernels::DecodeAttnParams p =
      kv_op_params(*spec_, *exact_pool_, int2_pool_, AttendMode::kPrefill).decode;
  p.n_heads_q = n_heads_q;
  p.layer = layer;
  return p;
}

kernels::PrefillAttnParams SequenceCache::prefill_params(int layer, int n_heads_q,
                                                         AttendMode mode) const {
  kernels::PrefillAttnParams p = kv_op_params(*spec_, *exact_pool_, int2_pool_, mode).prefill;
  p.n_heads_q = n_heads_q;
  p.layer = layer;
  return p;
}

kernels::DemotePagesParams SequenceCache::demote_params() const {
  return kv_op_params(*spec_, *exact_pool_, int2_pool_, AttendMode::kPrefill).demote;
}

Status SequenceCache::commit(int64_t n) {
  OSCAR_CHECK(spec_->device_tensors == nullptr,
              "SequenceCache::%s runs the CPU kernels: host caches only", __func__);
  std::vector<PageId> src, dst;
  pending_demotions(&src, &dst);
  if (!src.empty()) {
    // One pass over all layers, K and V, heads and slots of each page (OSCAR.md §4 demotion).
    std::vector<int32_t> status(src.size());
    kernels::DemotePagesParams p = demote_params();
    p.n_pages = static_cast<int32_t>(src.size());
    p.src_pages = src.data();
    p.dst_pages = dst.data();
    p.status = status.data();
    OSCAR_RETURN_IF_ERROR(kernels::demote_pages(p));
    for (size_t i = 0; i < status.size(); ++i)
      if (status[i] != kernels::kDemoteOk)
        return internal_error("kv cache: a K/V value of tokens [%lld, %lld) is non-finite or "
                                "beyond fp16, it cannot be stored in the history",
                                static_cast<long long>(hist_end_ + i * spec_->regions.page_size),
                                static_cast<long long>(hist_end_ +
                                                       (i + 1) * spec_->regions.page_size));
  }
  commit_demoted(n);
  return Status();
}

void SequenceCache::commit_demoted(int64_t n) {
  OSCAR_CHECK(n == n_staged_, "commit(%lld) with %lld staged", static_cast<long long>(n),
              static_cast<long long>(n_staged_));
  const int64_t n_demote = n_pending_demotions();
  n_tokens_ += n;
  n_staged_ = 0;
  staged_sink_pages_ = staged_recent_pages_ = 0;
  for (int64_t i = 0; i < n_demote; ++i) {
    exact_pool_->release(recent_pages_.front());
    recent_pages_.erase(recent_pages_.begin());
    hist_pages_.push_back(int2_reserved_.back());
    int2_reserved_.pop_back();
    hist_end_ += spec_->regions.page_size;
  }
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
