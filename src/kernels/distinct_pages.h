// The distinct pages of a page table, for kernels that process each page once however many
// sequences list it (sequences sharing a prefix through the radix cache share its pages): the
// CUDA prefill expands each history page to BF16 once (PrefillAttnParams::hist_unique /
// hist_slot). Host-side, header-only: the step plan, the kernel tests and the benchmarks use it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace oscar::kernels {

struct DistinctPages {
  std::vector<int32_t> pages;  // each page id once, in order of first appearance
  std::vector<int32_t> index;  // [ids.size()] index into pages of each entry
};

inline DistinctPages distinct_pages(std::span<const int32_t> ids) {
  DistinctPages d;
  d.index.reserve(ids.size());
  std::unordered_map<int32_t, int32_t> seen;
  seen.reserve(ids.size());
  for (const int32_t id : ids) {
    const auto [it, fresh] = seen.try_emplace(id, static_cast<int32_t>(d.pages.size()));
    if (fresh) d.pages.push_back(id);
    d.index.push_back(it->second);
  }
  return d;
}

}  // namespace oscar::kernels
