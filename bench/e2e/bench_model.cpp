// End-to-end model speed on the CPU (a benchmark, not a test): load time of the model and of the
// tokenizers, prefill tokens/s and decode tokens/s at several context lengths, per cache mode,
// side by side. Prints a Markdown table (docs/results/model_cpu.md records runs, and
// docs/results/bench_method.md how this benchmark measures and why).
//
//   ./build/bench/bench_model [--model DIR] [--modes bf16,int2-hadamard] [--contexts 512,4096]
//                             [--decode-tokens 256] [--warmup-tokens 16] [--reps 5]
//
// Per (mode, context): one untimed warm-up (a prefill and the warm-up decode steps, which also
// touch the KV pool's pages for the first time), then `reps` repetitions, each on a fresh cache:
// a timed prefill of the first `context` tokens of data/dev_eval.txt, `warmup-tokens` untimed
// single-token steps, and `decode-tokens` timed ones (so the timed decode runs from context +
// warmup-tokens to context + warmup-tokens + decode-tokens). A row prints the medians over the
// repetitions, the decode figure last (bench/llamacpp/run.sh reads it there), with its min-max and
// max/min, and the median count of voluntary context switches per timed decode token ("sleeps
// / token": an OpenMP thread that sleeps between parallel regions is woken by a futex, which
// on the development VM costs tens of µs and made repeated runs fall into two clusters 2-3×
// apart, docs/results/bench_method.md). Every repetition's figures also go to stderr.
// `--decode-tokens 32 --warmup-tokens 0 --reps 1` is the measurement before issue 28.
//
// Other shapes (issue #25): `--config FILE` runs that config.json instead of the model's (with
// the model directory's tokenizer and text, so its vocabulary must cover the tokenizer's ids),
// `--layers N` keeps its first N layers (a real-shape model that does not fit memory, e.g.
// Qwen3-30B-A3B's 48 layers; a hybrid's layer_types cut to match), `--dummy-weights` draws random weights instead of reading a
// checkpoint (needed with either). The config copy goes to a temporary directory.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "core/omp_env.h"
#include "engine/runtime.h"
#include "repeat_stats.h"
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

constexpr const char* kUsage =
    "usage: bench_model [--model DIR] [--modes bf16,int2-hadamard] [--contexts 512,2048,4096]\n"
    "                   [--decode-tokens 256] [--warmup-tokens 16] [--reps 5]\n"
    "                   [--config FILE] [--layers N] [--dummy-weights] [--deterministic 0|1]\n"
    "                   [--kv-budget-mib 512] [--folded-weights auto|f32|bf16]\n"
    "Prefill and decode tokens/s per (mode, context): medians of --reps repetitions, each a\n"
    "prefill, --warmup-tokens untimed decode steps and --decode-tokens timed ones, after one\n"
    "untimed warm-up; the decode min-max and max/min beside. Repetitions go to stderr.\n"
    "--kv-budget-mib: the KV pools (a real shape at 16K context needs ~2 GiB in bf16).\n"
    "--folded-weights: how v_proj / o_proj hold a folded value rotation (RuntimeOptions).\n";

// Prefill time and decode time of one repetition, in seconds, and the voluntary context switches
// (all threads) during the timed decode.
struct Times {
  double prefill_s = 0, decode_s = 0;
  long decode_sleeps = 0;
};

long voluntary_context_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw;
}

// On a fresh cache: prefill tokens [0, n) of `all`, then `warmup` untimed single-token steps and
// `decode` timed ones over the tokens after them. all.size() >= n + warmup + decode.
Status run_once(engine::Runtime& r, const std::vector<int32_t>& all, size_t n, int warmup,
                int decode, Times* times) {
  auto cache = r.new_cache();
  std::vector<float> logits;
  auto step = [&](size_t pos) {
    return r.model().forward_one(std::span<const int32_t>(&all[pos], 1), *cache, &logits);
  };
  auto t = Clock::now();
  Status st = r.model().forward_one(std::span<const int32_t>(all.data(), n), *cache, &logits);
  times->prefill_s = since(t);
  for (int k = 0; k < warmup && st.ok(); ++k) st = step(n + k);
  const long sleeps = voluntary_context_switches();
  t = Clock::now();
  for (int k = 0; k < decode && st.ok(); ++k) st = step(n + warmup + k);
  times->decode_s = since(t);
  times->decode_sleeps = voluntary_context_switches() - sleeps;
  return st;
}

// A temporary model directory: `config` (or DIR/config.json) with its first `layers` layers
// (0: all), and DIR's tokenizer files.
std::string config_dir(const std::string& dir, const std::string& config, int layers) {
  std::ifstream in(config.empty() ? dir + "/config.json" : config);
  nlohmann::json root = nlohmann::json::parse(in);
  // A multimodal wrapper (Qwen3.5) keeps the language model's fields in text_config.
  nlohmann::json& cfg = root.contains("text_config") ? root["text_config"] : root;
  if (layers > 0) {
    cfg["num_hidden_layers"] = layers;
    if (cfg.contains("mlp_only_layers") && cfg["mlp_only_layers"].is_array()) {
      nlohmann::json kept = nlohmann::json::array();
      for (const auto& l : cfg["mlp_only_layers"])
        if (l.is_number_integer() && l.get<int>() < layers) kept.push_back(l);
      cfg["mlp_only_layers"] = kept;
    }
    if (cfg.contains("layer_types") && cfg["layer_types"].is_array() &&
        cfg["layer_types"].size() > static_cast<size_t>(layers))
      cfg["layer_types"].erase(cfg["layer_types"].begin() + layers, cfg["layer_types"].end());
  }
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("oscar-bench-model-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(tmp);
  std::ofstream(tmp + "/config.json") << root.dump(2);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (std::filesystem::exists(dir + "/" + f))
      std::filesystem::copy_file(dir + "/" + f, tmp + "/" + f,
                                 std::filesystem::copy_options::overwrite_existing);
  return tmp;
}

}  // namespace

int main(int argc, char** argv) {
  set_omp_wait_policy(argv);
  std::string model = "models/tiny-qwen3";
  std::string modes = "bf16,int2-hadamard";
  std::string contexts = "512,2048,4096";
  std::string qwen3_tokenizer = OSCAR_QWEN3_TOKENIZER_DIR;  // unpacked by configure
  std::string config;
  int decode_tokens = 256, warmup_tokens = 16, reps = 5, layers = 0, deterministic = 0;
  long long kv_budget_mib = 512;
  std::string folded_weights = "auto";
  bool dummy = false;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--dummy-weights") continue;
    dummy = true;
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];  // drop the flag
    --argc;
    break;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--config") config = argv[i + 1];
    else if (a == "--layers") layers = std::stoi(argv[i + 1]);
    else if (a == "--modes") modes = argv[i + 1];
    else if (a == "--contexts") contexts = argv[i + 1];
    else if (a == "--decode-tokens") decode_tokens = std::stoi(argv[i + 1]);
    else if (a == "--warmup-tokens") warmup_tokens = std::stoi(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else if (a == "--deterministic") deterministic = std::stoi(argv[i + 1]);  // batch-invariant
    else if (a == "--kv-budget-mib") kv_budget_mib = std::stoll(argv[i + 1]);
    else if (a == "--folded-weights") folded_weights = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_model: unknown option %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if ((!config.empty() || layers > 0) && !dummy) {
    std::fprintf(stderr,
                 "bench_model: --config and --layers need --dummy-weights (no checkpoint fits)\n");
    return 2;
  }
  if (decode_tokens < 1 || warmup_tokens < 0 || reps < 1 || kv_budget_mib < 1) {
    std::fprintf(stderr, "bench_model: need --decode-tokens >= 1, --warmup-tokens >= 0, "
                         "--reps >= 1, --kv-budget-mib >= 1\n");
    return 2;
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
  std::printf("%d repetitions of: prefill, %d untimed decode steps, %d timed ones (medians)\n\n",
              reps, warmup_tokens, decode_tokens);
  std::printf("| mode | model load s | context | prefill tok/s | sleeps / token | decode tok/s "
              "min-max | max/min | decode tok/s |\n|---|---|---|---|---|---|---|---|\n");
  for (const std::string& mode : split(modes)) {
    engine::RuntimeOptions o;
    o.model_dir = config.empty() && layers == 0 ? model : config_dir(model, config, layers);
    o.dummy_weights = dummy;
    o.deterministic = deterministic != 0;
    o.cache_mode = mode;
    o.kv_budget_bytes = static_cast<size_t>(kv_budget_mib) << 20;
    o.folded_weights = folded_weights;
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
      if (n < 1 || n + warmup_tokens + decode_tokens > all.size()) {
        std::fprintf(stderr, "bench_model: context %zu + %d + %d tokens exceeds the text's %zu\n",
                     n, warmup_tokens, decode_tokens, all.size());
        return 2;
      }
      Times times;
      Status st;
      if (warmup_tokens > 0) st = run_once(r, all, n, warmup_tokens, 0, &times);
      std::vector<double> prefill, decode, sleeps;
      for (int rep = 0; rep < reps && st.ok(); ++rep) {
        st = run_once(r, all, n, warmup_tokens, decode_tokens, &times);
        prefill.push_back(n / times.prefill_s);
        decode.push_back(decode_tokens / times.decode_s);
        sleeps.push_back(static_cast<double>(times.decode_sleeps) / decode_tokens);
        std::fprintf(stderr,
                     "mode=%s context=%zu rep=%d prefill_tok_s=%.0f decode_tok_s=%.1f "
                     "sleeps_per_token=%.1f\n",
                     mode.c_str(), n, rep, prefill.back(), decode.back(), sleeps.back());
      }
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", mode.c_str(), st.message().c_str());
        break;
      }
      const bench::Spread d = bench::spread(decode);
      std::printf("| %s | %.3f | %zu | %.0f | %.1f | %s | %.2f | %.1f |\n", mode.c_str(), load_s, n,
                  bench::spread(prefill).median, bench::spread(sleeps).median,
                  bench::min_max(d, 1).c_str(), d.ratio(), d.median);
      std::fflush(stdout);
    }
  }
  std::printf("\nQwen3 tokenizer.json (151k vocab, 151k merges) load: %.3f s\n", qwen3_tok_s);
  return 0;
}
