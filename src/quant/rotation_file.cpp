// Rotation file reader and writer (see rotation_file.h, OSCAR.md §7).
#include "quant/rotation_file.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <span>

#include "core/check.h"
#include "format/safetensors.h"
#include "quant/rotation.h"

namespace oscar::quant {
namespace {

using format::DType;
using format::SafetensorsFile;
using format::TensorView;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Integer metadata field `key`, required.
Status metadata_int(const SafetensorsFile& file, const char* key, int* out) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    return invalid_argument("rotation file %s: metadata '%s' is missing", file.path().c_str(), key);
  }
  const std::string& v = it->second;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  if (ec != std::errc() || ptr != v.data() + v.size()) {
    return invalid_argument("rotation file %s: metadata '%s' = '%s' is not an integer",
                            file.path().c_str(), key, v.c_str());
  }
  return Status();
}

Status check_int_matches(const SafetensorsFile& file, const char* key, int expected) {
  int v = 0;
  OSCAR_RETURN_IF_ERROR(metadata_int(file, key, &v));
  if (v != expected) {
    return invalid_argument("rotation file %s: %s %d != model %d", file.path().c_str(), key, v,
                            expected);
  }
  return Status();
}

// Copies one per-layer tensor, [n_heads, per_head...] or [per_head...] (broadcast to heads),
// into dst: [n_heads, prod(per_head)] floats. `per_head` is the expected shape of one head;
// for clip it is {} and a [1]-shaped tensor is accepted too.
Status read_per_head(const SafetensorsFile& file, const std::string& name, int n_heads,
                     const std::vector<int64_t>& per_head, float* dst) {
  const TensorView* t = file.find(name);
  if (t == nullptr) {
    return not_found("rotation file %s: tensor '%s' is missing", file.path().c_str(),
                     name.c_str());
  }
  if (t->dtype != DType::kF32) {
    return invalid_argument("rotation file %s: tensor '%s' has dtype %s, expected F32",
                            file.path().c_str(), name.c_str(), format::dtype_name(t->dtype));
  }
  std::vector<int64_t> full = {n_heads};
  full.insert(full.end(), per_head.begin(), per_head.end());
  const bool per_head_shape = t->shape == full;
  const bool broadcast = t->shape == per_head || (per_head.empty() && t->shape == std::vector<int64_t>{1});
  if (!per_head_shape && !broadcast) {
    std::string expected = shape_string(full) + " or " + shape_string(per_head);
    return invalid_argument("rotation file %s: tensor '%s' has shape %s, expected %s",
                            file.path().c_str(), name.c_str(), shape_string(t->shape).c_str(),
                            expected.c_str());
  }
  const std::vector<float> values = t->to_f32();
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return invalid_argument("rotation file %s: tensor '%s' element %zu is not finite",
                              file.path().c_str(), name.c_str(), i);
    }
  }
  size_t head_numel = 1;
  for (int64_t s : per_head) head_numel *= static_cast<size_t>(s);
  for (int h = 0; h < n_heads; ++h) {
    const float* src = values.data() + (per_head_shape ? h * head_numel : 0);
    std::copy(src, src + head_numel, dst + h * head_numel);
  }
  return Status();
}

Status check_size(const char* what, size_t got, size_t expected) {
  if (got != expected) {
    return invalid_argument("write_rotation_file: %s has %zu values, expected %zu", what, got,
                            expected);
  }
  return Status();
}

// The entries' layers as the file records them (rotation_file.h, "Layer entries").
Result<RotationLayers> read_layers(const SafetensorsFile& file) {
  int n = 0;
  OSCAR_RETURN_IF_ERROR(metadata_int(file, "n_layers", &n));
  if (n <= 0)
    return invalid_argument("rotation file %s: n_layers %d must be > 0", file.path().c_str(), n);
  const auto& meta = file.metadata();
  const auto layers = meta.find("model_layers");
  const bool has_total = meta.count("model_n_layers") != 0;
  if (layers == meta.end() && !has_total) return RotationLayers::dense(n);
  if (layers == meta.end() || !has_total)
    return invalid_argument("rotation file %s: metadata model_layers and model_n_layers come "
                            "together (one is missing)", file.path().c_str());
  RotationLayers r;
  OSCAR_RETURN_IF_ERROR(metadata_int(file, "model_n_layers", &r.model_n_layers));
  Result<std::vector<int>> ids = parse_model_layers(layers->second);
  if (!ids.ok()) return ids.status().with_context("rotation file " + file.path());
  r.model_layers = std::move(ids).value();
  if (r.n_entries() != n)
    return invalid_argument("rotation file %s: model_layers '%s' names %d layers, n_layers is %d",
                            file.path().c_str(), layers->second.c_str(), r.n_entries(), n);
  if (r.model_layers.back() >= r.model_n_layers)
    return invalid_argument("rotation file %s: model_layers '%s' reaches past model_n_layers %d",
                            file.path().c_str(), layers->second.c_str(), r.model_n_layers);
  return r;
}

}  // namespace

RotationLayers RotationLayers::dense(int n_layers) {
  RotationLayers r;
  r.model_n_layers = n_layers;
  r.model_layers.resize(static_cast<size_t>(std::max(n_layers, 0)));
  for (int l = 0; l < n_layers; ++l) r.model_layers[static_cast<size_t>(l)] = l;
  return r;
}

bool RotationLayers::is_dense() const { return *this == dense(model_n_layers); }

std::string RotationLayers::describe() const {
  if (is_dense())
    return model_n_layers == 1 ? std::string("1 layer (0)")
                               : str_format("%d layers (0..%d)", model_n_layers, model_n_layers - 1);
  return str_format("%d of %d decoder layers ([%s])", n_entries(), model_n_layers,
                    format_model_layers(model_layers).c_str());
}

std::string format_model_layers(const std::vector<int>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (i > 0) s.push_back(',');
    s.append(std::to_string(layers[i]));
  }
  return s;
}

Result<std::vector<int>> parse_model_layers(const std::string& text) {
  std::vector<int> out;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  while (p < end) {
    int v = -1;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || v < 0 || (!out.empty() && v <= out.back()))
      return invalid_argument("model_layers '%s': expected ascending layer indices separated by "
                              "commas", text.c_str());
    out.push_back(v);
    p = next;
    if (p < end && *p++ != ',')
      return invalid_argument("model_layers '%s': expected ascending layer indices separated by "
                              "commas", text.c_str());
    if (p == end && text.back() == ',')
      return invalid_argument("model_layers '%s': trailing comma", text.c_str());
  }
  if (out.empty()) return invalid_argument("model_layers is empty");
  return out;
}

RotationLayers rotation_layers(const format::ModelConfig& config) {
  RotationLayers r;
  r.model_n_layers = config.n_layers;
  for (int l = 0; l < config.n_layers; ++l)
    if (config.kv_layer.empty() || config.kv_layer[static_cast<size_t>(l)] >= 0)
      r.model_layers.push_back(l);
  return r;
}

Result<RotationSet> load_rotation_file(const std::string& path,
                                       const format::ModelConfig& config) {
  return load_rotation_file(path, config.sha256, rotation_layers(config), config.n_heads_kv,
                            config.head_dim);
}

const float* RotationSet::k_rotation(int layer, int head) const {
  OSCAR_CHECK(layer >= 0 && layer < n_layers && head >= 0 && head < n_heads_kv,
              "layer %d head %d", layer, head);
  return k_rot.data() + (static_cast<size_t>(layer) * n_heads_kv + head) * head_dim * head_dim;
}
const float* RotationSet::v_rotation(int layer, int head) const {
  OSCAR_CHECK(layer >= 0 && layer < n_layers && head >= 0 && head < n_heads_kv,
              "layer %d head %d", layer, head);
  return v_rot.data() + (static_cast<size_t>(layer) * n_heads_kv + head) * head_dim * head_dim;
}
float RotationSet::k_clip_ratio(int layer, int head) const {
  OSCAR_CHECK(layer >= 0 && layer < n_layers && head >= 0 && head < n_heads_kv,
              "layer %d head %d", layer, head);
  return k_clip[static_cast<size_t>(layer) * n_heads_kv + head];
}
float RotationSet::v_clip_ratio(int layer, int head) const {
  OSCAR_CHECK(layer >= 0 && layer < n_layers && head >= 0 && head < n_heads_kv,
              "layer %d head %d", layer, head);
  return v_clip[static_cast<size_t>(layer) * n_heads_kv + head];
}

std::vector<float> RotationSet::key_transform(int layer, int head) const {
  const float* R = k_rotation(layer, head);
  if (!has_key_scaling()) return std::vector<float>(R, R + static_cast<size_t>(head_dim) * head_dim);
  return scaled_rotation(R, k_scale.data() + (static_cast<size_t>(layer) * n_heads_kv + head) * head_dim,
                         head_dim, /*inverse=*/false);
}
std::vector<float> RotationSet::query_transform(int layer, int head) const {
  const float* R = k_rotation(layer, head);
  if (!has_key_scaling()) return std::vector<float>(R, R + static_cast<size_t>(head_dim) * head_dim);
  return scaled_rotation(R, k_scale.data() + (static_cast<size_t>(layer) * n_heads_kv + head) * head_dim,
                         head_dim, /*inverse=*/true);
}

Result<RotationSet> load_rotation_file(const std::string& path,
                                       const std::string& expected_config_sha256, int n_layers,
                                       int n_heads_kv, int head_dim) {
  return load_rotation_file(path, expected_config_sha256, RotationLayers::dense(n_layers),
                            n_heads_kv, head_dim);
}

Result<RotationSet> load_rotation_file(const std::string& path,
                                       const std::string& expected_config_sha256,
                                       const RotationLayers& layers, int n_heads_kv,
                                       int head_dim) {
  const int n_layers = layers.n_entries();
  OSCAR_CHECK(n_layers > 0 && n_heads_kv > 0 && head_dim > 0, "n_layers %d n_heads_kv %d d %d",
              n_layers, n_heads_kv, head_dim);
  OSCAR_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  const auto& meta = file.metadata();

  auto fmt = meta.find("format");
  if (fmt == meta.end() || fmt->second != kRotationFileFormat) {
    return invalid_argument("rotation file %s: metadata format '%s', expected '%s'", path.c_str(),
                            fmt == meta.end() ? "(missing)" : fmt->second.c_str(),
                            kRotationFileFormat);
  }
  int version = 0;
  OSCAR_RETURN_IF_ERROR(metadata_int(file, "version", &version));
  if (version < 1 || version > kRotationFileVersion) {
    return unimplemented("rotation file %s: version %d is not supported (this build reads %d)",
                         path.c_str(), version, kRotationFileVersion);
  }
  OSCAR_RETURN_IF_ERROR(check_int_matches(file, "head_dim", head_dim));
  {  // the entries' layers (rotation_file.h, "Layer entries")
    OSCAR_ASSIGN_OR_RETURN(RotationLayers file_layers, read_layers(file));
    if (file_layers.n_entries() != n_layers)
      return invalid_argument("rotation file %s: n_layers %d != model %d: the file serves %s, "
                              "the model has a KV cache on %s",
                              path.c_str(), file_layers.n_entries(), n_layers,
                              file_layers.describe().c_str(), layers.describe().c_str());
    if (file_layers != layers)
      return invalid_argument("rotation file %s serves %s, but the model has a KV cache on %s",
                              path.c_str(), file_layers.describe().c_str(),
                              layers.describe().c_str());
  }
  OSCAR_RETURN_IF_ERROR(check_int_matches(file, "n_kv_heads", n_heads_kv));
  // The fingerprint after the sizes: a file of another shape is named by the size that differs.
  auto sha = meta.find("model_config_sha256");
  if (!expected_config_sha256.empty()) {
    if (sha == meta.end()) {
      return invalid_argument("rotation file %s: metadata model_config_sha256 is missing; "
                              "cannot check it against the model's config.json (sha256 %s)",
                              path.c_str(), expected_config_sha256.c_str());
    }
    if (sha->second != expected_config_sha256) {
      return invalid_argument("rotation file %s was calibrated for a model whose config.json has "
                              "sha256 %s, but this model's config.json has sha256 %s",
                              path.c_str(), sha->second.c_str(), expected_config_sha256.c_str());
    }
  }

  RotationSet set;
  set.n_layers = n_layers;
  set.layers = layers;
  set.n_heads_kv = n_heads_kv;
  set.head_dim = head_dim;
  OSCAR_RETURN_IF_ERROR(metadata_int(file, "group_size", &set.group_size));
  if (set.group_size <= 0 || head_dim % set.group_size != 0) {
    return invalid_argument("rotation file %s: group_size %d does not divide head_dim %d",
                            path.c_str(), set.group_size, head_dim);
  }
  set.metadata = meta;

  const size_t d = static_cast<size_t>(head_dim);
  const size_t lh = static_cast<size_t>(n_layers) * n_heads_kv;
  set.k_rot.resize(lh * d * d);
  set.v_rot.resize(lh * d * d);
  set.k_eig.resize(lh * d);
  set.v_eig.resize(lh * d);
  set.k_clip.resize(lh);
  set.v_clip.resize(lh);
  std::set<std::string> expected_names;
  for (int l = 0; l < n_layers; ++l) {
    for (const char* kind : {"k", "v"}) {
      const bool is_k = kind[0] == 'k';
      const std::string prefix = "layers." + std::to_string(l) + "." + kind + ".";
      const size_t base = static_cast<size_t>(l) * n_heads_kv;
      float* rot = (is_k ? set.k_rot : set.v_rot).data() + base * d * d;
      float* eig = (is_k ? set.k_eig : set.v_eig).data() + base * d;
      float* clip = (is_k ? set.k_clip : set.v_clip).data() + base;
      OSCAR_RETURN_IF_ERROR(read_per_head(file, prefix + "rotation", n_heads_kv,
                                          {head_dim, head_dim}, rot));
      OSCAR_RETURN_IF_ERROR(read_per_head(file, prefix + "eigenvalues", n_heads_kv, {head_dim}, eig));
      OSCAR_RETURN_IF_ERROR(read_per_head(file, prefix + "clip", n_heads_kv, {}, clip));
      for (const char* t : {"rotation", "eigenvalues", "clip"}) expected_names.insert(prefix + t);
      for (int h = 0; h < n_heads_kv; ++h) {
        const double err = orthogonality_error(rot + h * d * d, head_dim);
        if (!(err < kRotationOrthogonalityTol)) {
          return invalid_argument("rotation file %s: %srotation head %d is not orthogonal: "
                                  "max |RᵀR − I| = %.3g (limit %.0e)",
                                  path.c_str(), prefix.c_str(), h, err, kRotationOrthogonalityTol);
        }
        if (!(clip[h] > 0.0f)) {
          return invalid_argument("rotation file %s: %sclip head %d = %g must be > 0",
                                  path.c_str(), prefix.c_str(), h, static_cast<double>(clip[h]));
        }
      }
    }
  }
  // Optional key scaling: both tensors in every layer, or none anywhere.
  if (file.find("layers.0.k.scale") != nullptr) {
    set.k_scale.resize(lh * d);
    set.k_mean.resize(lh * d);
    for (int l = 0; l < n_layers; ++l) {
      const std::string prefix = "layers." + std::to_string(l) + ".k.";
      const size_t base = static_cast<size_t>(l) * n_heads_kv * d;
      OSCAR_RETURN_IF_ERROR(
          read_per_head(file, prefix + "scale", n_heads_kv, {head_dim}, set.k_scale.data() + base));
      OSCAR_RETURN_IF_ERROR(
          read_per_head(file, prefix + "mean", n_heads_kv, {head_dim}, set.k_mean.data() + base));
      expected_names.insert(prefix + "scale");
      expected_names.insert(prefix + "mean");
      for (size_t i = 0; i < static_cast<size_t>(n_heads_kv) * d; ++i) {
        if (!(set.k_scale[base + i] > 0.0f)) {
          return invalid_argument("rotation file %s: %sscale head %zu element %zu = %g must be > 0",
                                  path.c_str(), prefix.c_str(), i / d, i % d,
                                  static_cast<double>(set.k_scale[base + i]));
        }
      }
    }
  }
  // Optional bit plan: k.bits and v.bits in every layer, or none anywhere.
  if (file.find("layers.0.k.bits") != nullptr) {
    set.k_bits.resize(lh);
    set.v_bits.resize(lh);
    for (int l = 0; l < n_layers; ++l) {
      for (const char* kind : {"k", "v"}) {
        const std::string name = "layers." + std::to_string(l) + "." + kind + ".bits";
        const TensorView* t = file.find(name);
        if (t == nullptr)
          return not_found("rotation file %s: tensor '%s' is missing (layer 0 has a bit plan)",
                           path.c_str(), name.c_str());
        if (t->dtype != DType::kI32 || t->shape != std::vector<int64_t>{n_heads_kv})
          return invalid_argument("rotation file %s: tensor '%s' is %s %s, expected I32 [%d]",
                                  path.c_str(), name.c_str(), format::dtype_name(t->dtype),
                                  shape_string(t->shape).c_str(), n_heads_kv);
        const std::vector<int64_t> bits = t->to_i64();
        for (int h = 0; h < n_heads_kv; ++h) {
          if (bits[h] < 1 || bits[h] > 3)
            return invalid_argument("rotation file %s: %s head %d = %lld bits; expected 1, 2 or 3",
                                    path.c_str(), name.c_str(), h,
                                    static_cast<long long>(bits[h]));
          (kind[0] == 'k' ? set.k_bits : set.v_bits)[static_cast<size_t>(l) * n_heads_kv + h] =
              static_cast<int8_t>(bits[h]);
        }
        expected_names.insert(name);
      }
    }
  }
  // Optional per-head key logit error (version 4): in every layer, or none anywhere.
  if (file.find("layers.0.k.logit_error") != nullptr) {
    set.k_logit_error.resize(lh);
    for (int l = 0; l < n_layers; ++l) {
      const std::string name = "layers." + std::to_string(l) + ".k.logit_error";
      float* e = set.k_logit_error.data() + static_cast<size_t>(l) * n_heads_kv;
      OSCAR_RETURN_IF_ERROR(read_per_head(file, name, n_heads_kv, {}, e));
      for (int h = 0; h < n_heads_kv; ++h)
        if (!(e[h] >= 0.0f) || !std::isfinite(e[h]))
          return invalid_argument("rotation file %s: %s head %d = %g must be finite and >= 0",
                                  path.c_str(), name.c_str(), h, static_cast<double>(e[h]));
      expected_names.insert(name);
    }
  }
  for (const TensorView& t : file.tensors()) {
    if (expected_names.count(t.name) == 0) {
      return invalid_argument("rotation file %s: unexpected tensor '%s' (n_layers %d)",
                              path.c_str(), t.name.c_str(), n_layers);
    }
  }
  return set;
}

std::vector<double> RotationSet::value_energy() const {
  std::vector<double> e(static_cast<size_t>(n_layers) * n_heads_kv, 0.0);
  for (size_t i = 0; i < e.size(); ++i)
    for (int j = 0; j < head_dim; ++j)
      e[i] += std::max(0.0, static_cast<double>(v_eig[i * head_dim + j]));
  return e;
}

Status write_rotation_file(const std::string& path, const RotationSet& set) {
  if (set.n_layers <= 0 || set.n_heads_kv <= 0 || set.head_dim <= 0 || set.group_size <= 0) {
    return invalid_argument("write_rotation_file %s: bad sizes n_layers %d n_heads_kv %d "
                            "head_dim %d group_size %d",
                            path.c_str(), set.n_layers, set.n_heads_kv, set.head_dim,
                            set.group_size);
  }
  const size_t d = static_cast<size_t>(set.head_dim);
  const size_t lh = static_cast<size_t>(set.n_layers) * set.n_heads_kv;
  OSCAR_RETURN_IF_ERROR(check_size("k_rot", set.k_rot.size(), lh * d * d));
  OSCAR_RETURN_IF_ERROR(check_size("v_rot", set.v_rot.size(), lh * d * d));
  OSCAR_RETURN_IF_ERROR(check_size("k_eig", set.k_eig.size(), lh * d));
  OSCAR_RETURN_IF_ERROR(check_size("v_eig", set.v_eig.size(), lh * d));
  OSCAR_RETURN_IF_ERROR(check_size("k_clip", set.k_clip.size(), lh));
  OSCAR_RETURN_IF_ERROR(check_size("v_clip", set.v_clip.size(), lh));
  const bool scaled = set.has_key_scaling();
  if (scaled) {
    OSCAR_RETURN_IF_ERROR(check_size("k_scale", set.k_scale.size(), lh * d));
    OSCAR_RETURN_IF_ERROR(check_size("k_mean", set.k_mean.size(), lh * d));
  } else if (!set.k_mean.empty()) {
    return invalid_argument("write_rotation_file %s: k_mean without k_scale", path.c_str());
  }
  const bool planned = set.has_bit_plan();
  if (planned) {
    OSCAR_RETURN_IF_ERROR(check_size("k_bits", set.k_bits.size(), lh));
    OSCAR_RETURN_IF_ERROR(check_size("v_bits", set.v_bits.size(), lh));
    for (size_t i = 0; i < lh; ++i)
      if (set.k_bits[i] < 1 || set.k_bits[i] > 3 || set.v_bits[i] < 1 || set.v_bits[i] > 3)
        return invalid_argument("write_rotation_file %s: head %zu has %d / %d bits (K / V); "
                                "expected 1, 2 or 3", path.c_str(), i, set.k_bits[i],
                                set.v_bits[i]);
  } else if (!set.v_bits.empty()) {
    return invalid_argument("write_rotation_file %s: v_bits without k_bits", path.c_str());
  }
  const bool stats = set.has_logit_error();
  if (stats) OSCAR_RETURN_IF_ERROR(check_size("k_logit_error", set.k_logit_error.size(), lh));
  const bool sparse = !set.layers.model_layers.empty() && !set.layers.is_dense();
  if (!set.layers.model_layers.empty()) {
    const std::vector<int>& ids = set.layers.model_layers;
    if (set.layers.n_entries() != set.n_layers)
      return invalid_argument("write_rotation_file %s: %d model layers for %d entries",
                              path.c_str(), set.layers.n_entries(), set.n_layers);
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= set.layers.model_n_layers || (i > 0 && ids[i] <= ids[i - 1]))
        return invalid_argument("write_rotation_file %s: model layers [%s] are not ascending "
                                "indices below %d", path.c_str(),
                                format_model_layers(ids).c_str(), set.layers.model_n_layers);
  }
  auto sha = set.metadata.find("model_config_sha256");
  if (sha == set.metadata.end() || sha->second.empty()) {
    return invalid_argument("write_rotation_file %s: metadata model_config_sha256 is required",
                            path.c_str());
  }
  std::map<std::string, std::string> meta = set.metadata;
  meta["format"] = kRotationFileFormat;
  meta["version"] = stats ? "4" : planned ? "3" : scaled ? "2" : "1";
  meta["head_dim"] = std::to_string(set.head_dim);
  meta["n_layers"] = std::to_string(set.n_layers);
  meta["n_kv_heads"] = std::to_string(set.n_heads_kv);
  meta["group_size"] = std::to_string(set.group_size);
  meta.erase("model_layers");
  meta.erase("model_n_layers");
  if (sparse) {
    meta["model_layers"] = format_model_layers(set.layers.model_layers);
    meta["model_n_layers"] = std::to_string(set.layers.model_n_layers);
  }

  const int64_t h = set.n_heads_kv, dd = set.head_dim;
  std::vector<format::TensorToWrite> tensors;
  for (int l = 0; l < set.n_layers; ++l) {
    const size_t base = static_cast<size_t>(l) * set.n_heads_kv;
    for (const char* kind : {"k", "v"}) {
      const bool is_k = kind[0] == 'k';
      const std::string prefix = "layers." + std::to_string(l) + "." + kind + ".";
      const std::vector<float>& rot = is_k ? set.k_rot : set.v_rot;
      const std::vector<float>& eig = is_k ? set.k_eig : set.v_eig;
      const std::vector<float>& clip = is_k ? set.k_clip : set.v_clip;
      tensors.push_back(format::f32_tensor(
          prefix + "rotation", {h, dd, dd},
          std::span<const float>(rot.data() + base * d * d, set.n_heads_kv * d * d)));
      tensors.push_back(format::f32_tensor(
          prefix + "eigenvalues", {h, dd},
          std::span<const float>(eig.data() + base * d, set.n_heads_kv * d)));
      tensors.push_back(format::f32_tensor(
          prefix + "clip", {h}, std::span<const float>(clip.data() + base, set.n_heads_kv)));
      if (is_k && scaled) {
        tensors.push_back(format::f32_tensor(
            prefix + "scale", {h, dd},
            std::span<const float>(set.k_scale.data() + base * d, set.n_heads_kv * d)));
        tensors.push_back(format::f32_tensor(
            prefix + "mean", {h, dd},
            std::span<const float>(set.k_mean.data() + base * d, set.n_heads_kv * d)));
      }
      if (planned) {
        const std::vector<int8_t>& bits = is_k ? set.k_bits : set.v_bits;
        std::vector<int32_t> b(bits.begin() + base, bits.begin() + base + set.n_heads_kv);
        tensors.push_back(format::i32_tensor(prefix + "bits", {h}, b));
      }
      if (is_k && stats)
        tensors.push_back(format::f32_tensor(
            prefix + "logit_error", {h},
            std::span<const float>(set.k_logit_error.data() + base, set.n_heads_kv)));
    }
  }
  return format::write_safetensors(path, tensors, meta).with_context("write_rotation_file");
}

}  // namespace oscar::quant
