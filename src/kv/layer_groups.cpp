#include "kv/layer_groups.h"

namespace oscar::kv {

const LayerGroup* LayerGroups::group(LayerCache k) const {
  for (const LayerGroup& g : groups)
    if (g.kind == k) return &g;
  return nullptr;
}

int32_t LayerGroups::n_layers(LayerCache k) const {
  const LayerGroup* g = group(k);
  return g == nullptr ? 0 : static_cast<int32_t>(g->layers.size());
}

LayerGroups layer_groups(const format::ModelConfig& config) {
  LayerGroups out;
  out.kind.resize(static_cast<size_t>(config.n_layers));
  out.index.resize(out.kind.size());
  for (int32_t l = 0; l < config.n_layers; ++l)
    out.kind[l] = config.linear(l) ? LayerCache::kLinearState : LayerCache::kFullAttention;
  for (LayerCache k : {LayerCache::kFullAttention, LayerCache::kLinearState, LayerCache::kNone}) {
    LayerGroup g;
    g.kind = k;
    for (int32_t l = 0; l < config.n_layers; ++l)
      if (out.kind[l] == k) {
        out.index[l] = static_cast<int32_t>(g.layers.size());
        g.layers.push_back(l);
      }
    if (!g.layers.empty()) out.groups.push_back(std::move(g));
  }
  return out;
}

}  // namespace oscar::kv
