// `oscar inspect FILE` for rotation files (see inspect_rotations.h).
#include <cstdio>
#include <filesystem>
#include <set>

#include "apps/inspect_rotations.h"
#include "format/safetensors.h"
#include "format/torch_file.h"
#include "quant/rotation.h"
#include "quant/rotation_file.h"

namespace oscar::apps {

namespace {

using format::PyKind;
using format::PyValue;

// A pickle value in one short line: scalars as Python prints them, containers by size.
std::string brief(const format::PickleGraph& g, const PyValue& v, int depth = 0) {
  switch (v.kind) {
    case PyKind::kNone: return "None";
    case PyKind::kBool: return v.i ? "True" : "False";
    case PyKind::kInt: return std::to_string(v.i);
    case PyKind::kFloat: return str_format("%.17g", v.f);
    case PyKind::kStr: {
      std::string q = "'";
      q.append(v.s, 0, 120);
      q.append(v.s.size() > 120 ? "...'" : "'");
      return q;
    }
    case PyKind::kTensor:
      return "float32 " + format::shape_string(v.sizes) + " (storage " + g.at(v.storage).s +
             (v.storage_offset ? ", offset " + std::to_string(v.storage_offset) : "") + ")";
    case PyKind::kDict: {
      if (depth >= 1) return str_format("dict of %zu", v.items.size() / 2);
      std::string s = "{";
      for (size_t j = 0; j + 1 < v.items.size() && j < 40; j += 2)
        s += (j ? ", " : "") + brief(g, g.at(v.items[j]), depth + 1) + ": " +
             brief(g, g.at(v.items[j + 1]), depth + 1);
      return s + (v.items.size() > 40 ? ", ...}" : "}");
    }
    default: return std::string(format::py_kind_name(v.kind));
  }
}

}  // namespace

int inspect_rotation_file(const std::string& path) {
  auto file = format::SafetensorsFile::open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "error: %s\n", file.status().message().c_str());
    return 1;
  }
  const auto& meta = file->metadata();
  auto get = [&](const char* k) {
    auto it = meta.find(k);
    return it == meta.end() ? std::string() : it->second;
  };
  if (get("format") != quant::kRotationFileFormat) {
    std::fprintf(stderr, "error: %s: metadata format '%s' is not '%s': not a rotation file\n",
                 path.c_str(), get("format").c_str(), quant::kRotationFileFormat);
    return 1;
  }
  std::printf("rotation file       %s\n", path.c_str());
  // Provenance first, in a fixed order; then every other key.
  const char* order[] = {"created_by", "calibration", "model_config_sha256", "version", "n_layers",
                         "model_layers", "model_n_layers", "n_kv_heads", "head_dim", "group_size", "value_objective", "key_scaling",
                         "bit_plan", "eigenvalues", "import_config", quant::kRecommendedModeKey,
                         quant::kRecommendedRecentKey};
  std::set<std::string> shown = {"format"};
  for (const char* k : order) {
    if (meta.count(k) == 0) continue;
    std::printf("%-22s %s\n", k, get(k).c_str());
    shown.insert(k);
  }
  for (const auto& [k, v] : meta)
    if (shown.count(k) == 0) std::printf("%-22s %s\n", k.c_str(), v.c_str());
  // Validate against its own sizes, as a run would (without a model to compare the hash to).
  int n_layers = 0, heads = 0, d = 0;
  try {
    n_layers = std::stoi(get("n_layers"));
    heads = std::stoi(get("n_kv_heads"));
    d = std::stoi(get("head_dim"));
  } catch (const std::exception&) {
  }
  if (n_layers <= 0 || heads <= 0 || d <= 0) {
    std::fprintf(stderr, "error: %s: n_layers / n_kv_heads / head_dim metadata missing or bad\n",
                 path.c_str());
    return 1;
  }
  // The layers the file says it serves (a hybrid's: model_layers of model_n_layers).
  quant::RotationLayers layers = quant::RotationLayers::dense(n_layers);
  if (meta.count("model_layers") != 0) {
    auto ids = quant::parse_model_layers(get("model_layers"));
    if (!ids.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", path.c_str(), ids.status().message().c_str());
      return 1;
    }
    layers.model_layers = std::move(ids).value();
    try {
      layers.model_n_layers = std::stoi(get("model_n_layers"));
    } catch (const std::exception&) {
      layers.model_n_layers = 0;
    }
  }
  auto set = quant::load_rotation_file(path, "", layers, heads, d);
  if (!set.ok()) {
    std::fprintf(stderr, "error: %s\n", set.status().message().c_str());
    return 1;
  }
  double worst = 0;
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < heads; ++h) {
      worst = std::max(worst, quant::orthogonality_error(set->k_rotation(l, h), d));
      worst = std::max(worst, quant::orthogonality_error(set->v_rotation(l, h), d));
    }
  std::printf("valid                 %zu tensors; max |R^T R - I| %.2g; key scaling %s; bit plan %s\n",
              file->tensors().size(), worst, set->has_key_scaling() ? "yes" : "no",
              set->has_bit_plan() ? "yes" : "no");
  return 0;
}

int inspect_torch_file(const std::string& path) {
  auto f = format::TorchFile::open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "error: %s\n", f.status().message().c_str());
    return 1;
  }
  const format::PickleGraph& g = f->pickle();
  std::printf("torch file          %s (read with the restricted reader; nothing executed)\n",
              path.c_str());
  std::printf("archive folder      %s\n", f->prefix().c_str());
  std::printf("storages            %zu\n", g.storages.size());
  const PyValue& root = f->root();
  if (root.kind != PyKind::kDict) {
    std::printf("top level           %s\n", brief(g, root).c_str());
    return 0;
  }
  for (size_t j = 0; j + 1 < root.items.size(); j += 2) {
    const PyValue& k = g.at(root.items[j]);
    const PyValue& v = g.at(root.items[j + 1]);
    if (k.kind == PyKind::kStr && k.s == "layers" && v.kind == PyKind::kDict) {
      std::vector<std::string> ids;
      for (size_t i = 0; i < v.items.size(); i += 2) ids.push_back(brief(g, g.at(v.items[i])));
      std::string list;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i == 16 && ids.size() > 20) {
          list += ", ... " + ids.back();
          break;
        }
        list += (i ? ", " : "") + ids[i];
      }
      std::printf("%-19s %zu: %s\n", "layers", ids.size(), list.c_str());
      if (!v.items.empty())
        std::printf("  first layer       %s\n", brief(g, g.at(v.items[1])).c_str());
      continue;
    }
    std::printf("%-19s %s\n", brief(g, k).c_str(), brief(g, v).c_str());
  }
  return 0;
}

void print_default_rotations_line(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "oscar_rotations.safetensors").string();
  if (!std::filesystem::exists(path)) return;
  auto file = format::SafetensorsFile::open(path);
  if (!file.ok()) {
    std::printf("rotation file       %s: %s\n", path.c_str(), file.status().message().c_str());
    return;
  }
  auto it = file->metadata().find("created_by");
  std::printf("rotation file       %s (%s; `oscar inspect %s` for its provenance)\n", path.c_str(),
              it == file->metadata().end() ? "no created_by" : it->second.c_str(), path.c_str());
}

}  // namespace oscar::apps
