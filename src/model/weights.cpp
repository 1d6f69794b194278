// Weight containers and the blocks' views of a layer (model/weights.h).
#include "model/weights.h"

#include "core/check.h"

namespace oscar::model {

namespace {

const float* or_null(const Vec& v) { return v.empty() ? nullptr : v.data(); }

// dst = rows `rows` of src, in that order (host matrices, any dtype).
void take_rows(const Matrix& src, const std::vector<int64_t>& rows, Matrix* dst) {
  *dst = Matrix();
  dst->dtype = src.dtype;
  dst->rows = static_cast<int64_t>(rows.size());
  dst->cols = src.cols;
  const size_t cols = static_cast<size_t>(src.cols);
  for (int64_t r : rows) {
    OSCAR_CHECK(r >= 0 && r < src.rows, "take_rows: row %lld of %lld", static_cast<long long>(r),
                static_cast<long long>(src.rows));
    const size_t at = static_cast<size_t>(r) * cols;
    if (src.dtype == kernels::DType::kBF16)
      dst->bf16.insert(dst->bf16.end(), src.bf16.begin() + at, src.bf16.begin() + at + cols);
    else
      dst->f32.insert(dst->f32.end(), src.f32.begin() + at, src.f32.begin() + at + cols);
  }
}

}  // namespace

void split_in_proj_qkvz(const Matrix& qkvz, const format::ModelConfig& c, Matrix* qkv,
                        Matrix* z) {
  const int64_t hk = c.lin_heads_k, dk = c.lin_head_dim_k, dv = c.lin_head_dim_v;
  const int64_t r = c.lin_heads_v / c.lin_heads_k;
  const int64_t group = 2 * dk + 2 * r * dv;  // rows of one key-head group
  OSCAR_CHECK(qkvz.rows == hk * group, "in_proj_qkvz: %lld rows, expected %lld",
              static_cast<long long>(qkvz.rows), static_cast<long long>(hk * group));
  std::vector<int64_t> q, k, v, zr;
  for (int64_t g = 0; g < hk; ++g) {
    const int64_t base = g * group;
    for (int64_t i = 0; i < dk; ++i) q.push_back(base + i);
    for (int64_t i = 0; i < dk; ++i) k.push_back(base + dk + i);
    for (int64_t i = 0; i < r * dv; ++i) v.push_back(base + 2 * dk + i);
    for (int64_t i = 0; i < r * dv; ++i) zr.push_back(base + 2 * dk + r * dv + i);
  }
  q.insert(q.end(), k.begin(), k.end());
  q.insert(q.end(), v.begin(), v.end());
  take_rows(qkvz, q, qkv);
  take_rows(qkvz, zr, z);
}

void split_in_proj_ba(const Matrix& ba, const format::ModelConfig& c, Matrix* b, Matrix* a) {
  const int64_t hk = c.lin_heads_k, r = c.lin_heads_v / c.lin_heads_k;
  OSCAR_CHECK(ba.rows == 2 * hk * r, "in_proj_ba: %lld rows, expected %lld",
              static_cast<long long>(ba.rows), static_cast<long long>(2 * hk * r));
  std::vector<int64_t> br, ar;
  for (int64_t g = 0; g < hk; ++g)
    for (int64_t j = 0; j < r; ++j) {
      br.push_back(g * 2 * r + j);
      ar.push_back(g * 2 * r + r + j);
    }
  take_rows(ba, br, b);
  take_rows(ba, ar, a);
}

kernels::WeightView Matrix::view() const {
  const void* data = !dev.empty() ? dev.data() : host_bytes();
  return kernels::WeightView{data, dtype, rows, cols};
}

void* Matrix::host_bytes() const {
  if (!dev.empty()) return dev.device() == Device::kCpu ? dev.data() : nullptr;
  return dtype == kernels::DType::kBF16 ? static_cast<void*>(const_cast<bf16_t*>(bf16.data()))
                                        : static_cast<void*>(const_cast<float*>(f32.data()));
}

void Matrix::to_f32() {
  if (dtype == kernels::DType::kF32) return;
  f32.resize(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) f32[i] = bf16_to_f32(bf16[i]);
  bf16 = {};
  dtype = kernels::DType::kF32;
}

void Matrix::to_bf16() {
  if (dtype == kernels::DType::kBF16) return;
  bf16.resize(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) bf16[i] = f32_to_bf16(f32[i]);
  f32 = {};
  dtype = kernels::DType::kBF16;
}

AttentionWeights ModelWeights::attention(int layer) const {
  const LayerWeights& L = layers[layer];
  AttentionWeights w;
  w.wq = L.wq.view();
  w.wk = L.wk.view();
  w.wv = L.wv.view();
  w.wq_gate = L.wq_gate.view();
  w.wo = L.wo.view();
  w.bq = or_null(L.bq);
  w.bk = or_null(L.bk);
  w.bv = or_null(L.bv);
  w.q_norm = or_null(L.q_norm);
  w.k_norm = or_null(L.k_norm);
  w.out_unrotation = or_null(out_unrotation);
  return w;
}

DenseFfnWeights ModelWeights::dense_ffn(int layer) const {
  const LayerWeights& L = layers[layer];
  return DenseFfnWeights{L.w_gate.view(), L.w_up.view(), L.w_down.view()};
}

MoeFfnWeights ModelWeights::moe_ffn(int layer) const {
  const LayerWeights& L = layers[layer];
  const format::ModelConfig& c = config;
  auto experts = [&](const Matrix& w) {
    const kernels::WeightView v = w.view();
    kernels::ExpertWeights e;
    e.data = v.data;
    e.dtype = v.dtype;
    e.n_experts = c.n_experts;
    e.rows = v.rows / c.n_experts;
    e.cols = v.cols;
    return e;
  };
  MoeFfnWeights m;
  m.router = L.w_router.view();
  m.gate = experts(L.w_exp_gate);
  m.up = experts(L.w_exp_up);
  m.down = experts(L.w_exp_down);
  m.top_k = c.n_experts_per_tok;
  m.norm_topk_prob = c.norm_topk_prob;
  m.shared_gate = L.w_shared_gate.view();
  m.shared_up = L.w_shared_up.view();
  m.shared_down = L.w_shared_down.view();
  m.shared_expert_gate = L.w_shared_expert_gate.view();
  return m;
}

GatedDeltaNetWeights ModelWeights::gated_delta_net(int layer) const {
  const LayerWeights& L = layers[layer];
  const format::ModelConfig& c = config;
  GatedDeltaNetWeights w;
  w.in_qkv = L.lin_qkv.view();
  w.in_z = L.lin_z.view();
  w.in_b = L.lin_b.view();
  w.in_a = L.lin_a.view();
  w.conv = L.lin_conv.data();
  w.A_log = L.lin_A_log.data();
  w.dt_bias = L.lin_dt_bias.data();
  w.norm = L.lin_norm.data();
  w.out = L.lin_out.view();
  w.heads_k = c.lin_heads_k;
  w.heads_v = c.lin_heads_v;
  w.d_k = c.lin_head_dim_k;
  w.d_v = c.lin_head_dim_v;
  w.conv_kernel = c.lin_conv_kernel;
  w.norm_eps = c.rms_norm_eps;
  return w;
}

}  // namespace oscar::model
