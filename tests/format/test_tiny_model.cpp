// The embedded tiny-qwen3 checkpoint and its golden files through the format layer: the sharded
// checkpoint opens (90 BF16 tensors, 9,967,872 parameters), binds to its config, and the golden
// logits and rotation files read back with the dtypes and values their READMEs state.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "core/mmap_file.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "format/weight_table.h"

namespace oscar::format {
namespace {

constexpr const char* kModel = "models/tiny-qwen3";

TEST(TinyModel, CheckpointOpensAndBinds) {
  Result<ModelConfig> config = ModelConfig::load(kModel);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  Result<Checkpoint> ck = Checkpoint::open(kModel);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();

  std::vector<const TensorView*> all = ck->all();
  EXPECT_EQ(all.size(), 90u);
  int64_t params = 0;
  for (const TensorView* t : all) {
    EXPECT_EQ(t->dtype, DType::kBF16) << t->name;
    params += t->numel();
  }
  EXPECT_EQ(params, 9967872);
  EXPECT_EQ(params, config->n_params());
  EXPECT_EQ(ck->total_bytes(), 19935744u);  // the index's metadata.total_size
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end(),
                             [](const TensorView* a, const TensorView* b) { return a->name < b->name; }));

  Result<BoundWeights> bound = bind_weights(config.value(), ck.value());
  ASSERT_TRUE(bound.ok()) << bound.status().to_string();
  EXPECT_EQ(bound->specs.size(), 91u);  // 90 stored + the optional (tied) lm_head
  EXPECT_EQ(bound->tensors.back(), nullptr);

  // Weights are real numbers: RMSNorm gains are finite and mostly near 1-ish, not all zero.
  const TensorView* norm = ck->find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  std::vector<float> g = norm->to_f32();
  ASSERT_EQ(g.size(), 256u);
  double sum_abs = 0;
  for (float v : g) {
    ASSERT_TRUE(std::isfinite(v));
    sum_abs += std::fabs(v);
  }
  EXPECT_GT(sum_abs, 0.0);
}

TEST(TinyModel, GoldenLogitsReadable) {
  Result<SafetensorsFile> f = SafetensorsFile::open(std::string(kModel) + "/golden/logits.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  Result<std::string> index_text = read_text_file(std::string(kModel) + "/golden/golden_index.json");
  ASSERT_TRUE(index_text.ok());
  nlohmann::json index = nlohmann::json::parse(index_text.value());
  ASSERT_EQ(index["prompts"].size(), 4u);
  for (const auto& p : index["prompts"]) {
    const std::string name = p["name"].get<std::string>();
    SCOPED_TRACE(name);
    const TensorView* ids = f->find(name + ".input_ids");
    ASSERT_NE(ids, nullptr);
    EXPECT_EQ(ids->dtype, DType::kI64);
    EXPECT_EQ(ids->to_i64(), p["input_ids"].get<std::vector<int64_t>>());
    const TensorView* logits = f->find(name + ".logits_last8");
    ASSERT_NE(logits, nullptr);
    EXPECT_EQ(logits->dtype, DType::kF32);
    EXPECT_EQ(logits->shape, (std::vector<int64_t>{8, 8192}));
    std::vector<float> l = logits->to_f32();
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
    const TensorView* greedy = f->find(name + ".greedy_ids");
    ASSERT_NE(greedy, nullptr);
    EXPECT_EQ(greedy->shape, (std::vector<int64_t>{32}));
    // The greedy first token is the argmax of the last logits row.
    size_t best = 0;
    for (size_t i = 1; i < 8192; ++i) {
      if (l[7 * 8192 + i] > l[7 * 8192 + best]) best = i;
    }
    EXPECT_EQ(static_cast<int64_t>(best), greedy->to_i64()[0]);
  }
}

TEST(TinyModel, ReferenceRotationFileMetadata) {
  Result<SafetensorsFile> f =
      SafetensorsFile::open(std::string(kModel) + "/golden/oscar_rotations_reference.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  Result<ModelConfig> config = ModelConfig::load(kModel);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(f->metadata().at("format"), "oscar-rotations");
  EXPECT_EQ(f->metadata().at("model_config_sha256"), config->sha256);
  const TensorView* r = f->find("layers.0.k.rotation");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 128, 128}));
}

}  // namespace
}  // namespace oscar::format
