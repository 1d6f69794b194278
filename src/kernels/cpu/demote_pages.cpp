// CPU demote_pages (kernels/demote_pages.h): one task per (page, layer).
#include "kernels/demote_pages.h"

#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "kernels/exact_row.h"
#include "quant/kivi.h"

namespace oscar::kernels {

Status demote_pages(const DemotePagesParams& p) {
  const KvPageLayout& L = p.layout;
  if (p.n_pages < 0) return invalid_argument("demote_pages: n_pages %d < 0", p.n_pages);
  if (p.n_pages == 0) return Status();
  if (p.exact_pool == nullptr || p.hist_pool == nullptr || p.src_pages == nullptr ||
      p.dst_pages == nullptr || p.status == nullptr)
    return invalid_argument("demote_pages: null pool, page list or status");
  const bool kivi = p.codec.quantizer == quant::HistQuantizer::kKivi;
  constexpr int kBlock = quant::kKiviKeyBlockTokens;
  if (kivi && L.page_size % kBlock != 0)
    return invalid_argument("demote_pages: kivi2 needs page_size a multiple of %d, got %d", kBlock,
                            L.page_size);
  const int d = L.head_dim, H = L.n_heads_kv, P = L.page_size, G = p.codec.group_size;
  for (int32_t i = 0; i < p.n_pages; ++i) p.status[i] = kDemoteOk;
  const int n_tasks = p.n_pages * L.n_layers;
#pragma omp parallel if (n_tasks > 1)
  {
    std::vector<float> x(static_cast<size_t>(kivi ? kBlock : 1) * d);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tasks; ++task) {
      const int i = task / L.n_layers;
      const int layer = task % L.n_layers;
      const uint8_t* src = p.exact_pool + static_cast<size_t>(p.src_pages[i]) * L.exact_page_bytes();
      uint8_t* dst = p.hist_pool + static_cast<size_t>(p.dst_pages[i]) * L.int2_page_bytes();
      bool ok = true;
      for (int kv = 0; kv < 2 && ok; ++kv) {
        for (int h = 0; h < H && ok; ++h) {
          const quant::RowFormat f = p.codec.format(L, layer, kv, h);
          if (f == quant::RowFormat::kKiviKeyBlock) {
            // KIVI keys: per channel over each 32-token block of the page (kernels/kv_layout.h).
            for (int b = 0; b < P / kBlock && ok; ++b) {
              for (int t = 0; t < kBlock; ++t)
                load_exact_row(src + L.exact_row_offset(layer, 0, h, b * kBlock + t),
                           L.exact_elem_bytes, d, x.data() + static_cast<size_t>(t) * d);
              ok = quant::quantize_kivi_key_block_ref(x.data(), d,
                                                      dst + L.kivi_key_block_offset(layer, h, b))
                       .ok();
            }
            continue;
          }
          const quant::RowCodec& codec = quant::row_codec(f);
          const float clip = p.codec.clip(kv, layer, h, H);
          for (int slot = 0; slot < P && ok; ++slot) {
            load_exact_row(src + L.exact_row_offset(layer, kv, h, slot), L.exact_elem_bytes, d,
                       x.data());
            ok = codec.quantize(x.data(), d, G, clip, dst + L.int2_row_offset(layer, kv, h, slot))
                     .ok();
          }
        }
      }
      // The quantizers refuse only non-finite rows (shapes were checked by the cache spec).
      if (!ok) {
#pragma omp atomic write
        p.status[i] = kDemoteNonFinite;
      }
    }
  }
  return Status();
}

}  // namespace oscar::kernels
