// demote_pages: the fused demotion of OSCAR.md §4. Each full exact page (the oldest recent page of
// a sequence) is quantized into a history page, for all layers, K and V, heads and slots in one
// call for the whole step: K/V rows are already in the rotated basis (kv_append), so this is clip,
// quantize and pack, row by row, in the format of each plane (kernels/kv_codec.h: INT2, a bit
// plan's 3/1-bit rows, or the KIVI baseline's key blocks and value rows).
//
// A page holding a non-finite value cannot be quantized; its status is set and the other pages
// are unaffected, so the step fails only the request that owns it.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/kv_codec.h"
#include "kernels/kv_layout.h"

namespace oscar::kernels {

inline constexpr int32_t kDemoteOk = 0;
inline constexpr int32_t kDemoteNonFinite = 1;

struct DemotePagesParams {
  KvPageLayout layout;
  HistCodec codec;
  const uint8_t* exact_pool = nullptr;  // [n_pages, layout.exact_page_bytes()]
  uint8_t* hist_pool = nullptr;         // [n_pages, layout.int2_page_bytes()]
  int32_t n_pages = 0;
  const int32_t* src_pages = nullptr;   // [n_pages] full exact pages
  const int32_t* dst_pages = nullptr;   // [n_pages] history pages, written whole
  int32_t* status = nullptr;            // [n_pages] out: kDemoteOk or kDemoteNonFinite
};

// CPU: the reference quantizers of quant/row_codec.h (bit-exact with them), parallel over
// (page, layer). Returns a Status only for bad parameters; per-page failures go to `status`.
Status demote_pages(const DemotePagesParams& p);
Status demote_pages_cuda(const DemotePagesParams& p, void* stream);

}  // namespace oscar::kernels
