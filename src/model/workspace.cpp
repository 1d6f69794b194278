// The step runner's activations (model/workspace.h).
#include "model/workspace.h"

#include <algorithm>

#include "kernels/moe.h"

namespace oscar::model {

Status StepWorkspace::reserve(kernels::Backend& be, int64_t n, int64_t n_logits,
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
      if (c.has_shared_expert()) {
        for (DeviceBuffer* b : {&shared_gate, &shared_up})
          OSCAR_RETURN_IF_ERROR(fit(*b, c.shared_expert_intermediate_size));
        OSCAR_RETURN_IF_ERROR(fit(shared_out, c.hidden_size));
        OSCAR_RETURN_IF_ERROR(fit(shared_score, 1));
      }
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
