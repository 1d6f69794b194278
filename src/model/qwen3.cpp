#include "model/qwen3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/bf16.h"
#include "core/check.h"
#include "core/log.h"
#include "format/safetensors.h"
#include "format/weight_table.h"
#include "kernels/backend.h"

namespace oscar::model {

using format::WeightKind;

namespace {


// The params of y[n, out] = x[n, in] * W[out, in]^T (+ bias).
kernels::LinearParams lin(const float* x, int64_t n, const Qwen3Model::Matrix& w,
                          const std::vector<float>& bias, float* y) {
  kernels::LinearParams p;
  p.x = x;
  p.n = n;
  p.w = w.view();
  p.bias = bias.empty() ? nullptr : bias.data();
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

}  // namespace

void Qwen3Model::init_rope() {
  const int d = config_.head_dim;
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
      case WeightKind::kQProj: L->wq = to_matrix(t); break;
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
    }
  }
  if (config.tie_word_embeddings) m->lm_head_ = Matrix();
  m->init_rope();
  return m;
}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::load_dummy(const format::ModelConfig& config,
                                                           uint64_t seed) {
  std::unique_ptr<Qwen3Model> m(new Qwen3Model());
  m->config_ = config;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  auto randn = [&](int64_t rows, int64_t cols) {
    Matrix w;
    w.rows = rows;
    w.cols = cols;
    w.bf16.resize(static_cast<size_t>(rows * cols));
    for (auto& x : w.bf16) x = f32_to_bf16(normal(rng));
    return w;
  };
  auto ones = [](int64_t n) { return std::vector<float>(n, 1.0f); };
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  m->embed_ = randn(config.vocab_size, H);
  if (!config.tie_word_embeddings) m->lm_head_ = randn(config.vocab_size, H);
  m->final_norm_ = ones(H);
  m->layers_.resize(config.n_layers);
  for (Layer& L : m->layers_) {
    L.input_norm = ones(H);
    L.post_norm = ones(H);
    L.wq = randn(config.q_dim, H);
    L.wk = randn(config.kv_dim, H);
    L.wv = randn(config.kv_dim, H);
    L.wo = randn(H, config.q_dim);
    if (config.qk_norm) {
      L.q_norm = ones(config.head_dim);
      L.k_norm = ones(config.head_dim);
    }
    L.w_gate = randn(I, H);
    L.w_up = randn(I, H);
    L.w_down = randn(H, I);
  }
  m->init_rope();
  return m;
}

kernels::WeightView Qwen3Model::Matrix::view() const {
  return kernels::WeightView{dtype == kernels::DType::kBF16 ? static_cast<const void*>(bf16.data())
                                                            : f32.data(),
                             dtype, rows, cols};
}

void Qwen3Model::Matrix::to_f32() {
  if (dtype == kernels::DType::kF32) return;
  f32.resize(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) f32[i] = bf16_to_f32(bf16[i]);
  bf16 = {};
  dtype = kernels::DType::kF32;
}

size_t Qwen3Model::weight_bytes() const {
  size_t n = embed_.bytes() + lm_head_.bytes() + final_norm_.size() * sizeof(float);
  for (const Layer& L : layers_)
    n += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.w_gate.bytes() +
         L.w_up.bytes() + L.w_down.bytes() +
         sizeof(float) * (L.input_norm.size() + L.post_norm.size() + L.bq.size() + L.bk.size() +
                          L.bv.size() + L.q_norm.size() + L.k_norm.size());
  return n;
}

Status Qwen3Model::set_embedding_row(int32_t token, std::span<const float> row) {
  if (token < 0 || token >= embed_.rows || static_cast<int64_t>(row.size()) != embed_.cols)
    return invalid_argument("set_embedding_row: token %d of %lld, %zu values for %lld", token,
                            static_cast<long long>(embed_.rows), row.size(),
                            static_cast<long long>(embed_.cols));
  if (lm_head_.rows == 0) lm_head_ = embed_;  // tied: the output projection keeps the old row
  for (int64_t c = 0; c < embed_.cols; ++c) {
    if (embed_.dtype == kernels::DType::kBF16) embed_.bf16[token * embed_.cols + c] = f32_to_bf16(row[c]);
    else embed_.f32[token * embed_.cols + c] = row[c];
  }
  return Status();
}

Status Qwen3Model::fold_value_rotation(std::span<const float> v_rotation) {
  const int d = config_.head_dim, Hkv = config_.n_heads_kv, Hq = config_.n_heads_q;
  const int64_t hidden = config_.hidden_size;
  const size_t expected = static_cast<size_t>(config_.n_layers) * Hkv * d * d;
  if (v_rotation.size() != expected)
    return invalid_argument("value rotation has %zu values, expected %zu", v_rotation.size(),
                            expected);
  if (value_rotation_folded_) return invalid_argument("value rotation already folded");
  const int gqa = config_.gqa_ratio;
  std::vector<double> acc;
  for (int l = 0; l < config_.n_layers; ++l) {
    Layer& L = layers_[l];
    // The folded matrices are not BF16-representable: they stay float32 (kernels/linear.h).
    L.wv.to_f32();
    L.wo.to_f32();
    for (int g = 0; g < Hkv; ++g) {
      const float* R = v_rotation.data() + (static_cast<size_t>(l) * Hkv + g) * d * d;
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
        float* b = L.bv.data() + static_cast<int64_t>(g) * d;
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

Status Qwen3Model::demote(const kv::StepPlan& plan, std::vector<int32_t>* status) const {
  status->assign(plan.demote_src.size(), kernels::kDemoteOk);
  if (plan.demote_src.empty()) return Status();
  kernels::DemotePagesParams p = plan.caches[0]->demote_params();
  p.n_pages = static_cast<int32_t>(plan.demote_src.size());
  p.src_pages = plan.demote_src.data();
  p.dst_pages = plan.demote_dst.data();
  p.status = status->data();
  return backend_->demote_pages(p);
}

Status Qwen3Model::forward(const kv::StepPlan& plan, const ForwardOptions& options,
                           std::vector<float>* logits) {
  const format::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  const int Hq = c.n_heads_q, Hkv = c.n_heads_kv;
  const int64_t n = plan.n_rows();
  if (n == 0) return Status();
  for (int32_t t : plan.token_ids)
    if (t < 0 || t >= c.vocab_size)
      return invalid_argument("forward: token id %d out of range [0, %d)", t, c.vocab_size);
  // The scheduler and forward(SeqChunk) guarantee the context bound.
  OSCAR_DCHECK(plan.positions.back() < c.max_position_embeddings);

  Workspace& w = ws_;
  w.resize(n, c);
  float *x = w.x.data(), *h = w.h.data(), *q = w.q.data(), *k = w.k.data(), *v = w.v.data(),
        *qr = w.q_rot.data(), *attn = w.attn.data(), *o = w.o.data(), *gate = w.gate.data(),
        *up = w.up.data();
  kernels::Backend& be = *backend_;
  OSCAR_RETURN_IF_ERROR(be.embed(embed_.view(), plan.token_ids.data(), n, x));
  // RoPE angles once per step (they do not depend on the layer).
  kernels::rope_tables(plan.positions.data(), n, inv_freq_.data(), d / 2, w.cos.data(),
                       w.sin.data());
  kernels::RopeParams rope;
  rope.n_rows = n;
  rope.n_heads_q = Hq;
  rope.n_heads_kv = Hkv;
  rope.head_dim = static_cast<int32_t>(d);
  rope.cos = w.cos.data();
  rope.sin = w.sin.data();
  rope.q = q;
  rope.k = k;

  // One set of op parameters for the whole step; only the layer changes.
  const kv::SequenceCache& cache0 = *plan.caches[0];
  kernels::KvAppendParams append = cache0.append_params(0);
  append.n_tokens = n;
  append.k = k;
  append.v = v;
  append.slots = plan.write_slots.data();
  kernels::RotateQueriesParams rq;
  rq.n_rows = n;
  rq.n_heads_q = Hq;
  rq.n_heads_kv = Hkv;
  rq.head_dim = static_cast<int32_t>(d);
  rq.q = q;
  rq.q_rotation = cache0.spec().query_rotations();
  rq.out = qr;
  kernels::DecodeAttnParams dec = cache0.decode_params(0, Hq);
  dec.n_seqs = plan.n_decode;
  dec.q = qr;
  dec.out = attn;
  dec.sinks = plan.dec_sinks.view();
  dec.history = plan.dec_hist.view();
  dec.recent = plan.dec_recent.view();
  kernels::PrefillAttnParams pre = cache0.prefill_params(0, Hq, plan.mode);
  pre.n_seqs = plan.n_seqs() - plan.n_decode;
  // The prefill sequences' slice of the plan: their rows keep their step-wide numbering.
  pre.cu_seqlens = plan.cu_seqlens.data() + plan.n_decode;
  pre.pos0 = plan.pos0.data() + plan.n_decode;
  pre.q = qr;
  pre.out = attn;
  pre.sinks = plan.pre_sinks.view();
  pre.history = plan.pre_hist.view();
  pre.recent = plan.pre_recent.view();

  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[l];
    OSCAR_RETURN_IF_ERROR(be.rms_norm(x, n, H, L.input_norm.data(), c.rms_norm_eps, h));
    OSCAR_RETURN_IF_ERROR(be.linear(lin(h, n, L.wq, L.bq, q)));
    OSCAR_RETURN_IF_ERROR(be.linear(lin(h, n, L.wk, L.bk, k)));
    OSCAR_RETURN_IF_ERROR(be.linear(lin(h, n, L.wv, L.bv, v)));
    if (!L.q_norm.empty()) {
      OSCAR_RETURN_IF_ERROR(be.rms_norm(q, n * Hq, d, L.q_norm.data(), c.rms_norm_eps, q));
      OSCAR_RETURN_IF_ERROR(be.rms_norm(k, n * Hkv, d, L.k_norm.data(), c.rms_norm_eps, k));
    }
    OSCAR_RETURN_IF_ERROR(be.rope(rope));
    if (options.observer)
      for (int32_t s = 0; s < plan.n_seqs(); ++s) {
        const int64_t r0 = plan.cu_seqlens[s];
        options.observer->on_qkv(plan.chunk[s], l, q + r0 * c.q_dim, k + r0 * c.kv_dim,
                                 v + r0 * c.kv_dim, plan.cu_seqlens[s + 1] - r0, plan.pos0[s]);
      }
    append.layer = l;
    OSCAR_RETURN_IF_ERROR(be.kv_append(append));
    rq.layer = l;
    OSCAR_RETURN_IF_ERROR(be.rotate_queries(rq));
    if (dec.n_seqs > 0) {
      dec.layer = l;
      OSCAR_RETURN_IF_ERROR(be.decode_attn(dec));
    }
    if (pre.n_seqs > 0) {
      pre.layer = l;
      OSCAR_RETURN_IF_ERROR(be.prefill_attn(pre));
    }
    if (options.observer)
      for (int32_t s = 0; s < plan.n_seqs(); ++s) {
        const int64_t r0 = plan.cu_seqlens[s];
        options.observer->on_attention(plan.chunk[s], l, attn + r0 * c.q_dim,
                                       plan.cu_seqlens[s + 1] - r0, plan.pos0[s]);
      }
    OSCAR_RETURN_IF_ERROR(be.linear(lin(attn, n, L.wo, {}, o)));
    OSCAR_RETURN_IF_ERROR(be.add(x, o, n * H));

    OSCAR_RETURN_IF_ERROR(be.rms_norm(x, n, H, L.post_norm.data(), c.rms_norm_eps, h));
    OSCAR_RETURN_IF_ERROR(be.linear(lin(h, n, L.w_gate, {}, gate)));
    OSCAR_RETURN_IF_ERROR(be.linear(lin(h, n, L.w_up, {}, up)));
    OSCAR_RETURN_IF_ERROR(be.silu_mul(gate, up, n * I));
    OSCAR_RETURN_IF_ERROR(be.linear(lin(gate, n, L.w_down, {}, o)));
    OSCAR_RETURN_IF_ERROR(be.add(x, o, n * H));
  }

  OSCAR_RETURN_IF_ERROR(be.rms_norm(x, n, H, final_norm_.data(), c.rms_norm_eps, h));
  if (options.observer)
    for (int32_t s = 0; s < plan.n_seqs(); ++s)
      options.observer->on_final_hidden(plan.chunk[s], h + plan.cu_seqlens[s] * H,
                                        plan.cu_seqlens[s + 1] - plan.cu_seqlens[s], plan.pos0[s]);
  // lm_head over the rows that produce logits only.
  const int64_t n_out = plan.n_logit_rows();
  for (int64_t i = 0; i < n_out; ++i)
    std::copy_n(h + static_cast<int64_t>(plan.logit_rows[i]) * H, H, x + i * H);
  logits->resize(static_cast<size_t>(n_out) * c.vocab_size);
  return be.linear(lin(x, n_out, lm_head_.rows == 0 ? embed_ : lm_head_, {}, logits->data()));
}

void Qwen3Model::Workspace::resize(int64_t n, const format::ModelConfig& c) {
  auto fit = [](std::vector<float>& b, int64_t size) {
    if (static_cast<int64_t>(b.size()) < size) b.resize(size);
  };
  fit(x, n * c.hidden_size);
  fit(h, n * c.hidden_size);
  fit(o, n * c.hidden_size);
  fit(q, n * c.q_dim);
  fit(q_rot, n * c.q_dim);
  fit(attn, n * c.q_dim);
  fit(k, n * c.kv_dim);
  fit(v, n * c.kv_dim);
  fit(gate, n * c.intermediate_size);
  fit(up, n * c.intermediate_size);
  fit(cos, n * (c.head_dim / 2));
  fit(sin, n * (c.head_dim / 2));
}

}  // namespace oscar::model
