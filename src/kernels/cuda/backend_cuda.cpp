// The CUDA backend (kernels/backend.h): device memory from cudaMalloc, one stream per backend,
// and the ops of kernels/cuda/ launched on it. Nothing here waits for the device except
// download() and sample() (which hand results to the host) and synchronize(). Plain C++ against
// the CUDA runtime; the kernels are in the .cu files of this folder.
#include "kernels/cuda/backend_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/backend.h"

namespace oscar::kernels {

namespace {

#define OSCAR_CUDA_TRY(expr)                                                        \
  do {                                                                              \
    const cudaError_t oscar_err_ = (expr);                                          \
    if (oscar_err_ != cudaSuccess)                                                  \
      return internal_error("cuda: %s: %s", #expr, cudaGetErrorString(oscar_err_)); \
  } while (0)

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(cudaStream_t stream) : stream_(stream) {}
  ~CudaBackend() override {
    staging_.reset();
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }
  void* native_stream() override { return stream_; }

  Result<DeviceBuffer> alloc(size_t bytes, const char* what) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return resource_exhausted(
          "cuda: cannot allocate %zu bytes for %s (%zu of %zu bytes free): %s", bytes, what, free_b,
          total_b, cudaGetErrorString(e));
    }
    return DeviceBuffer(p, bytes, Device::kCuda, [](void* q) { cudaFree(q); });
  }
  Status upload(const void* host, size_t bytes, void* dst) override {
    // From pageable memory the call returns once the bytes are staged: the caller may reuse them.
    OSCAR_CUDA_TRY(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    return Status();
  }
  Status download(const void* src, size_t bytes, void* host) override {
    OSCAR_CUDA_TRY(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    OSCAR_CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status();
  }
  struct CudaGraph final : Graph {
    cudaGraphExec_t exec = nullptr;
    ~CudaGraph() override {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
  };
  bool supports_capture() const override { return true; }
  Status capture_begin() override {
    OSCAR_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    return Status();
  }
  Result<std::unique_ptr<Graph>> capture_end() override {
    cudaGraph_t graph = nullptr;
    OSCAR_CUDA_TRY(cudaStreamEndCapture(stream_, &graph));
    auto out = std::make_unique<CudaGraph>();
    const cudaError_t e = cudaGraphInstantiate(&out->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess)
      return internal_error("cuda: cudaGraphInstantiate: %s", cudaGetErrorString(e));
    return std::unique_ptr<Graph>(std::move(out));
  }
  Status replay(const Graph& graph) override {
    OSCAR_CUDA_TRY(cudaGraphLaunch(static_cast<const CudaGraph&>(graph).exec, stream_));
    return Status();
  }
  bool memory_info(size_t* free_bytes, size_t* total_bytes) override {
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
  }
  Status copy(const void* src, size_t bytes, void* dst) override {
    OSCAR_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return Status();
  }
  Status synchronize() override {
    OSCAR_CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status();
  }

  Status embed(const WeightView& t, const int32_t* ids, int64_t n, float* x) override {
    return embed_cuda(t, ids, n, x, stream_);
  }
  Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps,
                  float* y) override {
    return rms_norm_cuda(x, rows, dim, w, eps, y, stream_);
  }
  // Batch-invariant kernels (Backend::set_batch_invariant): the flag goes into the params of
  // linear, decode and prefill attention, the only ops whose reductions could follow the batch
  // (the norms, RoPE, the rotations and sampling work per row with a fixed order already).
  Status set_batch_invariant(bool on) override {
    batch_invariant_ = on;
    return Status();
  }
  Status linear(const LinearParams& p) override { return linear_cuda(invariant(p), stream_); }
  Status linear_group(const LinearParams* ps, int count) override {
    if (!batch_invariant_) return linear_group_cuda(ps, count, stream_);  // no copy
    return linear_group_cuda(invariant(ps, count).data(), count, stream_);
  }
  Status rope(const RopeParams& p) override { return rope_cuda(p, stream_); }
  Status kv_append(const KvAppendParams& p) override { return kv_append_cuda(p, stream_); }
  Status rotate_queries(const RotateQueriesParams& p) override {
    return rotate_queries_cuda(p, stream_);
  }
  Status decode_attn(const DecodeAttnParams& p) override {
    return decode_attn_cuda(invariant(p), stream_);
  }
  Status prefill_attn(const PrefillAttnParams& p) override {
    return prefill_attn_cuda(invariant(p), stream_);
  }
  Status silu_mul(float* gate, const float* up, int64_t n) override {
    return silu_mul_cuda(gate, up, n, stream_);
  }
  Status add(float* x, const float* y, int64_t n) override { return add_cuda(x, y, n, stream_); }
  Status add_rms_norm(float* x, const float* y, int64_t rows, int64_t dim, const float* w,
                      float eps, float* h) override {
    return add_rms_norm_cuda(x, y, rows, dim, w, eps, h, stream_);
  }
  Status gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t dim,
                     float* dst) override {
    return gather_rows_cuda(src, rows, n, dim, dst, stream_);
  }
  Status demote_pages(const DemotePagesParams& p) override { return demote_pages_cuda(p, stream_); }
  Status fill_normal_bf16(bf16_t* dst, int64_t n, float std, uint64_t seed) override {
    return fill_normal_bf16_cuda(dst, n, std, seed, stream_);
  }
  // A sticky error (the context is corrupt) comes back from every call, a synchronisation
  // included; an error of the last call alone has been returned and cleared by then.
  Status health() override {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return unavailable("the GPU failed: %s", cudaGetErrorString(e));
    return Status();
  }

  // Logits on the device, configs/steps/ids on the host (backend.h). The configs and draw
  // indices go up in one copy, the ids come back in one; rows the device sampler hands back
  // (kSampleOnHost: top-k / top-p, or a config it cannot check) are drawn on the host from
  // their downloaded logits row, with the CPU sampler's exact semantics and its errors.
  Status sample(const SampleParams& p) override {
    if (p.n_rows == 0) return Status();
    const size_t n = static_cast<size_t>(p.n_rows);
    const size_t cfg_bytes = n * sizeof(SamplingConfig);
    const size_t step_off = (cfg_bytes + 15) / 16 * 16;
    const size_t ids_off = step_off + n * sizeof(uint64_t);
    const size_t total = ids_off + n * sizeof(int32_t);
    host_staging_.resize(ids_off);
    std::copy_n(reinterpret_cast<const uint8_t*>(p.config), cfg_bytes, host_staging_.data());
    std::copy_n(reinterpret_cast<const uint8_t*>(p.step), n * sizeof(uint64_t),
                host_staging_.data() + step_off);
    if (staging_.bytes() < total) {
      staging_.reset();
      OSCAR_ASSIGN_OR_RETURN(staging_, alloc(std::max<size_t>(2 * total, 4096), "sampling"));
    }
    uint8_t* dev = staging_.as<uint8_t>();
    OSCAR_RETURN_IF_ERROR(upload(host_staging_.data(), ids_off, dev));
    SampleParams d = p;
    d.config = reinterpret_cast<const SamplingConfig*>(dev);
    d.step = reinterpret_cast<const uint64_t*>(dev + step_off);
    d.ids = reinterpret_cast<int32_t*>(dev + ids_off);
    OSCAR_RETURN_IF_ERROR(sample_cuda(d, stream_));
    OSCAR_RETURN_IF_ERROR(download(d.ids, n * sizeof(int32_t), p.ids));
    std::vector<float> row;
    for (size_t r = 0; r < n; ++r) {
      if (p.ids[r] != kSampleOnHost) continue;
      row.resize(static_cast<size_t>(p.vocab));
      OSCAR_RETURN_IF_ERROR(download(p.logits + r * static_cast<size_t>(p.vocab),
                                     row.size() * sizeof(float), row.data()));
      SampleParams one = p;
      one.logits = row.data();
      one.n_rows = 1;
      one.config = p.config + r;
      one.step = p.step + r;
      one.ids = p.ids + r;
      OSCAR_RETURN_IF_ERROR(kernels::sample(one));
    }
    return Status();
  }

 private:
  cudaStream_t stream_;
  DeviceBuffer staging_;
  std::vector<uint8_t> host_staging_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return not_found("--device cuda: no GPU is visible (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  cudaStream_t stream = nullptr;
  OSCAR_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<Backend>(new CudaBackend(stream));
}

}  // namespace oscar::kernels
