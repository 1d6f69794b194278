// Unit tests of the evaluation harness's arithmetic (no model): loss, window counting, bits per
// element from bytes and its projection, fidelity step positions, NIAH selection, the table/SVG.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "eval/cache_bits.h"
#include "eval/eval_data.h"
#include "eval/evaluate.h"
#include "eval/fidelity.h"
#include "eval/merge.h"
#include "eval/perplexity.h"
#include "eval/report.h"

namespace oscar::eval {
namespace {

TEST(Perplexity, TokenNllMatchesLogSoftmax) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = nd(rng);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x));
  for (int t : {0, 17, 999})
    EXPECT_NEAR(token_nll(logits, t), std::log(sum) - logits[t], 1e-9);
  // Uniform logits: log(vocab), exactly representable up to rounding.
  std::vector<float> flat(8192, 1.5f);
  EXPECT_NEAR(token_nll(flat, 3), std::log(8192.0), 1e-12);
}

TEST(Perplexity, AvailableWindows) {
  EXPECT_EQ(available_windows(683901, 4096), 166);  // the README's dev text
  EXPECT_EQ(available_windows(4097, 4096), 1);
  EXPECT_EQ(available_windows(4096, 4096), 0);
  EXPECT_EQ(available_windows(8193, 4096), 2);
}

TEST(CacheBits, Int2HistoryIs225AndProjectionMatchesOscarMd) {
  // tiny-qwen3 shape: 8 layers, 2 KV heads, head_dim 128, group 128, pages of 16 tokens.
  kv::KvCacheSpec spec;
  spec.n_layers = 8;
  spec.n_heads_kv = 2;
  spec.head_dim = 128;
  // An 8184-token prefill (an 8K NIAH prompt): history [64, 7920) in INT2, sinks 4 pages and
  // the recent window 264 tokens (17 pages of 16) in BF16.
  PrefillSnapshot s;
  s.n_tokens = 8184;
  s.hist_tokens = 7920 - 64;
  const int64_t row_i2 = 128 / 4 + 4, row_bf16 = 256;  // bytes per (token, head, K or V)
  const int64_t per_tok_i2 = row_i2 * 2 * 8 * 2, per_tok_bf16 = row_bf16 * 2 * 8 * 2;
  s.bytes.history = s.hist_tokens * per_tok_i2;
  s.bytes.sink = 64 * per_tok_bf16;
  s.bytes.recent = 17 * 16 * per_tok_bf16;
  const CacheBits b = cache_bits(s, spec);
  EXPECT_EQ(b.elems_per_token, 4096);
  EXPECT_DOUBLE_EQ(b.bits_hist, 2.25);
  // Projection: sink + recent bytes fixed, history at 2.25 bits for the other L - 328 tokens.
  for (int64_t L : {int64_t{32768}, int64_t{131072}}) {
    const double bytes = static_cast<double>(s.bytes.sink + s.bytes.recent) +
                         static_cast<double>(per_tok_i2) * static_cast<double>(L - 328);
    EXPECT_NEAR(b.bits_at(L), bytes * 8 / (static_cast<double>(L) * 4096), 1e-12);
  }
  // OSCAR.md §2: about 2.28 at 128K and 2.38 at 32K with 64 + 256 BF16 tokens.
  EXPECT_NEAR(b.bits_at(131072), 2.28, 0.01);
  EXPECT_NEAR(b.bits_at(32768), 2.38, 0.02);
  EXPECT_NEAR(b.bits_at(s.n_tokens), b.bits_total, 1e-12);
  // No history (bf16): 16 bits at every length.
  PrefillSnapshot f;
  f.n_tokens = 1024;
  f.bytes.sink = 64 * per_tok_bf16;
  f.bytes.recent = 960 * per_tok_bf16;
  const CacheBits fb = cache_bits(f, spec);
  EXPECT_DOUBLE_EQ(fb.bits_hist, 0.0);
  EXPECT_DOUBLE_EQ(fb.bits_total, 16.0);
  EXPECT_DOUBLE_EQ(fb.bits_at(131072), 16.0);
}

TEST(Fidelity, StepsAreIncreasingAndInsideTheWindow) {
  const std::vector<int64_t> s = fidelity_steps(4096, 8);
  ASSERT_EQ(s.size(), 8u);
  EXPECT_EQ(s.front(), 512 + 448 - 1);
  EXPECT_EQ(s.back(), 4095);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_GT(s[i], s[i - 1]);
  EXPECT_TRUE(fidelity_steps(4096, 0).empty());
  for (int64_t p : fidelity_steps(16, 40)) EXPECT_TRUE(p >= 1 && p < 16);
}

TEST(EvalData, SelectNiahTakesTheFirstCasesPerLength) {
  std::vector<NiahCase> all;
  for (int i = 0; i < 6; ++i) {
    NiahCase c;
    c.id = std::to_string(i);
    c.target_len = i % 2 ? 2048 : 1024;
    all.push_back(c);
  }
  const std::vector<int> lens = {2048, 1024};
  auto sel = select_niah(all, lens, 2);
  ASSERT_TRUE(sel.ok()) << sel.status().message();
  ASSERT_EQ(sel->size(), 4u);
  EXPECT_EQ((*sel)[0].id, "1");
  EXPECT_EQ((*sel)[1].id, "3");
  EXPECT_EQ((*sel)[2].id, "0");
  EXPECT_EQ((*sel)[3].id, "2");
  auto too_many = select_niah(all, lens, 4);
  EXPECT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("length 2048"), std::string::npos);
  // Shards: skip the first case of each length.
  auto shard = select_niah(all, lens, 2, /*skip=*/1);
  ASSERT_TRUE(shard.ok()) << shard.status().message();
  ASSERT_EQ(shard->size(), 4u);
  EXPECT_EQ((*shard)[0].id, "3");
  EXPECT_EQ((*shard)[1].id, "5");
  EXPECT_EQ((*shard)[2].id, "2");
  EXPECT_EQ((*shard)[3].id, "4");
  EXPECT_FALSE(select_niah(all, lens, 1, /*skip=*/3).ok());
}

TEST(ModeVariant, OverridesParseAndBadItemsAreRefused) {
  engine::RuntimeOptions base;
  base.model_dir = "m";
  auto plain = apply_mode_variant("oscar", base);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->cache_mode, "oscar");
  EXPECT_EQ(plain->k_clip, -1.f);
  auto v = apply_mode_variant("oscar-lloyd:k=1:v=0.96:rot=/tmp/r.safetensors:recent=384", base);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->cache_mode, "oscar-lloyd");
  EXPECT_FLOAT_EQ(v->k_clip, 1.0f);
  EXPECT_FLOAT_EQ(v->v_clip, 0.96f);
  EXPECT_EQ(v->rotations, "/tmp/r.safetensors");
  EXPECT_EQ(v->n_recent, 384);
  EXPECT_EQ(v->model_dir, "m");
  EXPECT_TRUE(v->bit_plan);
  auto np = apply_mode_variant("oscar:plan=0", base);
  ASSERT_TRUE(np.ok());
  EXPECT_FALSE(np->bit_plan);
  for (const char* bad : {"oscar:k", "oscar:k=0", "oscar:k=abc", "oscar:x=1", "oscar:recent=1.5",
                          "oscar:plan=2"}) {
    auto r = apply_mode_variant(bad, base);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
    }
  }
}

// A small report with one ppl window and NIAH at 1K, written and read back, then merged.
EvalReport shard_report(const std::string& mode, double nll, int correct, int n) {
  EvalReport r;
  r.config.niah_lengths = {1024};
  r.config.niah_per_length = n;
  r.config.ppl.n_windows = 1;
  r.info.command_line = "shard " + mode;
  ModeReport m;
  m.mode = mode;
  PplResult p;
  p.n_windows = 1;
  p.n_predictions = 4096;
  p.n_tail = 3072;
  p.nll_sum = nll * 4096;
  p.nll_tail_sum = (nll - 0.1) * 3072;
  p.window_nll = {nll};
  m.ppl = p;
  NiahResult nr;
  nr.per_length.push_back({1024, n, correct, 0});
  m.niah = nr;
  r.modes.push_back(m);
  return r;
}

TEST(Merge, ShardsOfOneModeAddAndOtherModesStaySeparate) {
  const std::string dir = testing::TempDir();
  ASSERT_TRUE(write_report(shard_report("oscar", 1.5, 40, 50), dir + "/m_a").ok());
  ASSERT_TRUE(write_report(shard_report("oscar", 1.6, 30, 50), dir + "/m_b").ok());
  ASSERT_TRUE(write_report(shard_report("bf16", 1.4, 48, 50), dir + "/m_c").ok());
  std::vector<EvalReport> parts;
  for (const char* f : {"/m_a.json", "/m_b.json", "/m_c.json"}) {
    auto r = read_report_json(dir + f);
    ASSERT_TRUE(r.ok()) << r.status().message();
    parts.push_back(std::move(r.value()));
  }
  // Round trip of one shard (tolerance: JSON doubles print to 17 digits, so 1e-12 relative).
  EXPECT_NEAR(parts[0].modes[0].ppl->ppl(), std::exp(1.5), 1e-12 * std::exp(1.5));
  auto merged = merge_reports(parts);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  ASSERT_EQ(merged->modes.size(), 2u);
  const ModeReport& o = merged->modes[0];
  EXPECT_EQ(o.mode, "oscar");
  EXPECT_EQ(o.ppl->n_windows, 2);
  EXPECT_NEAR(o.ppl->ppl(), std::exp(1.55), 1e-9);
  EXPECT_NEAR(o.ppl->ppl_tail(), std::exp(1.45), 1e-9);
  EXPECT_EQ(o.niah->per_length[0].n, 100);
  EXPECT_EQ(o.niah->per_length[0].correct, 70);
  EXPECT_EQ(merged->modes[1].niah->per_length[0].correct, 48);
  EXPECT_EQ(merged->config.niah_per_length, 100);
  EXPECT_EQ(merged->info.merged_from.size(), 3u);
  // bf16 has 50 prompts at 1K while the header says 100: the table shows its n.
  EXPECT_NE(format_table(*merged).find("0.96 (n=50)"), std::string::npos) << format_table(*merged);
  // Different windows cannot be merged.
  parts[2].config.ppl.window_tokens = 2048;
  EXPECT_FALSE(merge_reports(parts).ok());
  EXPECT_FALSE(merge_reports({}).ok());
  EXPECT_FALSE(read_report_json(dir + "/missing.json").ok());
}

TEST(EvalData, LoadNiahReportsTheBadLine) {
  const std::string path = testing::TempDir() + "/niah_bad.jsonl";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"id\":\"a\",\"target_len\":1024,\"n_prompt_tokens\":1016,\"prompt\":\"x\","
               "\"answer\":\"1234567\"}\n{\"id\":\"b\"}\n", f);
    std::fclose(f);
  }
  auto r = load_niah(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(":2:"), std::string::npos) << r.status().message();
}

TEST(Report, UnsupportedModeAppearsInTableAndJson) {
  EvalReport r;
  r.config.niah_lengths = {1024};
  ModeReport m;
  m.mode = "kivi2";
  m.supported = false;
  m.error = "not supported by the cache";
  r.modes.push_back(m);
  const std::string table = format_table(r);
  EXPECT_NE(table.find("unsupported: not supported"), std::string::npos) << table;
  const nlohmann::json j = nlohmann::json::parse(report_json(r).dump());
  EXPECT_FALSE(j["modes"][0]["supported"].get<bool>());
  const std::string svg = render_svg(r);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace oscar::eval

namespace oscar::eval {
namespace {

// Fidelity reads the cache with the CPU kernels: asked of a GPU it is a clear error before any
// work, never the abort in SequenceCache::read_row (issue 24 item 6).
TEST(Evaluate, FidelityOffTheCpuIsRefusedBeforeAnyWork) {
  EvalConfig cfg;
  cfg.fidelity.n_windows = 4;
  EXPECT_TRUE(check_fidelity_device(cfg, Device::kCpu).ok());
  const Status st = check_fidelity_device(cfg, Device::kCuda);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cannot run on the cuda device; pass --fidelity-windows 0"),
            std::string::npos)
      << st.message();
  cfg.fidelity.n_windows = 0;
  EXPECT_TRUE(check_fidelity_device(cfg, Device::kCuda).ok());

  // run_evaluation checks the device first: no model is read (the directory does not exist), and
  // the answer is an error (this CPU build has no CUDA backend; on a GPU, the fidelity error).
  cfg.fidelity.n_windows = 4;
  cfg.runtime.device = "cuda";
  cfg.runtime.model_dir = "/nonexistent/model";
  auto r = run_evaluation(cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find("/nonexistent"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("cuda"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace oscar::eval
