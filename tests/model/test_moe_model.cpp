// Qwen3-MoE end to end on the CPU (issue #25), on models/tiny-qwen3-moe (scripts/make_tiny_moe.py:
// 3 layers, layer 1 dense, layers 0 and 2 with 8 experts, top-2, renormalised):
// - the model's logits against an independent float64 forward pass written here from the
//   checkpoint's tensors (not through Qwen3Model): prefill, token-by-token decode, and a batch of
//   sequences of different lengths in one step, on fresh random tokens;
// - the Hugging Face golden (scripts/goldens/qwen3_moe_golden.py), skipped while it is absent;
// - experts stored in mixed dtypes (their stack widened to float32), --dummy-weights for the MoE
//   config, and the refusal of a device without MoE kernels.
//
// Tolerances. With an f32 KV cache every operation is float32 with float32 accumulation over at
// most 128 terms (hidden 64, q_dim 256, head_dim 128, expert width 32, the dense FFN's 128); the
// float64 reference differs by a few 1e-6 relative per operation and the logits (|z| up to ~15)
// by ~1e-5 through 3 layers. We allow kLogitTolF32 = 1e-3 absolute and a cosine similarity above
// 1 - 1e-6 per row. With a BF16 cache each cached K/V element is rounded to 2^-9 relative, which
// moves logits by a few 1e-2: kLogitTolBf16 = 0.1 and a cosine above kMinCosBf16 = 0.9999 (as
// test_golden allows the dense model). A different expert choice would move a row
// by O(1), so the reference also checks that every router top-k margin (k-th minus (k+1)-th
// logit) exceeds kMinRouterMargin = 1e-4, ten times the float32 error of a router logit (~1e-5):
// the routes are then the same in both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "float64_model.h"

namespace oscar {
namespace {

constexpr const char* kModel = "models/tiny-qwen3-moe";
constexpr double kLogitTolF32 = 1e-3;
constexpr double kLogitTolBf16 = 0.1;
constexpr double kMinCosBf16 = 0.9999;
constexpr double kMinRouterMargin = 1e-4;

using test::add;
using test::causal_attention;
using test::expect_close;
using test::matmul;
using test::random_tokens;
using test::rms_norm;
using test::rope;
using test::silu;
using test::Vec;

// The float64 reference: Hugging Face's Qwen3MoeForCausalLM, operation by operation.
class Reference {
 public:
  explicit Reference(const std::string& dir) : ckpt_(dir), c_(ckpt_.config()) {}
  const format::ModelConfig& config() const { return c_; }
  double min_router_margin() const { return min_margin_; }

  // Logits [T, vocab] of one sequence from position 0.
  Vec forward(const std::vector<int32_t>& ids) {
    const int64_t T = static_cast<int64_t>(ids.size()), H = c_.hidden_size, d = c_.head_dim;
    const int Hq = c_.n_heads_q, Hkv = c_.n_heads_kv;
    const double eps = c_.rms_norm_eps;
    const Vec& embed = w("model.embed_tokens.weight");
    Vec x(static_cast<size_t>(T * H));
    for (int64_t t = 0; t < T; ++t) std::copy_n(embed.begin() + ids[t] * H, H, x.begin() + t * H);
    for (int l = 0; l < c_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Vec h = rms_norm(x, T, H, w(p + "input_layernorm.weight"), eps);
      Vec q = matmul(h, T, w(p + "self_attn.q_proj.weight"), c_.q_dim, H);
      Vec k = matmul(h, T, w(p + "self_attn.k_proj.weight"), c_.kv_dim, H);
      Vec v = matmul(h, T, w(p + "self_attn.v_proj.weight"), c_.kv_dim, H);
      q = rms_norm(q, T * Hq, d, w(p + "self_attn.q_norm.weight"), eps);
      k = rms_norm(k, T * Hkv, d, w(p + "self_attn.k_norm.weight"), eps);
      rope(q, T, Hq, d, d, c_.rope_theta);
      rope(k, T, Hkv, d, d, c_.rope_theta);
      const Vec attn = causal_attention(q, k, v, T, Hq, Hkv, d);
      add(x, matmul(attn, T, w(p + "self_attn.o_proj.weight"), H, c_.q_dim));
      h = rms_norm(x, T, H, w(p + "post_attention_layernorm.weight"), eps);
      add(x, c_.moe_layer(l) ? moe(h, T, p) : dense(h, T, p));
    }
    const Vec h = rms_norm(x, T, H, w("model.norm.weight"), eps);
    const Vec& head = c_.tie_word_embeddings ? embed : w("lm_head.weight");
    return matmul(h, T, head, c_.vocab_size, H);
  }

 private:
  const Vec& w(const std::string& name) const { return ckpt_.w(name); }
  // down(silu(gate h) * up h) of each row with the given matrices.
  static Vec swiglu(const Vec& h, int64_t T, const Vec& gate, const Vec& up, const Vec& down,
                    int64_t inter, int64_t H) {
    const Vec g = matmul(h, T, gate, inter, H), u = matmul(h, T, up, inter, H);
    Vec a(g.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = silu(g[i]) * u[i];
    return matmul(a, T, down, H, inter);
  }
  Vec dense(const Vec& h, int64_t T, const std::string& p) const {
    return swiglu(h, T, w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight"),
                  w(p + "mlp.down_proj.weight"), c_.intermediate_size, c_.hidden_size);
  }
  Vec moe(const Vec& h, int64_t T, const std::string& p) {
    const int64_t H = c_.hidden_size, E = c_.n_experts, K = c_.n_experts_per_tok;
    const Vec logits = matmul(h, T, w(p + "mlp.gate.weight"), E, H);
    Vec y(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const double* l = &logits[t * E];
      std::vector<int> order(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      if (K < E) min_margin_ = std::min(min_margin_, l[order[K - 1]] - l[order[K]]);
      double m = l[order[0]], z = 0, top = 0;
      for (int e = 0; e < E; ++e) z += std::exp(l[e] - m);
      for (int j = 0; j < K; ++j) top += std::exp(l[order[j]] - m) / z;
      const Vec row(h.begin() + t * H, h.begin() + (t + 1) * H);
      for (int j = 0; j < K; ++j) {
        const int e = order[j];
        double wj = std::exp(l[e] - m) / z;
        if (c_.norm_topk_prob) wj /= top;
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        const Vec o = swiglu(row, 1, w(x + "gate_proj.weight"), w(x + "up_proj.weight"),
                             w(x + "down_proj.weight"), c_.moe_intermediate_size, H);
        for (int64_t i = 0; i < H; ++i) y[t * H + i] += wj * o[i];
      }
    }
    return y;
  }

  test::Float64Checkpoint ckpt_;
  const format::ModelConfig& c_;
  double min_margin_ = INFINITY;
};

std::unique_ptr<engine::Runtime> make_runtime(const std::string& mode, bool dummy = false) {
  engine::RuntimeOptions o;
  o.model_dir = kModel;
  o.device = "cpu";
  o.cache_mode = mode;
  o.dummy_weights = dummy;
  o.kv_budget_bytes = size_t{64} << 20;
  auto rt = engine::Runtime::create(o);
  EXPECT_TRUE(rt.ok()) << rt.status().to_string();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

TEST(MoeModel, TinyCheckpointShape) {
  auto rt = make_runtime("f32");
  ASSERT_TRUE(rt);
  const format::ModelConfig& c = rt->model().config();
  EXPECT_EQ(c.arch, format::Architecture::kQwen3Moe);
  EXPECT_EQ(c.n_moe_layers, 2);
  EXPECT_FALSE(c.moe_layer(1));
  // Every matrix stays BF16 (2 bytes a parameter), norms are float32.
  const int64_t norms = c.hidden_size * (1 + 2 * c.n_layers) + 2 * c.head_dim * c.n_layers;
  EXPECT_EQ(rt->model().weight_bytes(),
            static_cast<size_t>(2 * (c.n_params() - norms) + 4 * norms));
}

// Prefill of a whole prompt (the grouped experts' many-rows path), logits of every position.
TEST(MoeModel, PrefillMatchesFloat64Reference) {
  Reference ref(kModel);
  auto rt = make_runtime("f32");
  ASSERT_TRUE(rt);
  const int vocab = ref.config().vocab_size;
  std::mt19937 rng(2501);
  for (int len : {1, 7, 40, 97}) {
    const std::vector<int32_t> ids = random_tokens(rng, len, vocab);
    const Vec want = ref.forward(ids);
    auto cache = rt->new_cache();
    std::vector<float> logits;
    ASSERT_TRUE(rt->model().forward_one(ids, *cache, &logits, /*all_logits=*/true).ok());
    expect_close(logits, want, 0, len, vocab, kLogitTolF32, "prefill " + std::to_string(len));
  }
  std::printf("min router margin %.4g\n", ref.min_router_margin());
  ASSERT_GT(ref.min_router_margin(), kMinRouterMargin)
      << "a near-tie in the routing: pick other seeds";
}

// A short prefill, then one token a step (one row: the experts in parallel, streaming path).
TEST(MoeModel, DecodeMatchesFloat64Reference) {
  Reference ref(kModel);
  const int vocab = ref.config().vocab_size;
  std::mt19937 rng(2502);
  const std::vector<int32_t> ids = random_tokens(rng, 24, vocab);
  const Vec want = ref.forward(ids);
  ASSERT_GT(ref.min_router_margin(), kMinRouterMargin)
      << "a near-tie in the routing: pick other seeds";
  for (const char* mode : {"f32", "bf16"}) {
    auto rt = make_runtime(mode);
    ASSERT_TRUE(rt);
    const bool f32 = std::string(mode) == "f32";
    const double tol = f32 ? kLogitTolF32 : kLogitTolBf16, cos = f32 ? 1 - 1e-6 : kMinCosBf16;
    auto cache = rt->new_cache();
    std::vector<float> logits;
    ASSERT_TRUE(
        rt->model().forward_one(std::span<const int32_t>(ids.data(), 8), *cache, &logits).ok());
    expect_close(logits, want, 7, 1, vocab, tol, std::string(mode) + " prefill 8", cos);
    for (size_t t = 8; t < ids.size(); ++t) {
      ASSERT_TRUE(
          rt->model().forward_one(std::span<const int32_t>(&ids[t], 1), *cache, &logits).ok());
      expect_close(logits, want, static_cast<int64_t>(t), 1, vocab, tol,
                   std::string(mode) + " decode pos " + std::to_string(t), cos);
    }
  }
}

// Three sequences in one step: one decoding, two prefilling (rows of different sequences share
// experts); each sequence's logits are its own reference's.
TEST(MoeModel, MixedBatchMatchesFloat64Reference) {
  Reference ref(kModel);
  auto rt = make_runtime("f32");
  ASSERT_TRUE(rt);
  const int vocab = ref.config().vocab_size;
  std::mt19937 rng(2503);
  std::vector<std::vector<int32_t>> seqs = {
      random_tokens(rng, 13, vocab), random_tokens(rng, 30, vocab), random_tokens(rng, 5, vocab)};
  std::vector<Vec> want;
  for (const auto& s : seqs) want.push_back(ref.forward(s));
  ASSERT_GT(ref.min_router_margin(), kMinRouterMargin)
      << "a near-tie in the routing: pick other seeds";
  // Sequence 0 has 12 tokens cached, then its 13th decodes beside the others' prefills.
  std::vector<std::unique_ptr<kv::SequenceCache>> caches;
  for (size_t i = 0; i < seqs.size(); ++i) caches.push_back(rt->new_cache());
  std::vector<float> first;
  ASSERT_TRUE(rt->model()
                  .forward_one(std::span<const int32_t>(seqs[0].data(), 12), *caches[0], &first)
                  .ok());
  std::vector<std::vector<float>> logits(seqs.size());
  std::vector<model::SeqChunk> batch(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    batch[i].tokens =
        i == 0 ? std::span<const int32_t>(&seqs[0][12], 1) : std::span<const int32_t>(seqs[i]);
    batch[i].cache = caches[i].get();
    batch[i].all_logits = true;
    batch[i].logits = &logits[i];
  }
  ASSERT_TRUE(rt->model().forward(batch).ok());
  expect_close(logits[0], want[0], 12, 1, vocab, kLogitTolF32, "batch seq 0 (decode)");
  expect_close(logits[1], want[1], 0, 30, vocab, kLogitTolF32, "batch seq 1 (prefill 30)");
  expect_close(logits[2], want[2], 0, 5, vocab, kLogitTolF32, "batch seq 2 (prefill 5)");
}

// The Hugging Face golden (scripts/goldens/qwen3_moe_golden.py, run where torch and transformers
// 5.x are; the same layout as models/tiny-qwen3/golden): prefill logits of the last 8 positions
// within kLogitTolF32, and greedy continuations equal up to a near-tie (the first differing step
// must have chosen one of the reference's top-5 within 0.05 of its top-1).
TEST(MoeModel, HuggingFaceGolden) {
  const std::string dir = std::string(kModel) + "/golden";
  if (!std::filesystem::exists(dir + "/logits.safetensors") ||
      !std::filesystem::exists(dir + "/golden_index.json"))
    GTEST_SKIP() << dir << "/logits.safetensors absent: generate it with "
                 << "scripts/goldens/qwen3_moe_golden.py (torch + transformers 5.x)";
  std::ifstream in(dir + "/golden_index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  auto file = format::SafetensorsFile::open(dir + "/logits.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto rt = make_runtime("f32");
  ASSERT_TRUE(rt);
  const int vocab = rt->model().config().vocab_size;
  for (const auto& p : index["prompts"]) {
    const std::string name = p["name"];
    std::vector<int32_t> ids;
    for (int64_t v : file->find(name + ".input_ids")->to_i64())
      ids.push_back(static_cast<int32_t>(v));
    const std::vector<float> last8 = file->find(name + ".logits_last8")->to_f32();
    std::vector<int32_t> greedy;
    for (int64_t v : file->find(name + ".greedy_ids")->to_i64())
      greedy.push_back(static_cast<int32_t>(v));
    auto cache = rt->new_cache();
    std::vector<float> logits;
    ASSERT_TRUE(rt->model().forward_one(ids, *cache, &logits, /*all_logits=*/true).ok());
    const int64_t T = static_cast<int64_t>(ids.size()), rows = std::min<int64_t>(8, T);
    std::vector<float> got(logits.end() - rows * vocab, logits.end());
    expect_close(got, Vec(last8.begin(), last8.end()), 0, rows, vocab, kLogitTolF32,
                 "golden " + name);
    std::vector<float> last(logits.end() - vocab, logits.end());
    for (size_t step = 0; step < greedy.size(); ++step) {
      const int32_t next =
          static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      if (next != greedy[step]) {
        bool near_tie = false;
        for (const auto& e : p["greedy_top5"][step])
          if (e[0].get<int32_t>() == next &&
              p["greedy_top5"][step][0][1].get<double>() - e[1].get<double>() < 0.05)
            near_tie = true;
        EXPECT_TRUE(near_tie) << name << " step " << step << " chose " << next;
        break;
      }
      ASSERT_TRUE(rt->model().forward_one(std::span<const int32_t>(&next, 1), *cache, &last).ok());
    }
  }
}

// Experts stored in other dtypes: one expert matrix of each sparse layer as F32 (its stack is then
// widened to float32 at load, the others copied in), the rest BF16. The logits still match the
// reference computed from the original checkpoint (same values, so a misplaced expert would show).
TEST(MoeModel, MixedDtypeExpertsStack) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("oscar_moe_mixed_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(kModel) + "/config.json", dir / "config.json");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(std::string(kModel) + "/" + f, dir / f);
  auto ckpt = format::Checkpoint::open(kModel);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  std::vector<format::TensorToWrite> out;
  for (const format::TensorView* t : ckpt->all()) {
    if (t->name == "model.layers.0.mlp.experts.5.up_proj.weight" ||
        t->name == "model.layers.2.mlp.experts.0.down_proj.weight") {
      const std::vector<float> f = t->to_f32();
      out.push_back(format::f32_tensor(t->name, t->shape, f));
      continue;
    }
    const size_t bytes = static_cast<size_t>(t->numel()) * format::dtype_size(t->dtype);
    out.push_back({t->name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + bytes)});
  }
  ASSERT_TRUE(format::write_safetensors((dir / "model.safetensors").string(), out, {}).ok());

  Reference ref(kModel);
  std::mt19937 rng(2504);
  const std::vector<int32_t> ids = random_tokens(rng, 20, ref.config().vocab_size);
  const Vec want = ref.forward(ids);
  ASSERT_GT(ref.min_router_margin(), kMinRouterMargin);
  engine::RuntimeOptions o;
  o.model_dir = dir.string();
  o.device = "cpu";
  o.cache_mode = "f32";
  o.kv_budget_bytes = size_t{64} << 20;
  auto rt = engine::Runtime::create(o);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  // Two stacks of four widened to float32: 2 more bytes per element of each.
  const format::ModelConfig& c = rt.value()->model().config();
  const size_t stack = static_cast<size_t>(c.n_experts) * c.moe_intermediate_size * c.hidden_size;
  auto plain = make_runtime("f32");
  ASSERT_TRUE(plain);
  EXPECT_EQ(rt.value()->model().weight_bytes(), plain->model().weight_bytes() + 2 * 2 * stack);
  auto cache = rt.value()->new_cache();
  std::vector<float> logits;
  ASSERT_TRUE(rt.value()->model().forward_one(ids, *cache, &logits, /*all_logits=*/true).ok());
  expect_close(logits, want, 0, 20, c.vocab_size, kLogitTolF32, "mixed-dtype experts");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// --dummy-weights: random weights of the MoE shape, every logit finite.
TEST(MoeModel, DummyWeights) {
  auto rt = make_runtime("bf16", /*dummy=*/true);
  ASSERT_TRUE(rt);
  const format::ModelConfig& c = rt->model().config();
  const int64_t norms = c.hidden_size * (1 + 2 * c.n_layers) + 2 * c.head_dim * c.n_layers;
  EXPECT_EQ(rt->model().weight_bytes(),
            static_cast<size_t>(2 * (c.n_params() - norms) + 4 * norms));
  auto cache = rt->new_cache();
  std::vector<float> logits;
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  ASSERT_TRUE(rt->model().forward_one(ids, *cache, &logits).ok());
  ASSERT_TRUE(rt->model().forward_one(std::span<const int32_t>(&ids[3], 1), *cache, &logits).ok());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

// No MoE kernels on a device yet: an explicit device is refused up front, naming --device cpu.
TEST(MoeModel, DeviceWithoutMoeIsRefused) {
  engine::RuntimeOptions o;
  o.model_dir = kModel;
  o.device = "cuda";
  auto rt = engine::Runtime::create(o);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("MoE not implemented on cuda yet; use --device cpu"),
            std::string::npos)
      << rt.status().to_string();
}

}  // namespace
}  // namespace oscar
