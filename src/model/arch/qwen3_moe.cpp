// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention; routed experts in the sparse layers
// (ModelConfig::moe_layer), a dense FFN in the others (mlp_only_layers, decoder_sparse_step).
#include "model/architecture.h"

namespace oscar::model {
namespace {

class Qwen3Moe final : public Architecture {
 public:
  using Architecture::Architecture;
  Status mixer(int layer, LayerStep& step, const float* h, float* out) const override {
    return full_attention(layer, step, h, out);
  }
  Status ffn(int layer, LayerStep& step, const float* h, float* out) const override {
    if (w_.layers[layer].moe) return moe_ffn(*step.be, w_.moe_ffn(layer), h, step.n, step.ffn, out);
    return dense_ffn(*step.be, w_.dense_ffn(layer), h, step.n, step.ffn, out);
  }
};

}  // namespace

std::unique_ptr<Architecture> make_qwen3_moe(const ModelWeights& w) {
  return std::make_unique<Qwen3Moe>(w);
}

}  // namespace oscar::model
