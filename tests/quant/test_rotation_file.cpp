// Tests of the rotation file (quant/rotation_file.h, OSCAR.md §7) against the golden reference
// file of tiny-qwen3 and on files written here (round trip, broadcast, every refusal).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "format/safetensors.h"
#include "format/sha256.h"
#include "quant/hadamard.h"
#include "quant/rotation.h"
#include "quant/rotation_file.h"

namespace oscar::quant {
namespace {

const std::string kModelDir = std::string(OSCAR_SOURCE_DIR) + "/models/tiny-qwen3";
const std::string kReference = kModelDir + "/golden/oscar_rotations_reference.safetensors";
constexpr int kLayers = 8, kHeads = 2, kDim = 128;

std::string config_sha256() {
  std::ifstream in(kModelDir + "/config.json", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return format::sha256_hex(ss.str());
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "oscar_rot_" + std::to_string(getpid()) + "_" + name;
}

TEST(RotationFile, LoadsTheReferenceFile) {
  Result<RotationSet> r = load_rotation_file(kReference, config_sha256(), kLayers, kHeads, kDim);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const RotationSet& set = *r;
  EXPECT_EQ(set.group_size, 128);
  EXPECT_EQ(set.metadata.at("format"), "oscar-rotations");
  double worst = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) {
      worst = std::max(worst, orthogonality_error(set.k_rotation(l, h), kDim));
      worst = std::max(worst, orthogonality_error(set.v_rotation(l, h), kDim));
      for (const std::vector<float>* eig : {&set.k_eig, &set.v_eig}) {
        const float* e = eig->data() + (l * kHeads + h) * kDim;
        for (int i = 1; i < kDim; ++i) {
          ASSERT_GE(e[i - 1], e[i]) << "eigenvalues not descending, layer " << l << " head " << h;
        }
        EXPECT_GE(e[kDim - 1], -1e-3f * e[0]) << "covariance eigenvalues are >= 0";
      }
      EXPECT_GT(set.k_clip_ratio(l, h), 0.5f);
      EXPECT_LE(set.k_clip_ratio(l, h), 1.0f);
      EXPECT_GT(set.v_clip_ratio(l, h), 0.5f);
      EXPECT_LE(set.v_clip_ratio(l, h), 1.0f);
    }
  }
  std::printf("reference rotation file: max |RᵀR − I| = %.3g\n", worst);
  EXPECT_LT(worst, 1e-7);  // the golden README states 1.7e-8
}

TEST(RotationFile, RefusesAMismatchedModel) {
  const std::string wrong(64, 'a');
  Result<RotationSet> r = load_rotation_file(kReference, wrong, kLayers, kHeads, kDim);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(wrong), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(config_sha256()), std::string::npos) << r.status().message();

  r = load_rotation_file(kReference, config_sha256(), kLayers, kHeads, 64);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("head_dim 128 != model 64"), std::string::npos)
      << r.status().message();
  r = load_rotation_file(kReference, config_sha256(), 4, kHeads, kDim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("n_layers 8 != model 4"), std::string::npos);
  r = load_rotation_file(kReference, config_sha256(), kLayers, 4, kDim);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("n_kv_heads 2 != model 4"), std::string::npos);
  r = load_rotation_file(kModelDir + "/no_such_file.safetensors", "", kLayers, kHeads, kDim);
  EXPECT_FALSE(r.ok());
}

// A small synthetic set: random orthogonal U composed with H·P_br, per head.
RotationSet make_set(int n_layers, int n_heads, int d, uint32_t seed) {
  RotationSet set;
  set.n_layers = n_layers;
  set.n_heads_kv = n_heads;
  set.head_dim = d;
  set.group_size = 32;
  set.metadata["model_config_sha256"] = "abc123";
  set.metadata["calibration"] = "synthetic test";
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  for (int i = 0; i < n_layers * n_heads * 2; ++i) {
    std::vector<double> u(d * d);
    for (auto& v : u) v = normal(rng);
    for (int j = 0; j < d; ++j) {  // Gram-Schmidt on columns
      for (int p = 0; p < j; ++p) {
        double dot = 0;
        for (int r = 0; r < d; ++r) dot += u[r * d + j] * u[r * d + p];
        for (int r = 0; r < d; ++r) u[r * d + j] -= dot * u[r * d + p];
      }
      double n = 0;
      for (int r = 0; r < d; ++r) n += u[r * d + j] * u[r * d + j];
      for (int r = 0; r < d; ++r) u[r * d + j] /= std::sqrt(n);
    }
    std::vector<float> rot = compose_rotation(u.data(), d);
    auto& dst = (i % 2 == 0) ? set.k_rot : set.v_rot;
    dst.insert(dst.end(), rot.begin(), rot.end());
  }
  for (int i = 0; i < n_layers * n_heads; ++i) {
    for (int j = 0; j < d; ++j) {
      set.k_eig.push_back(static_cast<float>(d - j));
      set.v_eig.push_back(static_cast<float>(2 * (d - j)));
    }
    set.k_clip.push_back(0.9f + 0.01f * static_cast<float>(i));
    set.v_clip.push_back(0.92f);
  }
  return set;
}

TEST(RotationFile, WriteThenLoadRoundTrips) {
  const RotationSet set = make_set(3, 2, 32, 77);
  const std::string path = temp_path("roundtrip.safetensors");
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  Result<RotationSet> r = load_rotation_file(path, "abc123", 3, 2, 32);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->k_rot, set.k_rot);
  EXPECT_EQ(r->v_rot, set.v_rot);
  EXPECT_EQ(r->k_eig, set.k_eig);
  EXPECT_EQ(r->v_eig, set.v_eig);
  EXPECT_EQ(r->k_clip, set.k_clip);
  EXPECT_EQ(r->v_clip, set.v_clip);
  EXPECT_EQ(r->group_size, 32);
  EXPECT_EQ(r->metadata.at("calibration"), "synthetic test");
  EXPECT_EQ(r->metadata.at("version"), "1");
  std::remove(path.c_str());

  RotationSet bad = set;
  bad.metadata.erase("model_config_sha256");
  EXPECT_FALSE(write_rotation_file(path, bad).ok());
  bad = set;
  bad.k_clip.pop_back();
  EXPECT_FALSE(write_rotation_file(path, bad).ok());
}

// Writes a file by hand: one layer, [d, d] rotation etc. (per-layer form), or a custom variant.
Status write_custom(const std::string& path, int d, const std::vector<float>& rot,
                    std::vector<int64_t> rot_shape, std::map<std::string, std::string> meta,
                    bool extra_tensor = false) {
  std::vector<float> eig(d, 1.0f), clip = {0.95f};
  std::vector<format::TensorToWrite> t;
  for (const char* kind : {"k", "v"}) {
    const std::string p = std::string("layers.0.") + kind + ".";
    t.push_back(format::f32_tensor(p + "rotation", rot_shape, rot));
    t.push_back(format::f32_tensor(p + "eigenvalues", {d}, eig));
    t.push_back(format::f32_tensor(p + "clip", {1}, clip));
  }
  if (extra_tensor) t.push_back(format::f32_tensor("layers.1.k.clip", {1}, clip));
  return format::write_safetensors(path, t, meta);
}

std::map<std::string, std::string> good_meta(int d) {
  return {{"format", "oscar-rotations"}, {"version", "1"},       {"head_dim", std::to_string(d)},
          {"n_layers", "1"},             {"n_kv_heads", "4"},    {"group_size", "32"},
          {"model_config_sha256", "ff"}};
}

TEST(RotationFile, PerLayerRotationsBroadcastToHeads) {
  constexpr int d = 32;
  const std::vector<float> hp = hadamard_bitrev_rotation(d);
  const std::string path = temp_path("per_layer.safetensors");
  ASSERT_TRUE(write_custom(path, d, hp, {d, d}, good_meta(d)).ok());
  Result<RotationSet> r = load_rotation_file(path, "ff", 1, 4, d);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(std::vector<float>(r->k_rotation(0, h), r->k_rotation(0, h) + d * d), hp);
    EXPECT_EQ(std::vector<float>(r->v_rotation(0, h), r->v_rotation(0, h) + d * d), hp);
    EXPECT_EQ(r->k_clip_ratio(0, h), 0.95f);
  }
  std::remove(path.c_str());
}

// A copy of the rotation file at `path` with tensor `drop` left out and tensor `replace_name`
// replaced by `replacement` (either may be ""), loaded for a 2-layer, 2-head, d = 32 model:
// "ok", or the load error's message.
std::string load_edited(const std::string& path, const std::string& drop,
                        const std::string& replace_name, format::TensorToWrite replacement = {}) {
  Result<format::SafetensorsFile> f = format::SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok()) return f.status().message();
  std::vector<format::TensorToWrite> kept;
  for (const format::TensorView& t : f->tensors()) {
    if (t.name == drop) continue;
    if (t.name == replace_name) {
      kept.push_back(replacement);
    } else if (t.dtype == format::DType::kI32) {
      std::vector<int32_t> v;
      for (int64_t x : t.to_i64()) v.push_back(static_cast<int32_t>(x));
      kept.push_back(format::i32_tensor(t.name, t.shape, v));
    } else {
      kept.push_back(format::f32_tensor(t.name, t.shape, t.to_f32()));
    }
  }
  const std::string edited = temp_path("edited.safetensors");
  EXPECT_TRUE(format::write_safetensors(edited, kept, f->metadata()).ok());
  Result<RotationSet> e = load_rotation_file(edited, "abc123", 2, 2, 32);
  std::remove(edited.c_str());
  return e.ok() ? std::string("ok") : e.status().message();
}

// Version 2: key scale and mean round trip, the key/query transforms keep dot products, and a
// non-positive scale is refused by name.
TEST(RotationFile, KeyScalingRoundTripsAsVersion2) {
  RotationSet set = make_set(2, 2, 32, 91);
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> uni(0.5f, 2.0f);
  set.k_scale.resize(2 * 2 * 32);
  set.k_mean.resize(2 * 2 * 32);
  for (float& v : set.k_scale) v = uni(rng);
  for (float& v : set.k_mean) v = uni(rng) - 1.25f;
  const std::string path = temp_path("scaled.safetensors");
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  Result<RotationSet> r = load_rotation_file(path, "abc123", 2, 2, 32);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata.at("version"), "2");
  EXPECT_EQ(r->k_scale, set.k_scale);
  EXPECT_EQ(r->k_mean, set.k_mean);
  ASSERT_TRUE(r->has_key_scaling());
  const std::vector<float> mk = r->key_transform(1, 1), mq = r->query_transform(1, 1);
  // M_K·M_Qᵀ = I (to float rounding of transforms with w in [0.5, 2]).
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 32; ++j) {
      double dot = 0;
      for (int c = 0; c < 32; ++c) dot += static_cast<double>(mk[i * 32 + c]) * mq[j * 32 + c];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << " " << j;
    }
  // Without scaling the transforms are R itself.
  const RotationSet plain = make_set(2, 2, 32, 91);
  EXPECT_EQ(plain.key_transform(1, 0), std::vector<float>(plain.k_rotation(1, 0), plain.k_rotation(1, 0) + 32 * 32));
  EXPECT_EQ(plain.query_transform(1, 0), plain.key_transform(1, 0));

  RotationSet bad = set;
  bad.k_scale[40] = 0.0f;
  ASSERT_TRUE(write_rotation_file(path, bad).ok());
  r = load_rotation_file(path, "abc123", 2, 2, 32);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layers.0.k.scale head 1 element 8"), std::string::npos)
      << r.status().message();
  // Key scaling in some layers only: the first missing tensor is named.
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  const std::string partial = load_edited(path, "layers.1.k.scale", "");
  EXPECT_NE(partial.find("'layers.1.k.scale' is missing"), std::string::npos) << partial;
  bad = set;
  bad.k_mean.pop_back();
  EXPECT_FALSE(write_rotation_file(path, bad).ok());
  bad = make_set(2, 2, 32, 91);
  bad.k_mean = set.k_mean;  // a mean without a scale
  EXPECT_FALSE(write_rotation_file(path, bad).ok());
  std::remove(path.c_str());
}

// Version 3: a bit plan (I32 widths per head) round trips; a width outside 1..3, a float tensor
// and a plan in some layers only are refused by name.
TEST(RotationFile, BitPlanRoundTripsAsVersion3) {
  RotationSet set = make_set(2, 2, 32, 93);
  set.k_bits = {2, 2, 2, 3};
  set.v_bits = {1, 2, 2, 2};
  const std::string path = temp_path("planned.safetensors");
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  Result<RotationSet> r = load_rotation_file(path, "abc123", 2, 2, 32);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata.at("version"), "3");
  EXPECT_EQ(r->k_bits, set.k_bits);
  EXPECT_EQ(r->v_bits, set.v_bits);
  EXPECT_FALSE(r->has_key_scaling());

  RotationSet bad = set;
  bad.v_bits[2] = 4;
  EXPECT_FALSE(write_rotation_file(path, bad).ok());
  bad = set;
  bad.k_bits.pop_back();
  EXPECT_FALSE(write_rotation_file(path, bad).ok());

  // Files edited by hand: widths 0, a float tensor, a layer without its plan.
  const std::vector<int32_t> zero = {0, 2};
  EXPECT_NE(load_edited(path, "", "layers.1.v.bits",
                        format::i32_tensor("layers.1.v.bits", {2}, zero))
                .find("layers.1.v.bits head 0 = 0 bits"),
            std::string::npos);
  const std::vector<float> fbits = {2.0f, 3.0f};
  EXPECT_NE(load_edited(path, "", "layers.1.k.bits",
                        format::f32_tensor("layers.1.k.bits", {2}, fbits))
                .find("expected I32 [2]"),
            std::string::npos);
  EXPECT_NE(load_edited(path, "layers.1.k.bits", "").find("'layers.1.k.bits' is missing"),
            std::string::npos);
  std::remove(path.c_str());
}

// Version 4: the per-head key logit error (what --kv-bits plans from) round trips; a negative
// value and a layer without it are refused by name. The value energy is the eigenvalue sum.
TEST(RotationFile, KeyLogitErrorRoundTripsAsVersion4) {
  RotationSet set = make_set(2, 2, 32, 95);
  set.k_bits = {2, 2, 2, 3};
  set.v_bits = {1, 2, 2, 2};
  set.k_logit_error = {0.5f, 1.5f, 0.0f, 7.25f};
  const std::string path = temp_path("stats.safetensors");
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  Result<RotationSet> r = load_rotation_file(path, "abc123", 2, 2, 32);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata.at("version"), "4");
  EXPECT_EQ(r->k_logit_error, set.k_logit_error);
  EXPECT_EQ(r->k_bits, set.k_bits);
  const std::vector<double> e = r->value_energy();
  ASSERT_EQ(e.size(), 4u);
  double want = 0;
  for (int j = 0; j < 32; ++j) want += std::max(0.0, static_cast<double>(set.v_eig[32 + j]));
  EXPECT_DOUBLE_EQ(e[1], want);
  RotationSet bad = set;
  bad.k_logit_error.pop_back();
  EXPECT_FALSE(write_rotation_file(path, bad).ok());
  const std::vector<float> neg = {-1.0f, 2.0f};
  EXPECT_NE(load_edited(path, "", "layers.1.k.logit_error",
                        format::f32_tensor("layers.1.k.logit_error", {2}, neg))
                .find("layers.1.k.logit_error head 0 = -1 must be finite and >= 0"),
            std::string::npos);
  EXPECT_NE(
      load_edited(path, "layers.1.k.logit_error", "").find("'layers.1.k.logit_error' is missing"),
      std::string::npos);
  std::remove(path.c_str());
}

TEST(RotationFile, RefusesBadFiles) {
  constexpr int d = 32;
  const std::vector<float> hp = hadamard_bitrev_rotation(d);
  const std::string path = temp_path("bad.safetensors");
  auto load = [&]() { return load_rotation_file(path, "ff", 1, 4, d); };

  std::vector<float> skewed = hp;
  skewed[5] += 0.01f;  // not orthogonal
  ASSERT_TRUE(write_custom(path, d, skewed, {d, d}, good_meta(d)).ok());
  Result<RotationSet> r = load();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not orthogonal"), std::string::npos) << r.status().message();

  auto meta = good_meta(d);
  meta["format"] = "something-else";
  ASSERT_TRUE(write_custom(path, d, hp, {d, d}, meta).ok());
  r = load();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("something-else"), std::string::npos);

  meta = good_meta(d);
  meta["version"] = "5";
  ASSERT_TRUE(write_custom(path, d, hp, {d, d}, meta).ok());
  r = load();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);

  ASSERT_TRUE(write_custom(path, d, std::vector<float>(2 * d * d, 0.0f), {2, d, d}, good_meta(d)).ok());
  r = load();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shape [2, 32, 32]"), std::string::npos)
      << r.status().message();

  ASSERT_TRUE(write_custom(path, d, hp, {d, d}, good_meta(d), /*extra_tensor=*/true).ok());
  r = load();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unexpected tensor 'layers.1.k.clip'"), std::string::npos)
      << r.status().message();
  std::remove(path.c_str());
}

// A hybrid's file (rotation_file.h, "Layer entries"): entries for decoder layers 1 and 3 of 4
// record model_layers / model_n_layers and load only for a model with the KV cache on exactly
// those layers; a dense file writes neither key and loads as before.
TEST(RotationFile, LayerEntriesOfAHybrid) {
  RotationSet set = make_set(2, 2, 32, 91);
  set.layers.model_n_layers = 4;
  set.layers.model_layers = {1, 3};
  const std::string path = temp_path("hybrid.safetensors");
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  auto file = format::SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->metadata().at("model_layers"), "1,3");
  EXPECT_EQ(file->metadata().at("model_n_layers"), "4");
  EXPECT_EQ(file->metadata().at("n_layers"), "2");

  RotationLayers hybrid;
  hybrid.model_n_layers = 4;
  hybrid.model_layers = {1, 3};
  Result<RotationSet> r = load_rotation_file(path, "abc123", hybrid, 2, 32);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_layers, 2);
  EXPECT_EQ(r->layers, hybrid);
  EXPECT_EQ(r->k_rot, set.k_rot);
  // Rewriting what was read keeps the keys (from r->layers, not the stale metadata copy).
  ASSERT_TRUE(write_rotation_file(path, *r).ok());
  ASSERT_TRUE(load_rotation_file(path, "abc123", hybrid, 2, 32).ok());

  // A dense 2-layer model: same entry count, other layers.
  r = load_rotation_file(path, "abc123", 2, 2, 32);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("serves 2 of 4 decoder layers ([1,3]), but the model has a "
                                      "KV cache on 2 layers (0..1)"),
            std::string::npos)
      << r.status().message();
  // A dense 4-layer model: the count differs.
  r = load_rotation_file(path, "abc123", 4, 2, 32);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("n_layers 2 != model 4"), std::string::npos)
      << r.status().message();
  // Another hybrid (layers 1 and 2 of 4; layers 1 and 3 of 8).
  for (const RotationLayers& other : {RotationLayers{4, {1, 2}}, RotationLayers{8, {1, 3}}}) {
    r = load_rotation_file(path, "abc123", other, 2, 32);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("serves 2 of 4 decoder layers ([1,3])"), std::string::npos)
        << r.status().message();
  }

  // A dense file (no keys) for the hybrid: refused, by its layers.
  set.layers = {};
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  file = format::SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->metadata().count("model_layers"), 0u);
  EXPECT_EQ(file->metadata().count("model_n_layers"), 0u);
  r = load_rotation_file(path, "abc123", hybrid, 2, 32);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("serves 2 layers (0..1), but the model has a KV cache on 2 "
                                      "of 4 decoder layers ([1,3])"),
            std::string::npos)
      << r.status().message();
  r = load_rotation_file(path, "abc123", 2, 2, 32);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->layers.is_dense());
  // Dense layers given explicitly write no keys either (byte-identical files for dense models).
  set.layers = RotationLayers::dense(2);
  ASSERT_TRUE(write_rotation_file(path, set).ok());
  EXPECT_EQ(format::SafetensorsFile::open(path)->metadata().count("model_layers"), 0u);

  // The writer checks the layers it records.
  for (const RotationLayers& bad :
       {RotationLayers{4, {3, 1}}, RotationLayers{4, {1, 4}}, RotationLayers{4, {1}}}) {
    set.layers = bad;
    const Status st = write_rotation_file(path, set);
    EXPECT_FALSE(st.ok()) << format_model_layers(bad.model_layers);
  }
  std::remove(path.c_str());
}

TEST(RotationFile, ModelLayersText) {
  EXPECT_EQ(format_model_layers({3, 7, 11}), "3,7,11");
  auto ok = parse_model_layers("3,7,11");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value(), (std::vector<int>{3, 7, 11}));
  for (const char* bad : {"", "3,", ",3", "3,,7", "7,3", "3,3", "-1", "3 ,7", "a", "3;7"})
    EXPECT_FALSE(parse_model_layers(bad).ok()) << "'" << bad << "'";
}

}  // namespace
}  // namespace oscar::quant
