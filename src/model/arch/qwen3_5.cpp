// The Qwen3.5 / 3.6 hybrids (dense FFN): Gated DeltaNet layers, their state in the sequences'
// StatePool slots, between full-attention layers whose q_proj also gives the output gate (the
// attention block applies it when the layer has wq_gate). Partial RoPE and the zero-centred norms
// are settled at load (the config's rotary_dim; norms stored as 1 + w).
#include "model/architecture.h"

namespace oscar::model {
namespace {

class Qwen3_5 final : public Architecture {
 public:
  using Architecture::Architecture;
  Status mixer(int layer, LayerStep& step, const float* h, float* out) const override {
    return hybrid_mixer(layer, step, h, out);
  }
  Status ffn(int layer, LayerStep& step, const float* h, float* out) const override {
    return dense_ffn(*step.be, w_.dense_ffn(layer), h, step.n, step.ffn, out);
  }
};

}  // namespace

std::unique_ptr<Architecture> make_qwen3_5(const ModelWeights& w) {
  return std::make_unique<Qwen3_5>(w);
}

}  // namespace oscar::model
