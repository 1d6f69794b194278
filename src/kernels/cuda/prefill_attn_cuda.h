// Internal controls of the CUDA prefill attention (kernels/prefill_attn.h: prefill_attn_cuda),
// for tests and benchmarks: force the FP32 SIMT kernel instead of the tensor-core one. Plain C++:
// tests include it without nvcc. Production code calls prefill_attn_cuda (kAuto).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/prefill_attn.h"

namespace oscar::kernels {

enum class PrefillAttnCudaPath : int32_t {
  kAuto = 0,  // the tensor-core kernel (BF16 operands, FP32 accumulation)
  kSimt = 1,  // FP32 throughout on the CUDA cores: slower, agrees with the CPU to float rounding
};

// Same contract as prefill_attn_cuda.
Status prefill_attn_cuda_ex(const PrefillAttnParams& p, PrefillAttnCudaPath path, void* stream);

}  // namespace oscar::kernels
