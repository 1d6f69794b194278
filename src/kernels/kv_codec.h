// HistCodec: how one engine makes and reads its history rows, as every cache op sees it (demotion,
// the decode-equivalent prefill, the references): the quantizer, the group size and the clip
// quantile of each (layer, head) for K and V. The row widths of a bit plan are in KvPageLayout.
// Plain data over host or device pointers; kv::KvCacheSpec fills it (codec()).
#pragma once

#include <cstdint>

#include "kernels/kv_layout.h"
#include "quant/row_codec.h"

namespace oscar::kernels {

struct HistCodec {
  quant::HistQuantizer quantizer = quant::HistQuantizer::kInt2Uniform;
  int32_t group_size = 128;        // quant_group of the INT2/INT3/INT1 rows (KIVI: fixed 32)
  const float* k_clip = nullptr;   // [n_layers * n_heads_kv] clip quantile per (layer, head); null = 1
  const float* v_clip = nullptr;

  float clip(int kv, int layer, int head, int n_heads_kv) const {
    const float* c = kv == 0 ? k_clip : v_clip;
    return c == nullptr ? 1.0f : c[layer * n_heads_kv + head];
  }
  // Format of the history rows of (layer, kv, head) under `layout`'s bit plan.
  quant::RowFormat format(const KvPageLayout& layout, int layer, int kv, int head) const {
    return quant::hist_row_format(quantizer, kv, layout.hist_row_bits(layer, kv, head));
  }
};

}  // namespace oscar::kernels
