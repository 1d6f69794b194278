// CPU elementwise ops (kernels/elementwise.h), moved out of the model so that every backend
// implements the same list.
#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.h"

namespace oscar::kernels {

Status embed(const WeightView& table, const int32_t* ids, int64_t n, float* x) {
  const int64_t H = table.cols;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= table.rows)
      return invalid_argument("embed: token id %d out of range [0, %lld)", ids[i],
                              static_cast<long long>(table.rows));
    float* dst = x + i * H;
    if (table.dtype == DType::kF32) {
      std::memcpy(dst, static_cast<const float*>(table.data) + ids[i] * H, sizeof(float) * H);
    } else {
      const bf16_t* src = static_cast<const bf16_t*>(table.data) + ids[i] * H;
      for (int64_t c = 0; c < H; ++c) dst[c] = bf16_to_f32(src[c]);
    }
  }
  return Status();
}

Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0.f;
    for (int64_t c = 0; c < dim; ++c) ss += xr[c] * xr[c];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t c = 0; c < dim; ++c) yr[c] = w[c] * (xr[c] * inv);
  }
  return Status();
}

void rope_tables(const int32_t* positions, int64_t n_rows, const float* inv_freq, int64_t half,
                 float* cos, float* sin) {
  for (int64_t row = 0; row < n_rows; ++row)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[row]) * inv_freq[i];
      cos[row * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[row * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
}

Status rope(const RopeParams& p) {
  const int64_t d = p.head_dim, rot_dim = p.rotary_dim == 0 ? d : p.rotary_dim, half = rot_dim / 2;
  if (rot_dim <= 0 || rot_dim > d || rot_dim % 2 != 0)
    return invalid_argument("rope: rotary_dim %d must be even and in (0, head_dim %d]",
                            p.rotary_dim, p.head_dim);
  if (p.q_norm != nullptr)
    OSCAR_RETURN_IF_ERROR(rms_norm(p.q, p.n_rows * p.n_heads_q, d, p.q_norm, p.norm_eps, p.q));
  if (p.k_norm != nullptr)
    OSCAR_RETURN_IF_ERROR(rms_norm(p.k, p.n_rows * p.n_heads_kv, d, p.k_norm, p.norm_eps, p.k));
  for (int64_t row = 0; row < p.n_rows; ++row) {
    const float* cs = p.cos + row * half;
    const float* sn = p.sin + row * half;
    auto rot = [&](float* base, int heads) {
      for (int hh = 0; hh < heads; ++hh) {
        float* xh = base + (row * heads + hh) * d;
        for (int64_t i = 0; i < half; ++i) {
          const float a = xh[i], b = xh[i + half];
          xh[i] = a * cs[i] - b * sn[i];
          xh[i + half] = b * cs[i] + a * sn[i];
        }
      }
    };
    rot(p.q, p.n_heads_q);
    rot(p.k, p.n_heads_kv);
  }
  return Status();
}

Status sigmoid_mul(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  return Status();
}

Status sigmoid_scale_rows(float* x, const float* gate, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-gate[r]));
    for (int64_t i = 0; i < dim; ++i) x[r * dim + i] *= s;
  }
  return Status();
}

Status silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
  return Status();
}

Status add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  return Status();
}

Status gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t dim, float* dst) {
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(src + static_cast<int64_t>(rows[i]) * dim, dim, dst + i * dim);
  return Status();
}

Status fill_normal_bf16(bf16_t* dst, int64_t n, float std, uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(dummy_weight(seed, i, std));
  return Status();
}

}  // namespace oscar::kernels
