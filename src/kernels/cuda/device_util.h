// Small device utilities for tests and benchmarks (kernels/cuda/device_util.cu). Plain C++.
#pragma once

#include <cstddef>

#include "core/status.h"

namespace oscar::kernels {

// Reads `bytes` of `buf` (16-byte aligned) on the device, so that whatever was in the L2 cache
// is evicted by clean lines (a memset would leave the cache full of dirty lines, whose
// write-back then competes with the next kernel). `sink`: one device float, written only in a
// case that never happens (keeps the reads alive). Asynchronous on `stream`.
Status l2_flush_read_cuda(const void* buf, size_t bytes, float* sink, void* stream);

}  // namespace oscar::kernels
