// Device utilities for tests and benchmarks (kernels/cuda/device_util.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_util.h"

namespace oscar::kernels {
namespace {

__global__ void l2_flush_read_kernel(const uint4* buf, size_t n, float* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = static_cast<float>(acc);
}

}  // namespace

Status l2_flush_read_cuda(const void* buf, size_t bytes, float* sink, void* stream) {
  l2_flush_read_kernel<<<1024, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(buf), bytes / 16, sink);
  OSCAR_CUDA_LAUNCH_CHECK("l2_flush_read_kernel");
  return Status();
}

}  // namespace oscar::kernels
