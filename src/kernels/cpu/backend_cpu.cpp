// The CPU backend: host memory, and the ops of kernels/cpu/ called directly (each parallel inside
// through OpenMP). Ops run synchronously, so synchronize() has nothing to wait for.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/backend.h"
#ifdef OSCAR_HAS_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

namespace oscar::kernels {

namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }

  Result<DeviceBuffer> alloc(size_t bytes, const char* what) override {
    // 64-byte aligned (cache lines, AVX loads); zero-size allocations get one line. Buffers of
    // 2 MiB or more (the KV pools, the model's weight buffer) are 2 MiB-aligned and advised onto
    // transparent huge pages, unless OSCAR_CPU_HUGE_PAGES=0: a decode step streams every weight,
    // and decode attention reads a layer's rows in 4 KiB runs 128 KiB apart (a KV page holds every
    // layer), so with 4 KiB pages nearly every run is a TLB miss.
    constexpr size_t kHugePage = size_t{2} << 20;
    static const bool huge_pages = [] {
      const char* e = std::getenv("OSCAR_CPU_HUGE_PAGES");
      return e == nullptr || std::strcmp(e, "0") != 0;
    }();
    const size_t align = huge_pages && bytes >= kHugePage ? kHugePage : 64;
    const size_t n = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
    void* p = std::aligned_alloc(align, n);
    if (p == nullptr)
      return resource_exhausted("cpu: cannot allocate %zu bytes for %s", bytes, what);
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) madvise(p, n, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
    return DeviceBuffer(p, bytes, Device::kCpu, [](void* q) { std::free(q); });
  }
  Status upload(const void* host, size_t bytes, void* dst) override {
    std::memcpy(dst, host, bytes);
    return Status();
  }
  Status download(const void* src, size_t bytes, void* host) override {
    std::memcpy(host, src, bytes);
    return Status();
  }
  Status synchronize() override { return Status(); }

  Status embed(const WeightView& t, const int32_t* ids, int64_t n, float* x) override {
    return kernels::embed(t, ids, n, x);
  }
  Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps,
                  float* y) override {
    return kernels::rms_norm(x, rows, dim, w, eps, y);
  }
  Status set_batch_invariant(bool on) override {
    batch_invariant_ = on;
    return Status();
  }
  Status linear(const LinearParams& p) override { return kernels::linear(invariant(p)); }
  Status linear_group(const LinearParams* ps, int count) override {
    return kernels::linear_group(invariant(ps, count).data(), count);
  }
  Status rope(const RopeParams& p) override { return kernels::rope(p); }
  Status kv_append(const KvAppendParams& p) override { return kernels::kv_append(p); }
  Status rotate_queries(const RotateQueriesParams& p) override {
    return kernels::rotate_queries(p);
  }
  Status decode_attn(const DecodeAttnParams& p) override {
    return kernels::decode_attn(invariant(p));
  }
  Status prefill_attn(const PrefillAttnParams& p) override {
    return kernels::prefill_attn(invariant(p));
  }
  Status silu_mul(float* gate, const float* up, int64_t n) override {
    return kernels::silu_mul(gate, up, n);
  }
  Status moe_route(const MoeRouteParams& p) override { return kernels::moe_route(p); }
  Status moe_ffn(const MoeFfnParams& p) override { return kernels::moe_ffn(invariant(p)); }
  Status sigmoid_mul(float* x, const float* gate, int64_t n) override {
    return kernels::sigmoid_mul(x, gate, n);
  }
  Status sigmoid_scale_rows(float* x, const float* gate, int64_t rows, int64_t dim) override {
    return kernels::sigmoid_scale_rows(x, gate, rows, dim);
  }
  Status causal_conv1d(const CausalConv1dParams& p) override { return kernels::causal_conv1d(p); }
  Status gdn_gates(const GdnGatesParams& p) override { return kernels::gdn_gates(p); }
  Status gated_delta_rule(const GatedDeltaParams& p) override {
    return kernels::gated_delta_rule(p);
  }
  Status rms_norm_gated(const RmsNormGatedParams& p) override {
    return kernels::rms_norm_gated(p);
  }
  Status add(float* x, const float* y, int64_t n) override { return kernels::add(x, y, n); }
  Status gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t dim,
                     float* dst) override {
    return kernels::gather_rows(src, rows, n, dim, dst);
  }
  Status demote_pages(const DemotePagesParams& p) override { return kernels::demote_pages(p); }
  Status sample(const SampleParams& p) override { return kernels::sample(p); }
  Status process_logits(const LogitsProcessParams& p) override { return process_logits_ref(p); }
  Status logprobs(const LogprobsParams& p) override { return logprobs_ref(p); }
  Status copy(const void* src, size_t bytes, void* dst) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return Status();
  }
  Status fill_normal_bf16(bf16_t* dst, int64_t n, float std, uint64_t seed) override {
    return kernels::fill_normal_bf16(dst, n, std, seed);
  }

};

}  // namespace

// Backend's defaults for the ops that run only when a request asks (kernels/logits.h): each row
// goes to the host, through the CPU reference, and (process_logits) back. A device backend with
// its own kernels overrides them.
Status Backend::process_logits(const LogitsProcessParams& p) {
  if (p.n_edits <= 0) return Status();
  if (p.vocab <= 0 || p.logits == nullptr || p.edits == nullptr)
    return invalid_argument("process_logits: bad shape (vocab %d) or null pointers", p.vocab);
  std::vector<float> row(static_cast<size_t>(p.vocab));
  const size_t row_bytes = row.size() * sizeof(float);
  for (int32_t e = 0; e < p.n_edits; ++e) {
    LogitsRowEdit one = p.edits[e];
    if (one.row < 0 || one.row >= p.n_rows)
      return invalid_argument("process_logits: row %d out of range [0, %d)", one.row, p.n_rows);
    float* dev = p.logits + static_cast<int64_t>(one.row) * p.vocab;
    OSCAR_RETURN_IF_ERROR(download(dev, row_bytes, row.data()));
    OSCAR_RETURN_IF_ERROR(synchronize());
    one.row = 0;
    LogitsProcessParams h = p;
    h.logits = row.data();
    h.n_rows = 1;
    h.edits = &one;
    h.n_edits = 1;
    OSCAR_RETURN_IF_ERROR(process_logits_ref(h));
    OSCAR_RETURN_IF_ERROR(upload(row.data(), row_bytes, dev));
  }
  return synchronize();
}

Status Backend::logprobs(const LogprobsParams& p) {
  if (p.n <= 0) return Status();
  if (p.vocab <= 0 || p.logits == nullptr || p.rows == nullptr)
    return invalid_argument("logprobs: bad shape (vocab %d) or null pointers", p.vocab);
  std::vector<float> row(static_cast<size_t>(p.vocab));
  for (int32_t i = 0; i < p.n; ++i) {
    if (p.rows[i] < 0 || p.rows[i] >= p.n_rows)
      return invalid_argument("logprobs: row %d out of range [0, %d)", p.rows[i], p.n_rows);
    OSCAR_RETURN_IF_ERROR(download(p.logits + static_cast<int64_t>(p.rows[i]) * p.vocab,
                                   row.size() * sizeof(float), row.data()));
    OSCAR_RETURN_IF_ERROR(synchronize());
    const int32_t zero = 0;
    LogprobsParams h = p;
    h.logits = row.data();
    h.n_rows = 1;
    h.n = 1;
    h.rows = &zero;
    h.tokens = p.tokens + i;
    h.token_logprob = p.token_logprob + i;
    if (p.top_k > 0) {
      h.top_ids = p.top_ids + static_cast<int64_t>(i) * p.top_k;
      h.top_logprobs = p.top_logprobs + static_cast<int64_t>(i) * p.top_k;
    }
    OSCAR_RETURN_IF_ERROR(logprobs_ref(h));
  }
  return Status();
}

Status Backend::set_batch_invariant(bool on) {
  if (!on) return Status();
  return unimplemented("batch-invariant kernels are not implemented on %s yet (run with "
                       "--device cpu, or without --enable-deterministic-inference)",
                       device_name(device()));
}

Status Backend::moe_route(const MoeRouteParams& p) {
  (void)p;
  return unimplemented("moe_route: MoE not implemented on %s yet (run MoE models with --device "
                       "cpu)", device_name(device()));
}

Status Backend::moe_ffn(const MoeFfnParams& p) {
  (void)p;
  return unimplemented("moe_ffn: MoE not implemented on %s yet (run MoE models with --device cpu)",
                       device_name(device()));
}

namespace {
Status no_hybrid_ops(const char* op, Device device) {
  return unimplemented("%s: the hybrid (Gated DeltaNet) ops are not implemented on %s yet (run "
                       "Qwen3.5 models with --device cpu)", op, device_name(device));
}
}  // namespace

Status Backend::sigmoid_mul(float*, const float*, int64_t) {
  return no_hybrid_ops("sigmoid_mul", device());
}
Status Backend::sigmoid_scale_rows(float*, const float*, int64_t, int64_t) {
  return no_hybrid_ops("sigmoid_scale_rows", device());
}
Status Backend::causal_conv1d(const CausalConv1dParams&) {
  return no_hybrid_ops("causal_conv1d", device());
}
Status Backend::gdn_gates(const GdnGatesParams&) { return no_hybrid_ops("gdn_gates", device()); }
Status Backend::gated_delta_rule(const GatedDeltaParams&) {
  return no_hybrid_ops("gated_delta_rule", device());
}
Status Backend::rms_norm_gated(const RmsNormGatedParams&) {
  return no_hybrid_ops("rms_norm_gated", device());
}

Status Backend::copy(const void* src, size_t bytes, void* dst) {
  std::vector<unsigned char> host(bytes);
  OSCAR_RETURN_IF_ERROR(download(src, bytes, host.data()));
  OSCAR_RETURN_IF_ERROR(synchronize());
  OSCAR_RETURN_IF_ERROR(upload(host.data(), bytes, dst));
  return synchronize();
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

Result<std::unique_ptr<Backend>> make_backend(std::string_view device) {
  if (device == "cpu") return std::unique_ptr<Backend>(new CpuBackend());
  if (device == "cuda" || device == "auto") {
#ifdef OSCAR_HAS_CUDA
    Result<std::unique_ptr<Backend>> cuda = make_cuda_backend();
    if (cuda.ok() || device == "cuda") return cuda;
#else
    if (device == "cuda")
      return unimplemented(
          "--device cuda: this build has no CUDA backend (configure with "
          "-DOSCAR_CUDA=ON)");
#endif
    return std::unique_ptr<Backend>(new CpuBackend());  // auto without a usable GPU
  }
  return invalid_argument("unknown device '%.*s' (cpu, cuda or auto)",
                          static_cast<int>(device.size()), device.data());
}

}  // namespace oscar::kernels
