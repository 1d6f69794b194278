// BitPlan: how many bits each (layer, K/V, KV head) spends on its history rows (mixed precision,
// OSCAR.md §2 "Bit plans", beyond). Retrieval at long range hangs on a few heads' keys, and some
// heads' values barely matter (docs/results/ablation.md), so a plan gives a few key planes 3 bits
// per element and pays for them with as many value planes at 1 bit: one INT3 row plus one INT1 row
// cost exactly two INT2 rows (quant/bit_plan_layout.h), so the history stays at the INT2 average.
//
// A plan is immutable and shared (KvCacheSpec holds a shared_ptr): kernels::KvPageLayout points
// into it (hist_bits, hist_row_prefix), so pages of every sequence of an engine have one layout.
// The plan is chosen at calibration (calib/bit_plan.h) and stored in the rotation file
// (quant/rotation_file.h, layers.{l}.k.bits / v.bits).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::kv {

class BitPlan {
 public:
  // k_bits, v_bits: [n_layers * n_heads_kv] bits per element (1, 2 or 3) of the key and value
  // history rows of each (layer, KV head). InvalidArgument for a wrong size, a width outside
  // {1, 2, 3} or a group size the rows cannot use (quant::int2_valid_group).
  static Result<std::shared_ptr<const BitPlan>> create(int n_layers, int n_heads_kv, int head_dim,
                                                       int group_size,
                                                       const std::vector<int8_t>& k_bits,
                                                       const std::vector<int8_t>& v_bits);

  int n_layers() const { return n_layers_; }
  int n_heads_kv() const { return n_heads_kv_; }
  int head_dim() const { return head_dim_; }
  int group_size() const { return group_size_; }
  int bits(int layer, int kv, int head) const;
  // [n_planes] and [n_planes + 1], plane = (layer · 2 + kv) · n_heads_kv + head
  // (kernels/kv_layout.h).
  const int8_t* plane_bits() const { return plane_bits_.data(); }
  const uint32_t* row_prefix() const { return row_prefix_.data(); }
  // Bytes of one token's history rows over all planes, and bits per element on average.
  int64_t token_bytes() const { return row_prefix_.back(); }
  double bits_per_element() const;
  // "uniform" for an all-2 plan, else e.g. "3-bit: K L5H1; 1-bit: V L0H0".
  std::string describe() const;

 private:
  BitPlan() = default;
  int n_layers_ = 0, n_heads_kv_ = 0, head_dim_ = 0, group_size_ = 0;
  std::vector<int8_t> plane_bits_;
  std::vector<uint32_t> row_prefix_;
};

}  // namespace oscar::kv
