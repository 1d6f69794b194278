// Backend: the memory and every op a forward step needs, on one device. The forward step
// (model/step_runner.cpp, model/blocks.cpp) is written once against this list; the CPU backend is
// the code in kernels/cpu/, a CUDA backend implements the same ops with device pointers in the same
// params (kernels/*.h say which entry points exist). About a dozen calls per layer per step, so the
// virtual dispatch costs nothing measurable.
//
// Pointers handed to an op are in this backend's memory (host memory for the CPU backend). Ops
// may run asynchronously on the backend's stream; synchronize() waits for them. Only sample()
// hands results to the host (token ids), and logprobs() when a request asks for them.
//
// OSCAR_HAS_CUDA is tested only in make_backend() (cpu/backend_cpu.cpp).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/status.h"
#include "kernels/decode_attn.h"
#include "kernels/demote_pages.h"
#include "kernels/elementwise.h"
#include "kernels/gated_delta.h"
#include "kernels/kv_append.h"
#include "kernels/linear.h"
#include "kernels/logits.h"
#include "kernels/moe.h"
#include "kernels/prefill_attn.h"
#include "kernels/sample.h"

namespace oscar::kernels {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // Memory: `what` names the allocation in errors and in the memory plan the caller logs.
  virtual Result<DeviceBuffer> alloc(size_t bytes, const char* what) = 0;
  virtual Status upload(const void* host, size_t bytes, void* dst) = 0;
  virtual Status download(const void* src, size_t bytes, void* host) = 0;
  virtual Status synchronize() = 0;
  // Free and total bytes of the device's memory; false where that is not the backend's to say
  // (the CPU: host memory is the operating system's).
  virtual bool memory_info(size_t* free_bytes, size_t* total_bytes) {
    (void)free_bytes;
    (void)total_bytes;
    return false;
  }

  // The native stream (a cudaStream_t) the ops run on, for interop such as a benchmark's events;
  // null for the CPU.
  virtual void* native_stream() { return nullptr; }

  // Graphs (CUDA graphs): the ops issued between capture_begin() and capture_end() are recorded,
  // not run; replay() runs them again with the same pointers and sizes, in one launch. No upload,
  // download or allocation may happen while capturing. The CPU backend cannot (it runs ops as
  // they come).
  class Graph {
   public:
    virtual ~Graph() = default;
  };
  virtual bool supports_capture() const { return false; }
  virtual Status capture_begin() { return unimplemented("this backend records no graphs"); }
  virtual Result<std::unique_ptr<Graph>> capture_end() {
    return unimplemented("this backend records no graphs");
  }
  virtual Status replay(const Graph& graph) {
    (void)graph;
    return unimplemented("this backend records no graphs");
  }

  // Ops, in the order a layer calls them.
  virtual Status embed(const WeightView& table, const int32_t* ids, int64_t n, float* x) = 0;
  virtual Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps,
                          float* y) = 0;
  virtual Status linear(const LinearParams& p) = 0;
  // Several products of the same x (q/k/v, gate/up): the same results as one linear() each, in
  // one launch where the backend can (CUDA's streaming kernel for decode rows).
  virtual Status linear_group(const LinearParams* ps, int count) {
    for (int i = 0; i < count; ++i) OSCAR_RETURN_IF_ERROR(linear(ps[i]));
    return Status();
  }
  virtual Status rope(const RopeParams& p) = 0;
  virtual Status kv_append(const KvAppendParams& p) = 0;
  virtual Status rotate_queries(const RotateQueriesParams& p) = 0;
  virtual Status decode_attn(const DecodeAttnParams& p) = 0;
  virtual Status prefill_attn(const PrefillAttnParams& p) = 0;
  virtual Status silu_mul(float* gate, const float* up, int64_t n) = 0;
  // Mixture of experts (kernels/moe.h): the router's top-k over logits from linear(), then the
  // grouped expert FFN, whose p.work holds moe_ffn_work_bytes() bytes of this backend's memory.
  // The defaults (backend_cpu.cpp) refuse with a Status naming the device: a backend without MoE
  // kernels (CUDA, for now) says so rather than computing something else.
  virtual Status moe_route(const MoeRouteParams& p);
  virtual Status moe_ffn(const MoeFfnParams& p);
  // The hybrid models' ops (Qwen3.5, Qwen3-Next): the gated attention output and the shared
  // expert's row gate (elementwise.h) and the Gated DeltaNet layer's conv, gates, delta rule and
  // gated norm (gated_delta.h). The defaults (backend_cpu.cpp) refuse with a Status naming the
  // device, as the MoE ops do.
  virtual Status sigmoid_mul(float* x, const float* gate, int64_t n);
  virtual Status sigmoid_scale_rows(float* x, const float* gate, int64_t rows, int64_t dim);
  virtual Status causal_conv1d(const CausalConv1dParams& p);
  virtual Status gdn_gates(const GdnGatesParams& p);
  virtual Status gated_delta_rule(const GatedDeltaParams& p);
  virtual Status rms_norm_gated(const RmsNormGatedParams& p);
  virtual Status add(float* x, const float* y, int64_t n) = 0;
  // x += y, then h = rms_norm(x): a sub-layer's residual add and the next norm, the composition
  // of add() and rms_norm() (a device backend fuses them into one launch, same bits).
  virtual Status add_rms_norm(float* x, const float* y, int64_t rows, int64_t dim, const float* w,
                              float eps, float* h) {
    OSCAR_RETURN_IF_ERROR(add(x, y, rows * dim));
    return rms_norm(x, rows, dim, w, eps, h);
  }
  virtual Status gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t dim,
                             float* dst) = 0;
  virtual Status demote_pages(const DemotePagesParams& p) = 0;
  // logits in this backend's memory; config, step and ids in host memory (the backend stages
  // them): only the ids come back.
  virtual Status sample(const SampleParams& p) = 0;
  // Logits processing (penalties, allowed-token masks) in place and log-probabilities, for the
  // rows of requests that ask (kernels/logits.h); p.logits in this backend's memory, the rest in
  // host memory. Called only in steps where some request asks. The defaults (backend_cpu.cpp)
  // download each row asked for, run the CPU reference on it and upload it back (process_logits):
  // correct on any backend, one row's transfer per asking request; a device backend may replace
  // them with kernels.
  virtual Status process_logits(const LogitsProcessParams& p);
  virtual Status logprobs(const LogprobsParams& p);
  // A copy within this backend's memory (both pointers device memory). The default stages it
  // through the host.
  virtual Status copy(const void* src, size_t bytes, void* dst);
  // Weights for --dummy-weights (elementwise.h: fill_normal_bf16), in this backend's memory.
  virtual Status fill_normal_bf16(bf16_t* dst, int64_t n, float std, uint64_t seed) = 0;

  // Whether the device can still run work, asked after a failed step: a CUDA error that corrupts
  // the context (an illegal address, a launch failure) makes every later call fail, while a
  // request-level error (a non-finite K/V, an allocation) leaves it usable.
  // Batch-invariant kernels (README "Deterministic results"): each row's results independent of
  // the other rows of a step and of how its prompt was chunked; off by default (prefill is
  // slower, docs/results/determinism.md). The CPU and CUDA backends switch their kernels; the
  // default (backend_cpu.cpp) refuses to turn it on, naming the device.
  virtual Status set_batch_invariant(bool on);
  virtual Status health() { return Status(); }

 protected:
  // For backends that switch: set_batch_invariant stores the flag here, and each op whose
  // reductions could follow the batch hands its kernel the params with the flag set.
  template <class Params>
  Params invariant(Params p) const {
    p.batch_invariant = batch_invariant_;
    return p;
  }
  std::vector<LinearParams> invariant(const LinearParams* ps, int count) const {
    std::vector<LinearParams> qs(ps, ps + count);
    for (LinearParams& q : qs) q.batch_invariant = batch_invariant_;
    return qs;
  }
  bool batch_invariant_ = false;
};

// The process-wide CPU backend (stateless; its ops are thread-compatible).
Backend& cpu_backend();

// "cpu"; "cuda" where built with it and a GPU is visible (NotFound / Unimplemented with the
// reason otherwise); "auto": cuda when that works, else cpu.
Result<std::unique_ptr<Backend>> make_backend(std::string_view device);

}  // namespace oscar::kernels
