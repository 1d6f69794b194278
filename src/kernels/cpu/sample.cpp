// CPU sample / sample_ref (kernels/sample.h).
#include "kernels/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace oscar::kernels {

namespace {

Status check(const SampleParams& p) {
  if (p.n_rows < 0 || p.vocab <= 0)
    return invalid_argument("sample: bad shape (%d rows, vocab %d)", p.n_rows, p.vocab);
  if (p.n_rows > 0 && (p.logits == nullptr || p.config == nullptr || p.step == nullptr ||
                       p.ids == nullptr))
    return invalid_argument("sample: null logits, config, step or ids");
  for (int32_t r = 0; r < p.n_rows; ++r) OSCAR_RETURN_IF_ERROR(validate_sampling(p.config[r]));
  return Status();
}

bool all_finite(const float* l, int32_t n) {
  for (int32_t i = 0; i < n; ++i)
    if (!std::isfinite(l[i])) return false;
  return true;
}

int32_t argmax(const float* l, int32_t n) {
  return static_cast<int32_t>(std::max_element(l, l + n) - l);
}

// The draw over candidates ids[0..n) (in candidate order) with weights p and total mass M.
int32_t draw(const std::vector<int32_t>& ids, const std::vector<double>& p, int32_t n, double M,
             float top_p, double u) {
  int32_t keep = n;
  if (top_p < 1.f) {
    double cum = 0;
    for (int32_t i = 0; i < n; ++i) {
      cum += p[i];
      if (cum >= static_cast<double>(top_p) * M) {
        keep = i + 1;
        break;
      }
    }
  }
  double S = 0;
  for (int32_t i = 0; i < keep; ++i) S += p[i];
  double r = u * S;
  for (int32_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r < 0) return ids[i];
  }
  return ids[keep - 1];
}

// No filter: the draw walks the tokens in id order.
int32_t draw_unfiltered(const float* l, int32_t V, float temperature, double u,
                        std::vector<int32_t>& ids, std::vector<double>& w) {
  const double top = *std::max_element(l, l + V), inv_t = 1.0 / temperature;
  ids.resize(V);
  std::iota(ids.begin(), ids.end(), 0);
  w.resize(V);
  for (int32_t t = 0; t < V; ++t) w[t] = std::exp((l[t] - top) * inv_t);
  return draw(ids, w, V, 0.0, 1.f, u);
}

}  // namespace

Status validate_sampling(const SamplingConfig& c) {
  if (!(c.temperature >= 0.f) || !std::isfinite(c.temperature))
    return invalid_argument("temperature %g must be a finite number >= 0", c.temperature);
  if (c.top_k < 0) return invalid_argument("top_k %d must be >= 0", c.top_k);
  if (!(c.top_p > 0.f && c.top_p <= 1.f))
    return invalid_argument("top_p %g must be in (0, 1]", c.top_p);
  return Status();
}

double sample_uniform(uint64_t seed, uint64_t step) {
  uint64_t z = seed + (step + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

Status sample_ref(const SampleParams& p) {
  OSCAR_RETURN_IF_ERROR(check(p));
  const int32_t V = p.vocab;
  for (int32_t r = 0; r < p.n_rows; ++r) {
    const float* l = p.logits + static_cast<size_t>(r) * V;
    const SamplingConfig& c = p.config[r];
    if (!all_finite(l, V)) {
      p.ids[r] = kSampleNonFinite;
      continue;
    }
    if (c.temperature == 0.f) {
      p.ids[r] = argmax(l, V);
      continue;
    }
    std::vector<int32_t> ids;
    std::vector<double> w;
    if (c.top_k == 0 && c.top_p >= 1.f) {
      p.ids[r] = draw_unfiltered(l, V, c.temperature, sample_uniform(c.seed, p.step[r]), ids, w);
      continue;
    }
    ids.resize(V);
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(),
              [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    const int32_t n = c.top_k > 0 ? std::min(c.top_k, V) : V;
    const double top = l[ids[0]], inv_t = 1.0 / c.temperature;
    w.resize(n);
    for (int32_t i = 0; i < n; ++i) w[i] = std::exp((l[ids[i]] - top) * inv_t);
    double M = 0;
    if (c.top_k > 0) {
      for (int32_t i = 0; i < n; ++i) M += w[i];
    } else {
      for (int32_t t = 0; t < V; ++t) M += std::exp((l[t] - top) * inv_t);
    }
    p.ids[r] = draw(ids, w, n, M, c.top_p, sample_uniform(c.seed, p.step[r]));
  }
  return Status();
}

Status sample(const SampleParams& p) {
  OSCAR_RETURN_IF_ERROR(check(p));
  const int32_t V = p.vocab;
  std::vector<int32_t> ids;
  std::vector<double> w;
  for (int32_t r = 0; r < p.n_rows; ++r) {
    const float* l = p.logits + static_cast<size_t>(r) * V;
    const SamplingConfig& c = p.config[r];
    if (!all_finite(l, V)) {
      p.ids[r] = kSampleNonFinite;
      continue;
    }
    const int32_t best = argmax(l, V);
    if (c.temperature == 0.f) {
      p.ids[r] = best;
      continue;
    }
    if (c.top_k == 0 && c.top_p >= 1.f) {
      p.ids[r] = draw_unfiltered(l, V, c.temperature, sample_uniform(c.seed, p.step[r]), ids, w);
      continue;
    }
    const double top = l[best], inv_t = 1.0 / c.temperature;
    auto order = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
    ids.resize(V);
    std::iota(ids.begin(), ids.end(), 0);
    double M = 0;
    int32_t n;  // candidates sorted in ids[0..n)
    if (c.top_k > 0) {
      n = std::min(c.top_k, V);
      std::nth_element(ids.begin(), ids.begin() + (n - 1), ids.end(), order);
      std::sort(ids.begin(), ids.begin() + n, order);
      w.resize(n);
      for (int32_t i = 0; i < n; ++i) M += (w[i] = std::exp((l[ids[i]] - top) * inv_t));
    } else {
      for (int32_t t = 0; t < V; ++t) M += std::exp((l[t] - top) * inv_t);
      // Grow a sorted prefix until it holds top_p of the mass (or the whole vocabulary).
      n = std::min<int32_t>(64, V);
      for (;;) {
        std::nth_element(ids.begin(), ids.begin() + (n - 1), ids.end(), order);
        std::sort(ids.begin(), ids.begin() + n, order);
        w.resize(n);
        double cum = 0;
        for (int32_t i = 0; i < n; ++i) cum += (w[i] = std::exp((l[ids[i]] - top) * inv_t));
        if (n == V || cum >= static_cast<double>(c.top_p) * M) break;
        n = std::min<int64_t>(V, 4 * static_cast<int64_t>(n));
      }
    }
    p.ids[r] = draw(ids, w, n, M, c.top_p, sample_uniform(c.seed, p.step[r]));
  }
  return Status();
}

int32_t sample_one(const float* logits, int32_t vocab, const SamplingConfig& config,
                   uint64_t step) {
  int32_t id = kSampleNonFinite;
  SampleParams p;
  p.logits = logits;
  p.n_rows = 1;
  p.vocab = vocab;
  p.config = &config;
  p.step = &step;
  p.ids = &id;
  const Status st = sample(p);
  return st.ok() ? id : kSampleNonFinite;
}

}  // namespace oscar::kernels
