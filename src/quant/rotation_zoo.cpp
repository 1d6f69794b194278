// RotationZoo `.pt` files: validation and conversion into oscar's rotation file (see
// rotation_zoo.h).
#include "quant/rotation_zoo.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/check.h"
#include "format/safetensors.h"
#include "format/sha256.h"
#include "format/torch_file.h"
#include "quant/hadamard.h"
#include "quant/rotation.h"

namespace oscar::quant {
namespace {

using format::FloatTensor;
using format::shape_string;
using format::PyKind;
using format::PyValue;
using format::TorchFile;

// A scalar of the pickle as text, for the provenance metadata.
std::string scalar_text(const PyValue& v) {
  switch (v.kind) {
    case PyKind::kNone: return "None";
    case PyKind::kBool: return v.i ? "True" : "False";
    case PyKind::kInt: return std::to_string(v.i);
    case PyKind::kFloat: return str_format("%.17g", v.f);
    case PyKind::kStr: return v.s.substr(0, 200);
    default: return std::string("<") + format::py_kind_name(v.kind) + ">";
  }
}

// max_ij |(X·Yᵀ − I)_ij| in double; X, Y: [d, d] row-major.
double identity_error_xyt(const float* X, const float* Y, int d) {
  double worst = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double dot = 0;
      for (int k = 0; k < d; ++k)
        dot += static_cast<double>(X[static_cast<size_t>(i) * d + k]) * Y[static_cast<size_t>(j) * d + k];
      worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}
// B = H·P_br as double [d, d]: column bitrev(j) of B is column j of H.
std::vector<double> hadamard_bitrev(int d) {
  const std::vector<double> H = hadamard_matrix(d);
  std::vector<double> B(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) B[static_cast<size_t>(i) * d + bitrev(j, d)] = H[static_cast<size_t>(i) * d + j];
  return B;
}

// X·Bᵀ in double. X: float [d, d].
std::vector<double> times_bt(const float* X, const std::vector<double>& B, int d) {
  std::vector<double> out(static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double acc = 0;
      for (int k = 0; k < d; ++k) acc += X[static_cast<size_t>(i) * d + k] * B[static_cast<size_t>(j) * d + k];
      out[static_cast<size_t>(i) * d + j] = acc;
    }
  return out;
}

const char* kind_name(ZooKind k) { return k == ZooKind::kKey ? "K" : "V"; }

class Reader {
 public:
  Reader(const TorchFile& f, ZooKind kind, const std::vector<int>& ids, int n_heads_kv, int d)
      : f_(f), kind_(kind), ids_(ids), H_(n_heads_kv), d_(d) {}

  Result<ZooFile> run() {
    ZooFile z;
    z.path = f_.label();
    z.prefix = f_.prefix();
    z.kind = kind_;
    z.layer_ids = ids_;
    z.head_dim = d_;
    const std::span<const uint8_t> b = f_.bytes();
    z.sha256 = format::sha256_hex({reinterpret_cast<const char*>(b.data()), b.size()});
    const PyValue& root = f_.root();
    if (root.kind != PyKind::kDict)
      return err("the top level is a %s, expected a dict", format::py_kind_name(root.kind));
    const PyValue* fv = f_.pickle().dict_get(root, "format_version");
    if (fv == nullptr || fv->kind != PyKind::kInt)
      return err("no int format_version at the top level; this is not a release rotation file");
    if (fv->i < 1 || fv->i > 3)
      return unimplemented("%s: format_version %lld is not supported (1, 2 and 3 are)",
                           f_.label().c_str(), static_cast<long long>(fv->i));
    z.format_version = static_cast<int>(fv->i);
    if (const PyValue* o = str_field(root, "objective")) z.objective = o->s;
    if (const PyValue* g = str_field(root, "source_grouping")) z.source_grouping = g->s;
    if (const PyValue* c = f_.pickle().dict_get(root, "calibration"); c && c->kind == PyKind::kDict) {
      for (size_t j = 0; j + 1 < c->items.size() && j < 64; j += 2) {
        if (!z.calibration.empty()) z.calibration += "; ";
        z.calibration += scalar_text(f_.pickle().at(c->items[j])) + "=" +
                         scalar_text(f_.pickle().at(c->items[j + 1]));
      }
    }
    if (z.format_version == 3) {
      if (const PyValue* t = f_.pickle().dict_get(root, "transform"); t && t->kind == PyKind::kDict) {
        for (size_t j = 0; j + 1 < t->items.size() && j < 16; j += 2) {
          const PyValue& k = f_.pickle().at(t->items[j]);
          const PyValue& v = f_.pickle().at(t->items[j + 1]);
          if (!z.transform.empty()) z.transform += " ";
          z.transform += scalar_text(k) + "=" + scalar_text(v);
          if (k.kind == PyKind::kStr && k.s == "orthogonal") {
            if (v.kind != PyKind::kBool) return err("transform.orthogonal is not a bool");
            z.orthogonal = v.i != 0;
          }
        }
      }
    }
    const PyValue* layers = f_.pickle().dict_get(root, "layers");
    if (layers == nullptr || layers->kind != PyKind::kDict)
      return err("no 'layers' dict at the top level");
    OSCAR_RETURN_IF_ERROR(index_layers(*layers));

    const size_t n = ids_.size(), dd = static_cast<size_t>(d_) * d_;
    const char* companion_name = kind_ == ZooKind::kKey ? "q_rotation" : "o_rotation";
    int n_eig = 0, n_comp = 0, n_mean = 0;
    std::vector<FloatTensor> eig(n), comp(n), mean(n);
    for (size_t i = 0; i < n; ++i) {
      const int id = ids_[i];
      auto it = by_id_.find(id);
      if (it == by_id_.end())
        return err("missing layer %d (the file has %zu layers%s; the model needs %zu)", id,
                   by_id_.size(), range_text().c_str(), n);
      const PyValue& layer = *it->second;
      if (layer.kind != PyKind::kDict)
        return err("layer %d is a %s, expected a dict", id, format::py_kind_name(layer.kind));
      for (size_t j = 0; j + 1 < layer.items.size(); j += 2) {
        const PyValue& k = f_.pickle().at(layer.items[j]);
        const bool known = k.kind == PyKind::kStr &&
                           (k.s == "layer_id" || k.s == "rotation" || k.s == "eigenvalues" ||
                            (z.format_version == 3 && k.s == companion_name) ||
                            (z.format_version == 3 && kind_ == ZooKind::kKey && k.s == "k_mean"));
        if (!known)
          return err("layer %d: unexpected key '%s' in a format_version %d %s file", id,
                     scalar_text(k).c_str(), z.format_version, kind_name(kind_));
      }
      if (const PyValue* lid = f_.pickle().dict_get(layer, "layer_id")) {
        if (lid->kind != PyKind::kInt || lid->i != id)
          return err("layer %d: layer_id is %s", id, scalar_text(*lid).c_str());
      }
      const PyValue* rv = f_.pickle().dict_get(layer, "rotation");
      if (rv == nullptr) return err("layer %d has no rotation", id);
      OSCAR_ASSIGN_OR_RETURN(FloatTensor r, matrix(*rv, id, "rotation", i == 0));
      z.rotation.insert(z.rotation.end(), r.data.begin(), r.data.end());
      if (const PyValue* e = f_.pickle().dict_get(layer, "eigenvalues")) {
        OSCAR_ASSIGN_OR_RETURN(eig[i], vector(*e, id, "eigenvalues"));
        ++n_eig;
      }
      if (const PyValue* c = f_.pickle().dict_get(layer, companion_name)) {
        OSCAR_ASSIGN_OR_RETURN(comp[i], matrix(*c, id, companion_name, false));
        ++n_comp;
      }
      if (const PyValue* m = f_.pickle().dict_get(layer, "k_mean")) {
        OSCAR_ASSIGN_OR_RETURN(mean[i], vector(*m, id, "k_mean"));
        ++n_mean;
      }
    }
    z.n_heads = heads_;
    // Optional fields: on every wanted layer or none (the release raises ValueError likewise).
    const std::pair<const char*, int> optional_fields[] = {
        {"eigenvalues", n_eig}, {companion_name, n_comp}, {"k_mean", n_mean}};
    for (auto [name, count] : optional_fields) {
      if (count != 0 && static_cast<size_t>(count) != n)
        return err("%s present on %d of %zu layers; must be on all or none", name, count, n);
    }
    auto expand = [&](std::vector<FloatTensor>& src, size_t per_head, std::vector<float>& dst) {
      if (src.empty() || src[0].shape.empty()) return;
      for (FloatTensor& t : src) {
        const bool shared = t.data.size() == per_head;  // [d] on a per-head file: broadcast
        for (int h = 0; h < heads_; ++h)
          dst.insert(dst.end(), t.data.begin() + static_cast<std::ptrdiff_t>(shared ? 0 : h * per_head),
                     t.data.begin() + static_cast<std::ptrdiff_t>(shared ? per_head : (h + 1) * per_head));
      }
    };
    if (n_eig) expand(eig, static_cast<size_t>(d_), z.eigenvalues);
    if (n_mean) expand(mean, static_cast<size_t>(d_), z.k_mean);
    if (n_comp)
      for (const FloatTensor& t : comp) z.companion.insert(z.companion.end(), t.data.begin(), t.data.end());

    // Orthogonality where the version promises it, or where the runtime would alias the
    // companion to R (no q_rotation / o_rotation: Q = R needs R orthogonal).
    const bool check_orth = z.orthogonal || n_comp == 0;
    for (size_t i = 0; i < n; ++i)
      for (int h = 0; h < heads_; ++h) {
        const float* R = z.rotation.data() + (i * heads_ + h) * dd;
        if (check_orth) {
          std::vector<float> Rt(dd);
          for (int a = 0; a < d_; ++a)
            for (int b = 0; b < d_; ++b) Rt[static_cast<size_t>(b) * d_ + a] = R[static_cast<size_t>(a) * d_ + b];
          const double e1 = orthogonality_error(R, d_), e2 = orthogonality_error(Rt.data(), d_);
          const double e = std::max(e1, e2);
          z.orthogonality_error = std::max(z.orthogonality_error, e);
          if (!(e < kRotationOrthogonalityTol))
            return err("layer %d rotation not orthogonal%s: max|RᵀR − I| = %.3g, max|RRᵀ − I| = "
                       "%.3g (limit %.0e)%s", ids_[i],
                       heads_ > 1 ? str_format(" (head %d)", h).c_str() : "", e1, e2,
                       kRotationOrthogonalityTol,
                       n_comp == 0 && !z.orthogonal
                           ? str_format("; transform.orthogonal is false but the layer has no %s",
                                        companion_name).c_str()
                           : "");
        }
        if (n_comp) {
          const float* C = z.companion.data() + (i * heads_ + h) * dd;
          // K: Q·R_kᵀ = I; V: R_v·Oᵀ = I.
          const double e = kind_ == ZooKind::kKey ? identity_error_xyt(C, R, d_)
                                                  : identity_error_xyt(R, C, d_);
          z.identity_error = std::max(z.identity_error, e);
          if (!(e < kZooIdentityTol))
            return err("layer %d head %d: max|%s − I| = %.3g (limit %.0e): %s is not the inverse "
                       "transpose of rotation", ids_[i], h,
                       kind_ == ZooKind::kKey ? "q_rotation·rotationᵀ" : "rotation·o_rotationᵀ", e,
                       kZooIdentityTol, companion_name);
        }
      }
    return z;
  }

 private:
  template <typename... Args>
  Status err(const char* fmt, Args... args) const {
    return invalid_argument("%s: %s", f_.label().c_str(), str_format(fmt, args...).c_str());
  }
  Status err(const char* msg) const { return invalid_argument("%s: %s", f_.label().c_str(), msg); }

  const PyValue* str_field(const PyValue& d, const char* key) const {
    const PyValue* v = f_.pickle().dict_get(d, key);
    return v && v->kind == PyKind::kStr ? v : nullptr;
  }

  // layers: int keys (every release file) or decimal str keys (which the release also accepts).
  Status index_layers(const PyValue& layers) {
    for (size_t j = 0; j + 1 < layers.items.size(); j += 2) {
      const PyValue& k = f_.pickle().at(layers.items[j]);
      int64_t id = -1;
      if (k.kind == PyKind::kInt) {
        id = k.i;
      } else if (k.kind == PyKind::kStr && !k.s.empty() && k.s.size() <= 9 &&
                 std::all_of(k.s.begin(), k.s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        id = std::stoll(k.s);
      } else {
        return err("layers has a key %s of type %s; expected int layer ids",
                   scalar_text(k).c_str(), format::py_kind_name(k.kind));
      }
      if (id < 0 || id > (1 << 20)) return err("layer id %lld out of range", static_cast<long long>(id));
      if (!by_id_.emplace(static_cast<int>(id), &f_.pickle().at(layers.items[j + 1])).second)
        return err("layer %lld appears twice (as an int and a str key)", static_cast<long long>(id));
    }
    return Status();
  }
  std::string range_text() const {
    if (by_id_.empty()) return "";
    std::string s = ": ";
    int shown = 0;
    for (const auto& [id, v] : by_id_) {
      if (shown++ == 12) {
        s += ", ...";
        break;
      }
      s += (shown > 1 ? ", " : "") + std::to_string(id);
    }
    return s;
  }

  Status check_finite(const FloatTensor& t, int id, const char* what) const {
    for (size_t e = 0; e < t.data.size(); ++e) {
      if (std::isfinite(t.data[e])) continue;
      std::vector<int64_t> at(t.shape.size());
      size_t rest = e;
      for (size_t k = t.shape.size(); k-- > 0;) {
        at[k] = static_cast<int64_t>(rest % static_cast<size_t>(t.shape[k]));
        rest /= static_cast<size_t>(t.shape[k]);
      }
      return err("layer %d %s has a non-finite value at %s", id, what, shape_string(at).c_str());
    }
    return Status();
  }

  // A [d, d] or [H, d, d] tensor; the first layer's head axis sets heads_ for the file.
  Result<FloatTensor> matrix(const PyValue& v, int id, const char* what, bool first) {
    OSCAR_ASSIGN_OR_RETURN(FloatTensor t, f_.tensor(v, str_format("layer %d %s", id, what)));
    const std::vector<int64_t> one = {d_, d_}, per_head = {H_, d_, d_};
    if (t.shape != one && t.shape != per_head)
      return err("layer %d %s shape %s, expected %s or %s", id, what, shape_string(t.shape).c_str(),
                 shape_string(one).c_str(), shape_string(per_head).c_str());
    const int heads = t.shape.size() == 3 ? H_ : 1;
    if (first) heads_ = heads;
    else if (heads != heads_)
      return err("layer %d %s shape %s, but layer %d's rotation has %s", id, what,
                 shape_string(t.shape).c_str(), ids_[0],
                 heads_ == 1 ? "no head axis" : "a head axis");
    OSCAR_RETURN_IF_ERROR(check_finite(t, id, what));
    return t;
  }
  // A [d] or [heads_, d] tensor.
  Result<FloatTensor> vector(const PyValue& v, int id, const char* what) {
    OSCAR_ASSIGN_OR_RETURN(FloatTensor t, f_.tensor(v, str_format("layer %d %s", id, what)));
    const std::vector<int64_t> one = {d_}, per_head = {heads_, d_};
    if (t.shape != one && t.shape != per_head)
      return err("layer %d %s shape %s, expected %s%s", id, what, shape_string(t.shape).c_str(),
                 shape_string(one).c_str(),
                 heads_ > 1 ? (" or " + shape_string(per_head)).c_str() : "");
    OSCAR_RETURN_IF_ERROR(check_finite(t, id, what));
    return t;
  }

  const TorchFile& f_;
  ZooKind kind_;
  const std::vector<int>& ids_;
  int H_, d_;
  int heads_ = 1;
  std::map<int, const PyValue*> by_id_;
};

}  // namespace

const float* ZooFile::rotation_at(size_t layer, int head) const {
  OSCAR_CHECK(layer < layer_ids.size() && head >= 0 && head < n_heads, "layer %zu head %d", layer, head);
  return rotation.data() + (layer * n_heads + head) * static_cast<size_t>(head_dim) * head_dim;
}
const float* ZooFile::companion_at(size_t layer, int head) const {
  OSCAR_CHECK(!companion.empty() && layer < layer_ids.size() && head >= 0 && head < n_heads,
              "layer %zu head %d", layer, head);
  return companion.data() + (layer * n_heads + head) * static_cast<size_t>(head_dim) * head_dim;
}

std::string ZooFile::describe() const {
  std::string s = str_format("%s V%d objective %s, %s, %zu layers", kind_name(kind), format_version,
                             objective.empty() ? "(none)" : objective.c_str(),
                             n_heads == 1 ? "one matrix per layer" : "one matrix per KV head",
                             layer_ids.size());
  if (!transform.empty()) s += ", transform {" + transform + "}";
  if (!companion.empty()) s += kind == ZooKind::kKey ? ", q_rotation" : ", o_rotation";
  if (!k_mean.empty()) s += ", k_mean";
  return s;
}

Result<ZooFile> parse_zoo_file(std::span<const uint8_t> bytes, const std::string& label,
                               ZooKind kind, const std::vector<int>& layer_ids, int n_heads_kv,
                               int head_dim) {
  OSCAR_CHECK(n_heads_kv > 0 && head_dim > 0, "n_heads_kv %d head_dim %d", n_heads_kv, head_dim);
  if (layer_ids.empty()) return invalid_argument("%s: no layer ids asked for", label.c_str());
  OSCAR_ASSIGN_OR_RETURN(TorchFile f, TorchFile::parse(bytes, label));
  return Reader(f, kind, layer_ids, n_heads_kv, head_dim).run();
}

Result<ZooFile> read_zoo_file(const std::string& path, ZooKind kind,
                              const std::vector<int>& layer_ids, int n_heads_kv, int head_dim) {
  OSCAR_CHECK(n_heads_kv > 0 && head_dim > 0, "n_heads_kv %d head_dim %d", n_heads_kv, head_dim);
  if (layer_ids.empty()) return invalid_argument("%s: no layer ids asked for", path.c_str());
  OSCAR_ASSIGN_OR_RETURN(TorchFile f, TorchFile::open(path));
  return Reader(f, kind, layer_ids, n_heads_kv, head_dim).run();
}

Result<RotationSet> convert_zoo_pair(const ZooFile& k, const ZooFile& v, int n_heads_kv,
                                     const std::string& model_config_sha256,
                                     const ZooImportOptions& o) {
  if (k.kind != ZooKind::kKey || v.kind != ZooKind::kValue)
    return invalid_argument("import: the K file %s and the V file %s are swapped", k.path.c_str(),
                            v.path.c_str());
  if (k.layer_ids != v.layer_ids || k.head_dim != v.head_dim)
    return invalid_argument("import: %s and %s were read for different layers or head_dim",
                            k.path.c_str(), v.path.c_str());
  // Objectives say which side a file was fitted for: refuse a swapped pair rather than rotate
  // keys by a value covariance.
  auto value_objective = [](const std::string& s) {
    return s.rfind("sst", 0) == 0 || s.rfind("oscar2_v_", 0) == 0;
  };
  auto key_objective = [&](const std::string& s) {
    return s.rfind("qqt", 0) == 0 || (s.rfind("oscar2_", 0) == 0 && !value_objective(s));
  };
  if (value_objective(k.objective) || key_objective(v.objective))
    return invalid_argument("import: the K file %s has objective '%s' and the V file %s has '%s': "
                            "the two look swapped (K files are k_rotation_*, objectives qqt_* / "
                            "oscar2_<key variant>; V files v_rotation_*, sst_* / oscar2_v_*)",
                            k.path.c_str(), k.objective.c_str(), v.path.c_str(),
                            v.objective.c_str());
  const int d = k.head_dim;
  if (!(o.k_clip > 0) || !(o.v_clip > 0))
    return invalid_argument("import: clip ratios %g / %g must be positive", o.k_clip, o.v_clip);
  if (o.group_size <= 0 || o.group_size % 4 != 0 || d % o.group_size != 0)
    return invalid_argument("import: group size %d must be a multiple of 4 dividing head_dim %d",
                            o.group_size, d);
  if (o.n_sink < 0 || o.n_recent < 0)
    return invalid_argument("import: windows n_sink %d / n_recent %d must be >= 0", o.n_sink,
                            o.n_recent);
  if (o.quantizer != "uniform" && o.quantizer != "lloyd")
    return invalid_argument("import: quantizer '%s': expected uniform or lloyd", o.quantizer.c_str());

  RotationSet set;
  set.n_layers = static_cast<int>(k.layer_ids.size());
  set.n_heads_kv = n_heads_kv;
  set.head_dim = d;
  set.group_size = o.group_size;
  const size_t L = k.layer_ids.size(), H = static_cast<size_t>(n_heads_kv), dd = static_cast<size_t>(d) * d;
  set.k_rot.resize(L * H * dd);
  set.v_rot.resize(L * H * dd);
  set.k_eig.assign(L * H * d, 0.0f);
  set.v_eig.assign(L * H * d, 0.0f);
  set.k_clip.assign(L * H, o.k_clip);
  set.v_clip.assign(L * H, o.v_clip);

  // Eigenvalues: eigh's ascending order (release) -> oscar's descending. A file's single row
  // broadcasts like its rotation.
  auto eig = [&](const ZooFile& z, std::vector<float>& dst) {
    if (z.eigenvalues.empty()) return;
    for (size_t l = 0; l < L; ++l)
      for (size_t h = 0; h < H; ++h) {
        const float* src = z.eigenvalues.data() + (l * z.n_heads + (z.n_heads == 1 ? 0 : h)) * d;
        float* out = dst.data() + (l * H + h) * d;
        for (int j = 0; j < d; ++j) out[j] = src[d - 1 - j];
      }
  };
  eig(k, set.k_eig);
  eig(v, set.v_eig);

  // Values: an orthogonal R_v (oscar folds it and its transpose, OSCAR.md §3).
  // (A V3 file that promises orthogonality and carries o_rotation passed both checks, so its
  // o_rotation equals its rotation to the tolerance: the rotation alone represents it.)
  if (!v.companion.empty() && !v.orthogonal) {
    return unimplemented(
        "import: %s is a V3 value transform {%s} with o_rotation ≠ rotation (rotation·o_rotationᵀ "
        "= I, rotation not orthogonal): oscar folds an orthogonal value rotation R_v into v_proj "
        "and R_vᵀ into o_proj (OSCAR.md §3) and its rotation file has no o_rotation, so it cannot "
        "represent this exactly; import a value file whose transform is orthogonal (pre_wo)",
        v.path.c_str(), v.transform.c_str());
  }
  for (size_t l = 0; l < L; ++l)
    for (size_t h = 0; h < H; ++h) {
      const float* R = v.rotation_at(l, v.n_heads == 1 ? 0 : static_cast<int>(h));
      std::copy(R, R + dd, set.v_rot.begin() + static_cast<std::ptrdiff_t>((l * H + h) * dd));
    }

  // Keys.
  std::string key_scaling = "none";
  if (k.companion.empty()) {
    for (size_t l = 0; l < L; ++l)
      for (size_t h = 0; h < H; ++h) {
        const float* R = k.rotation_at(l, k.n_heads == 1 ? 0 : static_cast<int>(h));
        std::copy(R, R + dd, set.k_rot.begin() + static_cast<std::ptrdiff_t>((l * H + h) * dd));
      }
    if (!k.k_mean.empty()) {
      set.k_scale.assign(L * H * d, 1.0f);  // centring only: W = I
      key_scaling = "centre (the release's k_mean; keys minus it before the rotation)";
    }
  } else {
    // R_k = U·W·B and Q = U·W⁻¹·B with B = H·P_br: M = R_k·Bᵀ must be orthogonal × diagonal.
    if (!is_power_of_two(d))
      return unimplemented("import: %s has q_rotation and head_dim %d is not a power of two",
                           k.path.c_str(), d);
    const std::vector<double> B = hadamard_bitrev(d);
    set.k_scale.resize(L * H * d);
    double worst_offdiag = 0, worst_q = 0;
    for (size_t l = 0; l < L; ++l)
      for (size_t h = 0; h < H; ++h) {
        const int fh = k.n_heads == 1 ? 0 : static_cast<int>(h);
        const std::vector<double> M = times_bt(k.rotation_at(l, fh), B, d);
        const std::vector<double> QB = times_bt(k.companion_at(l, fh), B, d);
        std::vector<double> w(static_cast<size_t>(d));
        for (int j = 0; j < d; ++j) {
          double g = 0;
          for (int i = 0; i < d; ++i) g += M[static_cast<size_t>(i) * d + j] * M[static_cast<size_t>(i) * d + j];
          w[static_cast<size_t>(j)] = std::sqrt(g);
        }
        double offdiag = 0, q_err = 0, q_max = 0;
        for (int a = 0; a < d; ++a)
          for (int b = a + 1; b < d; ++b) {
            double g = 0;
            for (int i = 0; i < d; ++i) g += M[static_cast<size_t>(i) * d + a] * M[static_cast<size_t>(i) * d + b];
            offdiag = std::max(offdiag, std::fabs(g) / (w[static_cast<size_t>(a)] * w[static_cast<size_t>(b)]));
          }
        float* Rout = set.k_rot.data() + (l * H + h) * dd;
        // U = M·W⁻¹; oscar's R = U·B; Q·Bᵀ must equal U·W⁻¹ = M·W⁻².
        for (int i = 0; i < d; ++i) {
          for (int j = 0; j < d; ++j) {
            const double uw = M[static_cast<size_t>(i) * d + j] / (w[static_cast<size_t>(j)] * w[static_cast<size_t>(j)]);
            q_err = std::max(q_err, std::fabs(QB[static_cast<size_t>(i) * d + j] - uw));
            q_max = std::max(q_max, std::fabs(uw));
          }
          for (int c = 0; c < d; ++c) {
            double acc = 0;
            for (int j = 0; j < d; ++j)
              acc += M[static_cast<size_t>(i) * d + j] / w[static_cast<size_t>(j)] * B[static_cast<size_t>(j) * d + c];
            Rout[static_cast<size_t>(i) * d + c] = static_cast<float>(acc);
          }
        }
        const double q_rel = q_err / std::max(q_max, 1e-300);
        worst_offdiag = std::max(worst_offdiag, offdiag);
        worst_q = std::max(worst_q, q_rel);
        if (!(offdiag < kZooKeyScalingTol) || !(q_rel < kZooKeyScalingTol))
          return unimplemented(
              "import: %s layer %d head %zu: the V3 key transform {%s} is not oscar's key scaling "
              "U·W·H·P_br / U·W⁻¹·H·P_br (U orthogonal, W diagonal; OSCAR.md §1): rotation·(H·P_br)ᵀ "
              "has Gram off-diagonal %.3g (relative), q_rotation deviates by %.3g (relative); limit "
              "%.0e. oscar cannot represent it exactly, so it is refused",
              k.path.c_str(), k.layer_ids[l], h, k.transform.c_str(), offdiag, q_rel,
              kZooKeyScalingTol);
        for (int j = 0; j < d; ++j)
          set.k_scale[(l * H + h) * d + static_cast<size_t>(j)] = static_cast<float>(w[static_cast<size_t>(j)]);
      }
    key_scaling = str_format(
        "full (the release's V3 q_rotation / rotation pair as U·W^-1·H·P_br / U·W·H·P_br; Gram "
        "off-diagonal %.2g, q_rotation relative error %.2g)%s",
        worst_offdiag, worst_q, k.k_mean.empty() ? "" : ", keys minus the release's k_mean");
  }
  if (!set.k_scale.empty()) {
    set.k_mean.assign(L * H * d, 0.0f);
    for (size_t l = 0; l < L && !k.k_mean.empty(); ++l)
      for (size_t h = 0; h < H; ++h) {
        const float* src = k.k_mean.data() + (l * k.n_heads + (k.n_heads == 1 ? 0 : h)) * d;
        std::copy(src, src + d, set.k_mean.begin() + static_cast<std::ptrdiff_t>((l * H + h) * d));
      }
  }

  // Metadata: the calibrator's keys (OSCAR.md §7), then the provenance.
  auto& m = set.metadata;
  m["model_config_sha256"] = model_config_sha256;
  m["created_by"] = "oscar import-rotations 0.1";
  m["value_objective"] = "release " + (v.objective.empty() ? std::string("(none)") : v.objective) +
                         " (imported)";
  m["key_scaling"] = key_scaling;
  const std::string clip = str_format("clip fixed rho_K %.2f rho_V %.2f", o.k_clip, o.v_clip);
  m["calibration"] = "imported from the OSCAR release (RotationZoo): " + k.describe() +
                     (k.calibration.empty() ? "" : " [" + k.calibration + "]") + "; " +
                     v.describe() + (v.calibration.empty() ? "" : " [" + v.calibration + "]") +
                     "; " + clip;
  m["eigenvalues"] = std::string("K ") +
                     (k.eigenvalues.empty() ? "absent in the source: zeros"
                                            : "descending (reversed from the release's ascending eigh order)") +
                     "; V " +
                     (v.eigenvalues.empty() ? "absent in the source: zeros"
                                            : "descending (reversed from the release's ascending eigh order)");
  std::string ids;
  for (size_t l = 0; l < L; ++l) ids += (l ? "," : "") + std::to_string(k.layer_ids[l]);
  m["source_layer_ids"] = ids;
  for (const ZooFile* z : {&k, &v}) {
    const std::string p = z == &k ? "source_k_" : "source_v_";
    m[p + "file"] = z->path;
    m[p + "sha256"] = z->sha256;
    m[p + "archive"] = z->prefix;
    m[p + "format"] = z->describe() + (z->n_heads == 1 && n_heads_kv > 1
                                           ? str_format(" (broadcast to %d KV heads)", n_heads_kv)
                                           : "");
    m[p + "check"] = z->companion.empty()
                         ? str_format("max orthogonality error %.3g (limit %.0e)",
                                      z->orthogonality_error, kRotationOrthogonalityTol)
                         : str_format("max identity error %.3g (limit %.0e)", z->identity_error,
                                      kZooIdentityTol);
  }
  m["import_config"] = str_format("%s, group_size %d, n_sink %d, n_recent %d, quantizer %s",
                                  clip.c_str(), o.group_size, o.n_sink, o.n_recent,
                                  o.quantizer.c_str());
  m[kRecommendedModeKey] = o.quantizer == "lloyd" ? "oscar-lloyd" : "oscar";
  m[kRecommendedRecentKey] = std::to_string(o.n_recent);
  return set;
}

}  // namespace oscar::quant
