// Internal controls of the CUDA prefill attention (kernels/prefill_attn.h: prefill_attn_cuda),
// for tests and benchmarks: force one kernel (FP32 SIMT, the staged tensor-core one, or the tiled
// one on mma.sync or wgmma instead of the warp-specialised one). Plain C++:
// tests include it without nvcc. Production code calls prefill_attn_cuda (kAuto).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/prefill_attn.h"

namespace oscar::kernels {

enum class PrefillAttnCudaPath : int32_t {
  // Tensor cores (BF16 operands, FP32 accumulation): for serving prefill over a BF16 cache the
  // warp-specialised kernel (prefill_attn_ws.cu) at head_dim 128 on sm_90a, else the tiled one
  // (prefill_attn_tc.cu, wgmma on sm_90a); the staged one for the decode-equivalent reading.
  kAuto = 0,
  kSimt = 1,        // FP32 throughout on the CUDA cores: slower, agrees with the CPU to float rounding
  kStaged = 2,      // the staged tensor-core kernel (prefill_attn.cu) for both readings
  kTiledMma = 3,    // the tiled kernel on mma.sync (serving prefill; else as kAuto)
  kTiledWgmma = 4,  // the tiled kernel on wgmma where the device has it (serving prefill; else as kAuto)
};

// Same contract as prefill_attn_cuda.
Status prefill_attn_cuda_ex(const PrefillAttnParams& p, PrefillAttnCudaPath path, void* stream);

}  // namespace oscar::kernels
