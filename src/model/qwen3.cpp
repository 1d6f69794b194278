#include "model/qwen3.h"

#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <random>

#include "core/bf16.h"
#include "core/check.h"
#include "core/log.h"
#include "format/safetensors.h"
#include "format/weight_table.h"

namespace oscar::model {

using format::WeightKind;

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// y[n, out] = x[n, in] * W[out, in]^T (+ bias).
// Eigen, not OpenBLAS: Debian's OpenBLAS 0.3.21 does not recognise this machine's CPU and falls
// back to its SSE3 kernels; Eigen compiled with -march=native measured 3-4x faster here
// (docs/results/). Few rows (decode) split the output rows over threads; many rows use Eigen's
// own OpenMP-parallel GEMM.
void linear(const float* x, int64_t n, int64_t in, const std::vector<float>& w, int64_t out,
            const std::vector<float>& bias, float* y) {
  Eigen::Map<const RowMat> X(x, n, in);
  if (n <= 8) {
    const int64_t block = 64;
    const int64_t n_blocks = (out + block - 1) / block;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t r0 = b * block, rows = std::min(block, out - r0);
      Eigen::Map<const RowMat> W(w.data() + r0 * in, rows, in);
      Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y + r0, n, rows, Eigen::OuterStride<>(out));
      Y.noalias() = X * W.transpose();
    }
  } else {
    Eigen::Map<const RowMat> W(w.data(), out, in);
    Eigen::Map<RowMat> Y(y, n, out);
    Y.noalias() = X * W.transpose();
  }
  if (!bias.empty())
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) y[i * out + j] += bias[j];
}

// HF RMSNorm in float32: w * x / sqrt(mean(x^2) + eps), row by row of width `dim`.
void rms_norm(const float* x, int64_t rows, int64_t dim, const std::vector<float>& w, float eps,
              float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0.f;
    for (int64_t c = 0; c < dim; ++c) ss += xr[c] * xr[c];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t c = 0; c < dim; ++c) yr[c] = w[c] * (xr[c] * inv);
  }
}

std::vector<float> to_f32(const format::TensorView* t) { return t->to_f32(); }

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
    std::vector<float> w = to_f32(t);
    Layer* L = spec.layer >= 0 ? &m->layers_[spec.layer] : nullptr;
    switch (spec.kind) {
      case WeightKind::kEmbed: m->embed_ = std::move(w); break;
      case WeightKind::kFinalNorm: m->final_norm_ = std::move(w); break;
      case WeightKind::kLmHead: m->lm_head_ = std::move(w); break;
      case WeightKind::kInputNorm: L->input_norm = std::move(w); break;
      case WeightKind::kPostAttnNorm: L->post_norm = std::move(w); break;
      case WeightKind::kQProj: L->wq = std::move(w); break;
      case WeightKind::kKProj: L->wk = std::move(w); break;
      case WeightKind::kVProj: L->wv = std::move(w); break;
      case WeightKind::kOProj: L->wo = std::move(w); break;
      case WeightKind::kQNorm: L->q_norm = std::move(w); break;
      case WeightKind::kKNorm: L->k_norm = std::move(w); break;
      case WeightKind::kQBias: L->bq = std::move(w); break;
      case WeightKind::kKBias: L->bk = std::move(w); break;
      case WeightKind::kVBias: L->bv = std::move(w); break;
      case WeightKind::kGateProj: L->w_gate = std::move(w); break;
      case WeightKind::kUpProj: L->w_up = std::move(w); break;
      case WeightKind::kDownProj: L->w_down = std::move(w); break;
    }
  }
  if (config.tie_word_embeddings) m->lm_head_.clear();
  m->init_rope();
  return m;
}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::load_dummy(const format::ModelConfig& config,
                                                           uint64_t seed) {
  std::unique_ptr<Qwen3Model> m(new Qwen3Model());
  m->config_ = config;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  auto randn = [&](int64_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = round_to_bf16(normal(rng));
    return v;
  };
  auto ones = [](int64_t n) { return std::vector<float>(n, 1.0f); };
  const int64_t H = config.hidden_size, I = config.intermediate_size;
  m->embed_ = randn(static_cast<int64_t>(config.vocab_size) * H);
  if (!config.tie_word_embeddings) m->lm_head_ = randn(static_cast<int64_t>(config.vocab_size) * H);
  m->final_norm_ = ones(H);
  m->layers_.resize(config.n_layers);
  for (Layer& L : m->layers_) {
    L.input_norm = ones(H);
    L.post_norm = ones(H);
    L.wq = randn(config.q_dim * H);
    L.wk = randn(config.kv_dim * H);
    L.wv = randn(config.kv_dim * H);
    L.wo = randn(H * config.q_dim);
    if (config.qk_norm) {
      L.q_norm = ones(config.head_dim);
      L.k_norm = ones(config.head_dim);
    }
    L.w_gate = randn(I * H);
    L.w_up = randn(I * H);
    L.w_down = randn(H * I);
  }
  m->init_rope();
  return m;
}

size_t Qwen3Model::weight_bytes() const {
  size_t n = embed_.size() + lm_head_.size() + final_norm_.size();
  for (const Layer& L : layers_)
    n += L.input_norm.size() + L.post_norm.size() + L.wq.size() + L.wk.size() + L.wv.size() +
         L.wo.size() + L.bq.size() + L.bk.size() + L.bv.size() + L.q_norm.size() +
         L.k_norm.size() + L.w_gate.size() + L.w_up.size() + L.w_down.size();
  return n * sizeof(float);
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
    for (int g = 0; g < Hkv; ++g) {
      const float* R = v_rotation.data() + (static_cast<size_t>(l) * Hkv + g) * d * d;
      // v_proj rows of head g: W' = R^T W   ([d, d] x [d, hidden]); bias' = bias R.
      float* W = L.wv.data() + static_cast<int64_t>(g) * d * hidden;
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
          float* wo = L.wo.data() + o * (static_cast<int64_t>(Hq) * d) + static_cast<int64_t>(h) * d;
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

Status Qwen3Model::forward(std::span<SeqChunk> batch, const ForwardOptions& options) {
  const format::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  const int Hq = c.n_heads_q, Hkv = c.n_heads_kv;

  // Validate and stage every sequence before touching any cache (all-or-nothing reservation).
  int64_t n_total = 0;
  std::vector<int64_t> offset(batch.size() + 1, 0);
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqChunk& ch = batch[s];
    if (ch.cache == nullptr || ch.tokens.empty())
      return invalid_argument("forward: sequence %zu has no cache or no tokens", s);
    for (int32_t t : ch.tokens)
      if (t < 0 || t >= c.vocab_size)
        return invalid_argument("forward: token id %d out of range [0, %d)", t, c.vocab_size);
    const int64_t end = ch.cache->n_tokens() + static_cast<int64_t>(ch.tokens.size());
    if (end > c.max_position_embeddings)
      return out_of_range("forward: %lld tokens exceed the model's context of %d",
                          static_cast<long long>(end), c.max_position_embeddings);
    n_total += static_cast<int64_t>(ch.tokens.size());
    offset[s + 1] = n_total;
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    Status st = batch[s].cache->reserve(static_cast<int64_t>(batch[s].tokens.size()));
    if (!st.ok()) {
      for (size_t r = 0; r < s; ++r) batch[r].cache->unreserve();
      return st;
    }
  }

  std::vector<float> x(n_total * H), h(n_total * H), q(n_total * c.q_dim), k(n_total * c.kv_dim),
      v(n_total * c.kv_dim), attn(n_total * c.q_dim), o(n_total * H), gate(n_total * I),
      up(n_total * I);
  std::vector<int64_t> pos(n_total);
  for (size_t s = 0; s < batch.size(); ++s)
    for (size_t i = 0; i < batch[s].tokens.size(); ++i) {
      const int64_t row = offset[s] + static_cast<int64_t>(i);
      std::copy_n(embed_.data() + static_cast<int64_t>(batch[s].tokens[i]) * H, H, x.data() + row * H);
      pos[row] = batch[s].cache->n_tokens() + static_cast<int64_t>(i);
    }

  kv::AttendScratch scratch;
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[l];
    rms_norm(x.data(), n_total, H, L.input_norm, c.rms_norm_eps, h.data());
    linear(h.data(), n_total, H, L.wq, c.q_dim, L.bq, q.data());
    linear(h.data(), n_total, H, L.wk, c.kv_dim, L.bk, k.data());
    linear(h.data(), n_total, H, L.wv, c.kv_dim, L.bv, v.data());
    if (!L.q_norm.empty()) {
      rms_norm(q.data(), n_total * Hq, d, L.q_norm, c.rms_norm_eps, q.data());
      rms_norm(k.data(), n_total * Hkv, d, L.k_norm, c.rms_norm_eps, k.data());
    }
    // RoPE, non-interleaved halves (rotate_half), angles in float32 as the reference.
    const int64_t half = d / 2;
    for (int64_t row = 0; row < n_total; ++row) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos[row]) * inv_freq_[i];
        const float cs = static_cast<float>(std::cos(static_cast<double>(angle)));
        const float sn = static_cast<float>(std::sin(static_cast<double>(angle)));
        auto rot = [&](float* base, int heads) {
          for (int hh = 0; hh < heads; ++hh) {
            float* xh = base + (row * heads + hh) * d;
            const float a = xh[i], b = xh[i + half];
            xh[i] = a * cs - b * sn;
            xh[i + half] = b * cs + a * sn;
          }
        };
        rot(q.data(), Hq);
        rot(k.data(), Hkv);
      }
    }
    for (size_t s = 0; s < batch.size(); ++s) {
      const int64_t n = static_cast<int64_t>(batch[s].tokens.size());
      const int64_t r0 = offset[s];
      kv::SequenceCache& cache = *batch[s].cache;
      if (options.observer)
        options.observer->on_qkv(static_cast<int>(s), l, q.data() + r0 * c.q_dim,
                                 k.data() + r0 * c.kv_dim, v.data() + r0 * c.kv_dim, n,
                                 cache.n_tokens());
      cache.write(l, k.data() + r0 * c.kv_dim, v.data() + r0 * c.kv_dim, n);
      OSCAR_RETURN_IF_ERROR(cache.attend(l, q.data() + r0 * c.q_dim, Hq, n,
                                         attn.data() + r0 * c.q_dim, options.attend_mode, scratch));
      if (options.observer)
        options.observer->on_attention(static_cast<int>(s), l, attn.data() + r0 * c.q_dim, n,
                                       cache.n_tokens());
    }
    linear(attn.data(), n_total, c.q_dim, L.wo, H, {}, o.data());
    for (int64_t i = 0; i < n_total * H; ++i) x[i] += o[i];

    rms_norm(x.data(), n_total, H, L.post_norm, c.rms_norm_eps, h.data());
    linear(h.data(), n_total, H, L.w_gate, I, {}, gate.data());
    linear(h.data(), n_total, H, L.w_up, I, {}, up.data());
    for (int64_t i = 0; i < n_total * I; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
    linear(gate.data(), n_total, I, L.w_down, H, {}, o.data());
    for (int64_t i = 0; i < n_total * H; ++i) x[i] += o[i];
  }

  rms_norm(x.data(), n_total, H, final_norm_, c.rms_norm_eps, h.data());
  const std::vector<float>& head = lm_head_.empty() ? embed_ : lm_head_;
  for (size_t s = 0; s < batch.size(); ++s) {
    SeqChunk& ch = batch[s];
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    if (options.observer)
      options.observer->on_final_hidden(static_cast<int>(s), h.data() + offset[s] * H, n,
                                        ch.cache->n_tokens());
    ch.cache->commit(n);
    if (ch.logits == nullptr) continue;
    const int64_t first = ch.all_logits ? offset[s] : offset[s + 1] - 1;
    const int64_t rows = ch.all_logits ? n : 1;
    ch.logits->resize(rows * c.vocab_size);
    linear(h.data() + first * H, rows, H, head, c.vocab_size, {}, ch.logits->data());
  }
  return Status();
}

}  // namespace oscar::model
