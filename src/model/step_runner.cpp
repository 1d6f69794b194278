// One step from its plan, for every architecture (model/step_runner.h).
#include "model/step_runner.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/demote_pages.h"
#include "kernels/elementwise.h"
#include "model/plan_stager.h"

namespace oscar::model {

namespace {

// The observer reads host memory: on a device backend, what it is shown is copied back, into one
// of three slots of the workspace's host buffer (q, k and v are shown together).
class HostCopies {
 public:
  HostCopies(kernels::Backend& be, std::vector<float>* buf, size_t slot_floats, bool used)
      : be_(be), buf_(buf), slot_floats_(slot_floats) {
    if (used && be.device() != Device::kCpu && buf->size() < 3 * slot_floats)
      buf->resize(3 * slot_floats);
  }
  Result<const float*> get(const float* p, int64_t count, size_t slot) {
    if (be_.device() == Device::kCpu) return p;
    float* dst = buf_->data() + slot * slot_floats_;
    OSCAR_RETURN_IF_ERROR(be_.download(p, count * sizeof(float), dst));
    return static_cast<const float*>(dst);
  }

 private:
  kernels::Backend& be_;
  std::vector<float>* buf_;
  size_t slot_floats_;
};

// The attention block's tap, split into LayerObserver calls per plan sequence.
class ObserverTap final : public AttentionTap {
 public:
  ObserverTap(LayerObserver* observer, const kv::StepPlan& plan, const format::ModelConfig& c,
              HostCopies* host)
      : obs_(observer), plan_(plan), c_(c), host_(host) {}
  Status on_qkv(int kv_layer, const float* q, const float* k, const float* v) override {
    const int64_t n = plan_.n_rows();
    OSCAR_ASSIGN_OR_RETURN(const float* hq, host_->get(q, n * c_.q_dim, 0));
    OSCAR_ASSIGN_OR_RETURN(const float* hk, host_->get(k, n * c_.kv_dim, 1));
    OSCAR_ASSIGN_OR_RETURN(const float* hv, host_->get(v, n * c_.kv_dim, 2));
    for (int32_t s = 0; s < plan_.n_seqs(); ++s) {
      const int64_t r0 = plan_.cu_seqlens[s];
      obs_->on_qkv(plan_.chunk[s], kv_layer, hq + r0 * c_.q_dim, hk + r0 * c_.kv_dim,
                   hv + r0 * c_.kv_dim, plan_.cu_seqlens[s + 1] - r0, plan_.pos0[s]);
    }
    return Status();
  }
  Status on_attention(int kv_layer, const float* attn) override {
    OSCAR_ASSIGN_OR_RETURN(const float* ha, host_->get(attn, plan_.n_rows() * c_.q_dim, 0));
    for (int32_t s = 0; s < plan_.n_seqs(); ++s) {
      const int64_t r0 = plan_.cu_seqlens[s];
      obs_->on_attention(plan_.chunk[s], kv_layer, ha + r0 * c_.q_dim, plan_.cu_seqlens[s + 1] - r0,
                         plan_.pos0[s]);
    }
    return Status();
  }

 private:
  LayerObserver* obs_;
  const kv::StepPlan& plan_;
  const format::ModelConfig& c_;
  HostCopies* host_;
};

}  // namespace

StepRunner::StepRunner(const ModelWeights& weights, const Architecture& arch)
    : w_(weights), arch_(arch) {
  const format::ModelConfig& c = w_.config;
  const int d = c.rotary_dim;  // head_dim, or Qwen3.5's partial rotary dims
  inv_freq_.resize(d / 2);
  // As the reference: inv_freq = 1 / theta^(arange(0, d, 2) / d) in float32.
  for (int i = 0; i < d / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    const float pw = static_cast<float>(std::pow(c.rope_theta, static_cast<double>(expo)));
    inv_freq_[i] = 1.0f / pw;
  }
}

Status StepRunner::forward(const kv::StepPlan& plan, const ForwardOptions& options,
                           std::vector<float>* logits) {
  OSCAR_RETURN_IF_ERROR(forward(plan, options));
  return download_logits(plan, logits);
}

Status StepRunner::download_logits(const kv::StepPlan& plan, std::vector<float>* logits) const {
  logits->resize(static_cast<size_t>(plan.n_logit_rows()) * w_.config.vocab_size);
  if (logits->empty()) return Status();
  return backend_->download(ws_.logits.data(), logits->size() * sizeof(float), logits->data());
}

Status StepRunner::forward(const kv::StepPlan& plan, const ForwardOptions& options) {
  const format::ModelConfig& c = w_.config;
  const int64_t H = c.hidden_size;
  const int64_t n = plan.n_rows();
  if (n == 0) return Status();
  for (int32_t t : plan.token_ids)
    if (t < 0 || t >= c.vocab_size)
      return invalid_argument("forward: token id %d out of range [0, %d)", t, c.vocab_size);
  // The scheduler and run() guarantee the context bound.
  OSCAR_DCHECK(plan.positions.back() < c.max_position_embeddings);

  kernels::Backend& be = *backend_;
  StepWorkspace& w = ws_;
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

  // One set of block parameters for the whole step, engine-wide from the plan; only the layer
  // changes.
  LayerStep step;
  step.be = &be;
  step.n = n;
  AttentionStep& a = step.attention;
  a.q = w.q.as<float>();
  a.k = w.k.as<float>();
  a.v = w.v.as<float>();
  a.attn = w.attn.as<float>();
  a.gate = w.attn_gate.as<float>();
  float* q_rot = w.q_rot.as<float>();
  a.rope.n_rows = n;
  a.rope.n_heads_q = c.n_heads_q;
  a.rope.n_heads_kv = c.n_heads_kv;
  a.rope.head_dim = c.head_dim;
  a.rope.rotary_dim = c.rotary_dim;
  a.rope.cos = st.get<float>(h_cos);
  a.rope.sin = st.get<float>(h_sin);
  a.rope.q = a.q;
  a.rope.k = a.k;
  a.rope.norm_eps = c.rms_norm_eps;
  a.append = plan.ops.append;
  a.append.n_tokens = n;
  a.append.k = a.k;
  a.append.v = a.v;
  a.append.slots = st.get<int64_t>(h_slots);
  a.rotate = plan.ops.rotate_queries;
  a.rotate.n_rows = n;
  a.rotate.n_heads_q = c.n_heads_q;
  a.rotate.n_heads_kv = c.n_heads_kv;
  a.rotate.head_dim = c.head_dim;
  a.rotate.q = a.q;
  a.rotate.out = q_rot;
  a.decode = plan.ops.decode;
  a.decode.n_heads_q = c.n_heads_q;
  a.decode.n_seqs = plan.n_decode;
  a.decode.q = q_rot;
  a.decode.out = a.attn;
  a.decode.sinks = st.table(h_dec[0], plan.n_decode);
  a.decode.history = st.table(h_dec[1], plan.n_decode);
  a.decode.recent = st.table(h_dec[2], plan.n_decode);
  kernels::PrefillAttnParams& pre = a.prefill;
  pre = plan.ops.prefill;
  pre.n_heads_q = c.n_heads_q;
  pre.n_seqs = plan.n_seqs() - plan.n_decode;
  pre.max_rows = static_cast<int32_t>(n - plan.n_decode);  // the prefill rows of this step
  // The key split of short chunks at depth (kernels/cuda/prefill_attn_ws.cu): the longest key
  // range lets the kernel cut a call of few items into parts (H100, 2026-12-08: 128 queries over
  // 48K keys 2.96x faster, 64 over 96K 3.0x, nothing else changed;
  // docs/results/prefill_cuda.md, session 15). OSCAR_PREFILL_SPLIT=0 turns it off.
  static const bool split_short_chunk_keys = [] {
    const char* e = std::getenv("OSCAR_PREFILL_SPLIT");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }();
  pre.max_keys = 0;
  for (int32_t s = plan.n_decode; split_short_chunk_keys && s < plan.n_seqs(); ++s)
    pre.max_keys = std::max<int64_t>(pre.max_keys, plan.pos0[s] + plan.cu_seqlens[s + 1] -
                                                       plan.cu_seqlens[s]);
  // The prefill sequences' slice of the plan: their rows keep their step-wide numbering.
  pre.cu_seqlens = st.get<int32_t>(h_cu) + plan.n_decode;
  pre.pos0 = st.get<int64_t>(h_pos0) + plan.n_decode;
  pre.q = q_rot;
  pre.out = a.attn;
  pre.sinks = st.table(h_pre[0], pre.n_seqs);
  pre.history = st.table(h_pre[1], pre.n_seqs);
  pre.recent = st.table(h_pre[2], pre.n_seqs);
  pre.hist_unique = st.get<int32_t>(h_hist_unique);
  pre.hist_slot = st.get<int32_t>(h_hist_slot);
  pre.n_hist_unique = static_cast<int32_t>(hist_distinct.pages.size());
  HostCopies host(be, &w.host, static_cast<size_t>(n) * std::max<int64_t>(H, c.q_dim),
                  options.observer != nullptr);
  ObserverTap tap(options.observer, plan, c, &host);
  if (options.observer != nullptr) a.tap = &tap;

  step.ffn.gate = w.gate.as<float>();
  step.ffn.up = w.up.as<float>();
  step.ffn.router_logits = w.router_logits.as<float>();
  step.ffn.expert_ids = w.expert_ids.as<int32_t>();
  step.ffn.expert_weights = w.expert_weights.as<float>();
  step.ffn.moe_work = w.moe_work.data();
  step.ffn.moe_work_bytes = w.moe_work.bytes();
  step.ffn.shared_gate = w.shared_gate.as<float>();
  step.ffn.shared_up = w.shared_up.as<float>();
  step.ffn.shared_out = w.shared_out.as<float>();
  step.ffn.shared_score = w.shared_score.as<float>();

  // The linear-state layers' sequences and state slots (a hybrid model; host arrays: these ops
  // run on the CPU only for now).
  if (c.is_hybrid()) {
    step.state_pool = plan.state_pool;
    for (int32_t s = 0; s < plan.n_seqs(); ++s)
      if (plan.state_slots[s] < 0 || plan.state_pool == nullptr)
        return invalid_argument(
            "forward: sequence %d of a hybrid model has no DeltaNet state "
            "slot (its cache needs the runtime's StatePool)",
            s);
    step.delta_net.cu_seqlens = plan.cu_seqlens.data();
    step.delta_net.n_seqs = plan.n_seqs();
    step.delta_net.slots = plan.state_slots.data();
    step.delta_net_scratch.qkv = w.lin_qkv.as<float>();
    step.delta_net_scratch.conv_out = w.lin_conv.as<float>();
    step.delta_net_scratch.z = w.lin_z.as<float>();
    step.delta_net_scratch.ab = w.lin_ab.as<float>();
    step.delta_net_scratch.o = w.lin_o.as<float>();
  }

  float *x = w.x.as<float>(), *h = w.h.as<float>(), *o = w.o.as<float>();
  auto run_ops = [&]() -> Status {
    OSCAR_RETURN_IF_ERROR(be.embed(w_.embed.view(), st.get<int32_t>(h_ids), n, x));
    // h = the first layer's input norm; each layer ends with its residual add fused into the
    // next norm (the next layer's input norm, or the final norm).
    OSCAR_RETURN_IF_ERROR(be.rms_norm(x, n, H, w_.layers[0].input_norm.data(), c.rms_norm_eps, h));
    for (int l = 0; l < c.n_layers; ++l) {
      OSCAR_RETURN_IF_ERROR(arch_.mixer(l, step, h, o));
      OSCAR_RETURN_IF_ERROR(
          be.add_rms_norm(x, o, n, H, w_.layers[l].post_norm.data(), c.rms_norm_eps, h));
      OSCAR_RETURN_IF_ERROR(arch_.ffn(l, step, h, o));
      const float* next_norm =
          l + 1 < c.n_layers ? w_.layers[l + 1].input_norm.data() : w_.final_norm.data();
      OSCAR_RETURN_IF_ERROR(be.add_rms_norm(x, o, n, H, next_norm, c.rms_norm_eps, h));
    }
    if (options.observer) {
      OSCAR_ASSIGN_OR_RETURN(const float* hh, host.get(h, n * H, 0));
      for (int32_t s = 0; s < plan.n_seqs(); ++s)
        options.observer->on_final_hidden(plan.chunk[s], hh + plan.cu_seqlens[s] * H,
                                          plan.cu_seqlens[s + 1] - plan.cu_seqlens[s],
                                          plan.pos0[s]);
    }
    // lm_head over the rows that produce logits only.
    OSCAR_RETURN_IF_ERROR(be.gather_rows(h, st.get<int32_t>(h_rows), n_out, H, x));
    kernels::LinearParams head;
    head.x = x;
    head.n = n_out;
    head.w = w_.output().view();
    head.y = w.logits.as<float>();
    return be.linear(head);
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

Status StepRunner::demote(const kv::StepPlan& plan, std::vector<int32_t>* status) const {
  status->assign(plan.demote_src.size(), kernels::kDemoteOk);
  if (plan.demote_src.empty()) return Status();
  kernels::Backend& be = *backend_;
  const size_t n = plan.demote_src.size();
  kernels::DemotePagesParams p = plan.ops.demote;
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

Status StepRunner::step(const kv::StepPlan& plan, const ForwardOptions& options,
                        std::vector<Status>* per_chunk,
                        const std::function<Status()>& after_forward) {
  std::vector<int32_t> demote_status;
  Status st = forward(plan, options);
  if (st.ok() && after_forward) st = after_forward();
  if (st.ok()) st = demote(plan, &demote_status);
  if (!st.ok()) {
    for (kv::SequenceCache* cache : plan.caches) cache->unreserve();
    return st;
  }
  plan.commit(demote_status, per_chunk);
  return Status();
}

// The single-threaded driver (tools, evaluation, calibration): reserve -> plan -> step(), the
// logits downloaded right after the forward pass. The scheduler calls step() too.
Status StepRunner::run(std::span<SeqChunk> batch, const ForwardOptions& options) {
  const format::ModelConfig& c = w_.config;
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
  std::vector<Status> per_chunk;
  OSCAR_RETURN_IF_ERROR(
      step(plan, options, &per_chunk, [&] { return download_logits(plan, &logits); }));
  for (const Status& e : per_chunk)
    if (!e.ok()) return e;  // the caller drops the failed caches
  for (int32_t s = 0; s < plan.n_seqs(); ++s) {
    SeqChunk& ch = batch[plan.chunk[s]];
    if (ch.logits == nullptr) continue;
    const size_t v = static_cast<size_t>(c.vocab_size);
    ch.logits->assign(logits.begin() + plan.cu_logits[s] * v,
                      logits.begin() + plan.cu_logits[s + 1] * v);
  }
  return Status();
}

}  // namespace oscar::model
