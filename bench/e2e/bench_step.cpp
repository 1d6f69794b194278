// One CPU decode step of a whole batch, by phase (a benchmark, not a test): the step time and
// tokens/s at several batch sizes and contexts, and where the time goes (linear layers,
// attention, K/V append, demotion, sampling, the rest), for one cache mode.
//
//   ./build/bench/bench_step [--model DIR] [--mode oscar] [--contexts 4096,32000]
//                            [--batches 1,16,64] [--steps 8] [--warmup-steps 2] [--reps 5]
//
// Per (context, batch): `warmup-steps` untimed steps, then `reps` repetitions of `steps` timed
// steps on the same caches (so the context grows by warmup-steps + reps x steps). "step ms" is the
// median over the repetitions of their mean step, with its min-max and max/min beside; the phase
// columns are means over all timed steps, and "rest" is the mean step less their sum
// (docs/results/bench_method.md).
//
// Every sequence of a batch holds `context` tokens: one sequence is filled with random K/V, the
// others adopt its sinks and history pages as a prefix (as requests sharing a system prompt do)
// and get a recent window of their own; so the history bytes of a batch are shared and may sit
// in the CPU's caches (the step reads them once per sequence all the same). The file compiles
// against the engine before the batched step too (it uses only forward(SeqChunk), reserve,
// write, commit and adopt_prefix there), which is how docs/results/step_cpu.md compares the two
// in one run; the phase columns need the Backend (kernels/backend.h) and read "-" without it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/omp_env.h"
#include "engine/runtime.h"
#include "repeat_stats.h"

#if __has_include("kernels/backend.h")
#define OSCAR_BENCH_PHASES 1
#include "kernels/backend.h"
#include "phase_backend.h"
#endif

using namespace oscar;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

template <typename S>
void check(const S& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.to_string().c_str());
    std::exit(1);
  }
}

#ifdef OSCAR_BENCH_PHASES
// Adds up each op's wall time per phase (CPU ops are synchronous, so wall time is the op's time).
class TimedBackend final : public bench::PhaseBackend {
 public:
  using PhaseBackend::PhaseBackend;
  std::map<std::string, double> seconds;

 private:
  Status run(Op op, const std::function<Status()>& f) override {
    const auto t = Clock::now();
    Status st = f();
    seconds[phase(op)] += since(t);
    return st;
  }
  static const char* phase(Op op) {
    switch (op) {
      case Op::kLinear:
      case Op::kLmHead:
        return "linear";
      case Op::kKvAppend:
        return "append";
      case Op::kRotateQueries:
      case Op::kDecodeAttn:
      case Op::kPrefillAttn:
        return "attention";
      case Op::kDemotePages:
        return "demotion";
      case Op::kSample:
        return "sampling";
      default:
        return "other ops";
    }
  }
};
#endif

// Fills a fresh cache with n tokens of random K/V (all layers) and commits them.
void fill(engine::Runtime& rt, kv::SequenceCache& cache, int64_t n, std::mt19937& rng) {
  const auto& c = rt.model().config();
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> k(static_cast<size_t>(n) * c.kv_dim), v(k.size());
  check(cache.reserve(n), "reserve");
  for (int l = 0; l < c.n_layers; ++l) {
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    cache.write(l, k.data(), v.data(), n);
  }
#ifdef OSCAR_BENCH_PHASES
  check(cache.commit(n), "commit");
#else
  cache.commit(n);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  set_omp_wait_policy(argv);
  std::string model = "models/tiny-qwen3", mode = "oscar", contexts = "4096,32000",
              batches = "1,16,64";
  int steps = 8, warmup_steps = 2, reps = 5, deterministic = 0;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf(
          "usage: bench_step [--model DIR] [--mode oscar] [--contexts 4096,32000]\n"
          "                  [--batches 1,16,64] [--steps 8] [--warmup-steps 2] [--reps 5]\n"
          "                  [--deterministic 0|1]\n"
          "One CPU decode step of a batch by phase, a markdown row per (context, batch):\n"
          "--warmup-steps untimed steps, then --reps repetitions of --steps timed ones; the\n"
          "median step with its min-max and max/min. A context plus the steps decoded must fit\n"
          "the model's context.\n");
      return 0;
    }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--mode") mode = argv[i + 1];
    else if (a == "--contexts") contexts = argv[i + 1];
    else if (a == "--batches") batches = argv[i + 1];
    else if (a == "--steps") steps = std::stoi(argv[i + 1]);
    else if (a == "--warmup-steps") warmup_steps = std::stoi(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else if (a == "--deterministic") deterministic = std::stoi(argv[i + 1]);  // batch-invariant
    else {
      std::fprintf(stderr, "bench_step: unknown option %s (--help lists them)\n", a.c_str());
      return 2;
    }
  }
  if (steps < 1 || warmup_steps < 0 || reps < 1) {
    std::fprintf(stderr, "bench_step: need --steps >= 1, --warmup-steps >= 0, --reps >= 1\n");
    return 2;
  }
  const int decoded = warmup_steps + reps * steps;  // steps per (context, batch)
  engine::RuntimeOptions o;
  o.model_dir = model;
  o.cache_mode = mode;
  o.kv_budget_bytes = size_t{2} << 30;
  o.deterministic = deterministic != 0;
  auto made = engine::Runtime::create(o);
  check(made.status(), "runtime");
  engine::Runtime& rt = *made.value();
  const auto& cfg = rt.model().config();
#ifdef OSCAR_BENCH_PHASES
  TimedBackend timed(rt.model().backend());
  check(rt.model().set_backend(&timed), "set_backend");
#endif
  const char* phases[] = {"linear", "attention", "append", "demotion", "sampling", "other ops"};
  for (int ctx : split_ints(contexts))
    if (ctx + decoded > cfg.max_position_embeddings) {
      std::fprintf(stderr, "bench_step: context %d + %d steps exceeds the model's context of %d\n",
                   ctx, decoded, cfg.max_position_embeddings);
      return 2;
    }
  std::printf("%d warm-up steps, then %d repetitions of %d steps (step ms: the median)\n\n",
              warmup_steps, reps, steps);
  std::printf("| mode | context | batch | step ms | min-max | max/min | tok/s | linear | attention | "
              "append | demotion | sampling | other ops | rest |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(7);
  for (int ctx : split_ints(contexts)) {
    // One sequence of ctx tokens whose sinks and history the others share.
    auto base = rt.new_cache();
    fill(rt, *base, ctx, rng);
    auto shared = base->shareable_pages();
    if (rt.spec().quantized())  // sinks and history only: each sequence has its own window
      shared.resize(static_cast<size_t>(base->hist_end() / rt.spec().regions.page_size));
    for (int batch : split_ints(batches)) {
      std::vector<std::unique_ptr<kv::SequenceCache>> caches;
      for (int b = 0; b < batch; ++b) {
        caches.push_back(rt.new_cache());
        for (const kv::CachedPage& p : shared)
          (p.pool == kv::kPoolBf16 ? rt.exact_pool() : *rt.int2_pool()).retain(p.page);
        check(caches.back()->adopt_prefix(shared), "adopt_prefix");
        fill(rt, *caches.back(), ctx - caches.back()->n_tokens(), rng);
      }
      std::vector<int32_t> next(batch, 42);
      std::vector<std::vector<float>> logits(batch);
      std::vector<model::SeqChunk> chunks(batch);
      double total = 0, sampling = 0;
      std::vector<double> rep_ms;  // the mean step of each repetition
#ifdef OSCAR_BENCH_PHASES
      timed.seconds.clear();
#endif
      for (int s = -warmup_steps; s < reps * steps; ++s) {  // steps below 0 warm up
#ifdef OSCAR_BENCH_PHASES
        if (s == 0) timed.seconds.clear();
#endif
        if (s >= 0 && s % steps == 0) rep_ms.push_back(0);
        const auto t = Clock::now();
        for (int b = 0; b < batch; ++b)
          chunks[b] = model::SeqChunk{std::span<const int32_t>(&next[b], 1), caches[b].get(),
                                      false, &logits[b]};
        check(rt.model().forward(chunks), "forward");
        const auto ts = Clock::now();
        for (int b = 0; b < batch; ++b)
          next[b] = static_cast<int32_t>(std::max_element(logits[b].begin(), logits[b].end()) -
                                         logits[b].begin());
        if (s >= 0) {
          const double step_s = since(t);
          sampling += since(ts);
          total += step_s;
          rep_ms.back() += 1e3 * step_s / steps;
        }
      }
      const int timed_steps = reps * steps;
      const double step_ms = 1e3 * total / timed_steps;  // the mean, which the phases add up to
      const bench::Spread ms = bench::spread(rep_ms);
      std::printf("| %s | %d | %d | %.2f | %s | %.2f | %.0f |", mode.c_str(), ctx, batch,
                  ms.median, bench::min_max(ms, 2).c_str(), ms.ratio(), 1e3 * batch / ms.median);
#ifdef OSCAR_BENCH_PHASES
      timed.seconds["sampling"] += sampling;
      double sum = 0;
      for (const char* ph : phases) {
        const double phase_ms = 1e3 * timed.seconds[ph] / timed_steps;
        sum += phase_ms;
        std::printf(" %.2f |", phase_ms);
      }
      std::printf(" %.2f |\n", step_ms - sum);
#else
      (void)phases, (void)step_ms;
      std::printf(" - | - | - | - | %.2f | - | - |\n", 1e3 * sampling / timed_steps);
#endif
      std::fflush(stdout);
    }
  }
  return 0;
}
