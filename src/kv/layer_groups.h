// LayerGroups: what each layer of a model keeps across steps, as groups of layers of one kind
// (vLLM's KV-cache groups, llama.cpp's per-layer-type caches):
//   full attention  K/V rows per token, in the OSCAR cache (kv/sequence_cache.h)
//   linear state    a fixed-size state per sequence, in a StatePool slot (kv/state_pool.h)
//   none            nothing (no layer of today's architectures; a layer type that keeps
//                   nothing needs no store)
// A layer's index inside its group is its index in the group's store: the cache layer of the
// KvCacheSpec, the StatePool layer. Made once from the config; the model's loader and the
// architectures read it. Not here: the stores themselves, their sizes (engine/runtime.h).
#pragma once

#include <cstdint>
#include <vector>

#include "format/model_config.h"

namespace oscar::kv {

enum class LayerCache { kFullAttention, kLinearState, kNone };

struct LayerGroup {
  LayerCache kind = LayerCache::kFullAttention;
  std::vector<int32_t> layers;  // model layers, ascending
};

struct LayerGroups {
  std::vector<LayerGroup> groups;  // at most one per kind, in kind order; none empty
  std::vector<LayerCache> kind;    // [n_layers] each layer's kind
  std::vector<int32_t> index;      // [n_layers] each layer's index inside its group

  const LayerGroup* group(LayerCache k) const;  // null when no layer is of that kind
  int32_t n_layers(LayerCache k) const;
};

// Dense and MoE models: one full-attention group over every layer. Hybrids (Qwen3.5): the full
// attention layers and the Gated DeltaNet layers (ModelConfig::linear).
LayerGroups layer_groups(const format::ModelConfig& config);

}  // namespace oscar::kv
