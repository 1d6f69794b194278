// End-to-end model speed on the CPU (a benchmark, not a test): load time of the model and of the
// tokenizers, prefill tokens/s and decode tokens/s at several context lengths, per cache mode,
// side by side. Prints a Markdown table (docs/results/model_cpu.md records a run).
//
//   ./build/bench/bench_model [--model DIR] [--modes bf16,int2-hadamard] [--contexts 512,4096]
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "core/omp_env.h"
#include "engine/runtime.h"
#include "tokenizer/tokenizer.h"

using namespace oscar;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  set_omp_wait_policy(argv);
  std::string model = "models/tiny-qwen3";
  std::string modes = "bf16,int2-hadamard";
  std::string contexts = "512,2048,4096";
  std::string qwen3_tokenizer = "tests/data/qwen3_tokenizer";
  int decode_tokens = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--modes") modes = argv[i + 1];
    else if (a == "--contexts") contexts = argv[i + 1];
    else if (a == "--decode-tokens") decode_tokens = std::stoi(argv[i + 1]);
  }

  auto t = Clock::now();
  auto tok = tok::Tokenizer::load(qwen3_tokenizer);
  const double qwen3_tok_s = since(t);
  if (!tok.ok()) std::fprintf(stderr, "qwen3 tokenizer: %s\n", tok.status().message().c_str());

  auto text = read_text_file(model + "/data/dev_eval.txt");
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", text.status().message().c_str());
    return 1;
  }
  std::printf("| mode | model load s | context | prefill tok/s | decode tok/s |\n|---|---|---|---|---|\n");
  for (const std::string& mode : split(modes)) {
    engine::RuntimeOptions o;
    o.model_dir = model;
    o.cache_mode = mode;
    o.kv_budget_bytes = size_t{512} << 20;
    t = Clock::now();
    auto rt = engine::Runtime::create(o);
    const double load_s = since(t);
    if (!rt.ok()) {
      std::fprintf(stderr, "%s: %s\n", mode.c_str(), rt.status().message().c_str());
      continue;
    }
    engine::Runtime& r = *rt.value();
    const std::vector<int32_t> all = r.tokenizer().encode(text.value());
    for (const std::string& c : split(contexts)) {
      const size_t n = std::stoul(c);
      std::vector<int32_t> prompt(all.begin(), all.begin() + std::min(n, all.size()));
      auto cache = r.new_cache();
      std::vector<float> logits;
      t = Clock::now();
      Status st = r.model().forward_one(prompt, *cache, &logits);
      const double prefill_s = since(t);
      t = Clock::now();
      for (int k = 0; k < decode_tokens && st.ok(); ++k) {
        const int32_t next = all[n + k];
        st = r.model().forward_one(std::span<const int32_t>(&next, 1), *cache, &logits);
      }
      const double decode_s = since(t);
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", mode.c_str(), st.message().c_str());
        break;
      }
      std::printf("| %s | %.3f | %zu | %.0f | %.1f |\n", mode.c_str(), load_s, n,
                  prompt.size() / prefill_s, decode_tokens / decode_s);
    }
  }
  std::printf("\nQwen3 tokenizer.json (151k vocab, 151k merges) load: %.3f s\n", qwen3_tok_s);
  return 0;
}
