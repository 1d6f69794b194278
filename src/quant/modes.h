// KV-cache modes selectable at run time (OSCAR.md §8: baselines in the same binary) and their
// command-line names. What each mode means for the cache is implemented by kv/ and kernels/;
// this file is only the vocabulary.
#pragma once

#include <string_view>

#include "core/status.h"

namespace oscar::quant {

enum class CacheMode {
  kBF16,          // "bf16": no quantization, BF16 cache
  kF32,           // "f32": exact float32 cache, the reference for everything else
  kInt2Naive,     // "int2-naive": INT2, no rotation, no clipping
  kInt2Hadamard,  // "int2-hadamard": INT2 after H · P_br (QuaRot-style), no U
  kKivi2,         // "kivi2": keys per channel / values per token, groups of 32 (quant/kivi.h)
  kOscar,         // "oscar": R = U · H · P_br, clipping, uniform INT2
  kOscarLloyd,    // "oscar-lloyd": as oscar with the Lloyd-Max quantizer
  // The precision ladder (docs/results/precision_ladder.md): oscar's rotations and key scaling
  // within a budget of bits per element, 3-/4-bit rows not clipped unless --k-clip / --v-clip say
  // so (engine/runtime.cpp).
  kOscar4,  // "oscar4": every row 4-bit (quant/int4_layout.h), 4.25 bits per element at G 128
  kOscar3,  // "oscar3": 3.25 bits per element: planned from the rotation file's statistics
            // (widths 1-4), or every row 3-bit (quant/bit_plan_layout.h) without them
};

// "bf16", "f32", "int2-naive", "int2-hadamard", "kivi2", "oscar", "oscar-lloyd", "oscar4",
// "oscar3" (exact, lower case). Anything else is InvalidArgument naming the string and the accepted
// names.
Result<CacheMode> parse_cache_mode(std::string_view name);
const char* cache_mode_name(CacheMode mode);

// Whether a mode stores INT2 codes (and so has a quantized history region).
bool cache_mode_is_quantized(CacheMode mode);

// Whether a mode reads the rotation file (rotations, key scaling, clips): oscar, oscar-lloyd,
// oscar4, oscar3.
bool cache_mode_is_oscar(CacheMode mode);

// The width whose uniform rows set the budget of oscar4 / oscar3 (4 / 3); 0 for every other mode.
int cache_mode_fixed_bits(CacheMode mode);

}  // namespace oscar::quant
