// The calibration-time choice of a mixed-precision bit plan (kv/bit_plan.h; OSCAR.md §2 "Bit
// plans", beyond): which (layer, KV head) keys get 3 bits and which values pay for them at 1 bit.
//
// Measured on tiny-qwen3 (docs/results/ablation.md): NIAH retrieval at 8K is lost almost entirely
// in the INT2 keys of one head (layer 5 head 1); giving exactly that head 3-bit keys and layer 0
// head 0 1-bit values (the same bytes) lifts NIAH 8K from 0.70 to 0.82 at equal perplexity. The
// rule below names those heads from calibration statistics alone:
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
