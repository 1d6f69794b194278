#include "model/qwen3.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "core/bf16.h"
#include "core/check.h"
#include "core/log.h"
#include "format/safetensors.h"
#include "format/weight_table.h"
#include "kernels/backend.h"
#include "model/blocks.h"

namespace oscar::model {

using format::WeightKind;

namespace {


// The params of y[n, out] = x[n, in] * W[out, in]^T (+ bias).
kernels::LinearParams lin(const float* x, int64_t n, const Qwen3Model::Matrix& w,
                          const Qwen3Model::Vec* bias, float* y) {
  kernels::LinearParams p;
  p.x = x;
  p.n = n;
  p.w = w.view();
  p.bias = bias == nullptr || bias->empty() ? nullptr : bias->data();
  p.y = y;
  return p;
}

// A checkpoint matrix as stored when it is BF16 (a copy out of the mapped file), else widened.
Qwen3Model::Matrix to_matrix(const format::TensorView* t) {
  Qwen3Model::Matrix m;
  m.rows = t->shape.empty() ? 0 : t->shape[0];
  m.cols = t->shape.size() < 2 ? 1 : t->numel() / std::max<int64_t>(1, m.rows);
  if (t->dtype == format::DType::kBF16) {
    m.dtype = kernels::DType::kBF16;
    m.bf16.resize(static_cast<size_t>(t->numel()));
    std::memcpy(m.bf16.data(), t->data, m.bf16.size() * sizeof(bf16_t));
  } else {
    m.dtype = kernels::DType::kF32;
    m.f32 = t->to_f32();
  }
  return m;
}

// Expert `e`'s checkpoint matrix [out, in] into its rows [e · out, (e + 1) · out) of a stacked
// matrix sized by the loader (BF16 only when the tensor is BF16).
void put_expert(Qwen3Model::Matrix& stack, int e, const format::TensorView* t) {
  const size_t n = static_cast<size_t>(t->numel());
  if (stack.dtype == kernels::DType::kBF16) {
    OSCAR_CHECK(t->dtype == format::DType::kBF16, "expert %d: BF16 stack, tensor %s", e,
                t->name.c_str());
    std::memcpy(stack.bf16.data() + n * e, t->data, n * sizeof(bf16_t));
  } else {
    const std::vector<float> f = t->to_f32();
    std::copy(f.begin(), f.end(), stack.f32.begin() + static_cast<ptrdiff_t>(n * e));
  }
}

// Qwen3.5's q_proj [n_heads · 2 · head_dim, hidden] holds, per head, head_dim query rows then
// head_dim gate rows (transformers views it as [.., heads, 2 · head_dim] and chunks the last dim):
// split into the query matrix and the gate matrix, [n_heads · head_dim, hidden] each.
void split_gated_q(const format::TensorView* t, int n_heads, int64_t head_dim,
                   Qwen3Model::Matrix* q, Qwen3Model::Matrix* gate) {
  const Qwen3Model::Matrix both = to_matrix(t);
  const int64_t cols = both.cols, rows = int64_t{n_heads} * head_dim;
  for (Qwen3Model::Matrix* m : {q, gate}) {
    m->dtype = both.dtype;
    m->rows = rows;
    m->cols = cols;
  }
  for (int64_t h = 0; h < n_heads; ++h)
    for (int half = 0; half < 2; ++half) {
      Qwen3Model::Matrix* m = half == 0 ? q : gate;
      const int64_t src = (2 * h + half) * head_dim * cols, n = head_dim * cols;
      if (both.dtype == kernels::DType::kBF16)
        m->bf16.insert(m->bf16.end(), both.bf16.begin() + src, both.bf16.begin() + src + n);
      else
        m->f32.insert(m->f32.end(), both.f32.begin() + src, both.f32.begin() + src + n);
    }
}

// A matrix's slice of the CPU weight buffer: its bytes rounded up to 64 (cache lines, AVX loads).
size_t cpu_slice_bytes(const Qwen3Model::Matrix& w) { return (w.bytes() + 63) / 64 * 64; }

}  // namespace

void Qwen3Model::init_rope() {
  const int d = config_.rotary_dim;  // head_dim, or Qwen3.5's partial rotary dims
  inv_freq_.resize(d / 2);
  // As the reference: inv_freq = 1 / theta^(arange(0, d, 2) / d) in float32.
  for (int i = 0; i < d / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    const float pw = static_cast<float>(std::pow(config_.rope_theta, static_cast<double>(expo)));
    inv_freq_[i] = 1.0f / pw;
  }
}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::load(const std::string& dir) {
  OSCAR_ASSIGN_OR_RETURN(format::ModelConfig config, format::ModelConfig::load(dir));
  OSCAR_ASSIGN_OR_RETURN(format::Checkpoint ckpt, format::Checkpoint::open(dir));
  OSCAR_ASSIGN_OR_RETURN(format::BoundWeights bound, format::bind_weights(config, ckpt));

  std::unique_ptr<Qwen3Model> m(new Qwen3Model());
  m->config_ = config;
  m->layers_.resize(config.n_layers);
  // A sparse layer's experts go into one matrix per kind, [n_experts · out, in]: BF16 when every
  // expert of that kind is BF16 in the checkpoint, else float32.
  auto stack_of = [&](Layer& L, WeightKind kind) -> Matrix* {
    return kind == WeightKind::kExpertGate ? &L.w_exp_gate
           : kind == WeightKind::kExpertUp ? &L.w_exp_up
           : kind == WeightKind::kExpertDown ? &L.w_exp_down
                                             : nullptr;
  };
  for (size_t i = 0; i < bound.specs.size(); ++i) {
    const format::WeightSpec& spec = bound.specs[i];
    Matrix* stack = spec.layer >= 0 ? stack_of(m->layers_[spec.layer], spec.kind) : nullptr;
    if (stack == nullptr) continue;
    m->layers_[spec.layer].moe = true;
    if (stack->rows == 0) {  // first expert of this kind: the shape of the stack
      stack->rows = int64_t{config.n_experts} * spec.shape[0];
      stack->cols = spec.shape[1];
      stack->dtype = kernels::DType::kBF16;
    }
    if (bound.tensors[i]->dtype != format::DType::kBF16) stack->dtype = kernels::DType::kF32;
  }
  for (Layer& L : m->layers_)
    for (Matrix* w : {&L.w_exp_gate, &L.w_exp_up, &L.w_exp_down}) {
      if (w->rows == 0) continue;
      if (w->dtype == kernels::DType::kBF16)
        w->bf16.resize(static_cast<size_t>(w->rows * w->cols));
      else
        w->f32.resize(static_cast<size_t>(w->rows * w->cols));
    }
  for (size_t i = 0; i < bound.specs.size(); ++i) {
    const format::WeightSpec& spec = bound.specs[i];
    const format::TensorView* t = bound.tensors[i];
    if (t == nullptr) continue;  // optional and absent (tied lm_head)
    Layer* L = spec.layer >= 0 ? &m->layers_[spec.layer] : nullptr;
    switch (spec.kind) {
      case WeightKind::kEmbed: m->embed_ = to_matrix(t); break;
      case WeightKind::kFinalNorm: m->final_norm_ = t->to_f32(); break;
      case WeightKind::kLmHead: m->lm_head_ = to_matrix(t); break;
      case WeightKind::kInputNorm: L->input_norm = t->to_f32(); break;
      case WeightKind::kPostAttnNorm: L->post_norm = t->to_f32(); break;
      case WeightKind::kQProj:
        if (config.attn_output_gate)
          split_gated_q(t, config.n_heads_q, config.head_dim, &L->wq, &L->wq_gate);
        else
          L->wq = to_matrix(t);
        break;
      case WeightKind::kKProj: L->wk = to_matrix(t); break;
      case WeightKind::kVProj: L->wv = to_matrix(t); break;
      case WeightKind::kOProj: L->wo = to_matrix(t); break;
      case WeightKind::kQNorm: L->q_norm = t->to_f32(); break;
      case WeightKind::kKNorm: L->k_norm = t->to_f32(); break;
      case WeightKind::kQBias: L->bq = t->to_f32(); break;
      case WeightKind::kKBias: L->bk = t->to_f32(); break;
      case WeightKind::kVBias: L->bv = t->to_f32(); break;
      case WeightKind::kGateProj: L->w_gate = to_matrix(t); break;
      case WeightKind::kUpProj: L->w_up = to_matrix(t); break;
      case WeightKind::kDownProj: L->w_down = to_matrix(t); break;
      case WeightKind::kRouter: L->w_router = to_matrix(t); break;
      case WeightKind::kExpertGate:
      case WeightKind::kExpertUp:
      case WeightKind::kExpertDown: put_expert(*stack_of(*L, spec.kind), spec.expert, t); break;
      case WeightKind::kLinQkv: L->lin_qkv = to_matrix(t); break;
      case WeightKind::kLinZ: L->lin_z = to_matrix(t); break;
      case WeightKind::kLinB: L->lin_b = to_matrix(t); break;
      case WeightKind::kLinA: L->lin_a = to_matrix(t); break;
      case WeightKind::kLinConv: L->lin_conv = t->to_f32(); break;
      case WeightKind::kLinALog: L->lin_A_log = t->to_f32(); break;
      case WeightKind::kLinDtBias: L->lin_dt_bias = t->to_f32(); break;
      case WeightKind::kLinNorm: L->lin_norm = t->to_f32(); break;
      case WeightKind::kLinOut: L->lin_out = to_matrix(t); break;
    }
  }
  if (config.tie_word_embeddings) m->lm_head_ = Matrix();
  if (config.zero_centred_norms) {
    // Qwen3_5RMSNorm multiplies by (1 + w) in float32: stored so, the norm ops stay plain.
    auto shift = [](Vec& v) {
      for (float& x : v.host) x = 1.0f + x;
    };
    shift(m->final_norm_);
    for (Layer& L : m->layers_)
      for (Vec* v : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm}) shift(*v);
  }
  int32_t state_layer = 0;
  for (int l = 0; l < config.n_layers; ++l)
    if (config.linear(l)) m->layers_[l].state_layer = state_layer++;
  m->init_rope();
  return m;
}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::load_dummy(const format::ModelConfig& config,
                                                           uint64_t seed,
                                                           kernels::Backend* backend) {
  kernels::Backend& be = backend != nullptr ? *backend : kernels::cpu_backend();
  const bool device = be.device() != Device::kCpu;
  std::unique_ptr<Qwen3Model> m(new Qwen3Model());
  m->config_ = config;
  uint64_t index = 0;  // each matrix draws from its own range of the generator
  // With the CPU backend the matrices are drawn straight into the one weight buffer that
  // pack_cpu_weights would make (host vectors and that buffer would hold the weights twice):
  // randn only shapes them, and they are drawn below in the same order (the same values).
  const bool into_cpu_buffer = backend != nullptr && !device;
  auto randn = [&](int64_t rows, int64_t cols) -> Result<Matrix> {
    Matrix w;
    w.rows = rows;
    w.cols = cols;
    if (into_cpu_buffer) return w;
    const uint64_t s = seed + (++index << 40);
    const int64_t n = rows * cols;
    if (device) {
      OSCAR_ASSIGN_OR_RETURN(w.dev,
                             be.alloc(static_cast<size_t>(n) * sizeof(bf16_t), "dummy weights"));
      OSCAR_RETURN_IF_ERROR(be.fill_normal_bf16(w.dev.as<bf16_t>(), n, 0.02f, s));
    } else {
      w.bf16.resize(static_cast<size_t>(n));
      OSCAR_RETURN_IF_ERROR(kernels::fill_normal_bf16(w.bf16.data(), n, 0.02f, s));
    }
    return w;
  };
  auto ones = [](int64_t n) { return std::vector<float>(n, 1.0f); };
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  OSCAR_ASSIGN_OR_RETURN(m->embed_, randn(config.vocab_size, H));
  if (!config.tie_word_embeddings) {
    OSCAR_ASSIGN_OR_RETURN(m->lm_head_, randn(config.vocab_size, H));
  }
  m->final_norm_ = ones(H);
  m->layers_.resize(config.n_layers);
  const int64_t E = config.n_experts, MI = config.moe_intermediate_size;
  int32_t state_layer = 0;
  for (int l = 0; l < config.n_layers; ++l) {
    Layer& L = m->layers_[l];
    L.input_norm = ones(H);
    L.post_norm = ones(H);
    if (!config.linear(l)) {  // (a DeltaNet layer's matrices follow its FFN's, as matrices())
      OSCAR_ASSIGN_OR_RETURN(L.wq, randn(config.q_dim, H));
      if (config.attn_output_gate) {
        OSCAR_ASSIGN_OR_RETURN(L.wq_gate, randn(config.q_dim, H));
      }
      OSCAR_ASSIGN_OR_RETURN(L.wk, randn(config.kv_dim, H));
      OSCAR_ASSIGN_OR_RETURN(L.wv, randn(config.kv_dim, H));
      OSCAR_ASSIGN_OR_RETURN(L.wo, randn(H, config.q_dim));
      if (config.qk_norm) {
        L.q_norm = ones(config.head_dim);
        L.k_norm = ones(config.head_dim);
      }
    }
    if (!config.moe_layer(l)) {
      OSCAR_ASSIGN_OR_RETURN(L.w_gate, randn(I, H));
      OSCAR_ASSIGN_OR_RETURN(L.w_up, randn(I, H));
      OSCAR_ASSIGN_OR_RETURN(L.w_down, randn(H, I));
    } else {
      L.moe = true;
      OSCAR_ASSIGN_OR_RETURN(L.w_router, randn(E, H));
      OSCAR_ASSIGN_OR_RETURN(L.w_exp_gate, randn(E * MI, H));
      OSCAR_ASSIGN_OR_RETURN(L.w_exp_up, randn(E * MI, H));
      OSCAR_ASSIGN_OR_RETURN(L.w_exp_down, randn(E * H, MI));
    }
    if (config.linear(l)) {
      const int64_t hv = config.lin_heads_v;
      OSCAR_ASSIGN_OR_RETURN(L.lin_qkv, randn(config.lin_conv_dim, H));
      OSCAR_ASSIGN_OR_RETURN(L.lin_z, randn(config.lin_value_dim, H));
      OSCAR_ASSIGN_OR_RETURN(L.lin_b, randn(hv, H));
      OSCAR_ASSIGN_OR_RETURN(L.lin_a, randn(hv, H));
      OSCAR_ASSIGN_OR_RETURN(L.lin_out, randn(H, config.lin_value_dim));
      // Conv taps averaging the last K inputs, A = 1 and dt_bias 0 (decay exp(-softplus(a))):
      // finite states whatever the random projections give.
      L.lin_conv = std::vector<float>(static_cast<size_t>(config.lin_conv_dim) *
                                          config.lin_conv_kernel,
                                      1.0f / static_cast<float>(config.lin_conv_kernel));
      L.lin_A_log = std::vector<float>(static_cast<size_t>(hv), 0.0f);
      L.lin_dt_bias = std::vector<float>(static_cast<size_t>(hv), 0.0f);
      L.lin_norm = ones(config.lin_head_dim_v);
      L.state_layer = state_layer++;
    }
  }
  if (into_cpu_buffer) {
    size_t total = 0;
    for (Matrix* w : m->matrices()) total += w->rows > 0 ? cpu_slice_bytes(*w) : 0;
    OSCAR_ASSIGN_OR_RETURN(m->cpu_weights_, be.alloc(total, "weights"));
    uint8_t* dst = m->cpu_weights_.as<uint8_t>();
    for (Matrix* w : m->matrices()) {  // the order of the randn calls above
      if (w->rows == 0) continue;
      const uint64_t s = seed + (++index << 40);
      OSCAR_RETURN_IF_ERROR(
          kernels::fill_normal_bf16(reinterpret_cast<bf16_t*>(dst), w->rows * w->cols, 0.02f, s));
      w->dev = DeviceBuffer(dst, w->bytes(), Device::kCpu, {});  // a view: the buffer owns it
      dst += cpu_slice_bytes(*w);
    }
  }
  m->init_rope();
  // The matrices are already in the backend's memory; set_backend uploads the vectors.
  if (backend != nullptr) OSCAR_RETURN_IF_ERROR(m->set_backend(backend));
  m->dummy_on_device_ = device;
  return m;
}

Status Qwen3Model::set_backend(kernels::Backend* backend) {
  backend_ = backend;
  if (backend->device() == Device::kCpu) return pack_cpu_weights(*backend);
  kernels::Backend& be = *backend;
  auto up_matrix = [&](Matrix& w, const char* what) -> Status {
    if (w.rows == 0 || (!w.dev.empty() && w.dev.device() != Device::kCpu)) return Status();
    OSCAR_ASSIGN_OR_RETURN(DeviceBuffer dev, be.alloc(w.bytes(), what));
    OSCAR_RETURN_IF_ERROR(be.upload(w.host_bytes(), w.bytes(), dev.data()));
    w.dev = std::move(dev);  // drops a view into the CPU arena, if any
    w.bf16 = {};
    w.f32 = {};
    return Status();
  };
  auto up_vec = [&](Vec& v, const char* what) -> Status {
    if (!v.dev.empty() || v.host.empty()) return Status();
    OSCAR_ASSIGN_OR_RETURN(v.dev, be.alloc(v.host.size() * sizeof(float), what));
    return be.upload(v.host.data(), v.host.size() * sizeof(float), v.dev.data());
  };
  for (Matrix* w : matrices())
    OSCAR_RETURN_IF_ERROR(up_matrix(*w, w == &embed_     ? "embedding"
                                        : w == &lm_head_ ? "lm_head"
                                                         : "weights"));
  OSCAR_RETURN_IF_ERROR(up_vec(final_norm_, "final norm"));
  for (Layer& L : layers_)
    for (Vec* v : {&L.input_norm, &L.post_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm,
                   &L.lin_conv, &L.lin_A_log, &L.lin_dt_bias, &L.lin_norm})
      OSCAR_RETURN_IF_ERROR(up_vec(*v, "norms and biases"));
  OSCAR_RETURN_IF_ERROR(be.synchronize());
  cpu_weights_.reset();
  return Status();
}

std::vector<Qwen3Model::Matrix*> Qwen3Model::matrices() {
  std::vector<Matrix*> all = {&embed_, &lm_head_};
  for (Layer& L : layers_)
    for (Matrix* w : {&L.wq, &L.wq_gate, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down,
                      &L.w_router, &L.w_exp_gate, &L.w_exp_up, &L.w_exp_down, &L.lin_qkv,
                      &L.lin_z, &L.lin_b, &L.lin_a, &L.lin_out})
      all.push_back(w);
  return all;
}

Status Qwen3Model::pack_cpu_weights(kernels::Backend& be) {
  if (!cpu_weights_.empty()) return Status();
  // 64-byte aligned slices of one buffer; the CPU backend puts a buffer this large on 2 MiB
  // pages (a decode step streams every weight once: with 4 KiB pages, one TLB miss per 4 KiB).
  size_t total = 0;
  for (Matrix* w : matrices())
    if (w->rows > 0 && w->dev.empty()) total += cpu_slice_bytes(*w);
  if (total == 0) return Status();
  OSCAR_ASSIGN_OR_RETURN(cpu_weights_, be.alloc(total, "weights"));
  uint8_t* dst = cpu_weights_.as<uint8_t>();
  for (Matrix* w : matrices()) {
    if (w->rows == 0 || !w->dev.empty()) continue;
    std::memcpy(dst, w->host_bytes(), w->bytes());
    w->dev = DeviceBuffer(dst, w->bytes(), Device::kCpu, {});  // a view: the arena owns it
    w->bf16 = {};
    w->f32 = {};
    dst += cpu_slice_bytes(*w);
  }
  return Status();
}

DenseFfnWeights Qwen3Model::dense_weights(const Layer& L) const {
  return DenseFfnWeights{L.w_gate.view(), L.w_up.view(), L.w_down.view()};
}

GatedDeltaNetWeights Qwen3Model::gdn_weights(const Layer& L) const {
  const format::ModelConfig& c = config_;
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

MoeFfnWeights Qwen3Model::moe_weights(const Layer& L) const {
  const format::ModelConfig& c = config_;
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
  return m;
}

kernels::WeightView Qwen3Model::Matrix::view() const {
  const void* data = !dev.empty() ? dev.data() : host_bytes();
  return kernels::WeightView{data, dtype, rows, cols};
}

void* Qwen3Model::Matrix::host_bytes() const {
  if (!dev.empty()) return dev.device() == Device::kCpu ? dev.data() : nullptr;
  return dtype == kernels::DType::kBF16 ? static_cast<void*>(const_cast<bf16_t*>(bf16.data()))
                                        : static_cast<void*>(const_cast<float*>(f32.data()));
}

void Qwen3Model::Matrix::to_f32() {
  if (dtype == kernels::DType::kF32) return;
  f32.resize(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) f32[i] = bf16_to_f32(bf16[i]);
  bf16 = {};
  dtype = kernels::DType::kF32;
}

void Qwen3Model::Matrix::to_bf16() {
  if (dtype == kernels::DType::kBF16) return;
  bf16.resize(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) bf16[i] = f32_to_bf16(f32[i]);
  f32 = {};
  dtype = kernels::DType::kBF16;
}

size_t Qwen3Model::weight_bytes() const {
  size_t n = embed_.bytes() + lm_head_.bytes() + final_norm_.size() * sizeof(float);
  for (const Layer& L : layers_)
    n += L.wq.bytes() + L.wq_gate.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() +
         L.w_gate.bytes() + L.w_up.bytes() + L.w_down.bytes() + L.w_router.bytes() +
         L.w_exp_gate.bytes() + L.w_exp_up.bytes() + L.w_exp_down.bytes() + L.lin_qkv.bytes() +
         L.lin_z.bytes() + L.lin_b.bytes() + L.lin_a.bytes() + L.lin_out.bytes() +
         sizeof(float) * (L.input_norm.size() + L.post_norm.size() + L.bq.size() + L.bk.size() +
                          L.bv.size() + L.q_norm.size() + L.k_norm.size() + L.lin_conv.size() +
                          L.lin_A_log.size() + L.lin_dt_bias.size() + L.lin_norm.size());
  return n;
}

Status Qwen3Model::set_embedding_row(int32_t token, std::span<const float> row) {
  if (on_device()) return invalid_argument("set_embedding_row: the weights are on the device");
  if (token < 0 || token >= embed_.rows || static_cast<int64_t>(row.size()) != embed_.cols)
    return invalid_argument("set_embedding_row: token %d of %lld, %zu values for %lld", token,
                            static_cast<long long>(embed_.rows), row.size(),
                            static_cast<long long>(embed_.cols));
  if (lm_head_.rows == 0) {  // tied: the output projection keeps the old row (a host copy)
    lm_head_.dtype = embed_.dtype;
    lm_head_.rows = embed_.rows;
    lm_head_.cols = embed_.cols;
    if (embed_.dtype == kernels::DType::kBF16) {
      const auto* e = static_cast<const bf16_t*>(embed_.host_bytes());
      lm_head_.bf16.assign(e, e + embed_.rows * embed_.cols);
    } else {
      const auto* e = static_cast<const float*>(embed_.host_bytes());
      lm_head_.f32.assign(e, e + embed_.rows * embed_.cols);
    }
  }
  for (int64_t c = 0; c < embed_.cols; ++c) {
    const int64_t i = token * embed_.cols + c;
    if (embed_.dtype == kernels::DType::kBF16)
      static_cast<bf16_t*>(embed_.host_bytes())[i] = f32_to_bf16(row[c]);
    else
      static_cast<float*>(embed_.host_bytes())[i] = row[c];
  }
  return Status();
}

Status Qwen3Model::fold_value_rotation(std::span<const float> v_rotation, kernels::DType stored) {
  const int d = config_.head_dim, Hkv = config_.n_heads_kv, Hq = config_.n_heads_q;
  const int64_t hidden = config_.hidden_size;
  // One rotation per KV cache layer (a hybrid's full-attention layers only).
  const size_t expected = static_cast<size_t>(config_.n_kv_layers) * Hkv * d * d;
  if (v_rotation.size() != expected)
    return invalid_argument("value rotation has %zu values, expected %zu", v_rotation.size(),
                            expected);
  if (value_rotation_folded_) return invalid_argument("value rotation already folded");
  if (on_device() && dummy_on_device_) {
    // Random weights rotated are random weights: BF16 ones stay as drawn; float32 ones are
    // redrawn on the host and uploaded (the bytes a float32 fold costs).
    value_rotation_folded_ = true;
    if (stored == kernels::DType::kBF16) return Status();
    uint64_t index = 1000;
    for (Layer& L : layers_)
      for (Matrix* w : {&L.wv, &L.wo}) {
        const int64_t n = w->rows * w->cols;
        std::vector<float> host(static_cast<size_t>(n));
        const uint64_t seed = ++index << 40;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) host[i] = kernels::dummy_weight(seed, i, 0.02f);
        w->dtype = kernels::DType::kF32;
        w->dev.reset();
        OSCAR_ASSIGN_OR_RETURN(w->dev,
                               backend_->alloc(host.size() * sizeof(float), "dummy weights"));
        OSCAR_RETURN_IF_ERROR(
            backend_->upload(host.data(), host.size() * sizeof(float), w->dev.data()));
      }
    value_rotation_folded_ = true;
    return backend_->synchronize();
  }
  if (on_device()) return invalid_argument("fold_value_rotation: the weights are on the device");
  if (!cpu_weights_.empty())
    return invalid_argument(
        "fold_value_rotation: call it before set_backend (the weights are packed)");
  const int gqa = config_.gqa_ratio;
  std::vector<double> acc;
  for (int l = 0; l < config_.n_layers; ++l) {
    if (config_.linear(l)) continue;
    Layer& L = layers_[l];
    // Folded in float32 (the matrices are not BF16-representable), rounded below if asked.
    L.wv.to_f32();
    L.wo.to_f32();
    for (int g = 0; g < Hkv; ++g) {
      const float* R =
          v_rotation.data() + (static_cast<size_t>(config_.kv_layer[l]) * Hkv + g) * d * d;
      // v_proj rows of head g: W' = R^T W   ([d, d] x [d, hidden]); bias' = bias R.
      float* W = L.wv.f32.data() + static_cast<int64_t>(g) * d * hidden;
      acc.assign(static_cast<size_t>(d) * hidden, 0.0);
      for (int a = 0; a < d; ++a)
        for (int r = 0; r < d; ++r) {
          const double rr = R[static_cast<size_t>(r) * d + a];
          const float* wr = W + static_cast<int64_t>(r) * hidden;
          double* out = acc.data() + static_cast<int64_t>(a) * hidden;
          for (int64_t c = 0; c < hidden; ++c) out[c] += rr * wr[c];
        }
      for (size_t i = 0; i < acc.size(); ++i) W[i] = static_cast<float>(acc[i]);
      if (!L.bv.empty()) {
        float* b = L.bv.host.data() + static_cast<int64_t>(g) * d;
        std::vector<double> nb(d, 0.0);
        for (int r = 0; r < d; ++r)
          for (int c = 0; c < d; ++c) nb[c] += static_cast<double>(b[r]) * R[static_cast<size_t>(r) * d + c];
        for (int c = 0; c < d; ++c) b[c] = static_cast<float>(nb[c]);
      }
      // o_proj columns of every query head reading kv head g: W_o[:, h]' = W_o[:, h] R.
      for (int h = g * gqa; h < (g + 1) * gqa; ++h) {
        std::vector<double> row(d);
        for (int64_t o = 0; o < hidden; ++o) {
          float* wo = L.wo.f32.data() + o * (static_cast<int64_t>(Hq) * d) + static_cast<int64_t>(h) * d;
          std::fill(row.begin(), row.end(), 0.0);
          for (int r = 0; r < d; ++r) {
            const double x = wo[r];
            const float* Rr = R + static_cast<size_t>(r) * d;
            for (int c = 0; c < d; ++c) row[c] += x * Rr[c];
          }
          for (int c = 0; c < d; ++c) wo[c] = static_cast<float>(row[c]);
        }
      }
    }
    if (stored == kernels::DType::kBF16) {
      L.wv.to_bf16();
      L.wo.to_bf16();
    }
  }
  value_rotation_folded_ = true;
  return Status();
}

Status Qwen3Model::forward_one(std::span<const int32_t> tokens, kv::SequenceCache& cache,
                               std::vector<float>* logits, bool all_logits,
                               const ForwardOptions& options) {
  SeqChunk chunk;
  chunk.tokens = tokens;
  chunk.cache = &cache;
  chunk.all_logits = all_logits;
  chunk.logits = logits;
  return forward(std::span<SeqChunk>(&chunk, 1), options);
}

// The single-threaded driver (tools, evaluation, calibration): reserve -> plan -> forward ->
// demote -> commit. The scheduler runs the same steps itself, failing requests one by one.
Status Qwen3Model::forward(std::span<SeqChunk> batch, const ForwardOptions& options) {
  const format::ModelConfig& c = config_;
  std::vector<kv::StepChunk> chunks(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqChunk& ch = batch[s];
    if (ch.cache == nullptr || ch.tokens.empty())
      return invalid_argument("forward: sequence %zu has no cache or no tokens", s);
    const int64_t end = ch.cache->n_tokens() + static_cast<int64_t>(ch.tokens.size());
    if (end > c.max_position_embeddings)
      return out_of_range("forward: %lld tokens exceed the model's context of %d",
                          static_cast<long long>(end), c.max_position_embeddings);
    chunks[s] = kv::StepChunk{ch.cache, ch.tokens, ch.all_logits};
  }
  if (batch.empty()) return Status();
  // All-or-nothing reservation.
  for (size_t s = 0; s < batch.size(); ++s) {
    Status st = batch[s].cache->reserve(static_cast<int64_t>(batch[s].tokens.size()));
    if (!st.ok()) {
      for (size_t r = 0; r < s; ++r) batch[r].cache->unreserve();
      return st;
    }
  }
  const kv::StepPlan plan = kv::StepPlan::make(chunks, options.attend_mode);
  std::vector<float> logits;
  Status st = forward(plan, options, &logits);
  if (st.ok()) {
    std::vector<int32_t> demote_status;
    st = demote(plan, &demote_status);
    if (st.ok()) {
      std::vector<Status> per_chunk;
      plan.commit(demote_status, &per_chunk);
      for (const Status& e : per_chunk)
        if (!e.ok()) return e;  // the caller drops the failed caches
    }
  }
  if (!st.ok()) {
    for (SeqChunk& ch : batch) ch.cache->unreserve();
    return st;
  }
  for (int32_t s = 0; s < plan.n_seqs(); ++s) {
    SeqChunk& ch = batch[plan.chunk[s]];
    if (ch.logits == nullptr) continue;
    const size_t v = static_cast<size_t>(c.vocab_size);
    ch.logits->assign(logits.begin() + plan.cu_logits[s] * v, logits.begin() + plan.cu_logits[s + 1] * v);
  }
  return Status();
}

namespace {

// The plan's arrays where the ops read them: the plan's own vectors for the CPU backend; for a
// device backend, one host staging buffer uploaded in one copy (a few KiB per step).
class Stager {
 public:
  Stager(kernels::Backend& be, std::vector<uint8_t>* staging, DeviceBuffer* dev)
      : be_(be), staging_(staging), dev_(dev), host_(be.device() == Device::kCpu) {
    staging_->clear();
  }
  // Records n elements at p, in room for cap >= n of them (a fixed layout for graph replays);
  // returns a handle to resolve after upload().
  template <typename T>
  size_t add(const T* p, size_t n, size_t cap = 0) {
    const size_t off = (staging_->size() + 15) / 16 * 16;
    srcs_.push_back(p);
    if (!host_) {
      staging_->resize(off + std::max(n, cap) * sizeof(T));
      if (n > 0) std::memcpy(staging_->data() + off, p, n * sizeof(T));
    }
    offsets_.push_back(off);
    return srcs_.size() - 1;
  }
  size_t add_table(const kernels::PageTableView& t, size_t page_cap = 0) {
    const size_t h = add(t.indptr, static_cast<size_t>(t.n_seqs) + 1);
    add(t.page_ids, t.indptr == nullptr ? 0 : static_cast<size_t>(t.indptr[t.n_seqs]), page_cap);
    add(t.last_page_len, static_cast<size_t>(t.n_seqs));
    return h;
  }
  // True when upload() had to move the device copy (a replayed graph's pointers are stale).
  bool moved() const { return moved_; }
  Status upload() {
    if (host_ || staging_->empty()) return Status();
    if (dev_->bytes() < staging_->size()) {
      moved_ = true;
      dev_->reset();
      OSCAR_ASSIGN_OR_RETURN(*dev_,
                             be_.alloc(std::max<size_t>(staging_->size() * 2, 4096), "step plan"));
    }
    return be_.upload(staging_->data(), staging_->size(), dev_->data());
  }
  template <typename T>
  const T* get(size_t h) const {
    if (host_) return static_cast<const T*>(srcs_[h]);
    return reinterpret_cast<const T*>(dev_->as<uint8_t>() + offsets_[h]);
  }
  kernels::PageTableView table(size_t h, int32_t n_seqs) const {
    kernels::PageTableView t;
    t.indptr = get<int32_t>(h);
    t.page_ids = get<int32_t>(h + 1);
    t.last_page_len = get<int32_t>(h + 2);
    t.n_seqs = n_seqs;
    return t;
  }

 private:
  kernels::Backend& be_;
  std::vector<uint8_t>* staging_;
  DeviceBuffer* dev_;
  bool host_;
  bool moved_ = false;
  std::vector<const void*> srcs_;
  std::vector<size_t> offsets_;
};

}  // namespace

Status Qwen3Model::demote(const kv::StepPlan& plan, std::vector<int32_t>* status) const {
  status->assign(plan.demote_src.size(), kernels::kDemoteOk);
  if (plan.demote_src.empty()) return Status();
  kernels::Backend& be = *backend_;
  const size_t n = plan.demote_src.size();
  kernels::DemotePagesParams p = plan.caches[0]->demote_params();
  p.n_pages = static_cast<int32_t>(n);
  if (be.device() == Device::kCpu) {
    p.src_pages = plan.demote_src.data();
    p.dst_pages = plan.demote_dst.data();
    p.status = status->data();
    return be.demote_pages(p);
  }
  // One buffer: src ids, dst ids, status.
  std::vector<int32_t> host(3 * n, kernels::kDemoteOk);
  std::copy(plan.demote_src.begin(), plan.demote_src.end(), host.begin());
  std::copy(plan.demote_dst.begin(), plan.demote_dst.end(), host.begin() + n);
  DeviceBuffer& buf = demote_buf_;
  if (buf.bytes() < host.size() * sizeof(int32_t)) {
    buf.reset();
    OSCAR_ASSIGN_OR_RETURN(
        buf, be.alloc(std::max<size_t>(host.size() * sizeof(int32_t), 4096), "demotion list"));
  }
  OSCAR_RETURN_IF_ERROR(be.upload(host.data(), host.size() * sizeof(int32_t), buf.data()));
  p.src_pages = buf.as<int32_t>();
  p.dst_pages = buf.as<int32_t>() + n;
  p.status = buf.as<int32_t>() + 2 * n;
  OSCAR_RETURN_IF_ERROR(be.demote_pages(p));
  return be.download(p.status, n * sizeof(int32_t), status->data());
}

Status Qwen3Model::forward(const kv::StepPlan& plan, const ForwardOptions& options,
                           std::vector<float>* logits) {
  OSCAR_RETURN_IF_ERROR(forward(plan, options));
  logits->resize(static_cast<size_t>(plan.n_logit_rows()) * config_.vocab_size);
  if (logits->empty()) return Status();
  return backend_->download(ws_.logits.data(), logits->size() * sizeof(float), logits->data());
}

Status Qwen3Model::forward(const kv::StepPlan& plan, const ForwardOptions& options) {
  const format::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, d = c.head_dim;
  const int Hq = c.n_heads_q, Hkv = c.n_heads_kv;
  const int64_t n = plan.n_rows();
  if (n == 0) return Status();
  for (int32_t t : plan.token_ids)
    if (t < 0 || t >= c.vocab_size)
      return invalid_argument("forward: token id %d out of range [0, %d)", t, c.vocab_size);
  // The scheduler and forward(SeqChunk) guarantee the context bound.
  OSCAR_DCHECK(plan.positions.back() < c.max_position_embeddings);

  kernels::Backend& be = *backend_;
  Workspace& w = ws_;
  const int64_t n_out = plan.n_logit_rows();
  const void* before = w.x.data();
  const void* logits_before = w.logits.data();
  OSCAR_RETURN_IF_ERROR(w.reserve(be, n, n_out, c));
  if (w.x.data() != before || w.logits.data() != logits_before) ++graph_epoch_;
  // A step of decode rows only can run as a graph (kernels::Backend::Graph): the same batch size
  // gives the same launches, and the plan's arrays sit at fixed offsets (page tables in room
  // that grows by doubling; growing re-records).
  const bool graph = graphs_enabled_ && be.supports_capture() && options.observer == nullptr &&
                     plan.n_decode == plan.n_seqs() && n == plan.n_decode && n <= kMaxGraphRows;
  size_t caps[3] = {0, 0, 0};
  if (graph) {
    const kv::PageTableBuilder* dec_tables[3] = {&plan.dec_sinks, &plan.dec_hist, &plan.dec_recent};
    for (int t = 0; t < 3; ++t) {
      const kernels::PageTableView v = dec_tables[t]->view();
      const size_t pages = static_cast<size_t>(v.indptr[v.n_seqs]);
      if (pages > table_cap_[t]) {
        table_cap_[t] = std::max<size_t>(256, std::bit_ceil(pages));
        ++graph_epoch_;
      }
      caps[t] = table_cap_[t];
    }
  }
  float *x = w.x.as<float>(), *h = w.h.as<float>(), *q = w.q.as<float>(), *k = w.k.as<float>(),
        *v = w.v.as<float>(), *qr = w.q_rot.as<float>(), *attn = w.attn.as<float>(),
        *o = w.o.as<float>();
  FfnScratch ffn_scratch;
  ffn_scratch.gate = w.gate.as<float>();
  ffn_scratch.up = w.up.as<float>();
  ffn_scratch.router_logits = w.router_logits.as<float>();
  ffn_scratch.expert_ids = w.expert_ids.as<int32_t>();
  ffn_scratch.expert_weights = w.expert_weights.as<float>();
  ffn_scratch.moe_work = w.moe_work.data();
  ffn_scratch.moe_work_bytes = w.moe_work.bytes();
  // RoPE angles once per step (they do not depend on the layer), on the host as the reference
  // computes them.
  const int64_t rot_half = c.rotary_dim / 2;
  kernels::rope_tables(plan.positions.data(), n, inv_freq_.data(), rot_half, w.cos.data(),
                       w.sin.data());
  const size_t half_rows = static_cast<size_t>(n * rot_half);
  Stager st(be, &w.staging, &w.plan);
  const size_t h_ids = st.add(plan.token_ids.data(), plan.token_ids.size());
  const size_t h_slots = st.add(plan.write_slots.data(), plan.write_slots.size());
  const size_t h_cos = st.add(w.cos.data(), half_rows);
  const size_t h_sin = st.add(w.sin.data(), half_rows);
  const size_t h_cu = st.add(plan.cu_seqlens.data(), plan.cu_seqlens.size());
  const size_t h_pos0 = st.add(plan.pos0.data(), plan.pos0.size());
  const size_t h_rows = st.add(plan.logit_rows.data(), plan.logit_rows.size());
  const size_t h_dec[3] = {st.add_table(plan.dec_sinks.view(), caps[0]),
                           st.add_table(plan.dec_hist.view(), caps[1]),
                           st.add_table(plan.dec_recent.view(), caps[2])};
  const size_t h_pre[3] = {st.add_table(plan.pre_sinks.view()), st.add_table(plan.pre_hist.view()),
                           st.add_table(plan.pre_recent.view())};
  const kernels::DistinctPages& hist_distinct = plan.pre_hist_distinct;
  const size_t h_hist_unique = st.add(hist_distinct.pages.data(), hist_distinct.pages.size());
  const size_t h_hist_slot = st.add(hist_distinct.index.data(), hist_distinct.index.size());
  OSCAR_RETURN_IF_ERROR(st.upload());
  if (st.moved()) ++graph_epoch_;

  kernels::RopeParams rope;
  rope.n_rows = n;
  rope.n_heads_q = Hq;
  rope.n_heads_kv = Hkv;
  rope.head_dim = static_cast<int32_t>(d);
  rope.rotary_dim = c.rotary_dim;
  rope.cos = st.get<float>(h_cos);
  rope.sin = st.get<float>(h_sin);
  rope.q = q;
  rope.k = k;

  // One set of op parameters for the whole step; only the layer changes.
  const kv::SequenceCache& cache0 = *plan.caches[0];
  kernels::KvAppendParams append = cache0.append_params(0);
  append.n_tokens = n;
  append.k = k;
  append.v = v;
  append.slots = st.get<int64_t>(h_slots);
  kernels::RotateQueriesParams rq;
  rq.n_rows = n;
  rq.n_heads_q = Hq;
  rq.n_heads_kv = Hkv;
  rq.head_dim = static_cast<int32_t>(d);
  rq.q = q;
  rq.q_rotation = cache0.spec().op_query_rotations();
  rq.out = qr;
  kernels::DecodeAttnParams dec = cache0.decode_params(0, Hq);
  dec.n_seqs = plan.n_decode;
  dec.q = qr;
  dec.out = attn;
  dec.sinks = st.table(h_dec[0], plan.n_decode);
  dec.history = st.table(h_dec[1], plan.n_decode);
  dec.recent = st.table(h_dec[2], plan.n_decode);
  kernels::PrefillAttnParams pre = cache0.prefill_params(0, Hq, plan.mode);
  pre.n_seqs = plan.n_seqs() - plan.n_decode;
  pre.max_rows = static_cast<int32_t>(n - plan.n_decode);  // the prefill rows of this step
  // The prefill sequences' slice of the plan: their rows keep their step-wide numbering.
  pre.cu_seqlens = st.get<int32_t>(h_cu) + plan.n_decode;
  pre.pos0 = st.get<int64_t>(h_pos0) + plan.n_decode;
  pre.q = qr;
  pre.out = attn;
  pre.sinks = st.table(h_pre[0], pre.n_seqs);
  pre.history = st.table(h_pre[1], pre.n_seqs);
  pre.recent = st.table(h_pre[2], pre.n_seqs);
  pre.hist_unique = st.get<int32_t>(h_hist_unique);
  pre.hist_slot = st.get<int32_t>(h_hist_slot);
  pre.n_hist_unique = static_cast<int32_t>(hist_distinct.pages.size());

  // The observer reads host memory: on a device backend, what it is shown is copied back.
  const size_t host_slot = static_cast<size_t>(n) * std::max<int64_t>(H, c.q_dim);
  if (options.observer && be.device() != Device::kCpu && w.host.size() < 3 * host_slot)
    w.host.resize(3 * host_slot);
  auto host = [&](const float* p, int64_t count, size_t slot) -> Result<const float*> {
    if (be.device() == Device::kCpu) return p;
    const size_t base = slot * host_slot;
    OSCAR_RETURN_IF_ERROR(be.download(p, count * sizeof(float), w.host.data() + base));
    return static_cast<const float*>(w.host.data() + base);
  };

  // The Gated DeltaNet layers' sequences and state slots (a hybrid model; host arrays: these ops
  // run on the CPU only for now).
  kv::StatePool* state_pool = nullptr;
  GatedDeltaNetBatch gdn_batch;
  GatedDeltaNetScratch gdn_scratch;
  if (c.is_hybrid()) {
    state_pool = plan.caches[0]->state_pool();
    w.state_slots.resize(static_cast<size_t>(plan.n_seqs()));
    for (int32_t s = 0; s < plan.n_seqs(); ++s) {
      const kv::SequenceCache& cache = *plan.caches[s];
      if (cache.state_pool() != state_pool || cache.state_slot() < 0 || state_pool == nullptr)
        return invalid_argument("forward: sequence %d of a hybrid model has no DeltaNet state "
                                "slot (its cache needs the runtime's StatePool)", s);
      w.state_slots[s] = cache.state_slot();
    }
    gdn_batch.cu_seqlens = plan.cu_seqlens.data();
    gdn_batch.n_seqs = plan.n_seqs();
    gdn_batch.slots = w.state_slots.data();
    gdn_scratch.qkv = w.lin_qkv.as<float>();
    gdn_scratch.conv_out = w.lin_conv.as<float>();
    gdn_scratch.z = w.lin_z.as<float>();
    gdn_scratch.ab = w.lin_ab.as<float>();
    gdn_scratch.o = w.lin_o.as<float>();
  }

  auto run_ops = [&]() -> Status {
    OSCAR_RETURN_IF_ERROR(be.embed(embed_.view(), st.get<int32_t>(h_ids), n, x));
    // h = the first layer's input norm; each layer ends with its residual add fused into the
    // next norm (the next layer's input norm, or the final norm).
    OSCAR_RETURN_IF_ERROR(be.rms_norm(x, n, H, layers_[0].input_norm.data(), c.rms_norm_eps, h));
    // A full-attention layer, its K/V in cache layer kl: q/k/v (and Qwen3.5's output gate),
    // norms and RoPE, append, attention, o_proj into o.
    auto attention = [&](const Layer& L, int kl) -> Status {
      const kernels::LinearParams qkv[4] = {lin(h, n, L.wq, &L.bq, q), lin(h, n, L.wk, &L.bk, k),
                                            lin(h, n, L.wv, &L.bv, v),
                                            lin(h, n, L.wq_gate, nullptr, w.attn_gate.as<float>())};
      OSCAR_RETURN_IF_ERROR(be.linear_group(qkv, L.wq_gate.rows > 0 ? 4 : 3));
      rope.q_norm = L.q_norm.empty() ? nullptr : L.q_norm.data();  // q/k norms fused into RoPE
      rope.k_norm = L.k_norm.empty() ? nullptr : L.k_norm.data();
      rope.norm_eps = c.rms_norm_eps;
      OSCAR_RETURN_IF_ERROR(be.rope(rope));
      if (options.observer) {
        OSCAR_ASSIGN_OR_RETURN(const float* hq, host(q, n * c.q_dim, 0));
        OSCAR_ASSIGN_OR_RETURN(const float* hk, host(k, n * c.kv_dim, 1));
        OSCAR_ASSIGN_OR_RETURN(const float* hv, host(v, n * c.kv_dim, 2));
        for (int32_t s = 0; s < plan.n_seqs(); ++s) {
          const int64_t r0 = plan.cu_seqlens[s];
          options.observer->on_qkv(plan.chunk[s], kl, hq + r0 * c.q_dim, hk + r0 * c.kv_dim,
                                   hv + r0 * c.kv_dim, plan.cu_seqlens[s + 1] - r0, plan.pos0[s]);
        }
      }
      append.layer = kl;
      OSCAR_RETURN_IF_ERROR(be.kv_append(append));
      rq.layer = kl;
      OSCAR_RETURN_IF_ERROR(be.rotate_queries(rq));
      if (dec.n_seqs > 0) {
        dec.layer = kl;
        OSCAR_RETURN_IF_ERROR(be.decode_attn(dec));
      }
      if (pre.n_seqs > 0) {
        pre.layer = kl;
        OSCAR_RETURN_IF_ERROR(be.prefill_attn(pre));
      }
      if (options.observer) {
        OSCAR_ASSIGN_OR_RETURN(const float* ha, host(attn, n * c.q_dim, 0));
        for (int32_t s = 0; s < plan.n_seqs(); ++s) {
          const int64_t r0 = plan.cu_seqlens[s];
          options.observer->on_attention(plan.chunk[s], kl, ha + r0 * c.q_dim,
                                         plan.cu_seqlens[s + 1] - r0, plan.pos0[s]);
        }
      }
      if (L.wq_gate.rows > 0)  // Qwen3.5: attn · sigmoid(gate) before o_proj
        OSCAR_RETURN_IF_ERROR(be.sigmoid_mul(attn, w.attn_gate.as<float>(), n * c.q_dim));
      OSCAR_RETURN_IF_ERROR(be.linear(lin(attn, n, L.wo, nullptr, o)));
      return Status();
    };
    for (int l = 0; l < c.n_layers; ++l) {
      const Layer& L = layers_[l];
      if (L.state_layer >= 0) {  // a Gated DeltaNet layer (model/blocks.h)
        gdn_batch.conv_state = state_pool->conv(L.state_layer);
        gdn_batch.recurrent_state = state_pool->recurrent(L.state_layer);
        OSCAR_RETURN_IF_ERROR(gated_delta_net(be, gdn_weights(L), h, n, gdn_batch, gdn_scratch, o));
      } else {
        OSCAR_RETURN_IF_ERROR(attention(L, c.kv_layer[l]));
      }
      OSCAR_RETURN_IF_ERROR(be.add_rms_norm(x, o, n, H, L.post_norm.data(), c.rms_norm_eps, h));

      // The FFN block of the layer (model/blocks.h): routed experts in a sparse layer.
      if (L.moe)
        OSCAR_RETURN_IF_ERROR(moe_ffn(be, moe_weights(L), h, n, ffn_scratch, o));
      else
        OSCAR_RETURN_IF_ERROR(dense_ffn(be, dense_weights(L), h, n, ffn_scratch, o));
      const float* next_norm =
          l + 1 < c.n_layers ? layers_[l + 1].input_norm.data() : final_norm_.data();
      OSCAR_RETURN_IF_ERROR(be.add_rms_norm(x, o, n, H, next_norm, c.rms_norm_eps, h));
    }

    if (options.observer) {
      OSCAR_ASSIGN_OR_RETURN(const float* hh, host(h, n * H, 0));
      for (int32_t s = 0; s < plan.n_seqs(); ++s)
        options.observer->on_final_hidden(plan.chunk[s], hh + plan.cu_seqlens[s] * H,
                                          plan.cu_seqlens[s + 1] - plan.cu_seqlens[s],
                                          plan.pos0[s]);
    }
    // lm_head over the rows that produce logits only.
    OSCAR_RETURN_IF_ERROR(be.gather_rows(h, st.get<int32_t>(h_rows), n_out, H, x));
    return be.linear(
        lin(x, n_out, lm_head_.rows == 0 ? embed_ : lm_head_, nullptr, w.logits.as<float>()));
  };

  // Graph path: replay the recording for this batch size; record it (after one direct step at
  // this size, so that the kernels' own workspaces have grown); or run directly.
  if (!graph) return run_ops();
  if (graphs_.size() <= static_cast<size_t>(n)) graphs_.resize(static_cast<size_t>(n) + 1);
  StepGraph& g = graphs_[static_cast<size_t>(n)];
  if (g.graph && g.epoch == graph_epoch_) return be.replay(*g.graph);
  if (!g.warm) {
    OSCAR_RETURN_IF_ERROR(run_ops());
    g.warm = true;
    return Status();
  }
  OSCAR_RETURN_IF_ERROR(be.capture_begin());
  const Status ran = run_ops();
  auto recorded = be.capture_end();  // ends the capture whether or not the ops succeeded
  OSCAR_RETURN_IF_ERROR(ran);
  OSCAR_RETURN_IF_ERROR(recorded.status());
  g.graph = std::move(recorded).value();
  g.epoch = graph_epoch_;
  return be.replay(*g.graph);
}

Status Qwen3Model::Workspace::reserve(kernels::Backend& be, int64_t n, int64_t n_logits,
                                      const format::ModelConfig& c) {
  if (n > rows) {
    const int64_t r = std::max<int64_t>(n, 2 * rows);
    auto fit = [&](DeviceBuffer& b, int64_t per_row) -> Status {
      b.reset();
      OSCAR_ASSIGN_OR_RETURN(
          b, be.alloc(static_cast<size_t>(r * per_row) * sizeof(float), "activations"));
      return Status();
    };
    for (DeviceBuffer* b : {&x, &h, &o}) OSCAR_RETURN_IF_ERROR(fit(*b, c.hidden_size));
    for (DeviceBuffer* b : {&q, &q_rot, &attn}) OSCAR_RETURN_IF_ERROR(fit(*b, c.q_dim));
    for (DeviceBuffer* b : {&k, &v}) OSCAR_RETURN_IF_ERROR(fit(*b, c.kv_dim));
    if (c.n_moe_layers < c.n_layers)  // a dense FFN somewhere
      for (DeviceBuffer* b : {&gate, &up}) OSCAR_RETURN_IF_ERROR(fit(*b, c.intermediate_size));
    if (c.n_moe_layers > 0) {
      OSCAR_RETURN_IF_ERROR(fit(router_logits, c.n_experts));
      static_assert(sizeof(int32_t) == sizeof(float));
      for (DeviceBuffer* b : {&expert_ids, &expert_weights})
        OSCAR_RETURN_IF_ERROR(fit(*b, c.n_experts_per_tok));
      moe_work.reset();
      OSCAR_ASSIGN_OR_RETURN(
          moe_work, be.alloc(kernels::moe_ffn_work_bytes(r, c.n_experts_per_tok, c.n_experts,
                                                         c.hidden_size, c.moe_intermediate_size),
                             "MoE scratch"));
    }
    if (c.attn_output_gate) OSCAR_RETURN_IF_ERROR(fit(attn_gate, c.q_dim));
    if (c.is_hybrid()) {
      for (DeviceBuffer* b : {&lin_qkv, &lin_conv}) OSCAR_RETURN_IF_ERROR(fit(*b, c.lin_conv_dim));
      for (DeviceBuffer* b : {&lin_z, &lin_o}) OSCAR_RETURN_IF_ERROR(fit(*b, c.lin_value_dim));
      OSCAR_RETURN_IF_ERROR(fit(lin_ab, 4 * int64_t{c.lin_heads_v}));
    }
    cos.resize(static_cast<size_t>(r * (c.rotary_dim / 2)));
    sin.resize(cos.size());
    rows = r;
  }
  if (n_logits > logit_rows) {
    const int64_t r = std::max<int64_t>(n_logits, 2 * logit_rows);
    logits.reset();
    OSCAR_ASSIGN_OR_RETURN(
        logits, be.alloc(static_cast<size_t>(r) * c.vocab_size * sizeof(float), "logits"));
    logit_rows = r;
  }
  return Status();
}

}  // namespace oscar::model
