// The evaluation harness end to end on the embedded tiny-qwen3: 2 short perplexity windows, one
// fidelity window and 2 NIAH prompts per length, for bf16 and int2-naive (and an oscar mode whose
// rotation file does not exist, which must be reported as unsupported without failing the run).
#include <gtest/gtest.h>

#include <cmath>

#include "eval/evaluate.h"
#include "eval/report.h"

namespace oscar::eval {
namespace {

// Perplexity of windows 0 and 1 (1024 predictions each) of dev_eval.txt with the exact f32 cache,
// computed once with this harness (`--modes f32 --ppl-windows 2 --window-tokens 1024`).
constexpr double kF32Ppl2x1024 = 9.4157;
// bf16 differs from f32 only by the rounding of cached K/V to bf16 (8 significant bits).
constexpr double kBf16RelTol = 0.003;
// A mode the harness cannot run: its rotation file is missing.
const std::string kMissingRotations = "oscar:rot=/nonexistent/oscar_rotations.safetensors";

class EvalModelTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    EvalConfig cfg;
    cfg.runtime.model_dir = std::string(OSCAR_SOURCE_DIR) + "/models/tiny-qwen3";
    cfg.runtime.kv_budget_bytes = size_t{256} << 20;
    cfg.modes = {"bf16", "int2-naive", kMissingRotations};
    cfg.ppl.n_windows = 2;
    cfg.ppl.window_tokens = 1024;
    cfg.ppl.tail_from = 512;
    cfg.fidelity.n_windows = 1;
    cfg.fidelity.n_score_steps = 2;
    cfg.niah_per_length = 2;
    cfg.progress = false;
    auto r = run_evaluation(cfg);
    ASSERT_TRUE(r.ok()) << r.status().message();
    report_ = new EvalReport(std::move(r.value()));
  }
  static void TearDownTestSuite() {
    delete report_;
    report_ = nullptr;
  }
  static const ModeReport& mode(const std::string& name) {
    for (const ModeReport& m : report_->modes)
      if (m.mode == name) return m;
    ADD_FAILURE() << "no mode " << name;
    return report_->modes.front();
  }
  static EvalReport* report_;
};

EvalReport* EvalModelTest::report_ = nullptr;

TEST_F(EvalModelTest, Bf16PerplexityNearF32Reference) {
  ASSERT_NE(report_, nullptr);
  const ModeReport& bf = mode("bf16");
  ASSERT_TRUE(bf.ppl.has_value());
  EXPECT_EQ(bf.ppl->n_predictions, 2048);
  EXPECT_EQ(bf.ppl->n_tail, 2 * 512);
  EXPECT_NEAR(bf.ppl->ppl() / kF32Ppl2x1024, 1.0, kBf16RelTol) << bf.ppl->ppl();
  const ModeReport& naive = mode("int2-naive");
  ASSERT_TRUE(naive.ppl.has_value());
  EXPECT_GT(naive.ppl->ppl(), bf.ppl->ppl());  // 2-bit history costs something
  EXPECT_LT(naive.ppl->ppl(), 2.0 * bf.ppl->ppl());
}

TEST_F(EvalModelTest, NiahPromptsTokenizeToTheirCounts) {
  ASSERT_NE(report_, nullptr);
  for (const char* name : {"bf16", "int2-naive"}) {
    const ModeReport& m = mode(name);
    ASSERT_TRUE(m.niah.has_value()) << name;
    ASSERT_EQ(m.niah->per_length.size(), 4u);
    for (const NiahLengthResult& l : m.niah->per_length) {
      EXPECT_EQ(l.n, 2) << name << " " << l.target_len;
      EXPECT_EQ(l.token_count_mismatches, 0) << name << " " << l.target_len;
      EXPECT_GE(l.correct, 0);
      EXPECT_LE(l.correct, 2);
    }
  }
}

TEST_F(EvalModelTest, BitsPerElementFromBytes) {
  ASSERT_NE(report_, nullptr);
  const ModeReport& naive = mode("int2-naive");
  ASSERT_TRUE(naive.bits.has_value());
  EXPECT_EQ(naive.bits->n_tokens, 8184);  // the 8K prompts
  EXPECT_GT(naive.bits->hist_tokens, 7000);
  EXPECT_EQ(naive.bits->bits_hist, 2.25);  // group 128: 32 code bytes + fp16 scale and min
  EXPECT_NEAR(naive.bits->bits_at(131072), 2.28, 0.01);
  const ModeReport& bf = mode("bf16");
  ASSERT_TRUE(bf.bits.has_value());
  EXPECT_EQ(bf.bits->hist_tokens, 0);
  // 512 whole pages of 16 tokens hold the 8184 tokens.
  EXPECT_DOUBLE_EQ(bf.bits->bits_total, 16.0 * 8192 / 8184);
}

TEST_F(EvalModelTest, FidelityAgainstBf16) {
  ASSERT_NE(report_, nullptr);
  const ModeReport& bf = mode("bf16");
  const ModeReport& naive = mode("int2-naive");
  ASSERT_TRUE(bf.fidelity.has_value());
  ASSERT_TRUE(naive.fidelity.has_value());
  // bf16 against its own reference: the forward pass is deterministic.
  EXPECT_EQ(bf.fidelity->logit_kl, 0.0);
  EXPECT_EQ(bf.fidelity->hidden_err, 0.0);
  for (double e : bf.fidelity->out_err) EXPECT_EQ(e, 0.0);
  for (double e : bf.fidelity->score_kl) EXPECT_EQ(e, 0.0);
  // int2-naive: every layer reads an INT2 history, so every metric is positive.
  ASSERT_EQ(naive.fidelity->out_err.size(), 8u);
  for (int l = 0; l < 8; ++l) {
    EXPECT_GT(naive.fidelity->out_err[l], 0.0) << l;
    EXPECT_LT(naive.fidelity->out_err[l], 1.0) << l;
    EXPECT_GT(naive.fidelity->score_kl[l], 0.0) << l;
  }
  EXPECT_GT(naive.fidelity->logit_kl, 0.0);
  // The recomputed scores reproduce the model's attention output at the single-token steps.
  EXPECT_LT(bf.fidelity->score_check_max_err, 1e-4);
  EXPECT_LT(naive.fidelity->score_check_max_err, 1e-4);
}

TEST_F(EvalModelTest, UnsupportedModeIsReportedAndJsonIsValid) {
  ASSERT_NE(report_, nullptr);
  const ModeReport& missing = mode(kMissingRotations);
  EXPECT_FALSE(missing.supported);
  EXPECT_NE(missing.error.find("nonexistent"), std::string::npos) << missing.error;
  const std::string text = report_json(*report_).dump(2);
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(text));
  ASSERT_EQ(j["modes"].size(), 3u);
  EXPECT_EQ(j["modes"][0]["mode"], "bf16");
  EXPECT_TRUE(j["modes"][0]["ppl"]["ppl"].is_number());
  EXPECT_EQ(j["modes"][1]["bits"]["bits_hist"].get<double>(), 2.25);
  EXPECT_EQ(j["modes"][1]["niah"]["per_length"].size(), 4u);
  EXPECT_FALSE(j["modes"][2]["supported"].get<bool>());
  EXPECT_EQ(j["config"]["window_tokens"], 1024);
}

}  // namespace
}  // namespace oscar::eval
