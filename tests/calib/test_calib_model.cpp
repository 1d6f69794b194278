// Calibration on the embedded tiny-qwen3 (model label): a short run (2 windows × 512 tokens of
// data/calib.txt) must write a rotation file that loads against the model, with orthogonal
// rotations, descending non-negative eigenvalues, clip ratios on the grid, and byte-identical
// output when run twice (determinism, OSCAR.md §6).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "calib/calibrator.h"
#include "format/model_config.h"
#include "quant/rotation.h"
#include "quant/rotation_file.h"

namespace oscar::calib {
namespace {

const std::string kModel = std::string(OSCAR_SOURCE_DIR) + "/models/tiny-qwen3";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CalibrationOptions small_options(ValueObjective vo) {
  CalibrationOptions o;
  o.n_windows = 2;
  o.window_tokens = 512;
  o.prefill_chunk = 256;  // exercise chunked prefill
  o.value_objective = vo;
  o.diag_query_stride = 8;
  o.clip_mode = ClipMode::kSearch;
  o.clip_windows = 2;
  o.clip_queries = 16;
  return o;
}

TEST(CalibrateModel, ShortRunIsValidAndDeterministic) {
  for (ValueObjective vo : {ValueObjective::kFull, ValueObjective::kDiag}) {
    const CalibrationOptions o = small_options(vo);
    std::string bytes[2];
    for (int run = 0; run < 2; ++run) {
      auto r = calibrate_model_dir(kModel, kModel + "/data/calib.txt", o, false);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(r->n_windows, 2);
      EXPECT_EQ(r->n_tokens, 1024);
      std::printf("forward %.2f s, decompose %.2f s, clip search %.2f s\n", r->forward_s,
                  r->decompose_s, r->clip_s);
      const std::string path = ::testing::TempDir() + "calib_model_" + std::to_string(run) + ".safetensors";
      ASSERT_TRUE(quant::write_rotation_file(path, r->rotations).ok());
      bytes[run] = read_all(path);
      auto config = format::ModelConfig::load(kModel);
      ASSERT_TRUE(config.ok());
      auto loaded = quant::load_rotation_file(path, config->sha256, 8, 2, 128);
      ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
      EXPECT_EQ(loaded->metadata.at("created_by"), "oscar calibrate 0.1");
      EXPECT_NE(loaded->metadata.at("calibration").find("calib.txt: 2 x 512 tokens"),
                std::string::npos)
          << loaded->metadata.at("calibration");
      for (int l = 0; l < 8; ++l)
        for (int h = 0; h < 2; ++h) {
          EXPECT_LT(quant::orthogonality_error(loaded->k_rotation(l, h), 128), 1e-6);
          EXPECT_LT(quant::orthogonality_error(loaded->v_rotation(l, h), 128), 1e-6);
          const float* ke = loaded->k_eig.data() + (l * 2 + h) * 128;
          for (int j = 1; j < 128; ++j) EXPECT_GE(ke[j - 1], ke[j]);
          EXPECT_GE(ke[127], -1e-4f * ke[0]);
          EXPECT_GE(loaded->k_clip_ratio(l, h), 0.80f);
          EXPECT_LE(loaded->k_clip_ratio(l, h), 1.00f);
          EXPECT_GE(loaded->v_clip_ratio(l, h), 0.80f);
          EXPECT_LE(loaded->v_clip_ratio(l, h), 1.00f);
        }
      std::remove(path.c_str());
    }
    EXPECT_EQ(bytes[0].size(), bytes[1].size());
    EXPECT_TRUE(bytes[0] == bytes[1]) << "two runs with the same input differ";
  }
}

TEST(CalibrateModel, RefusesDataShorterThanAWindowAndNonExactCache) {
  CalibrationOptions o = small_options(ValueObjective::kFull);
  o.window_tokens = 1 << 20;
  auto r = calibrate_model_dir(kModel, kModel + "/data/calib.txt", o, false);
  EXPECT_FALSE(r.ok());
  o = small_options(ValueObjective::kFull);
  engine::RuntimeOptions ro;
  ro.model_dir = kModel;
  ro.cache_mode = "bf16";
  auto rt = engine::Runtime::create(ro);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  std::vector<int32_t> tokens(2048, 100);
  auto r2 = calibrate(*rt.value(), tokens, o, nullptr);
  EXPECT_EQ(r2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r2.status().to_string().find("exact f32 cache on cpu"), std::string::npos)
      << r2.status().to_string();
  // The device is named like everywhere else (oscar calibrate --device).
  auto r3 = calibrate_model_dir(kModel, kModel + "/data/calib.txt", o, false, "tpu");
  EXPECT_NE(r3.status().to_string().find("unknown device 'tpu'"), std::string::npos)
      << r3.status().to_string();
}

// `--kv-cache auto` follows the file's recommended_mode / recommended_n_recent (written by
// calibrate), keeps an explicit non-default --n-recent, and reads old files (no keys) as "oscar".
TEST(CalibrateModel, AutoFollowsTheRecommendation) {
  auto shipped = quant::load_rotation_file(kModel + "/oscar_rotations.safetensors", "", 8, 2, 128);
  ASSERT_TRUE(shipped.ok()) << shipped.status().to_string();
  EXPECT_EQ(shipped->metadata.at(kRecommendedModeKey), "oscar");
  EXPECT_EQ(shipped->metadata.at(kRecommendedRecentKey), std::to_string(kDefaultRecent));
  struct Case {
    const char* mode;    // recommended_mode, nullptr = key absent (old file)
    const char* recent;  // recommended_n_recent, nullptr = key absent
    int user_recent;     // RuntimeOptions.n_recent
    const char* want_mode;
    int want_recent;
  };
  const int def = engine::RuntimeOptions().n_recent;
  const Case cases[] = {{"oscar", "384", def, "oscar", 384},
                        {"oscar-lloyd", "384", def, "oscar-lloyd", 384},
                        {"oscar", "384", 512, "oscar", 512},
                        {nullptr, nullptr, def, "oscar", engine::kDefaultRecentTokens}};
  const std::string path = ::testing::TempDir() + "auto_rot.safetensors";
  for (const Case& c : cases) {
    quant::RotationSet set = *shipped;
    set.metadata.erase(kRecommendedModeKey);
    set.metadata.erase(kRecommendedRecentKey);
    if (c.mode) set.metadata[kRecommendedModeKey] = c.mode;
    if (c.recent) set.metadata[kRecommendedRecentKey] = c.recent;
    ASSERT_TRUE(quant::write_rotation_file(path, set).ok());
    engine::RuntimeOptions ro;
    ro.model_dir = kModel;
    ro.rotations = path;
    ro.n_recent = c.user_recent;
    auto rt = engine::Runtime::create(ro);
    ASSERT_TRUE(rt.ok()) << rt.status().to_string();
    EXPECT_EQ(rt.value()->options().cache_mode, c.want_mode);
    EXPECT_EQ(rt.value()->spec().regions.n_recent, c.want_recent);
  }
  quant::RotationSet bad = *shipped;
  bad.metadata[kRecommendedModeKey] = "int2-naive";
  ASSERT_TRUE(quant::write_rotation_file(path, bad).ok());
  engine::RuntimeOptions ro;
  ro.model_dir = kModel;
  ro.rotations = path;
  auto rt = engine::Runtime::create(ro);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("not an oscar mode"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace oscar::calib
