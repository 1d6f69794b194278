// LayerGroups (kv/layer_groups.h) from real configs (tests/data/configs) and the tiny models: one
// full-attention group over every layer for dense Qwen3 and Qwen3-30B-A3B (MoE); for the Qwen3.6
// hybrid a full-attention group of every fourth layer and a linear-state group of the others,
// each layer's index in its group equal to its store's index (ModelConfig::kv_layer for the
// cache, the DeltaNet layers counted in order for the StatePool).
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "core/mmap_file.h"
#include "format/model_config.h"
#include "kv/layer_groups.h"

namespace oscar::kv {
namespace {

format::ModelConfig config_of(const std::string& path) {
  Result<std::string> text = read_text_file(path);
  OSCAR_CHECK(text.ok(), "%s: %s", path.c_str(), text.status().to_string().c_str());
  Result<format::ModelConfig> c = format::ModelConfig::from_json_text(text.value());
  OSCAR_CHECK(c.ok(), "%s: %s", path.c_str(), c.status().to_string().c_str());
  return c.value();
}

// Every layer sits in exactly the group its kind names, at its index; full-attention indices are
// the config's cache layers.
void expect_consistent(const format::ModelConfig& c, const LayerGroups& g) {
  ASSERT_EQ(g.kind.size(), static_cast<size_t>(c.n_layers));
  int32_t total = 0;
  for (const LayerGroup& group : g.groups) {
    ASSERT_FALSE(group.layers.empty());
    total += static_cast<int32_t>(group.layers.size());
    for (size_t i = 0; i < group.layers.size(); ++i) {
      const int32_t l = group.layers[i];
      EXPECT_EQ(g.kind[l], group.kind) << "layer " << l;
      EXPECT_EQ(g.index[l], static_cast<int32_t>(i)) << "layer " << l;
      if (i > 0) {
        EXPECT_LT(group.layers[i - 1], l);
      }
      if (group.kind == LayerCache::kFullAttention) {
        EXPECT_EQ(c.kv_layer[l], g.index[l]);
      }
    }
  }
  EXPECT_EQ(total, c.n_layers);
  EXPECT_EQ(g.n_layers(LayerCache::kFullAttention), c.n_kv_layers);
  EXPECT_EQ(g.n_layers(LayerCache::kLinearState), c.n_linear_layers);
  EXPECT_EQ(g.group(LayerCache::kNone), nullptr);
}

TEST(LayerGroups, DenseIsOneFullAttentionGroup) {
  for (const char* path : {"tests/data/configs/qwen3-8b.json", "models/tiny-qwen3/config.json"}) {
    const format::ModelConfig c = config_of(path);
    const LayerGroups g = layer_groups(c);
    ASSERT_EQ(g.groups.size(), 1u) << path;
    EXPECT_EQ(g.groups[0].kind, LayerCache::kFullAttention);
    EXPECT_EQ(g.groups[0].layers.size(), static_cast<size_t>(c.n_layers));
    expect_consistent(c, g);
  }
}

TEST(LayerGroups, MoeIsOneFullAttentionGroup) {
  for (const char* path :
       {"tests/data/configs/qwen3-30b-a3b.json", "models/tiny-qwen3-moe/config.json"}) {
    const format::ModelConfig c = config_of(path);
    ASSERT_TRUE(c.is_moe()) << path;
    const LayerGroups g = layer_groups(c);
    ASSERT_EQ(g.groups.size(), 1u) << path;
    EXPECT_EQ(g.groups[0].kind, LayerCache::kFullAttention);
    expect_consistent(c, g);
  }
  EXPECT_EQ(layer_groups(config_of("tests/data/configs/qwen3-30b-a3b.json")).kind.size(), 48u);
}

TEST(LayerGroups, HybridHasAttentionAndLinearStateGroups) {
  const format::ModelConfig c = config_of("tests/data/configs/qwen3.6-27b.json");
  const LayerGroups g = layer_groups(c);
  ASSERT_EQ(g.groups.size(), 2u);
  const LayerGroup* attn = g.group(LayerCache::kFullAttention);
  const LayerGroup* lin = g.group(LayerCache::kLinearState);
  ASSERT_NE(attn, nullptr);
  ASSERT_NE(lin, nullptr);
  ASSERT_EQ(attn->layers.size(), 16u);
  ASSERT_EQ(lin->layers.size(), 48u);
  for (size_t i = 0; i < attn->layers.size(); ++i)
    EXPECT_EQ(attn->layers[i], static_cast<int32_t>(4 * i + 3));  // every fourth layer
  EXPECT_EQ(lin->layers[0], 0);
  EXPECT_EQ(lin->layers[3], 4);
  EXPECT_EQ(g.index[62], 47);  // the last DeltaNet layer (layer 63 is full attention)
  expect_consistent(c, g);

  for (const char* path :
       {"models/tiny-qwen3-5/config.json", "models/tiny-qwen3-5-vl/config.json"}) {
    const format::ModelConfig tiny = config_of(path);
    ASSERT_TRUE(tiny.is_hybrid()) << path;
    expect_consistent(tiny, layer_groups(tiny));
  }
}

}  // namespace
}  // namespace oscar::kv
