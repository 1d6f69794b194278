// The dense decoders: Qwen3 (q/k norms), Qwen2 (q/k/v biases), Llama. Each layer is full
// attention and a SwiGLU FFN; the weights present decide norms and biases (model/weights.h).
#include "model/architecture.h"

namespace oscar::model {
namespace {

class Dense final : public Architecture {
 public:
  using Architecture::Architecture;
  Status mixer(int layer, LayerStep& step, const float* h, float* out) const override {
    return full_attention(layer, step, h, out);
  }
  Status ffn(int layer, LayerStep& step, const float* h, float* out) const override {
    return dense_ffn(*step.be, w_.dense_ffn(layer), h, step.n, step.ffn, out);
  }
};

}  // namespace

std::unique_ptr<Architecture> make_dense(const ModelWeights& w) {
  return std::make_unique<Dense>(w);
}

}  // namespace oscar::model
