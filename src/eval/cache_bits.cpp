#include "eval/cache_bits.h"

namespace oscar::eval {

CacheBits cache_bits(const PrefillSnapshot& s, const kv::KvCacheSpec& spec) {
  CacheBits b;
  b.n_tokens = s.n_tokens;
  b.hist_tokens = s.hist_tokens;
  b.bytes = s.bytes;
  b.elems_per_token = int64_t{2} * spec.n_layers * spec.n_heads_kv * spec.head_dim;
  if (b.hist_tokens > 0)
    b.bits_hist = static_cast<double>(s.bytes.history) * 8.0 /
                  (static_cast<double>(b.hist_tokens) * static_cast<double>(b.elems_per_token));
  if (b.n_tokens > 0)
    b.bits_total = static_cast<double>(s.bytes.total()) * 8.0 /
                   (static_cast<double>(b.n_tokens) * static_cast<double>(b.elems_per_token));
  return b;
}

double CacheBits::bits_at(int64_t tokens) const {
  if (n_tokens <= 0 || tokens <= 0) return 0.0;
  double total_bytes;
  if (hist_tokens > 0) {
    // Sinks and the recent window stay as measured; history grows at its measured cost per token.
    const double per_hist = static_cast<double>(bytes.history) / static_cast<double>(hist_tokens);
    const int64_t fixed_tokens = n_tokens - hist_tokens;
    total_bytes = static_cast<double>(bytes.sink + bytes.recent) +
                  per_hist * static_cast<double>(tokens - fixed_tokens);
  } else {
    total_bytes = static_cast<double>(bytes.total()) / static_cast<double>(n_tokens) *
                  static_cast<double>(tokens);
  }
  return total_bytes * 8.0 / (static_cast<double>(tokens) * static_cast<double>(elems_per_token));
}

}  // namespace oscar::eval
