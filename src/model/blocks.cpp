// Decoder-layer blocks (model/blocks.h) over the backend's ops.
#include "model/blocks.h"

namespace oscar::model {

namespace {

// y[n, out] = x[n, in] · W[out, in]^T (+ bias).
kernels::LinearParams lin(const float* x, int64_t n, const kernels::WeightView& w, float* y,
                          const float* bias = nullptr) {
  kernels::LinearParams p;
  p.x = x;
  p.n = n;
  p.w = w;
  p.bias = bias;
  p.y = y;
  return p;
}

}  // namespace

Status attention(kernels::Backend& be, const AttentionWeights& w, int kv_layer, int64_t n,
                 AttentionStep& s, const float* h, float* out) {
  const kernels::LinearParams qkv[4] = {lin(h, n, w.wq, s.q, w.bq), lin(h, n, w.wk, s.k, w.bk),
                                        lin(h, n, w.wv, s.v, w.bv), lin(h, n, w.wq_gate, s.gate)};
  OSCAR_RETURN_IF_ERROR(be.linear_group(qkv, w.wq_gate.rows > 0 ? 4 : 3));
  s.rope.q_norm = w.q_norm;  // q/k norms fused into RoPE
  s.rope.k_norm = w.k_norm;
  OSCAR_RETURN_IF_ERROR(be.rope(s.rope));
  if (s.tap != nullptr) OSCAR_RETURN_IF_ERROR(s.tap->on_qkv(kv_layer, s.q, s.k, s.v));
  s.append.layer = kv_layer;
  OSCAR_RETURN_IF_ERROR(be.kv_append(s.append));
  s.rotate.layer = kv_layer;
  OSCAR_RETURN_IF_ERROR(be.rotate_queries(s.rotate));
  if (s.decode.n_seqs > 0) {
    s.decode.layer = kv_layer;
    OSCAR_RETURN_IF_ERROR(be.decode_attn(s.decode));
  }
  if (s.prefill.n_seqs > 0) {
    s.prefill.layer = kv_layer;
    OSCAR_RETURN_IF_ERROR(be.prefill_attn(s.prefill));
  }
  if (s.tap != nullptr) OSCAR_RETURN_IF_ERROR(s.tap->on_attention(kv_layer, s.attn));
  float* attn = s.attn;
  if (w.out_unrotation != nullptr) {
    // Back to the unrotated basis for the elementwise gate (ModelWeights::out_unrotation): the
    // rotated queries' buffer is free once attention has read it.
    kernels::RotateQueriesParams u = s.rotate;
    u.layer = kv_layer;
    u.q = s.attn;
    u.q_rotation = w.out_unrotation;
    OSCAR_RETURN_IF_ERROR(be.rotate_queries(u));
    attn = u.out;
  }
  const int64_t q_dim = int64_t{s.rotate.n_heads_q} * s.rotate.head_dim;
  if (w.wq_gate.rows > 0)  // Qwen3.5: attn · sigmoid(gate) before o_proj
    OSCAR_RETURN_IF_ERROR(be.sigmoid_mul(attn, s.gate, n * q_dim));
  return be.linear(lin(attn, n, w.wo, out));
}

Status dense_ffn(kernels::Backend& be, const DenseFfnWeights& w, const float* h, int64_t n,
                 const FfnScratch& s, float* out) {
  const kernels::LinearParams gate_up[2] = {lin(h, n, w.gate, s.gate), lin(h, n, w.up, s.up)};
  OSCAR_RETURN_IF_ERROR(be.linear_group(gate_up, 2));
  OSCAR_RETURN_IF_ERROR(be.silu_mul(s.gate, s.up, n * w.gate.rows));
  return be.linear(lin(s.gate, n, w.down, out));
}

Status moe_ffn(kernels::Backend& be, const MoeFfnWeights& w, const float* h, int64_t n,
               const FfnScratch& s, float* out) {
  const bool shared = w.shared_gate.rows > 0;
  if (shared) {  // everything that reads h: the router, the shared expert's gate/up and its score
    const kernels::LinearParams in[4] = {
        lin(h, n, w.router, s.router_logits), lin(h, n, w.shared_gate, s.shared_gate),
        lin(h, n, w.shared_up, s.shared_up), lin(h, n, w.shared_expert_gate, s.shared_score)};
    OSCAR_RETURN_IF_ERROR(be.linear_group(in, 4));
  } else {
    OSCAR_RETURN_IF_ERROR(be.linear(lin(h, n, w.router, s.router_logits)));
  }
  kernels::MoeRouteParams route;
  route.logits = s.router_logits;
  route.n = n;
  route.n_experts = w.gate.n_experts;
  route.top_k = w.top_k;
  route.norm_topk_prob = w.norm_topk_prob;
  route.expert_ids = s.expert_ids;
  route.weights = s.expert_weights;
  OSCAR_RETURN_IF_ERROR(be.moe_route(route));
  kernels::MoeFfnParams ffn;
  ffn.x = h;
  ffn.n = n;
  ffn.top_k = w.top_k;
  ffn.expert_ids = s.expert_ids;
  ffn.weights = s.expert_weights;
  ffn.gate = w.gate;
  ffn.up = w.up;
  ffn.down = w.down;
  ffn.y = out;
  ffn.work = s.moe_work;
  ffn.work_bytes = s.moe_work_bytes;
  OSCAR_RETURN_IF_ERROR(be.moe_ffn(ffn));
  if (!shared) return Status();
  // Qwen3NextSparseMoeBlock: routed + sigmoid(h · w_sgᵀ) · shared_expert(h).
  const int64_t hidden = w.shared_down.rows;
  OSCAR_RETURN_IF_ERROR(be.silu_mul(s.shared_gate, s.shared_up, n * w.shared_gate.rows));
  OSCAR_RETURN_IF_ERROR(be.linear(lin(s.shared_gate, n, w.shared_down, s.shared_out)));
  OSCAR_RETURN_IF_ERROR(be.sigmoid_scale_rows(s.shared_out, s.shared_score, n, hidden));
  return be.add(out, s.shared_out, n * hidden);
}

Status gated_delta_net(kernels::Backend& be, const GatedDeltaNetWeights& w, const float* h,
                       int64_t n, const GatedDeltaNetBatch& batch, const GatedDeltaNetScratch& s,
                       float* out) {
  const int64_t conv_dim = w.in_qkv.rows;
  const int64_t key_dim = int64_t{w.heads_k} * w.d_k;
  float* b = s.ab;
  float* a = s.ab + n * w.heads_v;
  float* beta = s.ab + 2 * n * w.heads_v;
  float* g = s.ab + 3 * n * w.heads_v;
  const kernels::LinearParams in[4] = {lin(h, n, w.in_qkv, s.qkv), lin(h, n, w.in_z, s.z),
                                       lin(h, n, w.in_b, b), lin(h, n, w.in_a, a)};
  OSCAR_RETURN_IF_ERROR(be.linear_group(in, 4));

  kernels::CausalConv1dParams conv;
  conv.x = s.qkv;
  conv.cu_seqlens = batch.cu_seqlens;
  conv.n_seqs = batch.n_seqs;
  conv.channels = conv_dim;
  conv.kernel_size = w.conv_kernel;
  conv.w = w.conv;
  conv.silu = true;
  conv.state = batch.conv_state;
  conv.slots = batch.slots;
  conv.y = s.conv_out;
  OSCAR_RETURN_IF_ERROR(be.causal_conv1d(conv));

  kernels::GdnGatesParams gates;
  gates.a = a;
  gates.b = b;
  gates.A_log = w.A_log;
  gates.dt_bias = w.dt_bias;
  gates.n_tokens = n;
  gates.n_heads_v = w.heads_v;
  gates.g = g;
  gates.beta = beta;
  OSCAR_RETURN_IF_ERROR(be.gdn_gates(gates));

  // q, k, v are column ranges of the conv output (split as transformers does: q | k | v).
  kernels::GatedDeltaParams rule;
  rule.q = s.conv_out;
  rule.k = s.conv_out + key_dim;
  rule.v = s.conv_out + 2 * key_dim;
  rule.q_stride = rule.k_stride = rule.v_stride = conv_dim;
  rule.g = g;
  rule.beta = beta;
  rule.cu_seqlens = batch.cu_seqlens;
  rule.n_seqs = batch.n_seqs;
  rule.n_heads_k = w.heads_k;
  rule.n_heads_v = w.heads_v;
  rule.d_k = w.d_k;
  rule.d_v = w.d_v;
  rule.l2norm_qk = true;
  rule.state = batch.recurrent_state;
  rule.slots = batch.slots;
  rule.o = s.o;
  OSCAR_RETURN_IF_ERROR(be.gated_delta_rule(rule));

  kernels::RmsNormGatedParams norm;
  norm.x = s.o;
  norm.z = s.z;
  norm.w = w.norm;
  norm.rows = n * w.heads_v;
  norm.dim = w.d_v;
  norm.eps = w.norm_eps;
  norm.y = s.o;
  OSCAR_RETURN_IF_ERROR(be.rms_norm_gated(norm));

  return be.linear(lin(s.o, n, w.out, out));
}

}  // namespace oscar::model
