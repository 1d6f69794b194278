// BitPlan: how many bits each (layer, K/V, KV head) spends on its history rows (mixed precision,
// OSCAR.md §2 "Bit plans", beyond). Retrieval at long range hangs on a few heads' keys, and some
// heads' values barely matter (docs/results/ablation.md), so a plan gives a few key planes 3 bits
// per element and pays for them with as many value planes at 1 bit: one INT3 row plus one INT1 row
// cost exactly two INT2 rows (quant/bit_plan_layout.h), so the history stays at the INT2 average.
//
// A plan is immutable and shared (KvCacheSpec holds a shared_ptr): kernels::KvPageLayout points
// into it (hist_bits, hist_row_prefix), so pages of every sequence of an engine have one layout.
// The plan is chosen at calibration (calib/bit_plan.h) and stored in the rotation file
// (quant/rotation_file.h, layers.{l}.k.bits / v.bits), or at startup for a target average
// (`--kv-bits`, calib::choose_bit_plan_for_bits), or is one width everywhere (uniform(): the
// `oscar4` / `oscar3` modes). Widths 1..4 (quant/bit_plan_layout.h, quant/int4_layout.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::kv {

class BitPlan {
 public:
  // k_bits, v_bits: [n_layers * n_heads_kv] bits per element (1, 2, 3 or 4) of the key and value
  // history rows of each (layer, KV head). InvalidArgument for a wrong size, a width outside
  // {1, 2, 3, 4} or a group size the rows cannot use (quant::int2_valid_group).
  static Result<std::shared_ptr<const BitPlan>> create(int n_layers, int n_heads_kv, int head_dim,
                                                       int group_size,
                                                       const std::vector<int8_t>& k_bits,
                                                       const std::vector<int8_t>& v_bits);
  // Every plane at `bits` (1..4).
  static Result<std::shared_ptr<const BitPlan>> uniform(int n_layers, int n_heads_kv, int head_dim,
                                                        int group_size, int bits);

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
  // "uniform" for an all-2 plan, "uniform 4-bit" for another single width, else e.g.
  // "3-bit: K L5H1; 1-bit: V L0H0" (the planes at widths other than 2, widest first).
  std::string describe() const;

 private:
  BitPlan() = default;
  int n_layers_ = 0, n_heads_kv_ = 0, head_dim_ = 0, group_size_ = 0;
  std::vector<int8_t> plane_bits_;
  std::vector<uint32_t> row_prefix_;
};

// --- A plan for a target average (`--kv-bits X`, OSCAR.md §2 "Bit plans", beyond) -------------
//
// The rule generalises calib::choose_bit_plan's pairs (3-bit keys where the expected INT2 logit
// error is largest, 1-bit values where tr C_S is smallest) to any budget and to widths 1..4:
//   cost:  plane p at b bits has expected error  w_p · n_p(b), where
//          w_p = key_logit_error_p / Σ_keys key_logit_error   for a key plane,
//          w_p = value_energy_p    / Σ_values value_energy    for a value plane
//          (the two calibration statistics of calib/bit_plan.h, each normalised so that keys and
//          values weigh the same in total), and n_p(b) is the measured error per unit variance
//          of the b-bit row codec with the clip that row gets (row_noise_per_unit_variance):
//          the plane's clip at 1-2 bits, none at 3-4 bits (the runtime does not clip the wide
//          rows of a plan: docs/results/precision_ladder.md).
//   bytes: every bit more costs head_dim/8 bytes per row at any width (quant/bit_plan_layout.h),
//          so a budget of X bits per element is a number of one-bit steps above all-1.
//   plan:  the widths that minimise Σ_p w_p · n_p(b_p) within the budget, found exactly by
//          dynamic programming over the planes (ties: the first plane in plane order gets the
//          step), with keys never below 2 bits (as today's rule: 1-bit rows hold values only).
// X ranges from all rows at 2 bits (2.25 at G 128) to all at 4 (4.25); the plan's average is
// within one step (head_dim/8 bytes over all planes of a token) below X.
struct PlanStatistics {
  std::vector<double> key_logit_error;  // [n_layers * n_heads_kv], >= 0
  std::vector<double> value_energy;     // [n_layers * n_heads_kv], >= 0 (tr C_S)
  std::vector<float> k_clip, v_clip;    // [n_layers * n_heads_kv] 2-bit rows' clips; empty = 1
};

// Bits per element of the history with every row at `bits` (1..4), metadata included.
double uniform_plan_bits(int bits, int head_dim, int group_size);

// The error per unit variance of the `bits`-bit history row (1..4, uniform; 1 = two Lloyd
// levels) with clip quantile `clip`, measured on seeded standard Gaussian rows of head_dim values
// (what rotated rows look like). Deterministic.
double row_noise_per_unit_variance(int bits, int head_dim, int group_size, float clip);

// The plan above. InvalidArgument for X outside [uniform_plan_bits(2), uniform_plan_bits(4)],
// non-finite X, mis-sized or negative statistics.
Result<std::shared_ptr<const BitPlan>> plan_for_bits(int n_layers, int n_heads_kv, int head_dim,
                                                     int group_size, double target_bits,
                                                     const PlanStatistics& stats);

}  // namespace oscar::kv
