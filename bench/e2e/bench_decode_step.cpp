// A whole decode step on any backend, the way the scheduler runs it (a benchmark, not a test):
// reserve -> StepPlan -> Qwen3Model::forward (logits stay on the device) -> demote -> commit ->
// Backend::sample (only ids come back), for a batch of sequences that each hold `context` tokens
// of their own (no shared prefix: every sequence's history is read from its own pages).
//
//   bench_decode_step --model DIR [--dummy-weights] [--device cuda] [--modes bf16,oscar]
//                     [--context 100000] [--batches 1,8] [--steps 32] [--fit-gib G] [--csv F]
//                     [--phases] [--no-graphs] [--folded-weights auto|f32|bf16] [--chunk C]
//                     [--deterministic 0|1]
//
// Per (mode, batch): median step time, tokens/s, the bytes one step must read (weights + every
// sequence's KV pages) and the floor = those bytes / the copy bandwidth measured in this run,
// and the demotion's share (timed apart: the step synchronises before and after it).
// Decode steps replay CUDA graphs by default (Qwen3Model::set_graphs); --no-graphs runs every op
// directly; --phases times ops with events and so runs them directly too. --folded-weights: how
// v_proj/o_proj are stored once a value rotation is folded in (RuntimeOptions::folded_weights).
// --chunk C: every step appends C tokens per sequence instead of one (a prefill chunk over a
// prefix of `context` tokens, growing by C a step): tok/s then counts prefill tokens, and
// --phases shows where a prefill chunk's time goes (linear layers, attention, the small ops).
// --deterministic 1: the batch-invariant kernels (--enable-deterministic-inference), with the
// prompt chunks read as the scheduler then reads them (AttendMode::kDecodeEquivalent).
// --fit-gib G: instead of --batches, the most sequences of `context` tokens that G GiB of KV
// pages hold in each mode (the fixed-budget comparison), and the step at that batch.
//
// The caches are filled without a prefill: random K/V rows go through the backend's kv_append
// and demote_pages ops in chunks (what a prefill writes, at a fraction of its cost), so a 100K
// context takes seconds. Speed does not depend on the values; they are finite and Gaussian.
// A model whose config.json limits positions below context + steps gets a copy of its config
// with the limit raised (a benchmark of the attention cost, not of the model's quality there).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "kernels/backend.h"
#include "kv/admission.h"
#include "kv/step_plan.h"
#include "phase_backend.h"

#ifdef OSCAR_HAS_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#endif

using namespace oscar;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

template <typename S>
void check(const S& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.to_string().c_str());
    std::exit(1);
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// Device-to-device copy bandwidth (bytes read + written per second), or 0 on the CPU.
double copy_bandwidth() {
#ifdef OSCAR_HAS_CUDA
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 8; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  cudaFree(a);
  cudaFree(b);
  std::sort(ms.begin(), ms.end());
  return 2.0 * bytes / (1e-3 * ms[ms.size() / 2]);
#else
  return 0;
#endif
}

// A model dir whose config allows `positions` positions (a temporary copy when it does not).
std::string model_dir_for(const std::string& dir, int64_t positions) {
  std::ifstream in(dir + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  if (cfg.value("max_position_embeddings", int64_t{0}) >= positions) return dir;
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("oscar-bench-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(tmp);
  cfg["max_position_embeddings"] = positions;
  std::ofstream(tmp + "/config.json") << cfg.dump(2);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    if (std::filesystem::exists(dir + "/" + f))
      std::filesystem::copy_file(dir + "/" + f, tmp + "/" + f,
                                 std::filesystem::copy_options::overwrite_existing);
  return tmp;
}

// Fills `cache` with n tokens of random K/V through the backend's ops, `chunk` tokens at a time.
void fill(engine::Runtime& rt, kv::SequenceCache& cache, int64_t n, const float* k_dev,
          const float* v_dev, int64_t chunk, DeviceBuffer& scratch) {
  kernels::Backend& be = rt.backend();
  const auto& c = rt.model().config();
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t m = std::min(chunk, n - at);
    check(cache.reserve(m), "reserve");
    std::vector<int64_t> slots(m);
    for (int64_t i = 0; i < m; ++i) slots[i] = cache.exact_slot(cache.n_tokens() + i);
    std::vector<kv::PageId> src, dst;
    cache.pending_demotions(&src, &dst);
    const size_t need = m * sizeof(int64_t) + 3 * src.size() * sizeof(int32_t) + 64;
    if (scratch.bytes() < need) {
      scratch.reset();
      auto buf = be.alloc(std::max<size_t>(need, 1 << 20), "bench scratch");
      check(buf.status(), "alloc");
      scratch = std::move(buf).value();
    }
    uint8_t* base = scratch.as<uint8_t>();
    check(be.upload(slots.data(), m * sizeof(int64_t), base), "upload");
    kernels::KvAppendParams p = cache.append_params(0);
    p.n_tokens = m;
    p.k = k_dev;
    p.v = v_dev;
    p.slots = reinterpret_cast<const int64_t*>(base);
    for (int l = 0; l < c.n_layers; ++l) {
      p.layer = l;
      check(be.kv_append(p), "kv_append");
    }
    if (!src.empty()) {
      int32_t* ids = reinterpret_cast<int32_t*>(base + (m * sizeof(int64_t) + 15) / 16 * 16);
      std::vector<int32_t> host(src.begin(), src.end());
      host.insert(host.end(), dst.begin(), dst.end());
      check(be.upload(host.data(), host.size() * sizeof(int32_t), ids), "upload");
      kernels::DemotePagesParams d = cache.demote_params();
      d.n_pages = static_cast<int32_t>(src.size());
      d.src_pages = ids;
      d.dst_pages = ids + src.size();
      d.status = ids + 2 * src.size();
      check(be.demote_pages(d), "demote");
    }
    check(be.synchronize(), "synchronize");  // slots / ids are reused by the next chunk
    cache.commit_demoted(m);
  }
}

#ifdef OSCAR_HAS_CUDA
// --phases: every op bracketed by two CUDA events on the stream it runs on (no host
// synchronisation inside the step), summed per phase once the step's ids are back. Costs ~1 us
// of host time per op, so the step time reported with it is a little higher than without.
class EventBackend final : public bench::PhaseBackend {
 public:
  using PhaseBackend::PhaseBackend;
  std::map<std::string, double> ms;  // summed over the steps since the last clear
  void collect() {
    for (size_t i = 0; i < used_; ++i) {
      cudaEventSynchronize(events_[i].second);
      float t = 0;
      cudaEventElapsedTime(&t, events_[i].first, events_[i].second);
      ms[phase_[i]] += t;
    }
    used_ = 0;
  }

 private:
  Status run(Op op, const std::function<Status()>& f) override {
    if (op == Op::kSample) return f();  // outside the step's GPU time (it waits for the host)
    if (used_ == events_.size()) {
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      events_.push_back({a, b});
      phase_.push_back(nullptr);
    }
    cudaStream_t stream = static_cast<cudaStream_t>(in_.native_stream());
    cudaEventRecord(events_[used_].first, stream);
    Status st = f();
    cudaEventRecord(events_[used_].second, stream);
    phase_[used_] = phase(op);
    ++used_;
    return st;
  }
  static const char* phase(Op op) {
    switch (op) {
      case Op::kRmsNorm:
      case Op::kAddRmsNorm:
        return "norms (+ residual adds)";
      case Op::kLinear:
        return "linear";
      case Op::kLmHead:
        return "lm_head";
      case Op::kRope:  // with the q/k norms
      case Op::kKvAppend:
        return "qk-norm+rope+append";
      case Op::kRotateQueries:
      case Op::kDecodeAttn:
      case Op::kPrefillAttn:
        return "attention";
      case Op::kDemotePages:
        return "demotion";
      default:
        return "other";
    }
  }
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  std::vector<const char*> phase_;
  size_t used_ = 0;
};
#endif

constexpr int64_t kFillChunk = 2048;  // tokens per fill step

struct Row {
  std::string mode;
  int batch = 0;
  double step_ms = 0, demote_ms = 0, bytes = 0, floor_ms = 0, tok_s = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model = "models/tiny-qwen3", device = "auto", modes = "bf16,oscar", batches = "1",
              csv, folded = "auto";
  int64_t context = 8192;
  int steps = 32, chunk_tokens = 1;
  double fit_gib = 0;
  bool dummy = false, phases = false, graphs = true, deterministic = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      model = next();
    else if (a == "--device")
      device = next();
    else if (a == "--modes")
      modes = next();
    else if (a == "--batches")
      batches = next();
    else if (a == "--context")
      context = std::stoll(next());
    else if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--chunk")
      chunk_tokens = std::max(1, std::stoi(next()));
    else if (a == "--fit-gib")
      fit_gib = std::stod(next());
    else if (a == "--csv")
      csv = next();
    else if (a == "--dummy-weights")
      dummy = true;
    else if (a == "--phases")
      phases = true;
    else if (a == "--no-graphs")
      graphs = false;
    else if (a == "--folded-weights")
      folded = next();
    else if (a == "--deterministic")
      deterministic = std::stoi(next()) != 0;
    else {
      std::fprintf(stderr,
                   "unknown argument %s (see the header of bench/e2e/bench_decode_step.cpp)\n",
                   a.c_str());
      return 2;
    }
  }
  // Tokens a sequence gains over the warm-up and timed steps.
  const int64_t grown = static_cast<int64_t>(steps + 2) * chunk_tokens;
  const std::string dir = model_dir_for(model, context + grown + 64);
  const double copy_bps = copy_bandwidth();
  std::printf("model %s (%s weights), device %s, context %lld, %d steps of %d tokens per sequence, "
              "copy %.2f TB/s, deterministic %d\n",
              model.c_str(), dummy ? "dummy" : "checkpoint", device.c_str(),
              static_cast<long long>(context), steps, chunk_tokens, copy_bps / 1e12,
              deterministic ? 1 : 0);
  std::printf(
      "| mode | batch | step ms | tok/s | bytes/step GB | floor ms | step/floor | demotion ms/step "
      "|\n"
      "|---|---|---|---|---|---|---|---|\n");
  std::vector<Row> rows;
  for (const std::string& mode : split(modes)) {
    engine::RuntimeOptions o;
    o.model_dir = dir;
    o.cache_mode = mode;
    o.device = device;
    o.dummy_weights = dummy;
    o.folded_weights = folded;
    o.deterministic = deterministic;
    o.split_tokens = context + grown;  // both pools run out together at this length
    std::vector<int> batch_list;
    if (fit_gib > 0) {
      o.kv_budget_bytes = static_cast<size_t>(fit_gib * (1ull << 30));
    } else {
      int most = 1;
      for (const std::string& b : split(batches)) {
        batch_list.push_back(std::stoi(b));
        most = std::max(most, batch_list.back());
      }
      // Room for the largest batch: its peak pages, two pages per sequence of slack.
      auto config = format::ModelConfig::load(dir);
      check(config.status(), "config");
      auto parsed = quant::parse_cache_mode(mode);
      check(parsed.status(), "mode");
      auto spec = engine::make_cache_spec(config.value(), o, parsed.value());
      check(spec.status(), "cache spec");
      const kv::PageNeed need =
          kv::peak_pages(spec.value().regions, spec.value().quantized(), context + grown + 16);
      const kernels::KvPageLayout L = spec.value().layout();
      // The fill stages fill_chunk tokens of one sequence at a time in exact pages.
      const double exact = (static_cast<double>(most) * (need.bf16_pages() + 2) +
                            kFillChunk / spec.value().regions.page_size + 2) *
                           L.exact_page_bytes();
      const double hist =
          spec.value().quantized()
              ? static_cast<double>(most) * (need.int2_pages() + 2) * L.int2_page_bytes()
              : 0.0;
      // The runtime splits a budget between the pools in the ratio of one sequence's peak
      // (split_tokens); ask for enough that both shares hold what they must.
      const double share =
          (need.bf16_pages() * static_cast<double>(L.exact_page_bytes())) /
          (need.bf16_pages() * static_cast<double>(L.exact_page_bytes()) +
           (spec.value().quantized() ? need.int2_pages() * static_cast<double>(L.int2_page_bytes())
                                     : 0.0));
      const double budget = std::max(exact / share, share < 1 ? hist / (1 - share) : 0.0);
      o.kv_budget_bytes = static_cast<size_t>(budget * 1.02) + (size_t{64} << 20);
    }
    auto made = engine::Runtime::create(o);
    check(made.status(), "runtime");
    engine::Runtime& rt = *made.value();
    kernels::Backend& be = rt.backend();
    const auto& cfg = rt.model().config();
    if (fit_gib > 0) {
      const kv::PageNeed need =
          kv::peak_pages(rt.spec().regions, rt.spec().quantized(), context + grown);
      // Less the exact pages the fill stages for one sequence at a time (a benchmark artefact;
      // a prefill would stage its chunk the same way).
      const int64_t staging = kFillChunk / rt.spec().regions.page_size + 1;
      int64_t fit = std::max<int64_t>(0, rt.exact_pool().n_pages() - staging) /
                    std::max<int64_t>(1, need.bf16_pages());
      if (rt.int2_pool() != nullptr)
        fit = std::min(fit, rt.int2_pool()->n_pages() / std::max<int64_t>(1, need.int2_pages()));
      batch_list = {static_cast<int>(fit)};
      std::printf("[%s] %.1f GiB of KV pages hold %lld sequences of %lld tokens\n", mode.c_str(),
                  fit_gib, static_cast<long long>(fit), static_cast<long long>(context));
      if (fit == 0) continue;
    }
    // Random K/V rows for the fill, uploaded once.
    const int64_t chunk = kFillChunk;
    std::vector<float> host(static_cast<size_t>(chunk) * cfg.kv_dim);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto kbuf = be.alloc(host.size() * sizeof(float), "bench K");
    auto vbuf = be.alloc(host.size() * sizeof(float), "bench V");
    check(kbuf.status(), "alloc");
    check(vbuf.status(), "alloc");
    for (float& x : host) x = normal(rng);
    check(be.upload(host.data(), host.size() * sizeof(float), kbuf.value().data()), "upload");
    for (float& x : host) x = normal(rng);
    check(be.upload(host.data(), host.size() * sizeof(float), vbuf.value().data()), "upload");
    DeviceBuffer scratch;
    rt.model().set_graphs(graphs);
#ifdef OSCAR_HAS_CUDA
    EventBackend timed(be);
    if (phases && be.device() == Device::kCuda)
      check(rt.model().set_backend(&timed), "set_backend");
#else
    (void)phases;
#endif

    std::vector<std::unique_ptr<kv::SequenceCache>> caches;
    for (int batch : batch_list) {
      const auto tf = Clock::now();
      while (static_cast<int>(caches.size()) < batch) {
        caches.push_back(rt.new_cache());
        fill(rt, *caches.back(), context, kbuf.value().as<float>(), vbuf.value().as<float>(), chunk,
             scratch);
      }
      const double fill_s = since(tf);
      std::vector<int32_t> next(batch, 42), ids(batch);
      std::vector<std::vector<int32_t>> chunk_ids(batch, std::vector<int32_t>(chunk_tokens, 42));
      std::vector<kernels::SamplingConfig> configs(batch);
      std::vector<uint64_t> draws(batch, 0);
      std::vector<double> step_s, demote_s;
      for (int s = -2; s < steps; ++s) {  // two warm-up steps
#ifdef OSCAR_HAS_CUDA
        if (s == 0) timed.ms.clear();
#endif
        const auto t = Clock::now();
        std::vector<kv::StepChunk> chunks(batch);
        for (int b = 0; b < batch; ++b) {
          check(caches[b]->reserve(chunk_tokens), "reserve");
          chunk_ids[b].back() = next[b];
          chunks[b] = kv::StepChunk{caches[b].get(), chunk_ids[b], false};
        }
        const kv::StepPlan plan = kv::StepPlan::make(
            chunks, deterministic ? kv::AttendMode::kDecodeEquivalent : kv::AttendMode::kPrefill);
#ifdef OSCAR_HAS_CUDA
        // OSCAR_PROFILE_STEP=1: the last step's forward between cudaProfilerStart/Stop, for
        // `ncu --profile-from-start off` (per-kernel GPU times of one step, graph nodes included).
        const bool profile = s == steps - 1 && std::getenv("OSCAR_PROFILE_STEP") != nullptr;
        if (profile) cudaProfilerStart();
#endif
        check(rt.model().forward(plan, {}), "forward");
#ifdef OSCAR_HAS_CUDA
        if (profile) {
          check(be.synchronize(), "synchronize");
          cudaProfilerStop();
        }
#endif
        double dem = 0;
        std::vector<int32_t> status;
        if (!plan.demote_src.empty()) {
          check(be.synchronize(), "synchronize");
          const auto td = Clock::now();
          check(rt.model().demote(plan, &status), "demote");
          check(be.synchronize(), "synchronize");
          dem = since(td);
        }
        std::vector<Status> per_chunk;
        plan.commit(status.empty() ? std::vector<int32_t>(plan.demote_src.size(), 0) : status,
                    &per_chunk);
        kernels::SampleParams sp;
        sp.logits = rt.model().logits();
        sp.n_rows = plan.n_logit_rows();
        sp.vocab = cfg.vocab_size;
        sp.config = configs.data();
        sp.step = draws.data();
        sp.ids = ids.data();
        check(be.sample(sp), "sample");
        for (int b = 0; b < batch; ++b) next[b] = std::max(0, ids[b]);
#ifdef OSCAR_HAS_CUDA
        timed.collect();
#endif
        if (s >= 0) {
          step_s.push_back(since(t));
          demote_s.push_back(dem);
        }
      }
      std::vector<double> sorted = step_s;
      std::sort(sorted.begin(), sorted.end());
      Row r;
      r.mode = mode;
      r.batch = batch;
      r.step_ms = 1e3 * sorted[sorted.size() / 2];
      double dem_total = 0;
      for (double d : demote_s) dem_total += d;
      r.demote_ms = 1e3 * dem_total / steps;
      // Bytes a step must read: every weight but the input embedding (one row per token is
      // read; an embedding tied to the lm_head is read whole there), and the KV pages.
      r.bytes = static_cast<double>(rt.model().weight_bytes());
      if (!cfg.tie_word_embeddings) r.bytes -= 2.0 * cfg.vocab_size * cfg.hidden_size;
      for (int b = 0; b < batch; ++b) r.bytes += static_cast<double>(caches[b]->bytes().total());
      // The floor reads those bytes at the copy bandwidth (counted read + write, as the peers'
      // floors are: PERF.md), the convention of ../shared/peers/torch_decode_step.py.
      r.floor_ms = copy_bps > 0 ? 1e3 * r.bytes / copy_bps : 0;
      r.tok_s = static_cast<double>(batch) * chunk_tokens / (1e-3 * r.step_ms);
      std::printf("| %s | %d | %.3f | %.1f | %.2f | %.3f | %.2f | %.4f |   (fill %.1f s)\n",
                  mode.c_str(), batch, r.step_ms, r.tok_s, r.bytes / 1e9, r.floor_ms,
                  r.floor_ms > 0 ? r.step_ms / r.floor_ms : 0.0, r.demote_ms, fill_s);
#ifdef OSCAR_HAS_CUDA
      if (phases && !timed.ms.empty()) {
        std::printf("    GPU time per step by phase (ms):");
        double sum = 0;
        for (const auto& [ph, t] : timed.ms) {
          std::printf(" %s %.3f", ph.c_str(), t / steps);
          sum += t / steps;
        }
        std::printf(" | sum %.3f of %.3f\n", sum, r.step_ms);
      }
#endif
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  if (!csv.empty()) {
    std::ofstream out(csv);
    out << "mode,batch,context,step_ms,tok_s,bytes,floor_ms,demote_ms,copy_bps\n";
    for (const Row& r : rows)
      out << r.mode << "," << r.batch << "," << context << "," << r.step_ms << "," << r.tok_s << ","
          << r.bytes << "," << r.floor_ms << "," << r.demote_ms << "," << copy_bps << "\n";
  }
  return 0;
}
