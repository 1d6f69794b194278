// Admission arithmetic: how many BF16 and INT2 pages one request can ever hold, given its prompt
// length, its max_tokens and the region config (OSCAR.md §4), and whether the pools can take it
// now. Pure functions of sizes; the scheduler decides what to do with the answer (queue, evict
// from the radix cache, preempt). Nothing here allocates.
//
// Regions, for a sequence of L tokens with page size P (n_sink and n_recent multiples of P):
//   sinks    tokens [0, min(L, n_sink))          BF16, ceil(min(L, n_sink) / P) pages
//   history  tokens [n_sink, n_sink + H*P)       INT2, H pages
//   recent   tokens [n_sink + H*P, L)            BF16, ceil(w / P) pages, w = L - n_sink - H*P
// where H = max(0, floor((L - n_sink - n_recent) / P)) (pages_for_length). Once the sequence is
// long enough the window holds n_recent <= w <= n_recent + P - 1 tokens: when a token brings w to
// n_recent + P, a new INT2 page is allocated while the oldest BF16 page is still held, then that
// BF16 page is freed. So the window's page count is not monotone in L (17 pages at w = 271, 16
// after the demotion at w = 272, for P = 16, n_recent = 256); over a lifetime it peaks at
//   ceil(min(L - n_sink, n_recent + P) / P)  <=  ceil((n_recent + P) / P) = n_recent / P + 1.
// Sinks and history only grow. The peak need of a request that may reach T = prompt_tokens +
// max_tokens tokens is therefore sinks(T) + that window peak in BF16, and H(T) in INT2
// (peak_pages_for_length); tests/kv/test_admission.cpp checks both formulas against a token-by-
// token simulation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"  // CachedChunk

namespace oscar::kv {

struct RegionConfig {
  int32_t page_size = 16;  // tokens per page, power of two
  int32_t n_sink = 64;     // BF16 sink tokens, multiple of page_size (0: no sinks)
  int32_t n_recent = 256;  // BF16 recent-window tokens, multiple of page_size (0: none)

  // InvalidArgument naming the field when page_size is not a positive power of two or a window is
  // negative or not a multiple of page_size.
  Status validate() const;
};

// Page counts of one sequence; bf16_pages = sink_pages + recent_pages, int2_pages = hist_pages.
struct PageNeed {
  int64_t sink_pages = 0;
  int64_t recent_pages = 0;
  int64_t hist_pages = 0;

  int64_t bf16_pages() const { return sink_pages + recent_pages; }
  int64_t int2_pages() const { return hist_pages; }
};

// Pages a sequence of exactly n_tokens tokens holds in each region (formula above), e.g. right
// after the prefill of an n_tokens prompt. cfg must be valid.
PageNeed pages_for_length(const RegionConfig& cfg, int64_t n_tokens);

// The most pages of each region that a sequence holds at any point while growing token by token
// to n_tokens tokens, demotion transients included (formula above).
PageNeed peak_pages_for_length(const RegionConfig& cfg, int64_t n_tokens);

// The same peak for a cache with (quantized) or without a history region; without one every page
// is an exact page, counted as recent_pages: ceil(n_tokens / page_size).
PageNeed peak_pages(const RegionConfig& cfg, bool quantized, int64_t n_tokens);

// The longest page-aligned prefix of a prompt of prompt_tokens tokens that lies in the sink or
// history regions at prefill time, leaving at least one prompt token to compute (its logits give
// the first output token): the cached prefix pages_needed() counts as sinks and history. A
// multiple of page_size; 0 for an empty prompt.
int64_t reusable_prefix_tokens(const RegionConfig& cfg, int64_t prompt_tokens);

// The pages a radix-cache hit supplies to a sequence about to prefill context_tokens tokens (the
// FormChooser of RadixCache::match_prefix), from the chunks found along its token path. At least
// one token is always left to compute (its logits give the next token), so at most the full pages
// before the last token are used.
// Unquantized caches: each chunk's BF16 page, as far as the chunks have one.
// Quantized caches: BF16 sink pages, then INT2 history pages for [n_sink, h), then BF16 pages
// (a recent window) for [h, m), the form a sequence holds; h never beyond the history a cold
// sequence of context_tokens tokens holds after its prefill. The longest m wins; for it, h is the
// history end of a cold sequence of m tokens when the forms allow it (then the next chunk reads
// what a cold chunked prefill reads), else the nearest h above it, else the nearest below: BF16
// pages where a cold sequence holds INT2, which the sequence's next commit demotes into its own
// new INT2 pages (the shared BF16 pages are only read). A chunk held only as INT2 where BF16 is
// needed ends the match there (the rest is recomputed).
// exact_history (--enable-deterministic-inference, quantized caches): h is exactly the history end
// of a cold sequence of m tokens, and m the longest prefix for which the forms allow it. Then the
// first computed query reads every key as a cold chunked prefill would (INT2 below the history
// end its position gives, BF16 above): an h above it would make it read INT2 where the cold run
// reads exact rows; one below, rows quantized on the fly that the CUDA decode-equivalent prefill
// only holds for one page beyond the history (prefill_deq_zone.cuh).
std::vector<CachedPage> choose_prefix_forms(const RegionConfig& cfg, bool quantized,
                                            int64_t context_tokens,
                                            std::span<const CachedChunk> chunks,
                                            bool exact_history = false);

// Fresh pages a request must be able to hold at once over its lifetime: the peak pages of a
// sequence growing to prompt_tokens + max_tokens tokens, minus the cached_tokens prefix already
// supplied by the radix cache (sink pages for the part below n_sink, history pages above). Checks
// that cached_tokens is a multiple of page_size and <= reusable_prefix_tokens(cfg, prompt_tokens).
PageNeed pages_needed(const RegionConfig& cfg, int64_t prompt_tokens, int64_t max_tokens,
                      int64_t cached_tokens = 0);

// True when both pools have enough free pages for `need` right now.
bool can_admit(const PagePool& bf16, const PagePool& int2, const PageNeed& need);

// ResourceExhausted when `need` exceeds a pool's total size, i.e. the request could never be
// admitted even with every other page free (the server rejects it instead of queueing forever).
Status check_fits_pools(const PagePool& bf16, const PagePool& int2, const PageNeed& need);

}  // namespace oscar::kv
