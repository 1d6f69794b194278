#include "kv/bit_plan.h"

#include "core/check.h"
#include "quant/bit_plan_layout.h"

namespace oscar::kv {

Result<std::shared_ptr<const BitPlan>> BitPlan::create(int n_layers, int n_heads_kv, int head_dim,
                                                       int group_size,
                                                       const std::vector<int8_t>& k_bits,
                                                       const std::vector<int8_t>& v_bits) {
  if (n_layers <= 0 || n_heads_kv <= 0)
    return invalid_argument("bit plan: %d layers, %d kv heads", n_layers, n_heads_kv);
  if (!quant::int2_valid_group(head_dim, group_size))
    return invalid_argument("bit plan: group size %d does not fit head_dim %d", group_size,
                            head_dim);
  const size_t heads = static_cast<size_t>(n_layers) * n_heads_kv;
  if (k_bits.size() != heads || v_bits.size() != heads)
    return invalid_argument("bit plan: %zu key and %zu value widths, expected n_layers x "
                            "n_kv_heads = %zu each", k_bits.size(), v_bits.size(), heads);
  auto plan = std::shared_ptr<BitPlan>(new BitPlan());
  plan->n_layers_ = n_layers;
  plan->n_heads_kv_ = n_heads_kv;
  plan->head_dim_ = head_dim;
  plan->group_size_ = group_size;
  plan->plane_bits_.resize(heads * 2);
  plan->row_prefix_.assign(heads * 2 + 1, 0);
  for (int l = 0; l < n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < n_heads_kv; ++h) {
        const int8_t b = (kv == 0 ? k_bits : v_bits)[static_cast<size_t>(l) * n_heads_kv + h];
        if (quant::bit_plan_row_bytes(b, head_dim, group_size) == 0)
          return invalid_argument("bit plan: layer %d %s head %d has %d bits per element; "
                                  "expected 1, 2 or 3", l, kv == 0 ? "K" : "V", h, b);
        const size_t p = (static_cast<size_t>(l) * 2 + kv) * n_heads_kv + h;
        plan->plane_bits_[p] = b;
        plan->row_prefix_[p + 1] =
            plan->row_prefix_[p] +
            static_cast<uint32_t>(quant::bit_plan_row_bytes(b, head_dim, group_size));
      }
  return std::shared_ptr<const BitPlan>(std::move(plan));
}

int BitPlan::bits(int layer, int kv, int head) const {
  OSCAR_CHECK(layer >= 0 && layer < n_layers_ && (kv == 0 || kv == 1) && head >= 0 &&
              head < n_heads_kv_);
  return plane_bits_[(static_cast<size_t>(layer) * 2 + kv) * n_heads_kv_ + head];
}

double BitPlan::bits_per_element() const {
  return 8.0 * static_cast<double>(token_bytes()) /
         (static_cast<double>(plane_bits_.size()) * head_dim_);
}

std::string BitPlan::describe() const {
  std::string out;
  for (int b : {3, 1}) {
    std::string list;
    for (int kv = 0; kv < 2; ++kv)
      for (int l = 0; l < n_layers_; ++l)
        for (int h = 0; h < n_heads_kv_; ++h)
          if (bits(l, kv, h) == b)
            list += str_format("%s%s L%dH%d", list.empty() ? "" : ", ", kv == 0 ? "K" : "V", l, h);
    if (!list.empty()) out += str_format("%s%d-bit: %s", out.empty() ? "" : "; ", b, list.c_str());
  }
  return out.empty() ? "uniform" : out;
}

}  // namespace oscar::kv
