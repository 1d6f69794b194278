#include "kv/bit_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "core/check.h"
#include "quant/bit_plan_layout.h"
#include "quant/row_codec.h"

namespace oscar::kv {

Result<std::shared_ptr<const BitPlan>> BitPlan::create(int n_layers, int n_heads_kv, int head_dim,
                                                       int group_size,
                                                       const std::vector<int8_t>& k_bits,
                                                       const std::vector<int8_t>& v_bits) {
  if (n_layers <= 0 || n_heads_kv <= 0)
    return invalid_argument("bit plan: %d layers, %d kv heads", n_layers, n_heads_kv);
  if (!quant::int2_valid_group(head_dim, group_size))
    return invalid_argument("bit plan: group size %d does not fit head_dim %d", group_size,
                            head_dim);
  const size_t heads = static_cast<size_t>(n_layers) * n_heads_kv;
  if (k_bits.size() != heads || v_bits.size() != heads)
    return invalid_argument("bit plan: %zu key and %zu value widths, expected n_layers x "
                            "n_kv_heads = %zu each", k_bits.size(), v_bits.size(), heads);
  auto plan = std::shared_ptr<BitPlan>(new BitPlan());
  plan->n_layers_ = n_layers;
  plan->n_heads_kv_ = n_heads_kv;
  plan->head_dim_ = head_dim;
  plan->group_size_ = group_size;
  plan->plane_bits_.resize(heads * 2);
  plan->row_prefix_.assign(heads * 2 + 1, 0);
  for (int l = 0; l < n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < n_heads_kv; ++h) {
        const int8_t b = (kv == 0 ? k_bits : v_bits)[static_cast<size_t>(l) * n_heads_kv + h];
        if (quant::bit_plan_row_bytes(b, head_dim, group_size) == 0)
          return invalid_argument(
              "bit plan: layer %d %s head %d has %d bits per element; "
              "expected 1, 2, 3 or 4",
              l, kv == 0 ? "K" : "V", h, b);
        const size_t p = (static_cast<size_t>(l) * 2 + kv) * n_heads_kv + h;
        plan->plane_bits_[p] = b;
        plan->row_prefix_[p + 1] =
            plan->row_prefix_[p] +
            static_cast<uint32_t>(quant::bit_plan_row_bytes(b, head_dim, group_size));
      }
  return std::shared_ptr<const BitPlan>(std::move(plan));
}

Result<std::shared_ptr<const BitPlan>> BitPlan::uniform(int n_layers, int n_heads_kv, int head_dim,
                                                        int group_size, int bits) {
  const size_t heads = static_cast<size_t>(std::max(0, n_layers)) * std::max(0, n_heads_kv);
  const std::vector<int8_t> w(heads, static_cast<int8_t>(bits));
  return create(n_layers, n_heads_kv, head_dim, group_size, w, w);
}

int BitPlan::bits(int layer, int kv, int head) const {
  OSCAR_CHECK(layer >= 0 && layer < n_layers_ && (kv == 0 || kv == 1) && head >= 0 &&
              head < n_heads_kv_);
  return plane_bits_[(static_cast<size_t>(layer) * 2 + kv) * n_heads_kv_ + head];
}

double BitPlan::bits_per_element() const {
  return 8.0 * static_cast<double>(token_bytes()) /
         (static_cast<double>(plane_bits_.size()) * head_dim_);
}

std::string BitPlan::describe() const {
  bool one_width = true;
  for (int8_t b : plane_bits_) one_width = one_width && b == plane_bits_[0];
  if (one_width && plane_bits_[0] != 2) return str_format("uniform %d-bit", plane_bits_[0]);
  std::string out;
  for (int b : {4, 3, 1}) {
    std::string list;
    for (int kv = 0; kv < 2; ++kv)
      for (int l = 0; l < n_layers_; ++l)
        for (int h = 0; h < n_heads_kv_; ++h)
          if (bits(l, kv, h) == b)
            list += str_format("%s%s L%dH%d", list.empty() ? "" : ", ", kv == 0 ? "K" : "V", l, h);
    if (!list.empty()) out += str_format("%s%d-bit: %s", out.empty() ? "" : "; ", b, list.c_str());
  }
  return out.empty() ? "uniform" : out;
}

}  // namespace oscar::kv

namespace oscar::kv {

double uniform_plan_bits(int bits, int head_dim, int group_size) {
  return 8.0 * quant::bit_plan_row_bytes(bits, head_dim, group_size) / head_dim;
}

double row_noise_per_unit_variance(int bits, int head_dim, int group_size, float clip) {
  OSCAR_CHECK(bits >= 1 && bits <= 4 && quant::int2_valid_group(head_dim, group_size));
  constexpr int kRows = 256;
  const quant::RowCodec& codec =
      quant::row_codec(quant::hist_row_format(quant::HistQuantizer::kInt2Uniform, 0, bits));
  std::mt19937 rng(20261201u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(head_dim), y(head_dim);
  std::vector<uint8_t> row(quant::bit_plan_row_bytes(bits, head_dim, group_size));
  double se = 0.0;
  for (int r = 0; r < kRows; ++r) {
    for (float& v : x) v = normal(rng);
    const Status st = codec.quantize(x.data(), head_dim, group_size, clip, row.data());
    OSCAR_CHECK(st.ok(), "%s", st.message().c_str());
    codec.dequantize(row.data(), head_dim, group_size, y.data());
    for (int i = 0; i < head_dim; ++i) se += static_cast<double>(y[i] - x[i]) * (y[i] - x[i]);
  }
  return se / (static_cast<double>(kRows) * head_dim);
}

Result<std::shared_ptr<const BitPlan>> plan_for_bits(int n_layers, int n_heads_kv, int head_dim,
                                                     int group_size, double target_bits,
                                                     const PlanStatistics& s) {
  if (n_layers <= 0 || n_heads_kv <= 0 || !quant::int2_valid_group(head_dim, group_size))
    return invalid_argument("--kv-bits: %d layers, %d kv heads, head_dim %d, group size %d",
                            n_layers, n_heads_kv, head_dim, group_size);
  const double lo = uniform_plan_bits(2, head_dim, group_size);
  const double hi = uniform_plan_bits(4, head_dim, group_size);
  if (!std::isfinite(target_bits) || target_bits < lo || target_bits > hi)
    return invalid_argument(
        "--kv-bits %g: expected %g..%g bits per element (every history row "
        "at 2 bits .. at 4 bits, metadata included, group size %d)",
        target_bits, lo, hi, group_size);
  const size_t heads = static_cast<size_t>(n_layers) * n_heads_kv;
  if (s.key_logit_error.size() != heads || s.value_energy.size() != heads ||
      (!s.k_clip.empty() && s.k_clip.size() != heads) ||
      (!s.v_clip.empty() && s.v_clip.size() != heads))
    return invalid_argument("--kv-bits: statistics for %zu / %zu heads, expected %zu",
                            s.key_logit_error.size(), s.value_energy.size(), heads);
  double sum_k = 0, sum_v = 0;
  for (size_t i = 0; i < heads; ++i) {
    if (!(s.key_logit_error[i] >= 0) || !(s.value_energy[i] >= 0) ||
        !std::isfinite(s.key_logit_error[i]) || !std::isfinite(s.value_energy[i]))
      return invalid_argument("--kv-bits: head %zu has statistics %g / %g (must be finite, >= 0)",
                              i, s.key_logit_error[i], s.value_energy[i]);
    sum_k += s.key_logit_error[i];
    sum_v += s.value_energy[i];
  }
  // Planes in kernels::KvPageLayout order: p = (layer·2 + kv)·n_heads_kv + head.
  const int n_planes = 2 * static_cast<int>(heads);
  std::vector<int> min_bits(n_planes);
  std::vector<std::array<double, 5>> cost(n_planes);  // cost[p][b], b = 1..4
  std::map<std::pair<int, float>, double> noise;      // (bits, clip) -> n(b)
  for (int l = 0; l < n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < n_heads_kv; ++h) {
        const size_t i = static_cast<size_t>(l) * n_heads_kv + h;
        const int p = (l * 2 + kv) * n_heads_kv + h;
        const std::vector<float>& clips = kv == 0 ? s.k_clip : s.v_clip;
        // The given clips are the 2-bit rows'; wider rows are not clipped (the runtime's rule).
        const float clip2 = clips.empty() ? 1.0f : clips[i];
        const double sum = kv == 0 ? sum_k : sum_v;
        const double w = sum > 0 ? (kv == 0 ? s.key_logit_error[i] : s.value_energy[i]) / sum : 0;
        min_bits[p] = kv == 0 ? 2 : 1;
        for (int b = 1; b <= 4; ++b) {
          const float clip = b >= 3 ? 1.0f : clip2;
          auto it = noise.find({b, clip});
          if (it == noise.end())
            it = noise
                     .emplace(std::pair{b, clip},
                              row_noise_per_unit_variance(b, head_dim, group_size, clip))
                     .first;
          cost[p][b] = w * it->second;
        }
      }
  // Budget in one-bit steps above all-1 rows (each step head_dim/8 bytes).
  const double budget_bytes = target_bits * n_planes * head_dim / 8.0;
  const int64_t base =
      static_cast<int64_t>(n_planes) * quant::bit_plan_row_bytes(1, head_dim, group_size);
  const int step_bytes = head_dim / 8;
  const int steps = static_cast<int>(std::floor((budget_bytes - base) / step_bytes + 1e-9));
  // best[p][k]: least cost of planes [0, p) with k steps; choice[p][k]: width of plane p - 1.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> best(static_cast<size_t>(steps) + 1, kInf), next(best.size());
  std::vector<int8_t> choice(static_cast<size_t>(n_planes) * (steps + 1), 0);
  best[0] = 0;
  for (int p = 0; p < n_planes; ++p) {
    std::fill(next.begin(), next.end(), kInf);
    for (int k = 0; k <= steps; ++k) {
      if (best[k] == kInf) continue;
      for (int b = 4; b >= min_bits[p]; --b) {  // wider first: ties give this plane the step
        const int k2 = k + b - 1;
        if (k2 > steps) continue;
        const double c = best[k] + cost[p][b];
        if (c < next[k2]) {
          next[k2] = c;
          choice[static_cast<size_t>(p) * (steps + 1) + k2] = static_cast<int8_t>(b);
        }
      }
    }
    best.swap(next);
  }
  int k = 0;
  for (int j = 1; j <= steps; ++j)
    if (best[j] < best[k]) k = j;  // least cost within the budget (the first on ties)
  OSCAR_CHECK(best[k] < kInf, "--kv-bits: no plan within %d steps", steps);
  std::vector<int8_t> k_bits(heads), v_bits(heads);
  for (int p = n_planes - 1; p >= 0; --p) {
    const int b = choice[static_cast<size_t>(p) * (steps + 1) + k];
    const int h = p % n_heads_kv, kv = (p / n_heads_kv) % 2, l = p / (2 * n_heads_kv);
    (kv == 0 ? k_bits : v_bits)[static_cast<size_t>(l) * n_heads_kv + h] = static_cast<int8_t>(b);
    k -= b - 1;
  }
  OSCAR_CHECK(k == 0);
  return BitPlan::create(n_layers, n_heads_kv, head_dim, group_size, k_bits, v_bits);
}

}  // namespace oscar::kv
