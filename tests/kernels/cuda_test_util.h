// Helpers the CUDA kernel tests (tests/kernels/test_*_cuda.cpp) share: the CUDA_OK assertion,
// have_gpu() for skipping without a device, the u = 2^-24 unit roundoff the tolerances use, and
// two owners of device memory: DevBuf (one raw allocation) and DeviceUploads (copies of host
// vectors, freed together). Header-only, test code only (gtest assertions); the tests' own
// typed buffers (test_ops_cuda.cpp's Dev<T>, test_demote_pages_cuda.cpp's Dev, which leaves an
// empty vector's pointer null) stay in their files, since their allocation rules differ.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace oscar::kernels {

// Asserts (fatal, in a void function) that a CUDA runtime call returned cudaSuccess.
#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

// Unit roundoff of FP32.
constexpr double kU = 0x1p-24;

// True when a CUDA device is visible; the tests skip otherwise.
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// One device allocation of at least `bytes` (16 at least), freed on scope exit; p is null when
// cudaMalloc failed (the caller asserts on it).
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) p = nullptr;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
};

// Device copies of host vectors, all freed when this is destroyed. up() allocates at least 16
// bytes (so an empty vector still gets a valid, unread pointer) and returns null when cudaMalloc
// fails.
struct DeviceUploads {
  std::vector<void*> bufs;
  DeviceUploads() = default;
  DeviceUploads(const DeviceUploads&) = delete;
  DeviceUploads& operator=(const DeviceUploads&) = delete;
  ~DeviceUploads() {
    for (void* b : bufs) cudaFree(b);
  }
  template <class T>
  T* up(const std::vector<T>& v) {
    void* ptr = nullptr;
    const size_t bytes = std::max<size_t>(v.size() * sizeof(T), 16);
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) return nullptr;
    bufs.push_back(ptr);
    if (!v.empty()) cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return static_cast<T*>(ptr);
  }
};

}  // namespace oscar::kernels
