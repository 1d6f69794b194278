// Internal to prefill_attn_cuda (prefill_attn.cu): the decode-equivalent pre-pass, which
// quantizes with the demotion's device quantizer (demote_pages.cuh) and dequantizes to float
// the recent rows that some query of the call reads as history (prefill_deq_zone.cuh: which rows,
// and the scratch layout). Lives in its own file because it must be compiled with --fmad=false,
// like demote_pages.cu, to produce the CPU's bytes; the attention kernels must not be.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/prefill_attn.h"

namespace oscar::kernels::cuda_detail {

// p: validated by prefill_attn_cuda (device pointers, decode_equivalent && quantized, not KIVI,
// head_dim 64 / 128). scratch: [cap_rows, 2, n_heads_kv, head_dim] float, device. Asynchronous
// on `stream` (a cudaStream_t); reads no device memory on the host.
Status prefill_deq_rows_cuda(const PrefillAttnParams& p, float* scratch, int64_t cap_rows,
                             void* stream);

}  // namespace oscar::kernels::cuda_detail
