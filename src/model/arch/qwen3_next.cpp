// Qwen3-Next (Qwen3NextForCausalLM): the token mixers of the Qwen3.5 hybrids (Gated DeltaNet
// layers, their state in the sequences' StatePool slots, between gated full-attention layers;
// partial RoPE and zero-centred norms settled at load), and in every sparse layer
// (ModelConfig::moe_layer) the routed experts plus the shared expert with its sigmoid gate
// (Qwen3NextSparseMoeBlock: the moe_ffn block with the layer's shared-expert weights); a dense
// FFN in the others (mlp_only_layers, decoder_sparse_step). The checkpoint's fused in_proj_qkvz /
// in_proj_ba are split into the block's layout at load (model/weights.h), so the DeltaNet here is
// Qwen3.5's.
#include "model/architecture.h"

namespace oscar::model {
namespace {

class Qwen3Next final : public Architecture {
 public:
  using Architecture::Architecture;
  Status mixer(int layer, LayerStep& step, const float* h, float* out) const override {
    return hybrid_mixer(layer, step, h, out);
  }
  Status ffn(int layer, LayerStep& step, const float* h, float* out) const override {
    if (w_.layers[layer].moe) return moe_ffn(*step.be, w_.moe_ffn(layer), h, step.n, step.ffn, out);
    return dense_ffn(*step.be, w_.dense_ffn(layer), h, step.n, step.ffn, out);
  }
};

}  // namespace

std::unique_ptr<Architecture> make_qwen3_next(const ModelWeights& w) {
  return std::make_unique<Qwen3Next>(w);
}

}  // namespace oscar::model
