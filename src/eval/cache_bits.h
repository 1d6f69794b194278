// Measured bits per element of a cache (OSCAR.md §2 "Effective bits per element"): the bytes the
// SequenceCache really holds after a prefill, per region, over 2 · L · n_layers · n_heads_kv ·
// head_dim elements, plus the projection to longer contexts (sink and recent bytes fixed, the
// INT2 history growing at its measured per-token cost). Measured bytes, never the formula alone.
#pragma once

#include <cstdint>

#include "eval/niah.h"
#include "kv/sequence_cache.h"

namespace oscar::eval {

struct CacheBits {
  int64_t n_tokens = 0, hist_tokens = 0;
  kv::CacheBytes bytes;
  int64_t elems_per_token = 0;  // 2 · n_layers · n_heads_kv · head_dim
  double bits_hist = 0.0;       // history bytes · 8 / (hist_tokens · elems_per_token); 0 if none
  double bits_total = 0.0;      // all bytes · 8 / (n_tokens · elems_per_token)
  // Projected total bits per element at a context of `tokens`.
  double bits_at(int64_t tokens) const;
};

CacheBits cache_bits(const PrefillSnapshot& snapshot, const kv::KvCacheSpec& spec);

}  // namespace oscar::eval
