// PrefillBudget: how much prompt a step may prefill while other sequences decode, so that their
// token gap stays within a multiple of an undisturbed decode step.
//
// Why: a step that carries a prefill chunk lasts as long as that chunk's attention over the whole
// prefix so far, so with a fixed chunk the running streams' token gap grows with the prompt's
// depth (session 11 on the H200: 8192-token chunks near 100K held the streams for 3.3 s; even 512
// tokens at 100K cost ~100 ms a step against a 7 ms decode step). Token budgets (vLLM's
// max_num_batched_tokens, our --max-batch-tokens) do not see depth.
//
// The rule: while decode rows run, a step's prefill chunks together cost at most
// (itl_factor - 1) x the decode step's time, in flops at the measured prefill rate; the cost of n
// tokens at depth D is n · 2 · (active parameters) for the linear layers plus n · (D + n / 2) ·
// 4 · head_dim · query heads · attention layers for causal attention. Every chunk gets at least
// one page, so a prompt always advances. Both times are measured online (exponential averages of
// the steps' wall times): the decode step from steps without prefill, the rate from steps with.
// Until both are known, and in steps without decode rows, chunks are not limited here.
//
// Off by default (serve --prefill-itl-factor): on the H200 (session 13, 8 streams decoding and a
// 100K-token prompt, factor 2.5) the prompt had not finished after 130 s. Chunks of ~100 tokens
// at depth 50K give the prefill attention kernel 4 query tiles per KV head, 32 blocks for 132
// SMs, so the measured rate fell, the chunks shrank to a page and the prefill crawled. The rule
// needs prefill attention that splits a short chunk's keys across blocks (as decode attention
// does) to hold its rate at small chunks.
#pragma once

#include <cstdint>

#include "format/model_config.h"

namespace oscar::engine {

class PrefillBudget {
 public:
  // itl_factor <= 1: off (budget() is unlimited).
  PrefillBudget(const format::ModelConfig& config, double itl_factor);

  // Flops of prefilling n tokens over a cache that holds `depth` tokens.
  double cost(int64_t n, int64_t depth) const;
  // The most tokens, at most `want` and at least min(want, floor), whose cost fits `flops`.
  int64_t fit(double flops, int64_t depth, int64_t want, int64_t floor) const;
  // The prefill flops a step may carry (infinity when unlimited).
  double budget(bool decoding) const;
  // A finished step: its decode rows, the cost of its prefill chunks, its wall time.
  void record(int n_decode, double prefill_flops, double seconds);

  bool enabled() const { return factor_ > 1; }
  double decode_step_seconds() const { return t_decode_; }
  double prefill_flops_per_second() const { return rate_; }

 private:
  double w_token_;  // linear flops per token
  double w_pair_;   // attention flops per (query, visible key) pair
  double factor_;
  double t_decode_ = 0;  // seconds of a step of decode rows alone
  double rate_ = 0;      // prefill flops per second
};

}  // namespace oscar::engine
