// CUDA sample (kernels/sample.h: sample_cuda): one block of kThreads per logits row, every
// pointer in device memory, one launch, asynchronous on the caller's stream, no allocation, no
// workspace. The host side checks shapes and null pointers only (configs live on the device).
//
// Per row: one coalesced pass for the maximum (lowest id on ties, as std::max_element) and
// finiteness. A non-finite logit gives kSampleNonFinite; temperature 0 gives the argmax, which
// equals the CPU's exactly. Rows with top_k > 0 or top_p < 1, and rows whose config
// validate_sampling would refuse, get kSampleOnHost: the caller samples them on the host
// (device top-k / top-p is not implemented yet).
//
// Temperature rows follow sample.h's contract: p_i = exp((l_i − l_max) / T) in float64 (the
// CPU's operations: (double(l_i) − l_max) · (1 / T), then exp), u = sample_uniform(seed, step)
// (the same SplitMix64 bits), and the pick is the first token in id order whose prefix sum
// exceeds u · S. Each thread owns a contiguous segment of ids and sums it in order; the segment
// sums are scanned across the block; the first thread whose inclusive prefix exceeds u·S walks
// its segment again (the same additions, so the crossing is found). Sums are float64 but in a
// different order from the CPU's sequential walk, and CUDA's exp is within 1 ulp of glibc's, so a
// row can differ from the CPU only when u·S falls within rounding (~1e-13 relative) of a
// boundary between two tokens; tests/kernels/test_ops_cuda.cpp measures it. A token whose p
// underflows to 0 is never picked (as on the CPU).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/sample.h"

namespace oscar::kernels {

namespace {

constexpr int kThreads = 512;

// sample_uniform (cpu/sample.cpp), the same bits.
__device__ __forceinline__ double sample_uniform_dev(uint64_t seed, uint64_t step) {
  uint64_t z = seed + (step + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return __dmul_rn(static_cast<double>(z >> 11), 0x1.0p-53);
}

__device__ __forceinline__ bool config_valid(const SamplingConfig& c) {
  return c.temperature >= 0.f && isfinite(c.temperature) && c.top_k >= 0 && c.top_p > 0.f &&
         c.top_p <= 1.f;
}

// The larger (value, id) pair, lower id on ties.
__device__ __forceinline__ void max_pair(float& v, int32_t& id, float v2, int32_t id2) {
  if (v2 > v || (v2 == v && id2 < id)) v = v2, id = id2;
}

__device__ __forceinline__ double weight(float l, double top, double inv_t) {
  return exp(__dmul_rn(__dsub_rn(static_cast<double>(l), top), inv_t));
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, int32_t vocab,
                  const SamplingConfig* __restrict__ config, const uint64_t* __restrict__ step,
                  int32_t* __restrict__ ids) {
  __shared__ float s_val[kThreads / 32];
  __shared__ int32_t s_id[kThreads / 32];
  __shared__ double s_scan[2][kThreads];
  __shared__ int32_t s_winner;
  const int tid = threadIdx.x, row = blockIdx.x;
  const float* l = logits + static_cast<size_t>(row) * vocab;

  // Pass 1: maximum and finiteness.
  float best = -INFINITY;
  int32_t best_id = 0x7fffffff;
  bool bad = false;
  for (int32_t i = tid; i < vocab; i += kThreads) {
    const float v = l[i];
    bad |= !isfinite(v);
    max_pair(best, best_id, v, i);
  }
  for (int o = 16; o > 0; o >>= 1)
    max_pair(best, best_id, __shfl_xor_sync(0xffffffffu, best, o),
             __shfl_xor_sync(0xffffffffu, best_id, o));
  if (tid % 32 == 0) s_val[tid / 32] = best, s_id[tid / 32] = best_id;
  if (tid == 0) s_winner = kThreads;
  bad = __syncthreads_or(bad);
  best = s_val[0], best_id = s_id[0];
  for (int w = 1; w < kThreads / 32; ++w) max_pair(best, best_id, s_val[w], s_id[w]);

  const SamplingConfig c = config[row];
  if (bad || !config_valid(c) || c.temperature == 0.f || c.top_k > 0 || c.top_p < 1.f) {
    if (tid == 0)
      ids[row] = bad                                                ? kSampleNonFinite
                 : !config_valid(c) || c.top_k > 0 || c.top_p < 1.f ? kSampleOnHost
                                                                    : best_id;
    return;
  }

  // Pass 2: segment sums of p in id order.
  const double top = static_cast<double>(best);
  const double inv_t = 1.0 / static_cast<double>(c.temperature);
  const int32_t seg = (vocab + kThreads - 1) / kThreads;
  const int32_t begin = min(vocab, tid * seg), end = min(vocab, begin + seg);
  double acc = 0.0;
  for (int32_t i = begin; i < end; ++i) acc = __dadd_rn(acc, weight(l[i], top, inv_t));

  // Inclusive scan of the segment sums (Hillis–Steele, double-buffered).
  s_scan[0][tid] = acc;
  __syncthreads();
  int buf = 0;
  for (int o = 1; o < kThreads; o <<= 1) {
    const double x = s_scan[buf][tid];
    s_scan[buf ^ 1][tid] = tid >= o ? __dadd_rn(x, s_scan[buf][tid - o]) : x;
    buf ^= 1;
    __syncthreads();
  }
  const double excl = tid > 0 ? s_scan[buf][tid - 1] : 0.0;
  const double incl = __dadd_rn(excl, acc);
  // S: the last thread's inclusive prefix (its exclusive prefix plus its own sum).
  __syncthreads();  // everyone has read s_scan before it is reused below
  if (tid == kThreads - 1) s_scan[0][0] = incl;
  __syncthreads();
  const double S = s_scan[0][0];
  const double target = __dmul_rn(sample_uniform_dev(c.seed, step[row]), S);
  if (acc > 0.0 && incl > target) atomicMin(&s_winner, tid);
  __syncthreads();
  const int winner = s_winner;
  if (winner == kThreads) {  // u·S rounded up to S: the CPU's walk ends on the last token
    if (tid == 0) ids[row] = vocab - 1;
    return;
  }
  if (tid != winner) return;
  // Pass 3: the winner walks its segment with the same additions as pass 2.
  double local = 0.0;
  for (int32_t i = begin; i < end; ++i) {
    const double w = weight(l[i], top, inv_t);
    local = __dadd_rn(local, w);
    if (w > 0.0 && __dadd_rn(excl, local) > target) {
      ids[row] = i;
      return;
    }
  }
  ids[row] = end - 1;  // unreachable: at the segment's last positive p, excl + local == incl
}

}  // namespace

Status sample_cuda(const SampleParams& p, void* stream) {
  if (p.n_rows < 0 || p.vocab <= 0)
    return invalid_argument("sample_cuda: bad shape (%d rows, vocab %d)", p.n_rows, p.vocab);
  if (p.n_rows == 0) return Status();
  if (p.logits == nullptr || p.config == nullptr || p.step == nullptr || p.ids == nullptr)
    return invalid_argument("sample_cuda: null logits, config, step or ids");
  sample_kernel<<<static_cast<unsigned>(p.n_rows), kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(p.logits, p.vocab, p.config, p.step, p.ids);
  OSCAR_CUDA_LAUNCH_CHECK("sample_kernel");
  return Status();
}

}  // namespace oscar::kernels
