// Importing the OSCAR release's RotationZoo files (quant/rotation_zoo.h): every fixture of
// tests/data/rotationzoo/manifest.json gives exactly its expected result.
//   V1/V2: values bit-exact against the source (models/tiny-qwen3/oscar_rotations.safetensors),
//          eigenvalues reversed to oscar's descending order, orthogonality errors as the manifest
//          states them (fp64, max of |RᵀR − I| and |RRᵀ − I|).
//   V3:    q_rotation·rotationᵀ = I and rotation·o_rotationᵀ = I within kZooIdentityTol (1e-5;
//          the manifest's values are 2.9e-8 / 3.7e-8), non-orthogonal rotations accepted, k_mean
//          bit-exact; the key pair maps onto oscar's key scaling (or is refused by name), the
//          non-orthogonal value pair is refused by name.
//   Invalid files: refused, each with the cause the manifest names.
// A converted pair is written, reloaded through load_rotation_file (what run/eval/serve use) and
// compared again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/mmap_file.h"
#include "format/model_config.h"
#include "quant/hadamard.h"
#include "quant/rotation.h"
#include "quant/rotation_file.h"
#include "quant/rotation_zoo.h"
#include "../format/torch_test_files.h"

namespace oscar::quant {
namespace {

const std::string kRoot = OSCAR_SOURCE_DIR;
const std::string kZoo = kRoot + "/tests/data/rotationzoo/";
const std::string kV1 = "valid/v1/tiny-qwen3/seq98304_prompt24_group128/";
const std::string kV2 = "valid/v2/tiny-qwen3-2layer/";
const std::string kV3 = "valid/v3/tiny-qwen3-1layer/outaware/";
constexpr int kH = 2, kD = 128;
constexpr size_t kDD = static_cast<size_t>(kD) * kD;

const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    auto text = read_text_file(kZoo + "manifest.json");
    EXPECT_TRUE(text.ok());
    return nlohmann::json::parse(text.value());
  }();
  return m;
}

// The source every fixture matrix was taken from.
const RotationSet& source() {
  static const RotationSet s = [] {
    auto r = load_rotation_file(kRoot + "/models/tiny-qwen3/oscar_rotations.safetensors", "", 8, kH, kD);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }();
  return s;
}

std::vector<int> range(int n) {
  std::vector<int> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
  return ids;
}

Result<ZooFile> read(const std::string& name, ZooKind kind, const std::vector<int>& ids,
                     int heads = kH, int d = kD) {
  return read_zoo_file(kZoo + name, kind, ids, heads, d);
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

void expect_error(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("oscar_zoo_" + std::to_string(getpid()) + "_" + name)).string();
}

TEST(RotationZoo, V1PairIsBitExactBroadcastAndReloads) {
  auto k = read(kV1 + "k_rotation_qqt_r_h_pbr.pt", ZooKind::kKey, range(8));
  auto v = read(kV1 + "v_rotation_sst_r_h_pbr.pt", ZooKind::kValue, range(8));
  ASSERT_TRUE(k.ok()) << k.status().message();
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(k->format_version, 1);
  EXPECT_EQ(k->objective, "qqt_r_h_pbr");
  EXPECT_EQ(v->objective, "sst_r_h_pbr");
  EXPECT_EQ(k->n_heads, 1);
  EXPECT_NEAR(k->orthogonality_error, manifest()[kV1 + "k_rotation_qqt_r_h_pbr.pt"]["orth_err"].get<double>(), 1e-12);
  EXPECT_NEAR(v->orthogonality_error, manifest()[kV1 + "v_rotation_sst_r_h_pbr.pt"]["orth_err"].get<double>(), 1e-12);
  EXPECT_EQ(k->sha256, manifest()[kV1 + "k_rotation_qqt_r_h_pbr.pt"]["sha256"].get<std::string>());
  const RotationSet& src = source();
  for (int l = 0; l < 8; ++l) {
    EXPECT_TRUE(same_bits(k->rotation_at(l, 0), src.k_rotation(l, 0), kDD)) << l;
    EXPECT_TRUE(same_bits(v->rotation_at(l, 0), src.v_rotation(l, 0), kDD)) << l;
  }
  auto set = convert_zoo_pair(*k, *v, kH, "cafe", ZooImportOptions{});
  ASSERT_TRUE(set.ok()) << set.status().message();
  for (int l = 0; l < 8; ++l)
    for (int h = 0; h < kH; ++h) {
      // Broadcast: both heads carry head 0 of the source, and so do the eigenvalues (reversed
      // in the file, reversed back here).
      EXPECT_TRUE(same_bits(set->k_rotation(l, h), src.k_rotation(l, 0), kDD)) << l << " " << h;
      EXPECT_TRUE(same_bits(set->v_rotation(l, h), src.v_rotation(l, 0), kDD)) << l << " " << h;
      EXPECT_TRUE(same_bits(set->k_eig.data() + (l * kH + h) * kD, src.k_eig.data() + l * kH * kD, kD));
      EXPECT_TRUE(same_bits(set->v_eig.data() + (l * kH + h) * kD, src.v_eig.data() + l * kH * kD, kD));
      EXPECT_EQ(set->k_clip_ratio(l, h), 0.96f);
      EXPECT_EQ(set->v_clip_ratio(l, h), 0.92f);
    }
  EXPECT_FALSE(set->has_key_scaling());
  EXPECT_FALSE(set->has_bit_plan());
  EXPECT_EQ(set->metadata.at("recommended_mode"), "oscar");
  EXPECT_EQ(set->metadata.at("recommended_n_recent"), "256");
  EXPECT_EQ(set->metadata.at("source_k_sha256"), k->sha256);
  EXPECT_EQ(set->metadata.at("source_v_archive"), "v_rotation_sst_r_h_pbr");
  EXPECT_EQ(set->metadata.at("model_config_sha256"), "cafe");

  const std::string out = temp_path("v1.safetensors");
  ASSERT_TRUE(write_rotation_file(out, set.value()).ok());
  auto back = load_rotation_file(out, "cafe", 8, kH, kD);
  std::filesystem::remove(out);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->k_rot, set->k_rot);
  EXPECT_EQ(back->v_rot, set->v_rot);
  EXPECT_EQ(back->metadata.at("version"), "1");
  EXPECT_EQ(back->metadata.at("source_v_sha256"), v->sha256);
}

TEST(RotationZoo, ImportOptionsReachTheFile) {
  auto k = read(kV1 + "k_rotation_qqt_r_h_pbr.pt", ZooKind::kKey, range(8));
  auto v = read(kV1 + "v_rotation_sst_r_h_pbr.pt", ZooKind::kValue, range(8));
  ASSERT_TRUE(k.ok() && v.ok());
  ZooImportOptions o;
  o.k_clip = 0.9f;
  o.v_clip = 1.0f;
  o.group_size = 64;
  o.n_recent = 384;
  o.quantizer = "lloyd";
  auto set = convert_zoo_pair(*k, *v, kH, "x", o);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->group_size, 64);
  EXPECT_EQ(set->k_clip_ratio(3, 1), 0.9f);
  EXPECT_EQ(set->v_clip_ratio(3, 1), 1.0f);
  EXPECT_EQ(set->metadata.at("recommended_mode"), "oscar-lloyd");
  EXPECT_EQ(set->metadata.at("recommended_n_recent"), "384");
  o.quantizer = "kivi";
  expect_error(convert_zoo_pair(*k, *v, kH, "x", o).status(), "quantizer 'kivi'");
  o.quantizer = "uniform";
  o.group_size = 48;
  expect_error(convert_zoo_pair(*k, *v, kH, "x", o).status(), "group size 48");
  expect_error(convert_zoo_pair(*v, *k, kH, "x", ZooImportOptions{}).status(), "swapped");
  // Files passed to the wrong flags: read as the other kind, refused by their objectives.
  auto k_as_v = read(kV1 + "k_rotation_qqt_r_h_pbr.pt", ZooKind::kValue, range(8));
  auto v_as_k = read(kV1 + "v_rotation_sst_r_h_pbr.pt", ZooKind::kKey, range(8));
  ASSERT_TRUE(k_as_v.ok() && v_as_k.ok());
  expect_error(convert_zoo_pair(*v_as_k, *k_as_v, kH, "x", ZooImportOptions{}).status(),
               "look swapped");
}

TEST(RotationZoo, HadamardSharedTensorEveryLayer) {
  const std::string name = "valid/v1/tiny-qwen3/hadamard/k_rotation_hadamard.pt";
  auto k = read(name, ZooKind::kKey, range(8));
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ(k->objective, "hadamard");
  EXPECT_NEAR(k->orthogonality_error, manifest()[name]["orth_err"].get<double>(), 1e-12);
  const std::vector<double> H = hadamard_matrix(kD);
  for (int l = 0; l < 8; ++l) {
    const float* R = k->rotation_at(l, 0);
    for (size_t i = 0; i < kDD; ++i) ASSERT_EQ(R[i], static_cast<float>(H[i])) << l << " " << i;
  }
  for (float e : k->eigenvalues) ASSERT_EQ(e, 1.0f);
}

TEST(RotationZoo, V2PerHeadIsBitExactWithoutEigenvalues) {
  auto k = read(kV2 + "k_rotation_perhead.pt", ZooKind::kKey, {0, 1});
  auto v = read(kV2 + "v_rotation_perhead.pt", ZooKind::kValue, {0, 1});
  ASSERT_TRUE(k.ok()) << k.status().message();
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(k->format_version, 2);
  EXPECT_EQ(k->n_heads, kH);  // detected by rotation.dim() == 3
  EXPECT_TRUE(k->eigenvalues.empty());
  EXPECT_NEAR(k->orthogonality_error, manifest()[kV2 + "k_rotation_perhead.pt"]["orth_err"].get<double>(), 1e-12);
  EXPECT_NEAR(v->orthogonality_error, manifest()[kV2 + "v_rotation_perhead.pt"]["orth_err"].get<double>(), 1e-12);
  auto set = convert_zoo_pair(*k, *v, kH, "x", ZooImportOptions{});
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->n_layers, 2);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < kH; ++h) {
      EXPECT_TRUE(same_bits(set->k_rotation(l, h), source().k_rotation(l, h), kDD)) << l << h;
      EXPECT_TRUE(same_bits(set->v_rotation(l, h), source().v_rotation(l, h), kDD)) << l << h;
    }
  for (float e : set->k_eig) ASSERT_EQ(e, 0.0f);
  EXPECT_NE(set->metadata.at("eigenvalues").find("absent in the source"), std::string::npos);
  // A per-head file for a model with another KV-head count is refused, never sliced.
  expect_error(read(kV2 + "k_rotation_perhead.pt", ZooKind::kKey, {0, 1}, 4).status(),
               "layer 0 rotation shape [2, 128, 128], expected [128, 128] or [4, 128, 128]");
  // Only the layers asked for: layer 2 is missing from a 2-layer file.
  expect_error(read(kV2 + "k_rotation_perhead.pt", ZooKind::kKey, range(8)).status(),
               "missing layer 2");
}

TEST(RotationZoo, V3IdentitiesAndTheirMappingOntoOscar) {
  const std::string kname = kV3 + "k_rotation_oscar2_outaware.pt";
  const std::string vname = kV3 + "v_rotation_oscar2_outaware.pt";
  auto k = read(kname, ZooKind::kKey, {0});
  auto v = read(vname, ZooKind::kValue, {0});
  ASSERT_TRUE(k.ok()) << k.status().message();
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(k->format_version, 3);
  EXPECT_FALSE(k->orthogonal);
  EXPECT_FALSE(k->companion.empty());
  EXPECT_EQ(k->eigenvalues.size(), static_cast<size_t>(kH * kD));
  // The identities, within kZooIdentityTol; the manifest's fp64 values.
  EXPECT_LT(k->identity_error, kZooIdentityTol);
  EXPECT_LT(v->identity_error, kZooIdentityTol);
  EXPECT_NEAR(k->identity_error, manifest()[kname]["q_rotation_times_rotation_T_minus_I"].get<double>(), 1e-12);
  EXPECT_NEAR(v->identity_error, manifest()[vname]["rotation_times_o_rotation_T_minus_I"].get<double>(), 1e-12);
  ASSERT_EQ(k->k_mean.size(), static_cast<size_t>(kH * kD));
  EXPECT_TRUE(same_bits(k->k_mean.data(), source().k_mean.data(), kH * kD));
  // Values: rotation·o_rotationᵀ = I with a non-orthogonal rotation is not oscar's folding.
  Status st = convert_zoo_pair(*k, *v, kH, "x", ZooImportOptions{}).status();
  expect_error(st, "o_rotation");
  expect_error(st, "cannot represent");
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
}

TEST(RotationZoo, V3KeyFixtureIsNotOscarsKeyScalingAndIsRefused) {
  // The fixture's rotation = A_h·T_h with a general SPD A_h: A_h is not diagonal in the basis
  // U·H·P_br, so oscar's key scaling (a diagonal there) cannot hold it. Refused by name.
  auto k = read(kV3 + "k_rotation_oscar2_outaware.pt", ZooKind::kKey, {0});
  auto v = read(kV2 + "v_rotation_perhead.pt", ZooKind::kValue, {0});  // an orthogonal V file
  ASSERT_TRUE(k.ok() && v.ok());
  Status st = convert_zoo_pair(*k, *v, kH, "x", ZooImportOptions{}).status();
  expect_error(st, "is not oscar's key scaling");
  expect_error(st, "key=flat");
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
}

// A V3 key pair that is exactly oscar's key scaling (rotation = U·W·H·P_br, q_rotation =
// U·W⁻¹·H·P_br, built from the source's own R, w and μ) maps onto it: what the cache then applies
// to keys and queries equals the file's transforms to fp32 rounding.
TEST(RotationZoo, V3KeyPairInOscarsFormMapsOntoKeyScaling) {
  const RotationSet& src = source();
  ASSERT_TRUE(src.has_key_scaling());
  auto base_k = read(kV3 + "k_rotation_oscar2_outaware.pt", ZooKind::kKey, {0});
  auto v = read(kV2 + "v_rotation_perhead.pt", ZooKind::kValue, {0});
  ASSERT_TRUE(base_k.ok() && v.ok());
  ZooFile k = base_k.value();
  for (int h = 0; h < kH; ++h) {
    const std::vector<float> kt = src.key_transform(0, h), qt = src.query_transform(0, h);
    std::copy(kt.begin(), kt.end(), k.rotation.begin() + h * kDD);
    std::copy(qt.begin(), qt.end(), k.companion.begin() + h * kDD);
  }
  auto set = convert_zoo_pair(k, *v, kH, "x", ZooImportOptions{});
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_TRUE(set->has_key_scaling());
  EXPECT_TRUE(same_bits(set->k_mean.data(), src.k_mean.data(), kH * kD));  // the file's k_mean
  for (int h = 0; h < kH; ++h) {
    const std::vector<float> kt = set->key_transform(0, h), qt = set->query_transform(0, h);
    double ek = 0, eq = 0, mk = 0, ew = 0;
    for (size_t i = 0; i < kDD; ++i) {
      ek = std::max(ek, std::fabs(static_cast<double>(kt[i]) - k.rotation_at(0, h)[i]));
      eq = std::max(eq, std::fabs(static_cast<double>(qt[i]) - k.companion_at(0, h)[i]));
      mk = std::max(mk, std::fabs(static_cast<double>(k.rotation_at(0, h)[i])));
    }
    for (int j = 0; j < kD; ++j)
      ew = std::max(ew, std::fabs(static_cast<double>(set->k_scale[h * kD + j]) / src.k_scale[h * kD + j] - 1));
    EXPECT_LT(ek, 1e-5 * mk) << h;
    EXPECT_LT(eq, 1e-5 * mk) << h;
    EXPECT_LT(ew, 1e-5) << h;  // the recovered W is the source's
    EXPECT_LT(orthogonality_error(set->k_rotation(0, h), kD), 1e-5);
  }
  EXPECT_NE(set->metadata.at("key_scaling").find("full"), std::string::npos);
}

// k_mean with an orthogonal V3 key rotation (the "center" variant) is oscar's centring, W = I.
TEST(RotationZoo, V3CentreIsKeyCentring) {
  auto base_k = read(kV3 + "k_rotation_oscar2_outaware.pt", ZooKind::kKey, {0});
  auto v = read(kV2 + "v_rotation_perhead.pt", ZooKind::kValue, {0});
  ASSERT_TRUE(base_k.ok() && v.ok());
  ZooFile k = base_k.value();
  k.companion.clear();
  for (int h = 0; h < kH; ++h)
    std::copy(source().k_rotation(0, h), source().k_rotation(0, h) + kDD, k.rotation.begin() + h * kDD);
  auto set = convert_zoo_pair(k, *v, kH, "x", ZooImportOptions{});
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_TRUE(set->has_key_scaling());
  for (float w : set->k_scale) ASSERT_EQ(w, 1.0f);
  EXPECT_TRUE(same_bits(set->k_mean.data(), source().k_mean.data(), kH * kD));
  EXPECT_TRUE(same_bits(set->k_rotation(0, 1), source().k_rotation(0, 1), kDD));
}

TEST(RotationZoo, ReaderFixturesThroughTheImporter) {
  // Genuine release file: sparse ids of a hybrid model, [256, 256] shared by all layers.
  const std::vector<int> hybrid = {3, 7, 11, 15, 19, 23, 27, 31};
  const std::string rel = "reader/release_qwen3.5-4B_hadamard_k_rotation.pt";
  auto r = read(rel, ZooKind::kKey, hybrid, 4, 256);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->orthogonality_error, 0.0);
  EXPECT_EQ(r->prefix, "k_rotation_hadamard");
  expect_error(read(rel, ZooKind::kKey, hybrid).status(),
               "layer 3 rotation shape [256, 256], expected [128, 128] or [2, 128, 128]");
  expect_error(read(rel, ZooKind::kKey, range(8), 4, 256).status(), "missing layer 0");
  // Transposed view of one storage: bit-exact.
  auto views = read("reader/v1_calibration_views_2layer.pt", ZooKind::kKey, {0, 1});
  ASSERT_TRUE(views.ok()) << views.status().message();
  for (int l = 0; l < 2; ++l)
    EXPECT_TRUE(same_bits(views->rotation_at(l, 0), source().k_rotation(l, 0), kDD)) << l;
  EXPECT_NE(views->calibration.find("post_rope=True"), std::string::npos) << views->calibration;
  // 300 layers of head_dim 4.
  auto many = read("reader/v1_300layers_hd4.pt", ZooKind::kKey, range(300), 1, 4);
  ASSERT_TRUE(many.ok()) << many.status().message();
  EXPECT_EQ(many->eigenvalues[279 * 4], 1.0f);
  EXPECT_EQ(many->eigenvalues[280 * 4], 2.0f);
}

// Every fixture in the manifest has a case here, with the ids it is meant for.
TEST(RotationZoo, EveryManifestFixtureHasItsExpectedResult) {
  struct Case {
    ZooKind kind;
    std::vector<int> ids;
    int heads, d;
    std::vector<std::string> needles;  // empty: must be accepted
  };
  const std::map<std::string, Case> cases = {
      {kV1 + "k_rotation_qqt_r_h_pbr.pt", {ZooKind::kKey, range(8), kH, kD, {}}},
      {kV1 + "v_rotation_sst_r_h_pbr.pt", {ZooKind::kValue, range(8), kH, kD, {}}},
      {"valid/v1/tiny-qwen3/hadamard/k_rotation_hadamard.pt", {ZooKind::kKey, range(8), kH, kD, {}}},
      {kV2 + "k_rotation_perhead.pt", {ZooKind::kKey, {0, 1}, kH, kD, {}}},
      {kV2 + "v_rotation_perhead.pt", {ZooKind::kValue, {0, 1}, kH, kD, {}}},
      {kV3 + "k_rotation_oscar2_outaware.pt", {ZooKind::kKey, {0}, kH, kD, {}}},
      {kV3 + "v_rotation_oscar2_outaware.pt", {ZooKind::kValue, {0}, kH, kD, {}}},
      {"reader/release_qwen3.5-4B_hadamard_k_rotation.pt",
       {ZooKind::kKey, {3, 7, 11, 15, 19, 23, 27, 31}, 4, 256, {}}},
      {"reader/v1_calibration_views_2layer.pt", {ZooKind::kKey, {0, 1}, kH, kD, {}}},
      {"reader/v1_300layers_hd4.pt", {ZooKind::kKey, range(300), 1, 4, {}}},
      {"reader/legacy_nonzip.pt", {ZooKind::kKey, {0}, kH, kD, {"legacy (non-zip) torch serialization"}}},
      {"invalid/truncated.pt", {ZooKind::kKey, range(8), kH, kD, {"truncated", "no end-of-central-directory record"}}},
      {"invalid/global_os_system.pt", {ZooKind::kKey, {0}, kH, kD, {"disallowed global os.system (GLOBAL opcode)"}}},
      {"invalid/stack_global_posix_system.pt",
       {ZooKind::kKey, {0}, kH, kD, {"disallowed global posix.system (STACK_GLOBAL opcode)"}}},
      {"invalid/missing_storage_record.pt",
       {ZooKind::kKey, {0}, kH, kD, {"storage record data/0 referenced by the pickle but absent"}}},
      {"invalid/short_storage_record.pt",
       {ZooKind::kKey, {0}, kH, kD, {"storage data/0 has 40 bytes, the pickle needs 16 float32 (64 bytes)"}}},
      {"invalid/wrong_shape_64.pt",
       {ZooKind::kKey, {0}, kH, kD, {"layer 0 rotation shape [64, 64], expected [128, 128] or [2, 128, 128]"}}},
      {"invalid/nan_rotation.pt", {ZooKind::kKey, {0}, kH, kD, {"layer 0 rotation has a non-finite value at [3, 5]"}}},
      {"invalid/non_orthogonal.pt",
       {ZooKind::kKey, {0}, kH, kD, {"layer 0 rotation not orthogonal", "max|RᵀR − I| = 1.25"}}},
      {"invalid/missing_layer_5.pt", {ZooKind::kKey, range(8), kH, kD, {"missing layer 5"}}},
      {"invalid/v3_k_mean_partial.pt",
       {ZooKind::kKey, {0, 1}, kH, kD, {"k_mean present on 1 of 2 layers; must be on all or none"}}},
  };
  std::set<std::string> seen;
  for (const auto& [name, entry] : manifest().items()) {
    if (name.empty() || name[0] == '_') continue;
    seen.insert(name);
    auto it = cases.find(name);
    ASSERT_NE(it, cases.end()) << "fixture without a test case: " << name;
    const Case& c = it->second;
    auto z = read(name, c.kind, c.ids, c.heads, c.d);
    if (c.needles.empty()) {
      EXPECT_TRUE(z.ok()) << name << ": " << z.status().message();
      EXPECT_TRUE(entry.contains("expect_error") == false) << name;
    } else {
      ASSERT_FALSE(z.ok()) << name << " was accepted";
      EXPECT_TRUE(entry.contains("expect_error")) << name;
      for (const std::string& n : c.needles) expect_error(z.status(), n);
      expect_error(z.status(), name);  // names the file
    }
  }
  EXPECT_EQ(seen.size(), cases.size());
}

// ---- Hand-built release files (d = 2): the checks no fixture reaches --------------------------

// {'format_version': V, 'objective': 'qqt_r_h_pbr', 'layers': {<keys[i]>: {'layer_id': ids[i],
// 'rotation': <tensor of storage "0", shape `size`>, <extra>}}}; every layer views storage "0".
std::vector<uint8_t> release_file(const std::string& version, const std::vector<std::string>& keys,
                                  const std::vector<int>& ids, const std::string& size,
                                  const std::string& stride, int numel,
                                  const std::vector<float>& values, const std::string& extra = "") {
  using namespace format;
  std::string layers = "}(";
  for (size_t i = 0; i < keys.size(); ++i)
    layers += keys[i] + "}(" + str("layer_id") + i1(ids[i]) + str("rotation") +
              tensor_pkl("0", numel, 0, size, stride) + extra + "u";
  layers += "u";
  const std::string pkl = kProto + "}(" + str("format_version") + version + str("objective") +
                          str("qqt_r_h_pbr") + str("layers") + layers + "u.";
  return torch_zip(pkl, {{"0", floats(values)}});
}
const std::string kSize2 = format::i1(2) + format::i1(2) + "\x86";
const std::string kStride2 = format::i1(2) + format::i1(1) + "\x86";
const std::vector<float> kSwap = {0, 1, 1, 0};  // orthogonal [2, 2]

Result<ZooFile> parse(const std::vector<uint8_t>& b, const std::vector<int>& ids, int heads = 1) {
  return parse_zoo_file(b, "mem.pt", ZooKind::kKey, ids, heads, 2);
}

TEST(RotationZooSynthetic, LayerKeysAndVersions) {
  using format::i1;
  using format::str;
  auto ok = parse(release_file(i1(1), {i1(0), i1(1)}, {0, 1}, kSize2, kStride2, 4, kSwap), {0, 1});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->rotation, (std::vector<float>{0, 1, 1, 0, 0, 1, 1, 0}));
  // Decimal str keys, which the release also accepts.
  EXPECT_TRUE(parse(release_file(i1(1), {str("0"), str("1")}, {0, 1}, kSize2, kStride2, 4, kSwap), {0, 1}).ok());
  expect_error(parse(release_file(i1(1), {i1(0), str("0")}, {0, 0}, kSize2, kStride2, 4, kSwap), {0}).status(),
               "layer 0 appears twice");
  expect_error(parse(release_file(i1(1), {str("x")}, {0}, kSize2, kStride2, 4, kSwap), {0}).status(),
               "layers has a key x of type str");
  expect_error(parse(release_file(i1(4), {i1(0)}, {0}, kSize2, kStride2, 4, kSwap), {0}).status(),
               "format_version 4 is not supported");
  expect_error(parse(release_file(str("1"), {i1(0)}, {0}, kSize2, kStride2, 4, kSwap), {0}).status(),
               "no int format_version");
  expect_error(parse(release_file(i1(1), {i1(0)}, {3}, kSize2, kStride2, 4, kSwap), {0}).status(),
               "layer 0: layer_id is 3");
  // A per-layer key outside the version's schema.
  expect_error(parse(release_file(i1(1), {i1(0)}, {0}, kSize2, kStride2, 4, kSwap,
                                  str("bits") + i1(2)), {0}).status(),
               "unexpected key 'bits' in a format_version 1 K file");
  expect_error(parse(release_file(i1(2), {i1(0)}, {0}, kSize2, kStride2, 4, kSwap,
                                  str("q_rotation") + i1(2)), {0}).status(),
               "unexpected key 'q_rotation' in a format_version 2");
}

TEST(RotationZooSynthetic, HeadAxisMustBeConsistentAndMatchTheModel) {
  using format::i1;
  // Layer 0 per head [2, 2, 2], layer 1 shared [2, 2]: refused.
  const std::string per_head = i1(2) + i1(2) + i1(2) + "\x87";
  const std::string per_head_stride = i1(4) + i1(2) + i1(1) + "\x87";
  const std::vector<float> two = {0, 1, 1, 0, 1, 0, 0, 1};
  using format::kProto;
  using format::str;
  const std::string pkl =
      kProto + "}(" + str("format_version") + i1(2) + str("layers") + "}(" + i1(0) + "}(" +
      str("rotation") + format::tensor_pkl("0", 8, 0, per_head, per_head_stride) + "u" + i1(1) +
      "}(" + str("rotation") + format::tensor_pkl("0", 8, 0, kSize2, kStride2) + "uuu.";
  const std::vector<uint8_t> z = format::torch_zip(pkl, {{"0", format::floats(two)}});
  auto ok = parse(z, {0}, 2);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->n_heads, 2);
  expect_error(parse(z, {0, 1}, 2).status(), "layer 1 rotation shape [2, 2], but layer 0's rotation has a head axis");
  expect_error(parse(z, {0}, 4).status(), "expected [2, 2] or [4, 2, 2]");
}

}  // namespace
}  // namespace oscar::quant
