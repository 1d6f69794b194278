// Admission arithmetic: how many BF16 and INT2 pages one request can ever hold, given its prompt
// length, its max_tokens and the region config (OSCAR.md §4), and whether the pools can take it
// now. Pure functions of sizes; the scheduler decides what to do with the answer (queue, evict
// from the radix cache, preempt). Nothing here allocates.
//
// Regions, for a sequence of L tokens with page size P (n_sink and n_recent multiples of P):
//   sinks    tokens [0, min(L, n_sink))                      BF16, ceil(min(L, n_sink) / P) pages
//   history  tokens [n_sink, n_sink + H*P)                   INT2, H pages
//   recent   tokens [n_sink + H*P, L)                        BF16, ceil(w / P) pages, w = L - n_sink - H*P
// where H = max(0, floor((L - n_sink - n_recent) / P)): the recent window holds w tokens with
// n_recent <= w <= n_recent + P - 1 once the sequence is long enough (a page is demoted when w
// reaches n_recent + P), so it spans at most ceil((n_recent + P) / P) = n_recent/P + 1 pages.
// All three counts are non-decreasing in L, and during a demotion the new INT2 page is allocated
// while the old BF16 page is still held, which the bounds above already cover. So the peak need
// of a request is the need at L = prompt_tokens + max_tokens.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kv/page_pool.h"

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

// Pages a sequence of n_tokens tokens holds in each region (formula above). cfg must be valid.
PageNeed pages_for_length(const RegionConfig& cfg, int64_t n_tokens);

// The longest page-aligned prefix of a prompt of prompt_tokens tokens whose pages a radix-cache
// hit may supply: it must lie in the sink or history regions at prefill time (the recent window
// is always recomputed in BF16), and at least one prompt token must remain to be computed (its
// logits give the first output token). A multiple of page_size; 0 for an empty prompt.
int64_t reusable_prefix_tokens(const RegionConfig& cfg, int64_t prompt_tokens);

// Fresh pages a request must allocate over its lifetime: the pages of a sequence of
// prompt_tokens + max_tokens tokens, minus the cached_tokens prefix already supplied by the radix
// cache (sink pages for the part below n_sink, history pages above). Checks that cached_tokens is
// a multiple of page_size and <= reusable_prefix_tokens(cfg, prompt_tokens).
PageNeed pages_needed(const RegionConfig& cfg, int64_t prompt_tokens, int64_t max_tokens,
                      int64_t cached_tokens = 0);

// True when both pools have enough free pages for `need` right now.
bool can_admit(const PagePool& bf16, const PagePool& int2, const PageNeed& need);

// ResourceExhausted when `need` exceeds a pool's total size, i.e. the request could never be
// admitted even with every other page free (the server rejects it instead of queueing forever).
Status check_fits_pools(const PagePool& bf16, const PagePool& int2, const PageNeed& need);

}  // namespace oscar::kv
