// `oscar run`: prefill a prompt through the KV cache, then decode token by token, streaming the
// text to stdout as complete UTF-8.
#include <chrono>
#include <cstdio>

#include "apps/commands.h"
#include "apps/runtime_options.h"
#include "core/log.h"
#include "engine/runtime.h"
#include "kernels/sample.h"

namespace oscar::apps {

Command add_run(CLI::App& app) {
  auto rt = std::make_shared<engine::RuntimeOptions>();
  auto prompt = std::make_shared<std::string>();
  auto max_tokens = std::make_shared<int>(128);
  auto sampling = std::make_shared<kernels::SamplingConfig>();
  auto show_stats = std::make_shared<bool>(false);
  add_runtime_options(app, *rt);
  app.add_option("-p,--prompt", *prompt, "Prompt text")->required();
  app.add_option("-n,--max-tokens", *max_tokens, "Tokens to generate")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", sampling->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  app.add_option("--top-k", sampling->top_k, "Keep the k most likely tokens; 0 = all")
      ->capture_default_str();
  app.add_option("--top-p", sampling->top_p, "Nucleus sampling mass")->capture_default_str();
  app.add_option("--seed", sampling->seed, "Random seed for sampling")->capture_default_str();
  app.add_flag("--stats", *show_stats, "Print timing and cache memory to stderr at the end");

  return [=]() -> int {
    Status st = kernels::validate_sampling(*sampling);
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 2;
    }
    auto runtime = engine::Runtime::create(*rt);
    if (!runtime.ok()) {
      std::fprintf(stderr, "error: %s\n", runtime.status().message().c_str());
      return 1;
    }
    engine::Runtime& r = *runtime.value();
    const auto& tok = r.tokenizer();
    std::vector<int32_t> ids = tok.encode(*prompt);
    if (ids.empty()) {
      std::fprintf(stderr, "error: the prompt encodes to no tokens\n");
      return 2;
    }
    const int ctx = r.model().config().max_position_embeddings;
    if (static_cast<int64_t>(ids.size()) + *max_tokens > ctx) {
      std::fprintf(stderr, "error: prompt (%zu tokens) + max tokens (%d) exceed the context of %d\n",
                   ids.size(), *max_tokens, ctx);
      return 2;
    }
    auto cache = r.new_cache();
    tok::StreamDecoder decoder(tok, /*skip_special=*/true);
    const auto eos = tok.eos_token_id();
    std::vector<float> logits;

    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    st = r.model().forward_one(ids, *cache, &logits);
    auto t1 = clock::now();
    int generated = 0;
    while (st.ok() && generated < *max_tokens) {
      const int32_t next = kernels::sample_one(logits.data(), r.model().config().vocab_size,
                                               *sampling, static_cast<uint64_t>(generated));
      if (next == kernels::kSampleNonFinite) {
        st = internal_error("the model produced non-finite logits");
        break;
      }
      ++generated;
      if (eos && next == *eos) break;
      std::string text = decoder.push(next);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      if (generated == *max_tokens) break;
      st = r.model().forward_one(std::span<const int32_t>(&next, 1), *cache, &logits);
    }
    std::string tail = decoder.flush();
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fputc('\n', stdout);
    auto t2 = clock::now();
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
    if (*show_stats) {
      const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
      const double decode_s = std::chrono::duration<double>(t2 - t1).count();
      const kv::CacheBytes b = cache->bytes();
      std::fprintf(stderr,
                   "prompt_tokens=%zu generated=%d prefill_tok_s=%.1f decode_tok_s=%.1f "
                   "cache_bytes sink=%lld history=%lld recent=%lld\n",
                   ids.size(), generated, ids.size() / prefill_s,
                   generated > 1 ? (generated - 1) / decode_s : 0.0,
                   static_cast<long long>(b.sink), static_cast<long long>(b.history),
                   static_cast<long long>(b.recent));
    }
    return 0;
  };
}

}  // namespace oscar::apps
