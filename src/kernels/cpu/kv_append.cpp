// CPU kv_append and rotate_queries (kernels/kv_append.h).
#include "kernels/kv_append.h"

#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/decode_pool.h"

namespace oscar::kernels {

namespace {

constexpr int kMaxHeadDim = 1024;
// Up to this many tokens (a decode step's rows, as linear.cpp's kFewRows) a parallel loop runs on
// the decode pool: an OpenMP region per op wakes the sleeping second thread (36-40 us) twice a
// layer in the rotated cache modes, ~100 sleeps a token at Qwen3-0.6B's 28 layers.
constexpr int64_t kDecodeTokens = 8;

// body(r) for r in [0, n): serially when small, on the decode pool for decode-sized calls,
// else OpenMP.
template <class Body>
void for_rows(int64_t n, bool parallel, bool decode_sized, const Body& body) {
  if (!parallel) {
    for (int64_t r = 0; r < n; ++r) body(r);
  } else if (decode_sized) {
    decode_parallel_for(n, [&](int64_t r, int) { body(r); });
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) body(r);
  }
}

// out[c] = sum_r x[r] * R[r, c]  (row vector times d x d matrix), r in order.
inline void rotate_row(const float* x, const float* R, int d, float* out) {
  for (int c = 0; c < d; ++c) out[c] = 0.f;
  for (int r = 0; r < d; ++r) {
    const float xr = x[r];
    const float* row = R + static_cast<size_t>(r) * d;
    for (int c = 0; c < d; ++c) out[c] += xr * row[c];
  }
}

inline void store_exact(const float* x, int elem_bytes, int d, uint8_t* dst) {
  if (elem_bytes == 4) {
    std::memcpy(dst, x, sizeof(float) * d);
  } else {
    bf16_t* h = reinterpret_cast<bf16_t*>(dst);
    for (int c = 0; c < d; ++c) h[c] = f32_to_bf16(x[c]);
  }
}

}  // namespace

Status kv_append(const KvAppendParams& p) {
  const KvPageLayout& L = p.layout;
  const int d = L.head_dim, H = L.n_heads_kv;
  if (p.layer < 0 || p.layer >= L.n_layers || d <= 0 || d > kMaxHeadDim || H <= 0 ||
      L.page_size <= 0 || p.n_tokens < 0)
    return invalid_argument("kv_append: bad shape (layer %d of %d, head_dim %d, %d kv heads, "
                            "%lld tokens)", p.layer, L.n_layers, d, H,
                            static_cast<long long>(p.n_tokens));
  if (p.n_tokens == 0) return Status();
  if (p.k == nullptr || p.v == nullptr || p.slots == nullptr || p.exact_pool == nullptr)
    return invalid_argument("kv_append: null k, v, slots or pool");
  const size_t page_bytes = L.exact_page_bytes();
  const int64_t n_rows = p.n_tokens * H;
  const bool parallel = n_rows * d * (p.k_rotation ? d : 1) >= (int64_t{1} << 16);
  for_rows(n_rows, parallel, p.n_tokens <= kDecodeTokens, [&](int64_t r) {
    const int64_t i = r / H;
    const int h = static_cast<int>(r % H);
    const int64_t page = p.slots[i] / L.page_size;
    const int slot = static_cast<int>(p.slots[i] % L.page_size);
    uint8_t* base = p.exact_pool + static_cast<size_t>(page) * page_bytes;
    float centred[kMaxHeadDim], rotated[kMaxHeadDim];
    const float* krow = p.k + r * d;
    const size_t head = static_cast<size_t>(p.layer) * H + h;
    if (p.k_mean != nullptr) {
      const float* mu = p.k_mean + head * d;
      for (int c = 0; c < d; ++c) centred[c] = krow[c] - mu[c];
      krow = centred;
    }
    if (p.k_rotation != nullptr) {
      rotate_row(krow, p.k_rotation + head * d * d, d, rotated);
      krow = rotated;
    }
    store_exact(krow, L.exact_elem_bytes, d, base + L.exact_row_offset(p.layer, 0, h, slot));
    store_exact(p.v + r * d, L.exact_elem_bytes, d, base + L.exact_row_offset(p.layer, 1, h, slot));
  });
  return Status();
}

Status rotate_queries(const RotateQueriesParams& p) {
  const int d = p.head_dim;
  if (p.n_heads_kv <= 0 || p.n_heads_q % p.n_heads_kv != 0 || d <= 0 || p.n_rows < 0)
    return invalid_argument("rotate_queries: bad shape (%d q heads, %d kv heads, head_dim %d)",
                            p.n_heads_q, p.n_heads_kv, d);
  const int gqa = p.n_heads_q / p.n_heads_kv;
  const int64_t n = p.n_rows * p.n_heads_q;
  if (p.q_rotation == nullptr) {
    std::memcpy(p.out, p.q, sizeof(float) * static_cast<size_t>(n) * d);
    return Status();
  }
  for_rows(n, n * d * d >= (int64_t{1} << 18), p.n_rows <= kDecodeTokens, [&](int64_t r) {
    const int h = static_cast<int>(r % p.n_heads_q);
    const float* R = p.q_rotation +
                     (static_cast<size_t>(p.layer) * p.n_heads_kv + h / gqa) * d * d;
    rotate_row(p.q + r * d, R, d, p.out + r * d);
  });
  return Status();
}

}  // namespace oscar::kernels
