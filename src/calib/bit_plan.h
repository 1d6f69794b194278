// The calibration-time choice of a mixed-precision bit plan (kv/bit_plan.h; OSCAR.md §2 "Bit
// plans", beyond): which (layer, KV head) keys get 3 bits and which values pay for them at 1 bit.
//
// Measured on tiny-qwen3 (docs/results/ablation.md): NIAH retrieval at 8K is lost almost entirely
// in the INT2 keys of one or two heads (layer 5 head 1 first), and layer 0's values carry almost
// no energy. The rule below names those heads from calibration statistics alone (with one pair
// it picks exactly the plan first found by hand; the default two pairs lift NIAH 8K from 0.70 to
// 0.80, 0.75 to 0.86 on held-out prompts, and lower perplexity, at the same bytes):
//   keys:   descending KeyScaling::logit_error, the expected squared logit error of a head's INT2
//           keys per unit of quantization noise (what finer steps remove);
//   values: ascending tr C_S, the energy of the values attention reads (what coarser steps cost;
//           the rotated noise is proportional to it).
// `pairs` planes of each are changed, so the history keeps the INT2 average (one INT3 + one INT1
// row = two INT2 rows). Ties break towards the lower (layer, head) index, so the choice is
// deterministic.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace oscar::calib {

struct BitPlanChoice {
  std::vector<int8_t> k_bits, v_bits;  // [n_layers * n_heads_kv], 1, 2 or 3
};

// key_logit_error, value_energy: [n_heads_total] per (layer, KV head). pairs in
// [0, n_heads_total]; 0 gives all 2s. InvalidArgument otherwise or on a size mismatch.
Result<BitPlanChoice> choose_bit_plan(const std::vector<double>& key_logit_error,
                                      const std::vector<double>& value_energy, int pairs);

}  // namespace oscar::calib
