// Benchmark of the CUDA linear (kernels/linear.h: linear_cuda; forced paths in
// kernels/cuda/linear_cuda.h) on Qwen3-8B's projection shapes (in -> out): 4096->4096 (q, o),
// 4096->1024 (k, v), 4096->12288 (gate, up), 12288->4096 (down), 4096->151936 (lm_head), BF16
// weights, at n = 1, 4, 8, 16, 32, 64, 512, 2048, 8192 rows of x (defaults). For each shape and
// n: the automatic path, the forced cuBLASLt GEMM and the forced batch-invariant tensor-core
// GEMM (linear_invariant.cuh: what --enable-deterministic-inference runs), and for n <= 16 also
// the forced streaming kernel (to check the threshold kLinearCudaFewRows). Timing: CUDA events
// around one linear_cuda call, the L2 flushed before each call by reading 256 MiB
// (l2_flush_read_cuda); 3 warm-up calls, median and p10/p90 of --iters calls (default 30).
// Reported: weight bytes / time (effective TB/s: the weights dominate what a decode step reads),
// 2·n·in·out / time (TFLOP/s), and the device-to-device copy bandwidth (read + write) measured
// in the same run; "gemm / this" is the GEMM's median time over this path's (above 1: faster).
//
// Run: bench_linear_cuda [--n 1,4,8,16,32,64,512,2048,8192] [--iters 30] [--f32 1] [--csv FILE]
// Not Google Benchmark: a plain program, so that one device call prints one table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_bench_util.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/linear.h"

namespace {

using namespace oscar;
using namespace oscar::kernels;
using namespace oscar::bench;

const char* path_name(LinearCudaPath p) {
  return p == LinearCudaPath::kAuto     ? "auto"
         : p == LinearCudaPath::kStream ? "stream"
         : p == LinearCudaPath::kGemm   ? "gemm"
                                        : "invariant";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ns = {1, 4, 8, 16, 32, 64, 512, 2048, 8192};
  int iters = 30;
  bool f32 = false;
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--n") && i + 1 < argc)
      ns = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--f32") && i + 1 < argc)
      f32 = std::atoi(argv[++i]) != 0;
    else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc)
      csv = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--n 1,4,16] [--iters n] [--f32 0|1] [--csv file]\n",
                   argv[0]);
      return 2;
    }
  }
  print_device_facts(DeviceFacts::kNameSmsL2Memory);
  const StreamTimer timer;
  const cudaStream_t stream = timer.stream;

  const double copy_tbs =
      copy_bandwidth_tbs(timer, 10, [](const std::vector<double>& v) { return pct(v, 0.5); });

  const L2Flush flush;

  struct Shape {
    const char* name;
    int64_t in, out;
  };
  const Shape shapes[] = {{"q/o", 4096, 4096},
                          {"k/v", 4096, 1024},
                          {"gate/up", 4096, 12288},
                          {"down", 12288, 4096},
                          {"lm_head", 4096, 151936}};
  const DType dt = f32 ? DType::kF32 : DType::kBF16;
  int64_t max_w = 0, max_x = 0, max_y = 0;
  const int max_n = *std::max_element(ns.begin(), ns.end());
  for (const Shape& s : shapes) {
    max_w = std::max(max_w, s.in * s.out);
    max_x = std::max<int64_t>(max_x, max_n * s.in);
    max_y = std::max<int64_t>(max_y, max_n * s.out);
  }
  void* w = nullptr;
  float *x = nullptr, *y = nullptr, *bias = nullptr;
  CK(cudaMalloc(&w, static_cast<size_t>(max_w) * dtype_bytes(dt)));
  CK(cudaMalloc(&x, static_cast<size_t>(max_x) * 4));
  CK(cudaMalloc(&y, static_cast<size_t>(max_y) * 4));
  CK(cudaMalloc(&bias, 151936 * 4));
  // Finite values: bf16 0x3C3C ~ 0.0115 (f32 0x3C3C3C3C ~ 0.0115), x 0x3F3F3F3F ~ 0.75.
  CK(cudaMemset(w, 0x3C, static_cast<size_t>(max_w) * dtype_bytes(dt)));
  CK(cudaMemset(x, 0x3F, static_cast<size_t>(max_x) * 4));
  CK(cudaMemset(bias, 0, 151936 * 4));

  FILE* fcsv = csv ? std::fopen(csv, "w") : nullptr;
  if (fcsv)
    std::fprintf(fcsv,
                 "shape,in,out,n,path,median_us,p10_us,p90_us,weight_bytes,tbs,tflops,"
                 "gemm_over_this\n");
  std::printf("weights %s; L2 flushed (256 MiB read) before each call; median of %d\n\n",
              f32 ? "F32" : "BF16", iters);
  std::printf(
      "| shape | in | out | n | path | median us | p10 | p90 | weight MB | TB/s | %% of copy "
      "| TFLOP/s | gemm / this |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes)
    for (int n : ns) {
      // The GEMM first: the others' ratio is to its median.
      std::vector<LinearCudaPath> paths = {LinearCudaPath::kGemm, LinearCudaPath::kAuto,
                                           LinearCudaPath::kInvariant};
      if (n <= 16) paths.push_back(LinearCudaPath::kStream);
      double gemm_med = 0;
      for (LinearCudaPath path : paths) {
        LinearParams p;
        p.x = x;
        p.n = n;
        p.w = WeightView{w, dt, s.out, s.in};
        p.bias = nullptr;
        p.y = y;
        std::vector<double> ts;
        const auto call = [&] {
          const Status st = linear_cuda_ex(p, path, stream);
          if (!st.ok()) std::fprintf(stderr, "linear_cuda: %s\n", st.to_string().c_str());
          return st.ok();
        };
        if (!time_flushed_us(timer, flush, 3, iters, call, &ts)) return 1;
        const double med = pct(ts, 0.5), p10 = pct(ts, 0.1), p90 = pct(ts, 0.9);
        const double wbytes = static_cast<double>(s.in) * s.out * dtype_bytes(dt);
        const double tbs = wbytes / (med * 1e-6) / 1e12;
        const double tflops = 2.0 * n * s.in * s.out / (med * 1e-6) / 1e12;
        if (path == LinearCudaPath::kGemm) gemm_med = med;
        const double vs_gemm = gemm_med / med;
        std::printf(
            "| %s | %lld | %lld | %d | %s | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f%% | "
            "%.1f | %.2f |\n",
            s.name, static_cast<long long>(s.in), static_cast<long long>(s.out), n, path_name(path),
            med, p10, p90, wbytes / 1e6, tbs, 100.0 * tbs / copy_tbs, tflops, vs_gemm);
        if (fcsv)
          std::fprintf(fcsv, "%s,%lld,%lld,%d,%s,%.2f,%.2f,%.2f,%.0f,%.3f,%.3f,%.3f\n", s.name,
                       static_cast<long long>(s.in), static_cast<long long>(s.out), n,
                       path_name(path), med, p10, p90, wbytes, tbs, tflops, vs_gemm);
      }
    }
  if (fcsv) std::fclose(fcsv);
  return 0;
}
