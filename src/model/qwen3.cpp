// Loading, packing and folding a decoder's weights (model/qwen3.h); the step is the runner's.
#include "model/qwen3.h"

#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "core/check.h"
#include "format/safetensors.h"
#include "format/weight_table.h"
#include "kernels/backend.h"

namespace oscar::model {

using format::WeightKind;

namespace {

// A checkpoint matrix as stored when it is BF16 (a copy out of the mapped file), else widened.
Matrix to_matrix(const format::TensorView* t) {
  Matrix m;
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
void put_expert(Matrix& stack, int e, const format::TensorView* t) {
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
                   Matrix* q, Matrix* gate) {
  const Matrix both = to_matrix(t);
  const int64_t cols = both.cols, rows = int64_t{n_heads} * head_dim;
  for (Matrix* m : {q, gate}) {
    m->dtype = both.dtype;
    m->rows = rows;
    m->cols = cols;
  }
  for (int64_t h = 0; h < n_heads; ++h)
    for (int half = 0; half < 2; ++half) {
      Matrix* m = half == 0 ? q : gate;
      const int64_t src = (2 * h + half) * head_dim * cols, n = head_dim * cols;
      if (both.dtype == kernels::DType::kBF16)
        m->bf16.insert(m->bf16.end(), both.bf16.begin() + src, both.bf16.begin() + src + n);
      else
        m->f32.insert(m->f32.end(), both.f32.begin() + src, both.f32.begin() + src + n);
    }
}

// A matrix's slice of the CPU weight buffer: its bytes rounded up to 64 (cache lines, AVX loads).
size_t cpu_slice_bytes(const Matrix& w) { return (w.bytes() + 63) / 64 * 64; }

}  // namespace

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::load(const std::string& dir) {
  OSCAR_ASSIGN_OR_RETURN(format::ModelConfig config, format::ModelConfig::load(dir));
  OSCAR_ASSIGN_OR_RETURN(format::Checkpoint ckpt, format::Checkpoint::open(dir));
  OSCAR_ASSIGN_OR_RETURN(format::BoundWeights bound, format::bind_weights(config, ckpt));

  std::unique_ptr<Qwen3Model> m(new Qwen3Model());
  m->w_.config = config;
  m->w_.layers.resize(config.n_layers);
  // A sparse layer's experts go into one matrix per kind, [n_experts · out, in]: BF16 when every
  // expert of that kind is BF16 in the checkpoint, else float32.
  auto stack_of = [&](LayerWeights& L, WeightKind kind) -> Matrix* {
    return kind == WeightKind::kExpertGate ? &L.w_exp_gate
           : kind == WeightKind::kExpertUp ? &L.w_exp_up
           : kind == WeightKind::kExpertDown ? &L.w_exp_down
                                             : nullptr;
  };
  for (size_t i = 0; i < bound.specs.size(); ++i) {
    const format::WeightSpec& spec = bound.specs[i];
    Matrix* stack = spec.layer >= 0 ? stack_of(m->w_.layers[spec.layer], spec.kind) : nullptr;
    if (stack == nullptr) continue;
    m->w_.layers[spec.layer].moe = true;
    if (stack->rows == 0) {  // first expert of this kind: the shape of the stack
      stack->rows = int64_t{config.n_experts} * spec.shape[0];
      stack->cols = spec.shape[1];
      stack->dtype = kernels::DType::kBF16;
    }
    if (bound.tensors[i]->dtype != format::DType::kBF16) stack->dtype = kernels::DType::kF32;
  }
  for (LayerWeights& L : m->w_.layers)
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
    LayerWeights* L = spec.layer >= 0 ? &m->w_.layers[spec.layer] : nullptr;
    switch (spec.kind) {
      case WeightKind::kEmbed: m->w_.embed = to_matrix(t); break;
      case WeightKind::kFinalNorm: m->w_.final_norm = t->to_f32(); break;
      case WeightKind::kLmHead: m->w_.lm_head = to_matrix(t); break;
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
      case WeightKind::kLinQkvz: split_in_proj_qkvz(to_matrix(t), config, &L->lin_qkv, &L->lin_z);
        break;
      case WeightKind::kLinBa: split_in_proj_ba(to_matrix(t), config, &L->lin_b, &L->lin_a); break;
      case WeightKind::kSharedGate: L->w_shared_gate = to_matrix(t); break;
      case WeightKind::kSharedUp: L->w_shared_up = to_matrix(t); break;
      case WeightKind::kSharedDown: L->w_shared_down = to_matrix(t); break;
      case WeightKind::kSharedExpertGate: L->w_shared_expert_gate = to_matrix(t); break;
    }
  }
  if (config.tie_word_embeddings) m->w_.lm_head = Matrix();
  if (config.zero_centred_norms) {
    // Qwen3_5RMSNorm multiplies by (1 + w) in float32: stored so, the norm ops stay plain.
    auto shift = [](Vec& v) {
      for (float& x : v.host) x = 1.0f + x;
    };
    shift(m->w_.final_norm);
    for (LayerWeights& L : m->w_.layers)
      for (Vec* v : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm}) shift(*v);
  }
  m->init_runner();
  return m;
}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::load_dummy(const format::ModelConfig& config,
                                                           uint64_t seed,
                                                           kernels::Backend* backend) {
  kernels::Backend& be = backend != nullptr ? *backend : kernels::cpu_backend();
  const bool device = be.device() != Device::kCpu;
  std::unique_ptr<Qwen3Model> m(new Qwen3Model());
  m->w_.config = config;
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
  OSCAR_ASSIGN_OR_RETURN(m->w_.embed, randn(config.vocab_size, H));
  if (!config.tie_word_embeddings) {
    OSCAR_ASSIGN_OR_RETURN(m->w_.lm_head, randn(config.vocab_size, H));
  }
  m->w_.final_norm = ones(H);
  m->w_.layers.resize(config.n_layers);
  const int64_t E = config.n_experts, MI = config.moe_intermediate_size;
  for (int l = 0; l < config.n_layers; ++l) {
    LayerWeights& L = m->w_.layers[l];
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
      if (config.has_shared_expert()) {
        const int64_t S = config.shared_expert_intermediate_size;
        OSCAR_ASSIGN_OR_RETURN(L.w_shared_gate, randn(S, H));
        OSCAR_ASSIGN_OR_RETURN(L.w_shared_up, randn(S, H));
        OSCAR_ASSIGN_OR_RETURN(L.w_shared_down, randn(H, S));
        OSCAR_ASSIGN_OR_RETURN(L.w_shared_expert_gate, randn(1, H));
      }
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
  m->init_runner();
  // The matrices are already in the backend's memory; set_backend uploads the vectors.
  if (backend != nullptr) OSCAR_RETURN_IF_ERROR(m->set_backend(backend));
  m->dummy_on_device_ = device;
  return m;
}

void Qwen3Model::init_runner() {
  arch_ = make_architecture(w_);
  runner_ = std::make_unique<StepRunner>(w_, *arch_);
}

Status Qwen3Model::set_backend(kernels::Backend* backend) {
  runner_->set_backend(backend);
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
    OSCAR_RETURN_IF_ERROR(up_matrix(*w, w == &w_.embed     ? "embedding"
                                        : w == &w_.lm_head ? "lm_head"
                                                         : "weights"));
  OSCAR_RETURN_IF_ERROR(up_vec(w_.final_norm, "final norm"));
  OSCAR_RETURN_IF_ERROR(up_vec(w_.out_unrotation, "output un-rotations"));
  for (LayerWeights& L : w_.layers)
    for (Vec* v : {&L.input_norm, &L.post_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm,
                   &L.lin_conv, &L.lin_A_log, &L.lin_dt_bias, &L.lin_norm})
      OSCAR_RETURN_IF_ERROR(up_vec(*v, "norms and biases"));
  OSCAR_RETURN_IF_ERROR(be.synchronize());
  cpu_weights_.reset();
  return Status();
}

std::vector<Matrix*> Qwen3Model::matrices() {
  std::vector<Matrix*> all = {&w_.embed, &w_.lm_head};
  for (LayerWeights& L : w_.layers)
    for (Matrix* w : {&L.wq, &L.wq_gate, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down,
                      &L.w_router, &L.w_exp_gate, &L.w_exp_up, &L.w_exp_down, &L.w_shared_gate,
                      &L.w_shared_up, &L.w_shared_down, &L.w_shared_expert_gate, &L.lin_qkv,
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

size_t Qwen3Model::weight_bytes() const {
  size_t n = w_.embed.bytes() + w_.lm_head.bytes() + w_.final_norm.size() * sizeof(float);
  for (const LayerWeights& L : w_.layers)
    n += L.wq.bytes() + L.wq_gate.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() +
         L.w_gate.bytes() + L.w_up.bytes() + L.w_down.bytes() + L.w_router.bytes() +
         L.w_exp_gate.bytes() + L.w_exp_up.bytes() + L.w_exp_down.bytes() +
         L.w_shared_gate.bytes() + L.w_shared_up.bytes() + L.w_shared_down.bytes() +
         L.w_shared_expert_gate.bytes() + L.lin_qkv.bytes() +
         L.lin_z.bytes() + L.lin_b.bytes() + L.lin_a.bytes() + L.lin_out.bytes() +
         sizeof(float) * (L.input_norm.size() + L.post_norm.size() + L.bq.size() + L.bk.size() +
                          L.bv.size() + L.q_norm.size() + L.k_norm.size() + L.lin_conv.size() +
                          L.lin_A_log.size() + L.lin_dt_bias.size() + L.lin_norm.size());
  return n;
}

Status Qwen3Model::set_embedding_row(int32_t token, std::span<const float> row) {
  if (on_device()) return invalid_argument("set_embedding_row: the weights are on the device");
  if (token < 0 || token >= w_.embed.rows || static_cast<int64_t>(row.size()) != w_.embed.cols)
    return invalid_argument("set_embedding_row: token %d of %lld, %zu values for %lld", token,
                            static_cast<long long>(w_.embed.rows), row.size(),
                            static_cast<long long>(w_.embed.cols));
  if (w_.lm_head.rows == 0) {  // tied: the output projection keeps the old row (a host copy)
    w_.lm_head.dtype = w_.embed.dtype;
    w_.lm_head.rows = w_.embed.rows;
    w_.lm_head.cols = w_.embed.cols;
    if (w_.embed.dtype == kernels::DType::kBF16) {
      const auto* e = static_cast<const bf16_t*>(w_.embed.host_bytes());
      w_.lm_head.bf16.assign(e, e + w_.embed.rows * w_.embed.cols);
    } else {
      const auto* e = static_cast<const float*>(w_.embed.host_bytes());
      w_.lm_head.f32.assign(e, e + w_.embed.rows * w_.embed.cols);
    }
  }
  for (int64_t c = 0; c < w_.embed.cols; ++c) {
    const int64_t i = token * w_.embed.cols + c;
    if (w_.embed.dtype == kernels::DType::kBF16)
      static_cast<bf16_t*>(w_.embed.host_bytes())[i] = f32_to_bf16(row[c]);
    else
      static_cast<float*>(w_.embed.host_bytes())[i] = row[c];
  }
  return Status();
}

Status Qwen3Model::fold_value_rotation(std::span<const float> v_rotation, kernels::DType stored) {
  const int d = w_.config.head_dim, Hkv = w_.config.n_heads_kv, Hq = w_.config.n_heads_q;
  const int64_t hidden = w_.config.hidden_size;
  // One rotation per KV cache layer (a hybrid's full-attention layers only).
  const size_t expected = static_cast<size_t>(w_.config.n_kv_layers) * Hkv * d * d;
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
    for (LayerWeights& L : w_.layers)
      for (Matrix* w : {&L.wv, &L.wo}) {
        const int64_t n = w->rows * w->cols;
        std::vector<float> host(static_cast<size_t>(n));
        const uint64_t seed = ++index << 40;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) host[i] = kernels::dummy_weight(seed, i, 0.02f);
        w->dtype = kernels::DType::kF32;
        w->dev.reset();
        OSCAR_ASSIGN_OR_RETURN(w->dev,
                               backend().alloc(host.size() * sizeof(float), "dummy weights"));
        OSCAR_RETURN_IF_ERROR(
            backend().upload(host.data(), host.size() * sizeof(float), w->dev.data()));
      }
    value_rotation_folded_ = true;
    return backend().synchronize();
  }
  if (on_device()) return invalid_argument("fold_value_rotation: the weights are on the device");
  if (!cpu_weights_.empty())
    return invalid_argument(
        "fold_value_rotation: call it before set_backend (the weights are packed)");
  const int gqa = w_.config.gqa_ratio;
  // An elementwise output gate sits between the attention output and o_proj: o_proj keeps its
  // weights and the output is turned back by R_Vᵀ at run time (ModelWeights::out_unrotation).
  const bool gated = w_.config.attn_output_gate;
  if (gated) {
    std::vector<float> rt(v_rotation.size());
    const size_t dd = static_cast<size_t>(d) * d;
    for (size_t m = 0; m < v_rotation.size() / dd; ++m)
      for (int r = 0; r < d; ++r)
        for (int c = 0; c < d; ++c)
          rt[m * dd + static_cast<size_t>(c) * d + r] = v_rotation[m * dd + static_cast<size_t>(r) * d + c];
    w_.out_unrotation = std::move(rt);
  }
  std::vector<double> acc;
  for (int l = 0; l < w_.config.n_layers; ++l) {
    if (w_.config.linear(l)) continue;
    LayerWeights& L = w_.layers[l];
    // Folded in float32 (the matrices are not BF16-representable), rounded below if asked.
    L.wv.to_f32();
    if (!gated) L.wo.to_f32();
    for (int g = 0; g < Hkv; ++g) {
      const float* R =
          v_rotation.data() + (static_cast<size_t>(w_.config.kv_layer[l]) * Hkv + g) * d * d;
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
      for (int h = g * gqa; h < (g + 1) * gqa && !gated; ++h) {
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
      if (!gated) L.wo.to_bf16();
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

}  // namespace oscar::model
