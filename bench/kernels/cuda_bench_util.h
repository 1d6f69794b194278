// Helpers the plain-program CUDA kernel benchmarks (bench/kernels/bench_*_cuda.cpp) share: the
// CK check (print file, line and the CUDA error, exit 1), the comma-list parser, percentiles of a
// sample, the printed device facts, a stream with two timing events, the device-to-device copy
// bandwidth measured in the same run, and the L2 flush + CUDA-event timing loop. Header-only;
// what a bench measures, its shapes and its table stay in its own file. Buffers allocated here
// are left to the process exit, like the benches' own.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/device_util.h"

namespace oscar::bench {

#define CK(expr)                                                                                  \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// "8192,32768" -> {8192, 32768} (atoi of each comma-separated field).
inline std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

// Element q·(n-1) (rounded down) of the sorted sample; q = 0.5 is the lower median.
inline double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// Element n/2 of the sorted sample (the upper median for an even n).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Which facts of device 0 the "device: ..." line lists.
enum class DeviceFacts { kName, kNameSms, kNameSmsL2Memory };

// Prints "device: NAME[, N SMs[, L2 M MiB, G GiB]]" for device 0.
inline void print_device_facts(DeviceFacts facts) {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (facts == DeviceFacts::kName)
    std::printf("device: %s\n", prop.name);
  else if (facts == DeviceFacts::kNameSms)
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  else
    std::printf("device: %s, %d SMs, L2 %d MiB, %.0f GiB\n", prop.name, prop.multiProcessorCount,
                prop.l2CacheSize >> 20, prop.totalGlobalMem / 1073741824.0);
}

// A stream and the two events every timed call is bracketed by.
struct StreamTimer {
  cudaStream_t stream;
  cudaEvent_t e0, e1;
  StreamTimer() {
    CK(cudaStreamCreate(&stream));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
  }
};

// Device-to-device copy bandwidth (read + write) in TB/s: 2 GiB copied 3 + n_timed times, the
// first 3 untimed, `stat` (pct(·, 0.5) or median) of the timed ones. Prints
// "copy bandwidth (read + write, 2 GiB D2D): X TB/s".
template <class Stat>
double copy_bandwidth_tbs(const StreamTimer& t, int n_timed, Stat stat) {
  double copy_tbs = 0;
  const size_t n = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemset(a, 1, n));
  std::vector<double> ts;
  for (int i = 0; i < n_timed + 3; ++i) {
    CK(cudaEventRecord(t.e0, t.stream));
    CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, t.stream));
    CK(cudaEventRecord(t.e1, t.stream));
    CK(cudaEventSynchronize(t.e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t.e0, t.e1));
    if (i >= 3) ts.push_back(ms);
  }
  copy_tbs = 2.0 * n / (stat(ts) * 1e-3) / 1e12;
  CK(cudaFree(a));
  CK(cudaFree(b));
  std::printf("copy bandwidth (read + write, 2 GiB D2D): %.2f TB/s\n", copy_tbs);
  return copy_tbs;
}

// 256 MiB read before each timed call (l2_flush_read_cuda), so the call starts with a cold L2
// holding no dirty lines.
struct L2Flush {
  const size_t flush_bytes = size_t{256} << 20;
  void* flush = nullptr;
  float* sink = nullptr;
  L2Flush() {
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&sink, sizeof(float)));
    CK(cudaMemset(flush, 1, flush_bytes));
  }
};

// Runs `call` (returns false on failure) warmup + iters times on t.stream, each after an L2
// flush and between t.e0 and t.e1; appends the last iters times, in µs, to *ts. False when the
// flush or the call failed (the bench then exits 1).
template <class Call>
bool time_flushed_us(const StreamTimer& t, const L2Flush& f, int warmup, int iters, Call&& call,
                     std::vector<double>* ts) {
  for (int it = 0; it < iters + warmup; ++it) {
    if (!kernels::l2_flush_read_cuda(f.flush, f.flush_bytes, f.sink, t.stream).ok()) return false;
    CK(cudaEventRecord(t.e0, t.stream));
    if (!call()) return false;
    CK(cudaEventRecord(t.e1, t.stream));
    CK(cudaEventSynchronize(t.e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t.e0, t.e1));
    if (it >= warmup) ts->push_back(ms * 1e3);
  }
  return true;
}

}  // namespace oscar::bench
