// The OSCAR release's published rotations ("RotationZoo", torch `.pt` files) read with the
// restricted reader of format/torch_file.h, validated, and converted into oscar's own rotation
// file (quant/rotation_file.h, OSCAR.md §7). The file format and the fixtures are specified in
// docs/formats/rotationzoo.md and tests/data/rotationzoo/README.md.
//
// Goals: accept the release's three versions and refuse, by name, anything that would make a
// run silently wrong.
//   V1 (format_version 1): per layer {layer_id, rotation f32 [d, d], eigenvalues f32 [d]}; one
//      matrix per layer, broadcast to every KV head.
//   V2 (format_version 2, detected by rotation.dim() == 3 as the release does): rotation
//      f32 [H_kv, d, d] per KV head, no eigenvalues.
//   V3 (format_version 3, "OSCAR-2"): rotation [H, d, d] (or [d, d] with source_grouping
//      "layer"), eigenvalues, and optionally q_rotation (K) / k_mean (K) / o_rotation (V). The
//      runtime equations are k' = (k − μ)·R_k, q' = q·Q, v' = v·R_v, o = o'·Oᵀ with Q·R_kᵀ = I
//      and R_v·Oᵀ = I.
// Checks: format_version in {1, 2, 3}; every wanted layer present (extra layers are ignored, as
// the release does); layer_id equal to its key; shapes [d, d] or [n_kv_heads, d, d], the same in
// every layer; every value finite; max(|RᵀR − I|, |RRᵀ − I|) < kRotationOrthogonalityTol where the
// version promises orthogonality (V1, V2, V3 with transform.orthogonal true); for V3 companions
// max|Q·R_kᵀ − I| and max|R_v·Oᵀ − I| < kZooIdentityTol; a companion or k_mean on all wanted
// layers or none.
// Conversion into oscar: rotations copied bit for bit (oscar and the release both apply x' = x·R
// to row vectors); eigenvalues reversed from eigh's ascending order to oscar's descending one
// (V2 has none: zeros, said in the metadata); clip ratios, group size, windows and quantizer from
// ImportOptions (the release's defaults). V3: k_mean alone is oscar's key centring (scale 1);
// a non-orthogonal key pair (R_k, Q) is taken when it is exactly oscar's query-aware key scaling,
// R_k = U·W·H·P_br and Q = U·W⁻¹·H·P_br with U orthogonal and W diagonal > 0 (OSCAR.md §1, "Key
// scaling"), and refused otherwise; a non-orthogonal value pair (R_v, O ≠ R_v) is refused,
// because oscar folds an orthogonal R_v and its transpose into v_proj / o_proj (OSCAR.md §3).
// Non-goals: GLM/MLA latent rotations (a different schema), writing `.pt` files.
// Versioning: format_version 1-3 as read in the release at the commits the spec names; another
// value is refused.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "quant/rotation_file.h"

namespace oscar::quant {

// Bound on the V3 identities Q·R_kᵀ = I and R_v·Oᵀ = I (max abs, fp64 products of the fp32
// files). The release's fitter asserts 1e-6 in fp64 before rounding to fp32; the fixtures show
// 2.9e-8 / 3.7e-8 after rounding.
inline constexpr double kZooIdentityTol = 1e-5;
// Bound on oscar's key-scaling form for a V3 key pair: the off-diagonal of (R_k·Bᵀ)ᵀ(R_k·Bᵀ),
// relative to its diagonal, and |Q·Bᵀ − U·W⁻¹| relative to max|U·W⁻¹| (B = H·P_br).
inline constexpr double kZooKeyScalingTol = 1e-4;

enum class ZooKind { kKey, kValue };

// One release file, read and checked against the layers and head shape it must serve.
struct ZooFile {
  std::string path;
  std::string sha256;       // of the whole file
  std::string prefix;       // archive folder (the file's stem when it was saved)
  ZooKind kind = ZooKind::kKey;
  int format_version = 0;   // 1, 2 or 3
  std::string objective;    // "qqt_r_h_pbr", "sst_r_h_pbr", "hadamard", "cov_eig_hadamard_perhead", ...
  std::string source_grouping;  // "layer", "per_kv_head", "head" ("" when absent)
  std::string transform;    // V3: "key=flat centered=true orthogonal=false"; "" otherwise
  bool orthogonal = true;   // what the version promises (V3: transform.orthogonal)
  std::string calibration;  // the calibration block, "key=value; ..." ("" when absent)
  std::vector<int> layer_ids;  // the wanted ids, in order; index i below is layer_ids[i]
  int n_heads = 1;          // heads per layer in the file: 1 (one matrix per layer) or n_kv_heads
  int head_dim = 0;
  std::vector<float> rotation;     // [n_layers, n_heads, d, d]
  std::vector<float> eigenvalues;  // [n_layers, n_heads, d] as stored (ascending); empty if none
  std::vector<float> companion;    // q_rotation (K) or o_rotation (V), [n_layers, n_heads, d, d]; or empty
  std::vector<float> k_mean;       // K only: [n_layers, n_heads, d]; or empty
  double orthogonality_error = 0;  // max over layers and heads (0 when not checked: V3 non-orth.)
  double identity_error = 0;       // V3 with a companion: max|Q·R_kᵀ − I| or max|R_v·Oᵀ − I|

  const float* rotation_at(size_t layer, int head) const;  // [d, d]
  const float* companion_at(size_t layer, int head) const; // [d, d]; precondition: has one
  std::string describe() const;  // "V1 objective qqt_r_h_pbr, one matrix per layer, 8 layers"
};

// Reads `path` as a release file of `kind` for layers `layer_ids` (global decoder-layer indices,
// in order; hybrid models list only their attention layers) of a model with n_heads_kv KV heads
// of head_dim. Every failure names the file and, where one is at fault, the layer.
Result<ZooFile> read_zoo_file(const std::string& path, ZooKind kind,
                              const std::vector<int>& layer_ids, int n_heads_kv, int head_dim);
// The same on bytes held in memory (fuzzer, tests); `label` stands for the path.
Result<ZooFile> parse_zoo_file(std::span<const uint8_t> bytes, const std::string& label,
                               ZooKind kind, const std::vector<int>& layer_ids, int n_heads_kv,
                               int head_dim);

// How the imported file configures the cache: the release's defaults (OSCAR.md §1, §2, §4).
struct ZooImportOptions {
  float k_clip = 0.96f;
  float v_clip = 0.92f;
  int group_size = 128;
  int n_sink = 64;           // recorded (the runtime's --n-sink applies; its default is 64 too)
  int n_recent = 256;        // written as recommended_n_recent
  std::string quantizer = "uniform";  // uniform -> recommended_mode oscar; lloyd -> oscar-lloyd
};

// Converts a checked K/V pair (same layers, same head_dim) into oscar's RotationSet for a model
// with n_heads_kv KV heads, its config.json hashing to `model_config_sha256`; metadata records
// the sources (paths, sha256, versions, objectives), the conversion and the cache configuration,
// plus recommended_mode / recommended_n_recent as `oscar calibrate` writes them.
Result<RotationSet> convert_zoo_pair(const ZooFile& k, const ZooFile& v, int n_heads_kv,
                                     const std::string& model_config_sha256,
                                     const ZooImportOptions& options);

}  // namespace oscar::quant
