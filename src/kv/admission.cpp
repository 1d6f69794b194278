#include "kv/admission.h"

#include <algorithm>

#include "core/check.h"

namespace oscar::kv {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Status RegionConfig::validate() const {
  if (page_size <= 0 || (page_size & (page_size - 1)) != 0) {
    return invalid_argument("region config: page_size %d is not a positive power of two",
                            page_size);
  }
  if (n_sink < 0 || n_sink % page_size != 0) {
    return invalid_argument(
        "region config: n_sink %d is not a non-negative multiple of page_size %d", n_sink,
        page_size);
  }
  if (n_recent < 0 || n_recent % page_size != 0) {
    return invalid_argument(
        "region config: n_recent %d is not a non-negative multiple of page_size %d", n_recent,
        page_size);
  }
  return Status();
}

PageNeed peak_pages(const RegionConfig& cfg, bool quantized, int64_t n_tokens) {
  if (quantized) return peak_pages_for_length(cfg, n_tokens);
  PageNeed need;
  need.recent_pages = (n_tokens + cfg.page_size - 1) / cfg.page_size;
  return need;
}

PageNeed pages_for_length(const RegionConfig& cfg, int64_t n_tokens) {
  OSCAR_CHECK(cfg.validate().ok(), "pages_for_length: invalid region config");
  OSCAR_CHECK(n_tokens >= 0, "pages_for_length: n_tokens %lld < 0",
              static_cast<long long>(n_tokens));
  const int64_t p = cfg.page_size;
  PageNeed need;
  need.sink_pages = ceil_div(std::min<int64_t>(n_tokens, cfg.n_sink), p);
  const int64_t after_sinks = std::max<int64_t>(0, n_tokens - cfg.n_sink);
  need.hist_pages = std::max<int64_t>(0, (after_sinks - cfg.n_recent) / p);
  const int64_t window = after_sinks - need.hist_pages * p;
  OSCAR_CHECK(window <= cfg.n_recent + p - 1, "pages_for_length: window %lld",
              static_cast<long long>(window));
  need.recent_pages = ceil_div(window, p);
  return need;
}

PageNeed peak_pages_for_length(const RegionConfig& cfg, int64_t n_tokens) {
  PageNeed need = pages_for_length(cfg, n_tokens);
  const int64_t after_sinks = std::max<int64_t>(0, n_tokens - cfg.n_sink);
  need.recent_pages = ceil_div(
      std::min<int64_t>(after_sinks, int64_t{cfg.n_recent} + cfg.page_size), cfg.page_size);
  return need;
}

int64_t reusable_prefix_tokens(const RegionConfig& cfg, int64_t prompt_tokens) {
  OSCAR_CHECK(cfg.validate().ok(), "reusable_prefix_tokens: invalid region config");
  OSCAR_CHECK(prompt_tokens >= 0, "reusable_prefix_tokens: prompt_tokens %lld < 0",
              static_cast<long long>(prompt_tokens));
  if (prompt_tokens == 0) return 0;
  const int64_t p = cfg.page_size;
  const PageNeed at_prefill = pages_for_length(cfg, prompt_tokens);
  // Full sink pages, then (only once the sinks are full) the history pages.
  int64_t tokens = std::min<int64_t>(prompt_tokens, cfg.n_sink) / p * p;
  if (prompt_tokens >= cfg.n_sink) tokens = cfg.n_sink + at_prefill.hist_pages * p;
  // Leave at least one prompt token to compute.
  return std::min(tokens, (prompt_tokens - 1) / p * p);
}

std::vector<CachedPage> choose_prefix_forms(const RegionConfig& cfg, bool quantized,
                                            int64_t context_tokens,
                                            std::span<const CachedChunk> chunks,
                                            bool exact_history) {
  OSCAR_CHECK(cfg.validate().ok(), "choose_prefix_forms: invalid region config");
  const int64_t p = cfg.page_size;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunks.size()),
                                      std::max<int64_t>(0, context_tokens - 1) / p);
  std::vector<CachedPage> pages;
  auto bf16 = [&](int64_t i) { return chunks[i].has(kPoolBf16); };
  auto int2 = [&](int64_t i) { return chunks[i].has(kPoolInt2); };
  // Sinks (every chunk when unquantized): BF16.
  const int64_t n_sink = quantized ? std::min<int64_t>(n, cfg.n_sink / p) : n;
  while (static_cast<int64_t>(pages.size()) < n_sink && bf16(pages.size()))
    pages.push_back(chunks[pages.size()].form(kPoolBf16));
  const int64_t s = static_cast<int64_t>(pages.size());
  if (!quantized || s < cfg.n_sink / p) return pages;
  // Chunk indices: history [s, h) where INT2 is held, h <= h_max; recent [h, m) where BF16 is.
  const int64_t h_max =
      std::min(n, (cfg.n_sink + pages_for_length(cfg, context_tokens).hist_pages * p) / p);
  int64_t int2_end = s;
  while (int2_end < h_max && int2(int2_end)) ++int2_end;
  std::vector<int64_t> bf16_run(n - s + 1, 0);  // [i - s]: BF16 chunks from i on
  for (int64_t i = n - 1; i >= s; --i) bf16_run[i - s] = bf16(i) ? bf16_run[i + 1 - s] + 1 : 0;
  auto cold_history = [&](int64_t chunks_held) {  // a cold sequence's history end, in chunks
    return (cfg.n_sink + pages_for_length(cfg, chunks_held * p).hist_pages * p) / p;
  };
  if (exact_history) {
    for (int64_t m = n; m > s; --m) {
      const int64_t h = cold_history(m);
      if (h > int2_end || h + bf16_run[h - s] < m) continue;
      for (int64_t i = s; i < m; ++i)
        pages.push_back(chunks[i].form(i < h ? kPoolInt2 : kPoolBf16));
      break;
    }
    return pages;
  }
  int64_t m = s;
  for (int64_t h = s; h <= int2_end; ++h) m = std::max(m, h + bf16_run[h - s]);
  const int64_t cold = cold_history(m);
  int64_t best = -1;
  for (int64_t h = s; h <= int2_end; ++h) {
    if (h + bf16_run[h - s] != m) continue;
    const bool better = best < 0 || (h >= cold && (best < cold || h < best)) ||
                        (h < cold && best < cold && h > best);
    if (better) best = h;
  }
  for (int64_t i = s; i < m; ++i) pages.push_back(chunks[i].form(i < best ? kPoolInt2 : kPoolBf16));
  return pages;
}

PageNeed pages_needed(const RegionConfig& cfg, int64_t prompt_tokens, int64_t max_tokens,
                      int64_t cached_tokens) {
  OSCAR_CHECK(prompt_tokens >= 0 && max_tokens >= 0,
              "pages_needed: prompt_tokens %lld, max_tokens %lld",
              static_cast<long long>(prompt_tokens), static_cast<long long>(max_tokens));
  const int64_t p = cfg.page_size;
  OSCAR_CHECK(cached_tokens >= 0 && cached_tokens % p == 0 &&
                  cached_tokens <= reusable_prefix_tokens(cfg, prompt_tokens),
              "pages_needed: cached_tokens %lld for a prompt of %lld tokens (reusable %lld)",
              static_cast<long long>(cached_tokens), static_cast<long long>(prompt_tokens),
              static_cast<long long>(reusable_prefix_tokens(cfg, prompt_tokens)));
  PageNeed need = peak_pages_for_length(cfg, prompt_tokens + max_tokens);
  const int64_t cached_sink_pages = std::min<int64_t>(cached_tokens, cfg.n_sink) / p;
  const int64_t cached_hist_pages = std::max<int64_t>(0, cached_tokens - cfg.n_sink) / p;
  need.sink_pages -= cached_sink_pages;
  need.hist_pages -= cached_hist_pages;
  OSCAR_CHECK(need.sink_pages >= 0 && need.hist_pages >= 0, "pages_needed: negative need");
  return need;
}

bool can_admit(const PagePool& bf16, const PagePool& int2, const PageNeed& need) {
  return need.bf16_pages() <= bf16.n_free() && need.int2_pages() <= int2.n_free();
}

Status check_fits_pools(const PagePool& bf16, const PagePool& int2, const PageNeed& need) {
  if (need.bf16_pages() > bf16.n_pages()) {
    return resource_exhausted(
        "request needs %lld BF16 pages (%lld sink + %lld recent), pool %s has %lld",
        static_cast<long long>(need.bf16_pages()), static_cast<long long>(need.sink_pages),
        static_cast<long long>(need.recent_pages), bf16.name().c_str(),
        static_cast<long long>(bf16.n_pages()));
  }
  if (need.int2_pages() > int2.n_pages()) {
    return resource_exhausted("request needs %lld INT2 history pages, pool %s has %lld",
                              static_cast<long long>(need.int2_pages()), int2.name().c_str(),
                              static_cast<long long>(int2.n_pages()));
  }
  return Status();
}

}  // namespace oscar::kv
