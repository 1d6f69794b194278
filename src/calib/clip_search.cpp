#include "calib/clip_search.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"
#include "quant/rotation.h"

namespace oscar::calib {

namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A window after rotation, with the exact attention of its sampled queries precomputed.
struct PreparedWindow {
  int64_t T = 0, m = 0;
  int64_t q_begin = 0, q_end = 0;  // union of the queries' quantized key ranges [q_begin, q_end)
  MatF k_rot, v_rot, q_rot;        // [T, d], [T, d], [m, d]
  std::vector<int64_t> pos;        // [m]
  std::vector<int64_t> hist_end;   // [m] end of query i's quantized range (start is q_begin)
  MatF z;                          // [m, T] exact logits (only t <= pos_i meaningful)
  MatF p;                          // [m, T] exact probabilities (0 beyond pos_i)
  std::vector<double> lse;         // [m] log-sum-exp of the exact logits
};

MatF rotate(const std::vector<float>& x, int64_t n, const float* R, int d) {
  MatF out(n, d);
  quant::rotate_rows(x.data(), static_cast<int>(n), R, d, out.data());
  return out;
}

// Quantize + dequantize rows [begin, end) of x in place of a copy.
Status fake_quantize(const MatF& x, int64_t begin, int64_t end, const ClipSearchConfig& c,
                     float rho, std::vector<uint8_t>& scratch, MatF& out) {
  const int d = c.head_dim;
  const int rows = static_cast<int>(end - begin);
  out.resize(rows, d);
  if (rows == 0) return Status();
  scratch.resize(static_cast<size_t>(rows) * quant::int2_row_bytes(d, c.group_size));
  const float* src = x.data() + begin * d;
  if (c.quantizer == quant::HistQuantizer::kInt2Uniform) {
    OSCAR_RETURN_IF_ERROR(quant::quantize_rows_int2(src, rows, d, c.group_size, rho, scratch.data()));
    quant::dequantize_rows_int2(scratch.data(), rows, d, c.group_size, out.data());
  } else {
    OSCAR_RETURN_IF_ERROR(quant::quantize_rows_lloyd(src, rows, d, c.group_size, rho, scratch.data()));
    quant::dequantize_rows_lloyd(scratch.data(), rows, d, c.group_size, out.data());
  }
  return Status();
}

PreparedWindow prepare(const ClipWindow& w, const KeyTransform& kt, const float* rv,
                       const ClipSearchConfig& c, float scale) {
  const int d = c.head_dim;
  PreparedWindow p;
  p.T = w.n_tokens;
  p.m = static_cast<int64_t>(w.q_pos.size());
  if (kt.mean != nullptr) {
    std::vector<float> centred = w.k;
    for (size_t i = 0; i < centred.size(); ++i) centred[i] -= kt.mean[i % d];
    p.k_rot = rotate(centred, p.T, kt.key, d);
  } else {
    p.k_rot = rotate(w.k, p.T, kt.key, d);
  }
  p.v_rot = rotate(w.v, p.T, rv, d);
  p.q_rot = rotate(w.q, p.m, kt.query, d);
  p.pos = w.q_pos;
  p.q_begin = std::min<int64_t>(c.n_sink, p.T);
  p.q_end = p.q_begin;
  p.hist_end.resize(p.m);
  for (int64_t i = 0; i < p.m; ++i) {
    p.hist_end[i] = std::max<int64_t>(p.q_begin, p.pos[i] + 1 - c.n_recent);
    p.q_end = std::max(p.q_end, p.hist_end[i]);
  }
  p.z.noalias() = (p.q_rot * p.k_rot.transpose()) * scale;
  p.p.setZero(p.m, p.T);
  p.lse.resize(p.m);
  for (int64_t i = 0; i < p.m; ++i) {
    const int64_t n = p.pos[i] + 1;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, static_cast<double>(p.z(i, t)));
    double s = 0;
    for (int64_t t = 0; t < n; ++t) s += std::exp(static_cast<double>(p.z(i, t)) - mx);
    p.lse[i] = mx + std::log(s);
    for (int64_t t = 0; t < n; ++t)
      p.p(i, t) = static_cast<float>(std::exp(static_cast<double>(p.z(i, t)) - p.lse[i]));
  }
  return p;
}

// Key loss of one window for the dequantized rotated keys khat = rows [q_begin, q_end).
double key_loss(const PreparedWindow& w, const MatF& khat, KeyClipObjective obj, float scale,
                MatF& zq) {
  const int64_t nq = w.q_end - w.q_begin;
  if (nq == 0) return 0.0;
  zq.noalias() = (w.q_rot * khat.transpose()) * scale;  // [m, nq]
  double loss = 0.0;
  std::vector<double> zhat;
  for (int64_t i = 0; i < w.m; ++i) {
    const int64_t n = w.pos[i] + 1;
    const int64_t he = w.hist_end[i];
    auto quantized = [&](int64_t t) { return t >= w.q_begin && t < he; };
    if (obj == KeyClipObjective::kLogit) {
      for (int64_t t = w.q_begin; t < he; ++t) {
        const double e = static_cast<double>(zq(i, t - w.q_begin)) - w.z(i, t);
        loss += e * e;
      }
      continue;
    }
    zhat.resize(static_cast<size_t>(n));
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t t = 0; t < n; ++t) {
      zhat[t] = quantized(t) ? static_cast<double>(zq(i, t - w.q_begin)) : w.z(i, t);
      mx = std::max(mx, zhat[t]);
    }
    if (obj == KeyClipObjective::kWeightedLogit) {
      for (int64_t t = w.q_begin; t < he; ++t) {
        const double e = zhat[t] - w.z(i, t);
        loss += static_cast<double>(w.p(i, t)) * e * e;
      }
      continue;
    }
    double s = 0;
    for (int64_t t = 0; t < n; ++t) s += std::exp(zhat[t] - mx);
    const double lse_hat = mx + std::log(s);
    if (obj == KeyClipObjective::kKl) {
      // KL(p || p̂) = Σ p (z − ẑ) − lse(z) + lse(ẑ); only quantized keys have z != ẑ.
      double kl = lse_hat - w.lse[i];
      for (int64_t t = w.q_begin; t < he; ++t)
        kl += static_cast<double>(w.p(i, t)) * (static_cast<double>(w.z(i, t)) - zhat[t]);
      loss += kl;
    } else {  // kProb
      for (int64_t t = 0; t < n; ++t) {
        const double e = std::exp(zhat[t] - lse_hat) - std::exp(static_cast<double>(w.z(i, t)) - w.lse[i]);
        loss += e * e;
      }
    }
  }
  return loss;
}

// Value loss Σ_i ‖Σ_{t quantized} p_it (v̂_t − v_t)‖² for vhat = rows [q_begin, q_end).
double value_loss(const PreparedWindow& w, const MatF& vhat, MatF& pm, MatF& err) {
  const int64_t nq = w.q_end - w.q_begin;
  if (nq == 0) return 0.0;
  err = vhat - w.v_rot.middleRows(w.q_begin, nq);
  MatF out = pm * err;  // [m, d]
  double loss = 0.0;
  for (int64_t i = 0; i < out.size(); ++i) loss += static_cast<double>(out.data()[i]) * out.data()[i];
  return loss;
}

}  // namespace

Result<KeyClipObjective> parse_key_clip_objective(const std::string& name) {
  if (name == "prob") return KeyClipObjective::kProb;
  if (name == "kl") return KeyClipObjective::kKl;
  if (name == "weighted-logit") return KeyClipObjective::kWeightedLogit;
  if (name == "logit") return KeyClipObjective::kLogit;
  return invalid_argument("key clip objective '%s': expected prob, kl, weighted-logit or logit",
                          name.c_str());
}

const char* key_clip_objective_name(KeyClipObjective o) {
  switch (o) {
    case KeyClipObjective::kProb: return "prob";
    case KeyClipObjective::kKl: return "kl";
    case KeyClipObjective::kWeightedLogit: return "weighted-logit";
    case KeyClipObjective::kLogit: return "logit";
  }
  return "?";
}

Result<quant::HistQuantizer> parse_quantizer(const std::string& name) {
  if (name == "uniform") return quant::HistQuantizer::kInt2Uniform;
  if (name == "lloyd") return quant::HistQuantizer::kInt2Lloyd;
  return invalid_argument("quantizer '%s': expected uniform or lloyd", name.c_str());
}

const char* quantizer_name(quant::HistQuantizer q) {
  switch (q) {
    case quant::HistQuantizer::kInt2Uniform: return "uniform";
    case quant::HistQuantizer::kInt2Lloyd: return "lloyd";
    case quant::HistQuantizer::kKivi: return "kivi";
  }
  return "?";
}

Status ClipGrid::validate() const {
  if (!(min > 0.0f && min <= max && max <= 1.5f))
    return invalid_argument("clip grid: need 0 < min <= max <= 1.5, got min %g max %g", min, max);
  if (!(step > 0.0f)) return invalid_argument("clip grid: step %g must be positive", step);
  if ((max - min) / step > 999.5f)
    return invalid_argument("clip grid: %g..%g by %g has more than 1000 points", min, max, step);
  return Status();
}

std::vector<float> ClipGrid::values() const {
  const int n = static_cast<int>(std::floor((static_cast<double>(max) - min) / step + 1e-6)) + 1;
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    v[i] = static_cast<float>(std::min<double>(max, static_cast<double>(min) + i * static_cast<double>(step)));
  // Round to the step's decimal precision so that 0.8 + 16 * 0.01 prints and stores as 0.96.
  for (float& x : v) x = static_cast<float>(std::round(static_cast<double>(x) * 1e6) / 1e6);
  return v;
}

Result<ClipSearchResult> search_clip(const std::vector<ClipWindow>& windows,
                                     const KeyTransform& key, const float* v_rotation,
                                     const ClipSearchConfig& c) {
  OSCAR_CHECK(key.key != nullptr && key.query != nullptr && v_rotation != nullptr);
  OSCAR_RETURN_IF_ERROR(c.grid.validate());
  if (c.quantizer != quant::HistQuantizer::kInt2Uniform &&
      c.quantizer != quant::HistQuantizer::kInt2Lloyd)
    return invalid_argument("clip search: quantizer %d is not an INT2 one (uniform or lloyd)",
                            static_cast<int>(c.quantizer));
  const int d = c.head_dim;
  if (!quant::int2_valid_group(d, c.group_size))
    return invalid_argument("clip search: group size %d does not divide head_dim %d", c.group_size, d);
  if (windows.empty()) return invalid_argument("clip search: no calibration windows");
  for (size_t w = 0; w < windows.size(); ++w) {
    const ClipWindow& cw = windows[w];
    const size_t T = static_cast<size_t>(cw.n_tokens), m = cw.q_pos.size();
    if (cw.n_tokens <= 0 || cw.k.size() != T * d || cw.v.size() != T * d || cw.q.size() != m * d)
      return invalid_argument("clip search: window %zu has mis-shaped k/v/q (%zu tokens, %zu queries)",
                              w, T, m);
    for (int64_t p : cw.q_pos)
      if (p < 0 || p >= cw.n_tokens)
        return invalid_argument("clip search: window %zu query position %lld outside [0, %zu)", w,
                                static_cast<long long>(p), T);
  }
  const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(d));

  ClipSearchResult r;
  r.grid = c.grid.values();
  r.k_loss.assign(r.grid.size(), 0.0);
  r.v_loss.assign(r.grid.size(), 0.0);
  std::vector<uint8_t> scratch;
  MatF khat, vhat, zq, pm, err;
  for (const ClipWindow& cw : windows) {
    const PreparedWindow w = prepare(cw, key, v_rotation, c, scale);
    const int64_t nq = w.q_end - w.q_begin;
    // Probabilities restricted to each query's quantized keys (the value loss's weights).
    pm.setZero(w.m, nq);
    for (int64_t i = 0; i < w.m; ++i)
      for (int64_t t = w.q_begin; t < w.hist_end[i]; ++t) pm(i, t - w.q_begin) = w.p(i, t);
    for (size_t g = 0; g < r.grid.size(); ++g) {
      OSCAR_RETURN_IF_ERROR(fake_quantize(w.k_rot, w.q_begin, w.q_end, c, r.grid[g], scratch, khat));
      r.k_loss[g] += key_loss(w, khat, c.key_objective, scale, zq);
      OSCAR_RETURN_IF_ERROR(fake_quantize(w.v_rot, w.q_begin, w.q_end, c, r.grid[g], scratch, vhat));
      r.v_loss[g] += value_loss(w, vhat, pm, err);
    }
  }
  // Argmin, ties to the larger ρ: scan from the top of the grid with a strict comparison.
  size_t bk = r.grid.size() - 1, bv = r.grid.size() - 1;
  for (size_t g = r.grid.size(); g-- > 0;) {
    if (r.k_loss[g] < r.k_loss[bk]) bk = g;
    if (r.v_loss[g] < r.v_loss[bv]) bv = g;
  }
  r.k_clip = r.grid[bk];
  r.v_clip = r.grid[bv];
  return r;
}

}  // namespace oscar::calib
