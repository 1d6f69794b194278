// The layout of one KV page, shared by the CPU reference, the CPU fast path and CUDA kernels.
//
// A page holds `page_size` consecutive tokens of one sequence for ALL layers, K and V, all KV
// heads (one page id per token range, as in vLLM's block tables). Two kinds of pages:
//   exact page (BF16 pool; F32 for the bit-faithful reference mode):
//     [n_layers][2 (K,V)][n_heads_kv][page_size][head_dim] elements of exact_elem_bytes
//   INT2 page (history pool): [n_layers][2][n_heads_kv][page_size] rows of
//     int2_row_bytes(head_dim, group_size) bytes (quant/int2_layout.h: codes, then fp16 metadata)
//   KIVI page (history pool of the `kivi2` baseline, OSCAR.md §8): the same size and planes as an
//     INT2 page with int2_row_bytes = int2_row_bytes(head_dim, 32) = 3·head_dim/8. The V plane
//     [layer][1][head] holds page_size value rows (per token, groups of 32 channels). The K plane
//     [layer][0][head] (page_size x int2_row_bytes bytes) holds page_size/32 key blocks of
//     quant::kivi_key_block_bytes(head_dim) = 12·head_dim = 32 x int2_row_bytes bytes each
//     (quant/kivi.h: per channel over 32 tokens), block b covering slots [32b, 32b + 32).
//     page_size is a multiple of 32, so a page never splits a block.
//   bit-plan page (history pool of `oscar` with a mixed-precision bit plan, kv/bit_plan.h): the
//     same planes [n_layers][2][n_heads_kv], but plane p = (layer, kv, head) holds rows of
//     hist_bits[p] bits per element (4, 3, 2 or 1: quant/int4_layout.h, quant/bit_plan_layout.h,
//     quant/int2_layout.h; `oscar4` / `oscar3` are plans of one width),
//     each of hist_row_prefix[p + 1] − hist_row_prefix[p] bytes, and starts at byte
//     page_size · hist_row_prefix[p]. A page is page_size · hist_row_prefix[n_planes] bytes.
// Plain data only: this header is included by CUDA code (methods are OSCAR_HD).
//
// History bytes on the GPU (docs/OSCAR.md §4, "History bytes"): the row layout above is the one
// the CUDA kernels read too; a plane of one page is page_size contiguous rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hd.h"

namespace oscar::kernels {

struct KvPageLayout {
  int32_t n_layers = 0;
  int32_t n_heads_kv = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;          // tokens per page
  int32_t exact_elem_bytes = 2;   // 2 = bf16, 4 = f32
  int32_t int2_row_bytes = 0;     // bytes per (token, head) INT2 row, metadata included
  // Bit plan (null = every history row is INT2 of int2_row_bytes): bits per element of each plane
  // and the prefix sums of one token's row bytes over the planes, [n_planes] and [n_planes + 1]
  // with n_planes = n_layers · 2 · n_heads_kv, plane index (layer · 2 + kv) · n_heads_kv + head.
  // Owned by kv::BitPlan; the host pointers here, device copies in CUDA code (the backend makes
  // them once per engine).
  const int8_t* hist_bits = nullptr;
  const uint32_t* hist_row_prefix = nullptr;

  // Exact pages.
  OSCAR_HD size_t exact_row_bytes() const { return static_cast<size_t>(head_dim) * exact_elem_bytes; }
  OSCAR_HD size_t exact_page_bytes() const {
    return static_cast<size_t>(n_layers) * 2 * n_heads_kv * page_size * exact_row_bytes();
  }
  // Byte offset of row (layer, kv 0=K 1=V, head, slot) inside an exact page.
  OSCAR_HD size_t exact_row_offset(int layer, int kv, int head, int slot) const {
    return ((((static_cast<size_t>(layer) * 2 + kv) * n_heads_kv + head) * page_size) + slot) *
           exact_row_bytes();
  }

  // History (INT2, KIVI or bit-plan) pages.
  OSCAR_HD int n_planes() const { return n_layers * 2 * n_heads_kv; }
  OSCAR_HD int plane(int layer, int kv, int head) const { return (layer * 2 + kv) * n_heads_kv + head; }
  // Bits per element of the history rows of (layer, kv, head): 2 without a bit plan.
  OSCAR_HD int hist_row_bits(int layer, int kv, int head) const {
    return hist_bits != nullptr ? hist_bits[plane(layer, kv, head)] : 2;
  }
  OSCAR_HD size_t hist_row_bytes(int layer, int kv, int head) const {
    if (hist_row_prefix == nullptr) return static_cast<size_t>(int2_row_bytes);
    const int p = plane(layer, kv, head);
    return hist_row_prefix[p + 1] - hist_row_prefix[p];
  }
  OSCAR_HD size_t int2_page_bytes() const {
    if (hist_row_prefix != nullptr)
      return static_cast<size_t>(page_size) * hist_row_prefix[n_planes()];
    return static_cast<size_t>(n_planes()) * page_size * int2_row_bytes;
  }
  OSCAR_HD size_t int2_row_offset(int layer, int kv, int head, int slot) const {
    const int p = plane(layer, kv, head);
    if (hist_row_prefix != nullptr)
      return static_cast<size_t>(page_size) * hist_row_prefix[p] +
             static_cast<size_t>(slot) * (hist_row_prefix[p + 1] - hist_row_prefix[p]);
    return (static_cast<size_t>(p) * page_size + slot) * static_cast<size_t>(int2_row_bytes);
  }

  // Inside a history row: the codes start at byte 0, the fp16 metadata after them
  // (quant/int2_layout.h, bit_plan_layout.h). Kernels that read codes and metadata separately use
  // these, so that a later split of a plane into a code block and a metadata block touches this
  // header only.
  OSCAR_HD size_t hist_codes_offset(int layer, int kv, int head, int slot) const {
    return int2_row_offset(layer, kv, head, slot);
  }
  OSCAR_HD size_t hist_meta_offset(int layer, int kv, int head, int slot) const {
    const int bits = hist_row_bits(layer, kv, head);
    return int2_row_offset(layer, kv, head, slot) +
           static_cast<size_t>(bits == 1   ? head_dim / 8
                               : bits == 3 ? head_dim / 4 + head_dim / 8
                               : bits == 4 ? head_dim / 2
                                           : head_dim / 4);
  }
  // Every plane of a history page starts 16-byte aligned (whole planes can be staged with
  // 16-byte loads); KvCacheSpec::validate() checks it for the engine's layout.
  OSCAR_HD bool hist_planes_aligned() const {
    for (int p = 0; p <= n_planes(); ++p) {
      const size_t start = hist_row_prefix != nullptr
                               ? static_cast<size_t>(page_size) * hist_row_prefix[p]
                               : static_cast<size_t>(p) * page_size * int2_row_bytes;
      if (start % 16 != 0) return false;
    }
    return true;
  }

  // KIVI pages: tokens per key block, and the byte offset of key block `block` (slots
  // [32·block, 32·block + 32)) of (layer, head) inside a page.
  static constexpr int32_t kKiviKeyBlockTokens = 32;
  OSCAR_HD size_t kivi_key_block_offset(int layer, int head, int block) const {
    return int2_row_offset(layer, 0, head, block * kKiviKeyBlockTokens);
  }
};

}  // namespace oscar::kernels
