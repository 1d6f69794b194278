// Decoder-layer blocks (model/blocks.h) over the backend's ops.
#include "model/blocks.h"

namespace oscar::model {

Status dense_ffn(kernels::Backend& be, const DenseFfnWeights& w, const float* h, int64_t n,
                 const FfnScratch& s, float* out) {
  kernels::LinearParams gate_up[2];
  gate_up[0].x = gate_up[1].x = h;
  gate_up[0].n = gate_up[1].n = n;
  gate_up[0].w = w.gate;
  gate_up[0].y = s.gate;
  gate_up[1].w = w.up;
  gate_up[1].y = s.up;
  OSCAR_RETURN_IF_ERROR(be.linear_group(gate_up, 2));
  OSCAR_RETURN_IF_ERROR(be.silu_mul(s.gate, s.up, n * w.gate.rows));
  kernels::LinearParams down;
  down.x = s.gate;
  down.n = n;
  down.w = w.down;
  down.y = out;
  return be.linear(down);
}

Status moe_ffn(kernels::Backend& be, const MoeFfnWeights& w, const float* h, int64_t n,
               const FfnScratch& s, float* out) {
  kernels::LinearParams router;
  router.x = h;
  router.n = n;
  router.w = w.router;
  router.y = s.router_logits;
  OSCAR_RETURN_IF_ERROR(be.linear(router));
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
  return be.moe_ffn(ffn);
}

}  // namespace oscar::model
