// What the MoE reference (moe_ref.cpp) and fast path (moe.cpp) share: the params checks and the
// expert selection, so that both select the same experts bit for bit. Internal to kernels/cpu/.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/moe.h"

namespace oscar::kernels::moe_detail {

Status check_route(const MoeRouteParams& p);
// Shapes, dtypes, pointers, and every expert id in [0, n_experts).
Status check_ffn(const MoeFfnParams& p);
// ids[0 .. top_k) = the experts of the largest logits, descending, equal logits to the lower
// index, NaN below every number. logits: [n_experts].
void select_top_k(const float* logits, int32_t n_experts, int32_t top_k, int32_t* ids);

}  // namespace oscar::kernels::moe_detail
