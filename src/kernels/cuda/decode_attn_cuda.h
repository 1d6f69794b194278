// Internal controls of the CUDA decode attention (kernels/decode_attn.h: decode_attn_cuda), for
// tests and benchmarks: force a split count, force the generic (dequantize-to-BF16) history path
// or the naive kernel. Plain C++: tests include it without nvcc. Production code calls
// decode_attn_cuda, which is decode_attn_cuda_ex with default options.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/decode_attn.h"

namespace oscar::kernels {

enum class DecodeAttnCudaPath : int32_t {
  kAuto = 0,     // fast kernel where the shape allows it, the naive kernel otherwise
  kGeneric = 1,  // fast kernel, but history always through the generic dequantize-to-BF16 tiles
  kNaive = 2,    // one block per (sequence, query head), scalar FP32: the simplest kernel
};

struct DecodeAttnCudaOptions {
  DecodeAttnCudaPath path = DecodeAttnCudaPath::kAuto;
  int32_t n_splits = 0;  // context splits per (sequence, KV head); 0 = chosen to fill the GPU
  // Benchmarks only: bit 0 = copy every tile into shared memory but skip its compute (the
  // output is then garbage): the bandwidth the loads alone reach; bit 1 = skip the INT2 tiles'
  // copies and compute on whatever shared memory holds (garbage too): the compute alone.
  int32_t debug_flags = 0;
  // Launch configuration of the fast kernel: 0 = by the call (dense with history, wide without),
  // 1 = wide (16 KiB per warp, 3 blocks per SM), 2 = dense (14 KiB per warp, 4 blocks per SM).
  int32_t config = 0;
  // 0 = the default: INT2 history tiles packed two per softmax fragment where a block's group
  // has <= 4 query heads; 1 = the kernel of main before them (every column its own head), kept
  // to measure the two side by side. Applies to the dense configuration (the wide one always
  // runs 0).
  int32_t int2_kernel = 0;
};

// Same contract as decode_attn_cuda. Allocates (once, then grows) a device workspace for the
// split partials, guarded by a mutex: calls from several host threads are safe, but two calls
// in flight on different streams share it (use one stream per device).
Status decode_attn_cuda_ex(const DecodeAttnParams& p, const DecodeAttnCudaOptions& opts,
                           void* stream);

// What the last call on this host thread launched: path used (0 fast, 2 naive), splits, grid,
// resident blocks per SM and launch configuration.
struct DecodeAttnCudaLaunchInfo {
  int32_t path = -1;
  int32_t n_splits = 0;
  int32_t blocks = 0;
  int32_t blocks_per_sm = 0;
  int32_t config = -1;  // 0 wide, 1 dense
};
DecodeAttnCudaLaunchInfo decode_attn_cuda_last_launch();

}  // namespace oscar::kernels
