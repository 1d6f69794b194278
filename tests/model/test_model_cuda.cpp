// The whole model on the GPU against the same model on the CPU (label cuda; skips without a GPU):
// tiny-qwen3 with its rotation file, per cache mode (bf16, int2-hadamard, oscar), the NIAH
// golden prompt (1016 tokens: sinks, history and recent window all in use) prefilled in chunks,
// then 40 decode steps fed the CPU's greedy token (teacher forcing, so both sides see the same
// tokens and their logits stay comparable step by step), crossing a demotion every 16 steps.
// Then the same through the scheduler: a batch of prompts decoded greedily on each device.
//
// Tolerance. The two backends differ only in rounding: the CUDA prefill GEMMs round activations
// to BF16 (2^-9 relative per operand), decode attention rounds q and P to BF16/FP16 on tensor
// cores (kernels/cuda/decode_attn.cuh), sums run in other orders. With a BF16 cache the CPU
// golden test allows 0.15 absolute on the logits for the cache's own rounding (2^-9 per element
// through 8 layers); the GPU adds at most as much again, so we allow kLogitTol = 0.3 absolute
// (|z| up to ~30) and a cosine of at least 0.9995 per row.
// An INT2 history amplifies those roundings: a K/V row that differs in its last BF16 bit can
// round to the neighbouring 2-bit level, a whole quantization step. The GPU's history is then
// another draw of the same quantization noise, not a worse one, so for INT2 modes the bound is
// relative to that noise: the GPU may differ from the CPU by at most twice what the CPU's own
// INT2 cache differs from its BF16 cache on the same tokens (two independent draws differ by
// ~√2 times one; 2 leaves room), and never less than the BF16 bound. Greedy tokens may differ
// only at a near-tie (the two best CPU logits within the bound).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "calib/calibrator.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "format/safetensors.h"

namespace oscar {
namespace {

constexpr const char* kModel = "models/tiny-qwen3";
constexpr double kLogitTol = 0.3;
constexpr double kMinCos = 0.9995;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<int32_t> niah_prompt() {
  auto file = format::SafetensorsFile::open(std::string(kModel) + "/golden/logits.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().to_string();
  std::vector<int32_t> ids;
  for (int64_t v : file->find("p3_niah_1k.input_ids")->to_i64())
    ids.push_back(static_cast<int32_t>(v));
  return ids;
}

std::unique_ptr<engine::Runtime> make_runtime(const std::string& mode, const std::string& device) {
  engine::RuntimeOptions o;
  o.model_dir = kModel;
  o.cache_mode = mode;
  o.device = device;
  o.folded_weights = "bf16";  // the same folded model on both devices (auto differs)
  o.kv_budget_bytes = size_t{256} << 20;
  auto rt = engine::Runtime::create(o);
  EXPECT_TRUE(rt.ok()) << rt.status().to_string();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

struct RowError {
  double max_abs = 0, min_cos = 1;
};
RowError compare(const std::vector<float>& got, const std::vector<float>& want) {
  RowError e;
  double dot = 0, ng = 0, nw = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e.max_abs = std::max(e.max_abs, std::abs(double(got[i]) - want[i]));
    dot += double(got[i]) * want[i];
    ng += double(got[i]) * got[i];
    nw += double(want[i]) * want[i];
  }
  e.min_cos = dot / std::sqrt(ng * nw);
  return e;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}
// The gap between the best and second-best logit.
double top2_gap(const std::vector<float>& v) {
  float a = -INFINITY, b = -INFINITY;
  for (float x : v) {
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return double(a) - b;
}

class ModelCuda : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no GPU visible";
  }
};

TEST_P(ModelCuda, PrefillAndDecodeMatchTheCpu) {
  const std::string mode = GetParam();
  auto cpu = make_runtime(mode, "cpu");
  auto gpu = make_runtime(mode, "cuda");
  auto ref = make_runtime("bf16", "cpu");  // the quantization noise's yardstick (INT2 modes)
  ASSERT_TRUE(cpu && gpu && ref);
  ASSERT_EQ(gpu->backend().device(), Device::kCuda);
  const std::vector<int32_t> prompt = niah_prompt();
  auto cc = cpu->new_cache(), gc = gpu->new_cache(), rc = ref->new_cache();
  std::vector<float> lc, lg, lr;
  RowError noise;  // CPU mode vs CPU bf16, over the same steps
  auto track_noise = [&] {
    const RowError e = compare(lc, lr);
    noise.max_abs = std::max(noise.max_abs, e.max_abs);
    noise.min_cos = std::min(noise.min_cos, e.min_cos);
  };
  // Chunks of 256 tokens (as the server's prefill_chunk), the last logits of each compared.
  RowError worst;
  for (size_t at = 0; at < prompt.size(); at += 256) {
    const size_t n = std::min<size_t>(256, prompt.size() - at);
    std::span<const int32_t> chunk(prompt.data() + at, n);
    ASSERT_TRUE(cpu->model().forward_one(chunk, *cc, &lc).ok());
    ASSERT_TRUE(ref->model().forward_one(chunk, *rc, &lr).ok());
    track_noise();
    const Status st = gpu->model().forward_one(chunk, *gc, &lg);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const RowError e = compare(lg, lc);
    worst.max_abs = std::max(worst.max_abs, e.max_abs);
    worst.min_cos = std::min(worst.min_cos, e.min_cos);
  }
  // The bounds: BF16's, or twice the INT2 cache's own distance from BF16 (see the header).
  const bool quantized = mode != "bf16";
  auto tol = [&] { return quantized ? std::max(kLogitTol, 2 * noise.max_abs) : kLogitTol; };
  auto min_cos = [&] {
    return quantized ? std::min(kMinCos, 1 - 2 * (1 - noise.min_cos)) : kMinCos;
  };
  std::printf("[%s] prefill: max_abs %.4g min_cos %.8f (bound %.4g / %.8f)\n", mode.c_str(),
              worst.max_abs, worst.min_cos, tol(), min_cos());
  EXPECT_LE(worst.max_abs, tol());
  EXPECT_GE(worst.min_cos, min_cos());
  EXPECT_EQ(gc->n_tokens(), cc->n_tokens());
  EXPECT_EQ(gc->hist_end(), cc->hist_end());

  RowError dec;
  int token_mismatch = 0;
  for (int step = 0; step < 40; ++step) {
    const int32_t next = argmax(lc);
    if (argmax(lg) != next) {
      ++token_mismatch;
      EXPECT_LT(top2_gap(lc), tol()) << "step " << step << ": not a near-tie";
    }
    ASSERT_TRUE(cpu->model().forward_one(std::span<const int32_t>(&next, 1), *cc, &lc).ok());
    ASSERT_TRUE(ref->model().forward_one(std::span<const int32_t>(&next, 1), *rc, &lr).ok());
    track_noise();
    const Status st = gpu->model().forward_one(std::span<const int32_t>(&next, 1), *gc, &lg);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const RowError e = compare(lg, lc);
    dec.max_abs = std::max(dec.max_abs, e.max_abs);
    dec.min_cos = std::min(dec.min_cos, e.min_cos);
  }
  std::printf(
      "[%s] decode x40: max_abs %.4g min_cos %.8f, greedy mismatches %d (history %lld "
      "tokens; bound %.4g / %.8f, INT2 vs BF16 on the CPU: %.4g / %.8f)\n",
      mode.c_str(), dec.max_abs, dec.min_cos, token_mismatch,
      static_cast<long long>(gc->hist_end() - 64), tol(), min_cos(), noise.max_abs, noise.min_cos);
  EXPECT_LE(dec.max_abs, tol());
  EXPECT_GE(dec.min_cos, min_cos());
  EXPECT_EQ(gc->hist_end(), cc->hist_end());
}

// The scheduler on each device: the same prompts decoded greedily in one batch (continuous
// batching, decode rows and prefill chunks in the same steps) give the same text, up to a
// near-tie that the logit comparison above bounds.
TEST_P(ModelCuda, SchedulerGreedyMatchesTheCpu) {
  const std::string mode = GetParam();
  const std::vector<int32_t> niah = niah_prompt();
  constexpr int kRequests = 6;
  std::vector<int32_t> outs[2][kRequests];
  for (int dev = 0; dev < 2; ++dev) {
    engine::RuntimeOptions o;
    o.model_dir = kModel;
    o.cache_mode = mode;
    o.device = dev == 0 ? "cpu" : "cuda";
    o.kv_budget_bytes = size_t{64} << 20;
    auto rt = engine::Runtime::create(o);
    ASSERT_TRUE(rt.ok()) << rt.status().to_string();
    auto sched = engine::Scheduler::create(std::move(rt).value(), engine::SchedulerOptions{});
    ASSERT_TRUE(sched.ok()) << sched.status().to_string();
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    for (int i = 0; i < kRequests; ++i) {
      engine::GenerationRequest r;
      r.request_id = std::to_string(i);  // ("r" + to_string trips GCC 12's -Wrestrict)
      r.prompt_ids.assign(niah.begin() + 37 * i, niah.begin() + 37 * i + 300 + 100 * i);
      r.max_tokens = 24;
      r.sampling.config.temperature = 0;
      std::vector<int32_t>* out = &outs[dev][i];
      ASSERT_TRUE(sched.value()
                      ->submit(r,
                               [&, out](const engine::GenerationEvent& e) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 if (e.kind == engine::GenerationEvent::kToken)
                                   out->push_back(e.token_id);
                                 else {
                                   EXPECT_TRUE(e.error.ok()) << e.error.to_string();
                                   ++done;
                                   cv.notify_all();
                                 }
                               })
                      .ok());
    }
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(300), [&] { return done == kRequests; }));
  }
  int same = 0;
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(outs[1][i].size(), 24u);
    same += outs[0][i] == outs[1][i];
  }
  std::printf("[%s] scheduler: %d of %d greedy outputs identical\n", mode.c_str(), same, kRequests);
  EXPECT_GE(same, kRequests - 1);
}

// --enable-deterministic-inference on the GPU (README "Deterministic results"): a greedy request
// and a seeded top-p one, both with logprobs, give bit-identical tokens and logprobs alone and
// beside requests of other lengths (as Scheduler.DeterministicWhateverRunsBeside on the CPU).
// Steps of at most 48 tokens cut the 400-token prompts (past the 256-token recent window in the
// INT2 modes) into different chunks in the two runs; the decode steps hold 2 to 7 rows, across
// the 2-4 rows where the default linear_cuda leaves the streaming kernel for the GEMM; the
// prefix cache is on in the INT2 modes (the busy run adopts the solo run's pages).
TEST_P(ModelCuda, DeterministicWhateverRunsBeside) {
  const std::string mode = GetParam();
  const bool quantized = mode != "bf16";
  const std::vector<int32_t> niah = niah_prompt();
  engine::RuntimeOptions o;
  o.model_dir = kModel;
  o.cache_mode = mode;
  o.device = "cuda";
  o.kv_budget_bytes = size_t{64} << 20;
  o.deterministic = true;
  auto rt = engine::Runtime::create(o);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  engine::SchedulerOptions so;
  so.max_batch_tokens = 48;
  so.prefill_chunk = 40;
  so.prefix_cache = quantized;
  auto sched = engine::Scheduler::create(std::move(rt).value(), so);
  ASSERT_TRUE(sched.ok()) << sched.status().to_string();

  struct Out {
    std::vector<int32_t> ids;
    std::vector<float> logprobs;  // chosen, then the top 3, per token
    std::vector<int32_t> top_ids;
    bool done = false;
  };
  std::mutex mu;
  std::condition_variable cv;
  auto submit = [&](engine::GenerationRequest r, Out* out) {
    const Status st = sched.value()->submit(r, [&, out](const engine::GenerationEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e.kind == engine::GenerationEvent::kToken) {
        out->ids.push_back(e.token_id);
        if (!e.has_logprobs) return;
        out->logprobs.push_back(e.chosen.logprob);
        for (const auto& t : e.top_logprobs) {
          out->top_ids.push_back(t.token_id);
          out->logprobs.push_back(t.logprob);
        }
      } else {
        EXPECT_TRUE(e.error.ok()) << e.error.to_string();
        out->done = true;
        cv.notify_all();
      }
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
  };
  engine::GenerationRequest g;
  g.prompt_ids.assign(niah.begin(), niah.begin() + 400);
  g.max_tokens = 16;
  g.logprobs = 3;
  g.sampling.config.temperature = 0;
  engine::GenerationRequest t = g;
  t.sampling.config.temperature = 0.9f;
  t.sampling.config.top_p = 0.95f;
  t.sampling.has_seed = true;
  t.sampling.config.seed = 11;
  Out runs[2][2];  // [alone, busy][greedy, seeded]
  std::vector<std::unique_ptr<Out>> side;
  for (int busy = 0; busy < 2; ++busy) {
    g.request_id = "greedy" + std::to_string(busy);
    t.request_id = "seeded" + std::to_string(busy);
    if (busy) {
      for (int n : {7, 33, 90, 200, 61}) {
        engine::GenerationRequest r;
        r.request_id = std::to_string(n);
        r.prompt_ids.assign(niah.begin() + 500, niah.begin() + 500 + n);
        r.max_tokens = 5 + n % 17;
        r.sampling.config.temperature = n % 2 ? 0.7f : 0.f;
        side.push_back(std::make_unique<Out>());
        submit(r, side.back().get());
      }
    }
    submit(g, &runs[busy][0]);
    submit(t, &runs[busy][1]);
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(300), [&] {
      bool all = runs[busy][0].done && runs[busy][1].done;
      for (const auto& s : side) all = all && s->done;
      return all;
    }));
  }
  for (int k = 0; k < 2; ++k) {
    const Out &a = runs[0][k], &b = runs[1][k];
    EXPECT_EQ(a.ids.size(), 16u);
    EXPECT_EQ(a.ids, b.ids) << (k ? "seeded" : "greedy");
    EXPECT_EQ(a.top_ids, b.top_ids) << (k ? "seeded" : "greedy");
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t i = 0; i < a.logprobs.size(); ++i)
      EXPECT_EQ(a.logprobs[i], b.logprobs[i]) << (k ? "seeded" : "greedy") << " logprob " << i;
  }
  std::printf("[%s] deterministic: greedy and seeded requests alone == beside 5 others (%zu and "
              "%zu logprobs)\n",
              mode.c_str(), runs[0][0].logprobs.size(), runs[0][1].logprobs.size());
}

// What the GPU cannot do is refused with the reason, not run wrongly: cache modes without CUDA
// kernels at start-up, and editing weights that live on the device.
// `oscar calibrate --device cuda`: the forward passes on the GPU (observer rows copied back, BF16
// pages since the GPU has no f32 ones) give the CPU's statistics. Inputs to the covariances
// differ by the GPU's BF16 activation rounding (2^-9 relative per element) and, for the value
// statistics, the BF16 cache; averaged over 1024 tokens those moved a head's expected key logit
// error by 1.7e-4 and tr C_S by 4.8e-4 relative on the H200 (docs/results/cuda_backend.md); the
// bound is 1%.
TEST(ModelCudaCalibrate, StatisticsMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU visible";
  calib::CalibrationOptions o;
  o.n_windows = 2;
  o.window_tokens = 512;
  o.prefill_chunk = 256;
  const std::string data = std::string(kModel) + "/data/calib.txt";
  auto cpu = calib::calibrate_model_dir(kModel, data, o, false, "cpu");
  auto gpu = calib::calibrate_model_dir(kModel, data, o, false, "cuda");
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  ASSERT_EQ(cpu->key_logit_error.size(), gpu->key_logit_error.size());
  ASSERT_EQ(cpu->value_energy.size(), gpu->value_energy.size());
  double worst_k = 0, worst_v = 0;
  for (size_t i = 0; i < cpu->key_logit_error.size(); ++i) {
    const double rk = std::abs(gpu->key_logit_error[i] / cpu->key_logit_error[i] - 1);
    const double rv = std::abs(gpu->value_energy[i] / cpu->value_energy[i] - 1);
    worst_k = std::max(worst_k, rk);
    worst_v = std::max(worst_v, rv);
    EXPECT_LT(rk, 0.01) << "key logit error, plane " << i;
    EXPECT_LT(rv, 0.01) << "value energy, plane " << i;
  }
  std::printf("[calibrate] cuda vs cpu: key logit error within %.2e, tr C_S within %.2e "
              "(relative, worst head; forward cpu %.2f s, cuda %.2f s)\n",
              worst_k, worst_v, cpu->forward_s, gpu->forward_s);
}

TEST(ModelCudaRefuses, UnsupportedModesAndDeviceWeightEdits) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU visible";
  for (const char* mode : {"f32", "kivi2", "oscar-lloyd"}) {
    engine::RuntimeOptions o;
    o.model_dir = kModel;
    o.cache_mode = mode;
    o.device = "cuda";
    const Status st = engine::Runtime::create(o).status();
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << mode << ": " << st.to_string();
    EXPECT_NE(st.to_string().find(mode), std::string::npos) << st.to_string();
    EXPECT_NE(st.to_string().find("--device cpu"), std::string::npos) << st.to_string();
  }
  auto gpu = make_runtime("bf16", "cuda");
  ASSERT_TRUE(gpu);
  const std::vector<float> row(gpu->model().config().hidden_size, 0.f);
  const Status edit = gpu->model().set_embedding_row(1, row);
  EXPECT_EQ(edit.code(), StatusCode::kInvalidArgument) << edit.to_string();
  EXPECT_NE(edit.to_string().find("on the device"), std::string::npos) << edit.to_string();
}

INSTANTIATE_TEST_SUITE_P(Modes, ModelCuda, ::testing::Values("bf16", "int2-hadamard", "oscar"));

}  // namespace
}  // namespace oscar
