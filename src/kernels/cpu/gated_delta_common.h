// What the Gated DeltaNet reference (gated_delta_ref.cpp) and fast path (gated_delta.cpp) share:
// the params checks and the state/row addressing. Internal to kernels/cpu/.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/gated_delta.h"

namespace oscar::kernels::gdn_detail {

// Shapes, pointers, cu_seqlens ascending from 0, slots non-negative and distinct.
Status check_conv(const CausalConv1dParams& p);
Status check_gates(const GdnGatesParams& p);
Status check_delta(const GatedDeltaParams& p, const char* op);
Status check_norm(const RmsNormGatedParams& p, const char* op);

inline int32_t slot_of(const int32_t* slots, int32_t s) { return slots ? slots[s] : s; }
inline int64_t stride_or(int64_t stride, int64_t dense) { return stride ? stride : dense; }

}  // namespace oscar::kernels::gdn_detail
