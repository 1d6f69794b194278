// The architecture of a config (model/architecture.h) and the mixers they share.
#include "model/architecture.h"

#include "core/check.h"

namespace oscar::model {

Status Architecture::full_attention(int layer, LayerStep& step, const float* h, float* out) const {
  OSCAR_DCHECK(groups_.kind[layer] == kv::LayerCache::kFullAttention);
  return attention(*step.be, w_.attention(layer), groups_.index[layer], step.n, step.attention, h,
                   out);
}

Status Architecture::hybrid_mixer(int layer, LayerStep& step, const float* h, float* out) const {
  if (groups_.kind[layer] != kv::LayerCache::kLinearState)
    return full_attention(layer, step, h, out);
  const int32_t state_layer = groups_.index[layer];
  step.delta_net.conv_state = step.state_pool->conv(state_layer);
  step.delta_net.recurrent_state = step.state_pool->recurrent(state_layer);
  return gated_delta_net(*step.be, w_.gated_delta_net(layer), h, step.n, step.delta_net,
                         step.delta_net_scratch, out);
}

std::unique_ptr<Architecture> make_architecture(const ModelWeights& w) {
  switch (w.config.arch) {
    case format::Architecture::kQwen3:
    case format::Architecture::kQwen2:
    case format::Architecture::kLlama:
      return make_dense(w);
    case format::Architecture::kQwen3Moe:
      return make_qwen3_moe(w);
    case format::Architecture::kQwen3_5:
      return make_qwen3_5(w);
    case format::Architecture::kQwen3Next:
      return make_qwen3_next(w);
  }
  OSCAR_CHECK(false, "architecture %d has no model/arch file", static_cast<int>(w.config.arch));
  return nullptr;
}

}  // namespace oscar::model
