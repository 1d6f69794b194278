// The OSCAR rotation file (OSCAR.md §7): reading, validating and writing the per-(layer, KV head)
// rotations R = U·H·P_br, eigenvalues and clip ratios that `oscar calibrate` produces.
//
// Goals: one safetensors file, mmap-read and copied once into a RotationSet; every check that
// protects a run from a wrong file (format tag, version, model fingerprint, head_dim / n_layers /
// n_kv_heads, tensor names, shapes and dtypes, finite values, orthogonality), each failure a
// Status whose message names the file, the tensor and both values. Non-goals: reading the
// published RotationZoo torch files (quant/rotation_zoo.h converts them into this format);
// choosing or applying rotations.
//
// Layout, for each layer l and kind c in {k, v}:
//   layers.{l}.{c}.rotation     F32 [n_kv_heads, d, d]  (or [d, d]: one per layer, broadcast)
//   layers.{l}.{c}.eigenvalues  F32 [n_kv_heads, d]     (or [d], broadcast)
//   layers.{l}.{c}.clip         F32 [n_kv_heads]        (or [1] / [], broadcast)
// and, optionally (version 2, query-aware key scaling, OSCAR.md §1 "Key scaling"; all layers or
// none):
//   layers.{l}.k.scale          F32 [n_kv_heads, d]     w > 0 per column of U (calib/key_scaling.h)
//   layers.{l}.k.mean           F32 [n_kv_heads, d]     μ_K, subtracted from keys before rotation
// and, optionally (version 3, a mixed-precision bit plan, kv/bit_plan.h; all layers or none):
//   layers.{l}.k.bits           I32 [n_kv_heads]        bits per element of history key rows (1-3)
//   layers.{l}.v.bits           I32 [n_kv_heads]        bits per element of history value rows
// and, optionally (version 4, the statistic `--kv-bits` plans from, kv/bit_plan.h; all layers or
// none):
//   layers.{l}.k.logit_error    F32 [n_kv_heads]        calib::KeyScaling::logit_error (>= 0)
// __metadata__ strings: format = "oscar-rotations", version, head_dim, n_layers, n_kv_heads,
// group_size, value_objective, model_config_sha256, calibration, created_by.
// Layer entries: `n_layers` counts the file's entries l = 0 .. n_layers-1, one per KV-cache layer
// of the model (ModelConfig::kv_layer). A hybrid (Qwen3.5: Gated DeltaNet layers, a KV cache on
// its full-attention layers only) also records which decoder layers they are:
//   model_layers     "3,7,11,15"  entry l serves decoder layer model_layers[l] (ascending)
//   model_n_layers   "16"         the model's decoder layers
// Files without them (every dense model's; writers omit them when entry l is layer l of
// n_layers) mean entries 0 .. n_layers-1 of an n_layers-layer model. Loading compares them with
// the model's (RotationLayers) and refuses a file made for other layers, naming both.
// Versioning: "1" (no key scaling), "2" (with k.scale / k.mean), "3" (with a bit plan) and "4"
// (with k.logit_error) are read; a higher one is Unimplemented (refused), so a reader never
// silently misreads a newer layout. Unknown tensors are refused as well. The writer writes the
// lowest version that holds what the file has, so older readers keep reading files that do not need
// the newer tensors.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/model_config.h"

namespace oscar::quant {

inline constexpr const char* kRotationFileFormat = "oscar-rotations";
inline constexpr int kRotationFileVersion = 4;
// Loading refuses a rotation whose max |RᵀR − I| reaches this.
inline constexpr double kRotationOrthogonalityTol = 1e-3;

// Metadata naming the cache the file was made for, written by `oscar calibrate` and read by
// `--kv-cache auto` (engine/runtime.cpp); files without them mean "oscar" with the runtime's
// windows.
inline constexpr const char* kRecommendedModeKey = "recommended_mode";        // oscar | oscar-lloyd
inline constexpr const char* kRecommendedRecentKey = "recommended_n_recent";  // BF16 recent window

// The layers a rotation file's entries serve: entry l (tensors layers.{l}.*) is the model's KV
// cache layer l, decoder layer model_layers[l] of model_n_layers. A dense model: 0 .. n-1 of n.
struct RotationLayers {
  int model_n_layers = 0;         // decoder layers of the model
  std::vector<int> model_layers;  // [entries] ascending decoder-layer indices

  static RotationLayers dense(int n_layers);  // 0 .. n_layers-1 of n_layers
  int n_entries() const { return static_cast<int>(model_layers.size()); }
  bool is_dense() const;  // entry l is layer l, every layer has one
  // "8 layers (0..7)" or "1 of 4 decoder layers ([3])".
  std::string describe() const;
  bool operator==(const RotationLayers&) const = default;
};
// `model_layers` metadata: "3,7,11" (decimal, comma-separated, no spaces).
std::string format_model_layers(const std::vector<int>& layers);
Result<std::vector<int>> parse_model_layers(const std::string& text);

// Owned, host-side copy of a rotation file. Row-major float everywhere; x' = x R.
struct RotationSet {
  int n_layers = 0;  // entries: the model's KV-cache layers (all its layers if dense)
  // Which decoder layers the entries serve; empty = dense (entry l is layer l of n_layers).
  // Loading fills it; a writer records it when it is not dense (model_layers / model_n_layers).
  RotationLayers layers;
  int n_heads_kv = 0;
  int head_dim = 0;
  int group_size = 0;
  std::vector<float> k_rot, v_rot;    // [n_layers, n_heads_kv, head_dim, head_dim]
  std::vector<float> k_eig, v_eig;    // [n_layers, n_heads_kv, head_dim], descending
  std::vector<float> k_clip, v_clip;  // [n_layers, n_heads_kv], ρ (>= 1 means no clipping)
  // Query-aware key scaling; both empty when the file has none.
  std::vector<float> k_scale;  // [n_layers, n_heads_kv, head_dim] w per column of U, > 0
  std::vector<float> k_mean;   // [n_layers, n_heads_kv, head_dim] μ_K (key basis, pre-rotation)
  // Mixed-precision bit plan; both empty when the file has none (every history row INT2).
  std::vector<int8_t> k_bits, v_bits;  // [n_layers, n_heads_kv], each 1, 2 or 3
  // Calibration's expected squared logit error of each head's keys per unit of quantization
  // noise (calib::KeyScaling::logit_error); empty when the file has none (written before v4).
  std::vector<float> k_logit_error;             // [n_layers, n_heads_kv]
  std::map<std::string, std::string> metadata;  // every __metadata__ string, as read

  // Pointers into the arrays above. Preconditions (checked): layer, head in range.
  const float* k_rotation(int layer, int head) const;  // [head_dim, head_dim]
  const float* v_rotation(int layer, int head) const;  // [head_dim, head_dim]
  float k_clip_ratio(int layer, int head) const;
  float v_clip_ratio(int layer, int head) const;
  bool has_key_scaling() const { return !k_scale.empty(); }
  bool has_bit_plan() const { return !k_bits.empty(); }
  bool has_logit_error() const { return !k_logit_error.empty(); }
  // tr C_S of each (layer, head): the sum of the value eigenvalues (negatives as 0), the energy
  // of the values attention reads (calib/bit_plan.h). [n_layers * n_heads_kv].
  std::vector<double> value_energy() const;
  // What the cache applies to keys (k' = (k − μ_K)·key_transform) and to queries
  // (q' = q·query_transform): R itself without key scaling, else quant::scaled_rotation.
  std::vector<float> key_transform(int layer, int head) const;    // [head_dim, head_dim]
  std::vector<float> query_transform(int layer, int head) const;  // [head_dim, head_dim]
};

// Reads and validates a rotation file against the model it will serve. `expected_config_sha256`
// is the SHA-256 (lowercase hex) of the model's config.json; a mismatch is InvalidArgument naming
// both hashes. An empty `expected_config_sha256` skips that one check (inspection tools only).
// `n_layers` is the model's layer count (a dense model, RotationLayers::dense).
Result<RotationSet> load_rotation_file(const std::string& path,
                                       const std::string& expected_config_sha256, int n_layers,
                                       int n_heads_kv, int head_dim);
// The same for a model whose KV-cache layers are `layers` (a hybrid: its full-attention layers).
// A file whose entries serve other layers (n_layers, model_layers, model_n_layers) is
// InvalidArgument naming both sets of layers.
Result<RotationSet> load_rotation_file(const std::string& path,
                                       const std::string& expected_config_sha256,
                                       const RotationLayers& layers, int n_heads_kv, int head_dim);
// The layers a model's rotation file serves (ModelConfig::kv_layer), and the file loaded for it
// (config.sha256, n_heads_kv, head_dim checked).
RotationLayers rotation_layers(const format::ModelConfig& config);
Result<RotationSet> load_rotation_file(const std::string& path, const format::ModelConfig& config);

// Writes `set` (shapes checked against its sizes) with per-head tensors. Metadata: everything
// in set.metadata, with format, version, head_dim, n_layers, n_kv_heads and group_size set from
// the struct, and model_layers / model_n_layers from set.layers when it is set and not dense
// (its entries must number n_layers, ascending, below model_n_layers); set.metadata must hold a
// non-empty "model_config_sha256".
Status write_rotation_file(const std::string& path, const RotationSet& set);

}  // namespace oscar::quant
