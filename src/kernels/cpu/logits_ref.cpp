// CPU process_logits_ref / logprobs_ref (kernels/logits.h): plain loops, float64 sums.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/logits.h"

namespace oscar::kernels {

Status process_logits_ref(const LogitsProcessParams& p) {
  if (p.n_rows < 0 || p.vocab <= 0 || p.n_edits < 0)
    return invalid_argument("process_logits: bad shape (%d rows, vocab %d, %d edits)", p.n_rows,
                            p.vocab, p.n_edits);
  if (p.n_edits > 0 && (p.logits == nullptr || p.edits == nullptr))
    return invalid_argument("process_logits: null logits or edits");
  for (int32_t e = 0; e < p.n_edits; ++e) {
    const LogitsRowEdit& ed = p.edits[e];
    if (ed.row < 0 || ed.row >= p.n_rows)
      return invalid_argument("process_logits: row %d out of range [0, %d)", ed.row, p.n_rows);
    if (!(ed.repetition_penalty > 0.f) || !std::isfinite(ed.repetition_penalty) ||
        !std::isfinite(ed.presence_penalty) || !std::isfinite(ed.frequency_penalty))
      return invalid_argument(
          "process_logits: penalties repetition %g (> 0), presence %g, frequency %g (finite)",
          ed.repetition_penalty, ed.presence_penalty, ed.frequency_penalty);
    if (ed.n_tokens < 0 || (ed.n_tokens > 0 && (!ed.token_ids || !ed.output_counts)))
      return invalid_argument("process_logits: %d seen tokens without ids or counts", ed.n_tokens);
    float* l = p.logits + static_cast<int64_t>(ed.row) * p.vocab;
    for (int32_t i = 0; i < ed.n_tokens; ++i) {
      const int32_t t = ed.token_ids[i];
      if (t < 0 || t >= p.vocab)
        return invalid_argument("process_logits: token id %d out of range [0, %d)", t, p.vocab);
      if (ed.repetition_penalty != 1.f)
        l[t] = l[t] > 0.f ? l[t] / ed.repetition_penalty : l[t] * ed.repetition_penalty;
      const int32_t c = ed.output_counts[i];
      if (c > 0) l[t] -= ed.frequency_penalty * static_cast<float>(c) + ed.presence_penalty;
    }
    if (ed.allowed)
      for (int32_t t = 0; t < p.vocab; ++t)
        if (!ed.allowed[t]) l[t] = kMaskedLogit;
  }
  return Status();
}

Status logprobs_ref(const LogprobsParams& p) {
  if (p.n_rows < 0 || p.vocab <= 0 || p.n < 0 || p.top_k < 0 || p.top_k > kMaxTopLogprobs ||
      p.top_k > p.vocab)
    return invalid_argument("logprobs: bad shape (%d rows, vocab %d, %d asked, top_k %d)", p.n_rows,
                            p.vocab, p.n, p.top_k);
  if (p.n > 0 && (!p.logits || !p.rows || !p.tokens || !p.token_logprob ||
                  (p.top_k > 0 && (!p.top_ids || !p.top_logprobs))))
    return invalid_argument("logprobs: null pointer");
  std::vector<int32_t> order;
  for (int32_t i = 0; i < p.n; ++i) {
    const int32_t r = p.rows[i], tok = p.tokens[i];
    if (r < 0 || r >= p.n_rows || tok < 0 || tok >= p.vocab)
      return invalid_argument("logprobs: row %d or token %d out of range (%d rows, vocab %d)", r,
                              tok, p.n_rows, p.vocab);
    const float* l = p.logits + static_cast<int64_t>(r) * p.vocab;
    const double top = *std::max_element(l, l + p.vocab);
    double sum = 0;
    for (int32_t t = 0; t < p.vocab; ++t) sum += std::exp(static_cast<double>(l[t]) - top);
    const double lse = top + std::log(sum);
    p.token_logprob[i] = static_cast<float>(l[tok] - lse);
    if (p.top_k == 0) continue;
    order.resize(p.vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + p.top_k, order.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int32_t k = 0; k < p.top_k; ++k) {
      p.top_ids[static_cast<int64_t>(i) * p.top_k + k] = order[k];
      p.top_logprobs[static_cast<int64_t>(i) * p.top_k + k] = static_cast<float>(l[order[k]] - lse);
    }
  }
  return Status();
}

}  // namespace oscar::kernels
