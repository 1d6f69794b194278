// PhaseBackend: a kernels::Backend that forwards everything to another backend and hands each op
// to run(), where a benchmark times it (bench_step: wall time of the CPU's synchronous ops;
// bench_decode_step: CUDA events on the device's stream). Graph capture is not forwarded, so a
// model running on it takes every op directly.
#pragma once

#include <functional>

#include "kernels/backend.h"

namespace oscar::bench {

class PhaseBackend : public kernels::Backend {
 public:
  enum class Op {
    kEmbed,
    kRmsNorm,
    kAddRmsNorm,  // a residual add fused with the next norm
    kLinear,
    kLmHead,
    kRope,
    kKvAppend,
    kRotateQueries,
    kDecodeAttn,
    kPrefillAttn,
    kSiluMul,
    kAdd,
    kGatherRows,
    kDemotePages,
    kSample,
  };
  explicit PhaseBackend(kernels::Backend& inner) : in_(inner) {}

  Device device() const override { return in_.device(); }
  Result<DeviceBuffer> alloc(size_t b, const char* w) override { return in_.alloc(b, w); }
  Status upload(const void* h, size_t b, void* d) override { return in_.upload(h, b, d); }
  Status download(const void* s, size_t b, void* h) override { return in_.download(s, b, h); }
  Status synchronize() override { return in_.synchronize(); }
  bool memory_info(size_t* f, size_t* t) override { return in_.memory_info(f, t); }
  void* native_stream() override { return in_.native_stream(); }
  Status fill_normal_bf16(bf16_t* d, int64_t n, float s, uint64_t seed) override {
    return in_.fill_normal_bf16(d, n, s, seed);
  }

  Status embed(const kernels::WeightView& t, const int32_t* ids, int64_t n, float* x) override {
    return run(Op::kEmbed, [&] { return in_.embed(t, ids, n, x); });
  }
  Status rms_norm(const float* x, int64_t r, int64_t d, const float* w, float e,
                  float* y) override {
    return run(Op::kRmsNorm, [&] { return in_.rms_norm(x, r, d, w, e, y); });
  }
  Status linear(const kernels::LinearParams& p) override {
    // The lm_head is the one matrix with a vocabulary's rows.
    return run(p.w.rows > 100000 ? Op::kLmHead : Op::kLinear, [&] { return in_.linear(p); });
  }
  Status linear_group(const kernels::LinearParams* ps, int count) override {
    return run(Op::kLinear, [&] { return in_.linear_group(ps, count); });
  }
  Status add_rms_norm(float* x, const float* y, int64_t r, int64_t d, const float* w, float e,
                      float* h) override {
    return run(Op::kAddRmsNorm, [&] { return in_.add_rms_norm(x, y, r, d, w, e, h); });
  }
  Status rope(const kernels::RopeParams& p) override {
    return run(Op::kRope, [&] { return in_.rope(p); });
  }
  Status kv_append(const kernels::KvAppendParams& p) override {
    return run(Op::kKvAppend, [&] { return in_.kv_append(p); });
  }
  Status rotate_queries(const kernels::RotateQueriesParams& p) override {
    return run(Op::kRotateQueries, [&] { return in_.rotate_queries(p); });
  }
  Status decode_attn(const kernels::DecodeAttnParams& p) override {
    return run(Op::kDecodeAttn, [&] { return in_.decode_attn(p); });
  }
  Status prefill_attn(const kernels::PrefillAttnParams& p) override {
    return run(Op::kPrefillAttn, [&] { return in_.prefill_attn(p); });
  }
  Status silu_mul(float* g, const float* u, int64_t n) override {
    return run(Op::kSiluMul, [&] { return in_.silu_mul(g, u, n); });
  }
  Status add(float* x, const float* y, int64_t n) override {
    return run(Op::kAdd, [&] { return in_.add(x, y, n); });
  }
  Status gather_rows(const float* s, const int32_t* r, int64_t n, int64_t d, float* y) override {
    return run(Op::kGatherRows, [&] { return in_.gather_rows(s, r, n, d, y); });
  }
  Status demote_pages(const kernels::DemotePagesParams& p) override {
    return run(Op::kDemotePages, [&] { return in_.demote_pages(p); });
  }
  Status sample(const kernels::SampleParams& p) override {
    return run(Op::kSample, [&] { return in_.sample(p); });
  }
  Status process_logits(const kernels::LogitsProcessParams& p) override {
    return run(Op::kSample, [&] { return in_.process_logits(p); });
  }
  Status logprobs(const kernels::LogprobsParams& p) override {
    return run(Op::kSample, [&] { return in_.logprobs(p); });
  }
  Status copy(const void* s, size_t b, void* d) override { return in_.copy(s, b, d); }

 protected:
  // Runs one op (f) and times it as the benchmark wants.
  virtual Status run(Op op, const std::function<Status()>& f) = 0;
  kernels::Backend& in_;
};

}  // namespace oscar::bench
