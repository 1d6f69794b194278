// Tokenizer on the embedded tiny-qwen3 data: dev_eval.txt must encode to exactly 683,901 tokens
// (later perplexity evaluation depends on it), and the golden prompts' input_ids must be
// reproduced. Prints load time and encode throughput (informational; nothing is asserted on time).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/mmap_file.h"
#include "tokenizer/tokenizer.h"

namespace oscar::tok {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

TEST(TokenizerModel, DevEvalTokenCountAndThroughput) {
  auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::load(OSCAR_SOURCE_DIR "/models/tiny-qwen3");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  std::printf("[ info ] tiny-qwen3 tokenizer load: %.1f ms\n", ms_since(t0));

  auto text = read_text_file(OSCAR_SOURCE_DIR "/models/tiny-qwen3/data/dev_eval.txt");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  const double mb = static_cast<double>(text->size()) / 1e6;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0: cold word cache, pass 1: warm
    t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    const std::vector<int32_t> ids = tok->encode(*text);
    const double cpu_ms = 1e3 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    const double ms = ms_since(t0);
    std::printf(
        "[ info ] dev_eval.txt %.2f MB -> %zu tokens: wall %.1f ms, cpu %.1f ms (%.1f MB/s cpu, "
        "%s cache)\n",
        mb, ids.size(), ms, cpu_ms, mb / (cpu_ms / 1e3), pass == 0 ? "cold" : "warm");
    EXPECT_EQ(ids.size(), 683901u);
    if (pass == 0) {
      EXPECT_EQ(tok->decode(ids), tok->normalize(*text));
    }
  }
}

TEST(TokenizerModel, GoldenPromptIds) {
  auto tok = Tokenizer::load(OSCAR_SOURCE_DIR "/models/tiny-qwen3");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto idx = read_text_file(OSCAR_SOURCE_DIR "/models/tiny-qwen3/golden/golden_index.json");
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  const nlohmann::json j = nlohmann::json::parse(*idx);
  ASSERT_FALSE(j.at("prompts").empty());
  for (const auto& p : j.at("prompts")) {
    const std::string text = p.at("text").get<std::string>();
    const auto expect = p.at("input_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(text), expect) << p.at("name");
    EXPECT_EQ(expect.size(), p.at("n_tokens").get<size_t>()) << p.at("name");
  }
}

}  // namespace
}  // namespace oscar::tok
