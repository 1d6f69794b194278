// The continuous-batching scheduler on the embedded model: batched greedy output equals
// sequential decoding, stop strings and max_tokens end requests, cancellation (queued, mid-prefill,
// mid-decode) frees every page, impossible requests are refused at submit, memory follows use
// (many requests on a small pool, preemption that resumes exactly) and the waiting queue is
// bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <variant>

#include "engine/json_schema.h"
#include "engine/scheduler.h"
#include "kv/kv_events.h"
#include "schema_validator.h"

namespace oscar::engine {
namespace {

constexpr const char* kModel = "models/tiny-qwen3";

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;
  std::vector<int32_t> ids;
  std::string finish;
  Status error;
  bool done = false;
  int events = 0;
  std::vector<GenerationEvent> tokens;  // every kToken event
  int cached_tokens = 0;                // of the terminal event

  std::function<void(const GenerationEvent&)> callback() {
    return [this](const GenerationEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      ++events;
      if (e.kind == GenerationEvent::kToken) {
        text += e.text_delta;
        ids.push_back(e.token_id);
        tokens.push_back(e);
      } else {
        finish = e.finish_reason;
        cached_tokens = e.cached_tokens;
        error = e.error;
        done = true;
        cv.notify_all();
      }
    };
  }
  bool wait(int seconds = 120) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return done; });
  }
};

// A scheduler over the embedded model; `prepare` may change the runtime (fault injection) first.
// budget_kib > 0 overrides budget_mib (a model whose pages are small: the hybrid's one KV layer).
// `deterministic`: batch-invariant kernels (RuntimeOptions::deterministic).
std::unique_ptr<Scheduler> make_scheduler_with(const std::string& mode, const SchedulerOptions& so,
                                               const std::function<void(Runtime&)>& prepare = {},
                                               size_t budget_mib = 64,
                                               const std::string& model = kModel,
                                               size_t budget_kib = 0, bool deterministic = false) {
  RuntimeOptions o;
  o.model_dir = model;
  o.cache_mode = mode;
  o.kv_budget_bytes = budget_kib > 0 ? budget_kib << 10 : budget_mib << 20;
  o.deterministic = deterministic;
  auto rt = Runtime::create(o);
  EXPECT_TRUE(rt.ok()) << rt.status().to_string();
  if (prepare) prepare(*rt.value());
  auto s = Scheduler::create(std::move(rt).value(), so);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(s).value();
}

std::unique_ptr<Scheduler> make_scheduler(const std::string& mode, size_t budget_mib = 64,
                                          int prefill_chunk = 256, bool prefix_cache = false) {
  SchedulerOptions so;
  so.prefill_chunk = prefill_chunk;
  so.prefix_cache = prefix_cache;
  return make_scheduler_with(mode, so, {}, budget_mib);
}

// `text` tokenized and repeated until the prompt holds at least n tokens.
std::vector<int32_t> repeated(const Scheduler& s, const std::string& text, size_t n) {
  std::vector<int32_t> ids;
  while (ids.size() < n) {
    auto more = s.tokenize(text).value();
    ids.insert(ids.end(), more.begin(), more.end());
  }
  return ids;
}

GenerationRequest greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.config.temperature = 0;
  return r;
}

int64_t used_pages(const Scheduler& s) {
  int64_t n = 0;
  for (const auto& p : s.metrics().kv_pools) n += p.pages_used;
  return n;
}

void wait_idle(const Scheduler& s) {
  for (int i = 0; i < 200 && (used_pages(s) != 0 || s.metrics().requests_running != 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

TEST(Scheduler, BatchedGreedyEqualsSequential) {
  auto sched = make_scheduler("int2-hadamard");
  auto prompt_a = sched->tokenize("def fibonacci(n):\n").value();
  auto prompt_b = sched->tokenize("import numpy as np\n\nclass Model:\n").value();
  // A prompt long enough to have INT2 history, prefilled in several chunks.
  std::vector<int32_t> prompt_c;
  while (prompt_c.size() < 700) {
    auto more = sched->tokenize("def add(a, b):\n    return a + b\n\n").value();
    prompt_c.insert(prompt_c.end(), more.begin(), more.end());
  }
  std::vector<std::vector<int32_t>> prompts = {prompt_a, prompt_b, prompt_c};

  // Sequentially, one at a time.
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Collector c;
    ASSERT_TRUE(sched->submit(greedy("seq" + std::to_string(i), prompts[i], 24), c.callback()).ok());
    ASSERT_TRUE(c.wait());
    EXPECT_EQ(c.finish, "length");
    alone.push_back(c.ids);
  }
  // All together: continuous batching must not change any greedy output.
  std::vector<Collector> cs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    ASSERT_TRUE(sched->submit(greedy("bat" + std::to_string(i), prompts[i], 24), cs[i].callback()).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(cs[i].wait());
    EXPECT_EQ(cs[i].ids, alone[i]) << "prompt " << i;
  }
  wait_idle(*sched);
  EXPECT_EQ(used_pages(*sched), 0);
  // Idle: nothing is stored, so 0 bits per element (not the last request's value, not 0/0).
  EXPECT_EQ(sched->metrics().kv_effective_bits_per_element, 0.0);
}

TEST(Scheduler, StopStringEndsAndIsNotEmitted) {
  auto sched = make_scheduler("bf16");
  auto prompt = sched->tokenize("def fibonacci(n):\n").value();
  Collector full;
  ASSERT_TRUE(sched->submit(greedy("a", prompt, 32), full.callback()).ok());
  ASSERT_TRUE(full.wait());
  ASSERT_NE(full.text.find("Returns"), std::string::npos) << full.text;
  GenerationRequest r = greedy("b", prompt, 32);
  r.stop = {"Returns"};
  Collector c;
  ASSERT_TRUE(sched->submit(r, c.callback()).ok());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.finish, "stop");
  EXPECT_EQ(c.text, full.text.substr(0, full.text.find("Returns")));
}

TEST(Scheduler, CancellationFreesEveryPage) {
  // A tiny prefill chunk keeps the long request in its prefill for many steps.
  auto sched = make_scheduler("int2-naive", 64, 16);
  std::vector<int32_t> long_prompt;
  while (long_prompt.size() < 2000) {
    auto more = sched->tokenize("x = [i * i for i in range(10)]\n").value();
    long_prompt.insert(long_prompt.end(), more.begin(), more.end());
  }
  Collector mid_prefill, mid_decode;
  ASSERT_TRUE(sched->submit(greedy("p", long_prompt, 8), mid_prefill.callback()).ok());
  auto short_prompt = sched->tokenize("def f(x):\n").value();
  ASSERT_TRUE(sched->submit(greedy("d", short_prompt, 20000), mid_decode.callback()).ok());
  // Wait until the short request decodes (the long one is then still in its 125-step prefill).
  for (int i = 0; i < 3000; ++i) {
    {
      std::lock_guard<std::mutex> lock(mid_decode.mu);
      if (mid_decode.ids.size() >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(used_pages(*sched), 0);
  EXPECT_TRUE(mid_prefill.ids.empty());
  sched->cancel("p");
  sched->cancel("d");
  ASSERT_TRUE(mid_prefill.wait());
  ASSERT_TRUE(mid_decode.wait());
  EXPECT_EQ(mid_prefill.finish, "cancelled");
  EXPECT_EQ(mid_decode.finish, "cancelled");
  wait_idle(*sched);
  EXPECT_EQ(used_pages(*sched), 0);
  // Still serving afterwards.
  Collector after;
  ASSERT_TRUE(sched->submit(greedy("after", short_prompt, 4), after.callback()).ok());
  ASSERT_TRUE(after.wait());
  EXPECT_EQ(after.finish, "length");
}

std::vector<int32_t> code_prompt(const Scheduler& s, size_t n_tokens, const std::string& line) {
  std::vector<int32_t> p;
  while (p.size() < n_tokens) {
    auto more = s.tokenize(line).value();
    p.insert(p.end(), more.begin(), more.end());
  }
  p.resize(n_tokens);
  return p;
}

// A second request with the same long prefix adopts the cached sinks and history; with a BF16
// cache the result is the same as without the prefix cache. A finished request's generated tokens
// are cached too (multi-turn).
TEST(Scheduler, PrefixCacheReusesSharedPrefix) {
  for (const char* mode : {"bf16", "int2-hadamard"}) {
    auto cached = make_scheduler(mode, 64, 256, /*prefix_cache=*/true);
    auto plain = make_scheduler(mode, 64, 256, /*prefix_cache=*/false);
    const std::vector<int32_t> system = code_prompt(*cached, 900, "def add(a, b):\n    return a + b\n");
    auto with_question = [&](const std::string& q) {
      auto p = system;
      auto more = cached->tokenize(q).value();
      p.insert(p.end(), more.begin(), more.end());
      return p;
    };
    Collector first;
    ASSERT_TRUE(cached->submit(greedy("a", with_question("# one\n"), 8), first.callback()).ok());
    ASSERT_TRUE(first.wait());
    Collector second, reference;
    const auto prompt = with_question("# two\n");
    ASSERT_TRUE(cached->submit(greedy("b", prompt, 8), second.callback()).ok());
    ASSERT_TRUE(plain->submit(greedy("b", prompt, 8), reference.callback()).ok());
    ASSERT_TRUE(second.wait());
    ASSERT_TRUE(reference.wait());
    EXPECT_GT(cached->metrics().prefix_cache_hit_rate, 0.2) << mode;
    if (std::string(mode) == "bf16") {
      EXPECT_EQ(second.ids, reference.ids);
    }

    // Multi-turn: the next turn's prompt extends the previous prompt and its answer.
    auto turn2 = prompt;
    turn2.insert(turn2.end(), second.ids.begin(), second.ids.end());
    auto more = cached->tokenize("\n# three\n").value();
    turn2.insert(turn2.end(), more.begin(), more.end());
    Collector third;
    ASSERT_TRUE(cached->submit(greedy("c", turn2, 4), third.callback()).ok());
    ASSERT_TRUE(third.wait());
    EXPECT_EQ(third.finish, "length");
  }
}

// The 2-bit cache reuses the full recent-window (BF16) pages of a cached prompt, not only its
// sinks and history: a request over a 896-token shared prefix computes only its own 10 tokens,
// and gives the tokens it gives cold with the same chunking (one chunk of 896, then the rest):
// it holds what a cold sequence of 896 tokens holds (history [64, 640), recent [640, 896)), and
// its decode demotes the shared recent pages into INT2 pages of its own (copy-on-demote: the
// cached pages stay intact for the next request, which gives the same tokens again). Afterwards
// only the prefix cache holds pages.
TEST(Scheduler, SharedRecentPagesGiveTheColdResult) {
  SchedulerOptions so;
  so.prefill_chunk = 896;
  so.prefix_cache = true;
  auto cached = make_scheduler_with("int2-hadamard", so);
  so.prefix_cache = false;
  auto plain = make_scheduler_with("int2-hadamard", so);
  const std::vector<int32_t> system =
      code_prompt(*cached, 896, "def add(a, b):\n    return a + b\n");
  auto with_question = [&](const std::string& q) {
    auto p = system;
    auto more = code_prompt(*cached, 10, q);
    p.insert(p.end(), more.begin(), more.end());
    return p;
  };
  Collector first;
  ASSERT_TRUE(cached->submit(greedy("a", with_question("# one\n"), 1), first.callback()).ok());
  ASSERT_TRUE(first.wait());
  auto request = greedy("b", with_question("# two\n"), 48);  // 3 shared pages demoted
  request.ignore_eos = true;
  Collector reference;
  ASSERT_TRUE(plain->submit(request, reference.callback()).ok());
  ASSERT_TRUE(reference.wait());
  for (int run = 0; run < 2; ++run) {
    const uint64_t prompt_before = cached->metrics().prompt_tokens_total;
    Collector served;
    request.request_id = "b" + std::to_string(run);
    ASSERT_TRUE(cached->submit(request, served.callback()).ok());
    ASSERT_TRUE(served.wait());
    EXPECT_EQ(served.cached_tokens, 896) << run;
    EXPECT_EQ(cached->metrics().prompt_tokens_total - prompt_before, 10u) << run;
    EXPECT_EQ(served.ids, reference.ids) << run;
  }
  // Every used page is a page the prefix cache holds (nothing leaked by the sequences).
  for (int i = 0; i < 100 && used_pages(*cached) != cached->metrics().prefix_cache_pages; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(used_pages(*cached), cached->metrics().prefix_cache_pages);
}

// logprobs: each token carries its log-probability and the top alternatives, the log-softmax of
// the raw logits: the greedy token is the first alternative, a sampled request (temperature 1.5)
// reports the same alternatives for its first token (temperature is not applied), and asking
// changes no token.
TEST(Scheduler, LogprobsAreTheRawLogSoftmax) {
  SchedulerOptions so;
  so.prefill_chunk = 256;
  so.prefix_cache = false;
  auto sched = make_scheduler_with("bf16", so, {}, 64, kModel, 0, /*deterministic=*/true);
  const auto prompt = sched->tokenize("def fibonacci(n):\n").value();
  Collector plain, with_lp, hot;
  ASSERT_TRUE(sched->submit(greedy("plain", prompt, 12), plain.callback()).ok());
  GenerationRequest r = greedy("lp", prompt, 12);
  r.logprobs = 5;
  ASSERT_TRUE(sched->submit(r, with_lp.callback()).ok());
  GenerationRequest h = r;
  h.request_id = "hot";
  h.sampling.config.temperature = 1.5f;
  h.sampling.has_seed = true;
  h.sampling.config.seed = 3;
  ASSERT_TRUE(sched->submit(h, hot.callback()).ok());
  ASSERT_TRUE(plain.wait() && with_lp.wait() && hot.wait());
  EXPECT_EQ(with_lp.ids, plain.ids);
  ASSERT_EQ(with_lp.tokens.size(), 12u);
  std::string bytes;
  for (const GenerationEvent& e : with_lp.tokens) {
    ASSERT_TRUE(e.has_logprobs);
    EXPECT_EQ(e.chosen.token_id, e.token_id);
    ASSERT_EQ(e.top_logprobs.size(), 5u);
    EXPECT_EQ(e.top_logprobs[0].token_id, e.token_id);  // greedy: the most likely token
    EXPECT_FLOAT_EQ(e.top_logprobs[0].logprob, e.chosen.logprob);
    double mass = 0;
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_LE(e.top_logprobs[k].logprob, 0.f);
      if (k > 0) {
        EXPECT_LE(e.top_logprobs[k].logprob, e.top_logprobs[k - 1].logprob);
      }
      mass += std::exp(e.top_logprobs[k].logprob);
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
    bytes += e.chosen.bytes;
  }
  EXPECT_EQ(bytes, with_lp.text);
  ASSERT_FALSE(hot.tokens.empty());
  ASSERT_TRUE(hot.tokens[0].has_logprobs);
  // The same prompt's first logprobs, whatever ran beside it, bit for bit: the two requests may
  // share a prefill step or not, and the batch-invariant kernels make each row's sums independent
  // of the other rows (issue #24 item 2; without them: -0.39944634 vs -0.39944708 once).
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(hot.tokens[0].top_logprobs[k].token_id, with_lp.tokens[0].top_logprobs[k].token_id);
    EXPECT_EQ(hot.tokens[0].top_logprobs[k].logprob, with_lp.tokens[0].top_logprobs[k].logprob);
  }
  EXPECT_TRUE(plain.tokens[0].top_logprobs.empty());
  EXPECT_FALSE(plain.tokens[0].has_logprobs);
  GenerationRequest bad = greedy("bad", prompt, 4);
  bad.logprobs = 21;
  Collector unused;
  EXPECT_EQ(sched->submit(bad, unused.callback()).code(), StatusCode::kInvalidArgument);
}

// Batch invariance (README "Deterministic results"): with the batch-invariant kernels, a greedy
// request and a seeded sampled one (top-p, both with logprobs) give bit-identical tokens and
// logprobs alone and beside requests of other lengths. A step holds at most 48 tokens, so the
// targets' prompts are cut into different chunks in the two runs, and they decode in steps of
// 2 to 7 rows (past the 8 rows where the default linear() changes kernel, once the neighbours'
// prefill chunks join). Modes: bf16 (150-token prompts), and int2-hadamard with 400-token prompts
// (past the 256-token recent window: part of the prompt is read from INT2 history) and the prefix
// cache on (the busy run adopts the prompt pages the solo run left: with the history exactly where
// a cold prefill holds it, kv::choose_prefix_forms' exact_history; the default choice, with INT2
// pages past it, changed the first logprob by 2e-2 at 400 tokens).
TEST(Scheduler, DeterministicWhateverRunsBeside) {
  for (const std::string mode : {"bf16", "int2-hadamard"}) {
    SCOPED_TRACE(mode);
    const bool quantized = mode != "bf16";
    SchedulerOptions so;
    so.max_batch_tokens = 48;
    so.prefill_chunk = 40;
    so.prefix_cache = quantized;
    auto sched = make_scheduler_with(mode, so, {}, 64, kModel, 0, /*deterministic=*/true);
    const size_t n_prompt = quantized ? 400 : 150;
    auto prompt = repeated(*sched, "def fibonacci(n):\n    return n if n < 2 else fib(n - 1)\n",
                           n_prompt);
    prompt.resize(n_prompt);
    GenerationRequest g = greedy("greedy", prompt, 16);
    g.logprobs = 3;
    GenerationRequest t = g;
    t.request_id = "seeded";
    t.sampling.config.temperature = 0.9f;
    t.sampling.config.top_p = 0.95f;
    t.sampling.has_seed = true;
    t.sampling.config.seed = 11;
    // Ids differ between the runs: a finished request's id may still be registered a moment.
    auto run = [&](const std::vector<GenerationRequest>& others, Collector& cg, Collector& ct) {
      g.request_id += "+";
      t.request_id += "+";
      std::vector<std::unique_ptr<Collector>> side;
      std::vector<Status> submitted;
      for (const GenerationRequest& o : others) {
        side.push_back(std::make_unique<Collector>());
        submitted.push_back(sched->submit(o, side.back()->callback()));
      }
      submitted.push_back(sched->submit(g, cg.callback()));
      submitted.push_back(sched->submit(t, ct.callback()));
      for (const Status& st : submitted) EXPECT_TRUE(st.ok()) << st.to_string();
      EXPECT_TRUE(cg.wait() && ct.wait());
      for (size_t i = 0; i < side.size(); ++i) {
        if (submitted[i].ok()) {
          EXPECT_TRUE(side[i]->wait());
        }
      }
    };
    Collector g_alone, t_alone, g_busy, t_busy;
    run({}, g_alone, t_alone);
    std::vector<GenerationRequest> others;
    for (int n : {7, 33, 90, 200, 61}) {
      GenerationRequest o = greedy("side" + std::to_string(n),
                                   repeated(*sched, "import numpy as np\n", n), 5 + n % 17);
      o.sampling.config.temperature = n % 2 ? 0.7f : 0.f;
      others.push_back(o);
    }
    run(others, g_busy, t_busy);
    for (auto [alone, busy] : {std::pair{&g_alone, &g_busy}, std::pair{&t_alone, &t_busy}}) {
      ASSERT_EQ(alone->ids, busy->ids);
      ASSERT_EQ(alone->tokens.size(), busy->tokens.size());
      for (size_t i = 0; i < alone->tokens.size(); ++i) {
        const GenerationEvent &a = alone->tokens[i], &b = busy->tokens[i];
        ASSERT_TRUE(a.has_logprobs && b.has_logprobs);
        EXPECT_EQ(a.chosen.logprob, b.chosen.logprob) << "token " << i;
        ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
        for (size_t k = 0; k < a.top_logprobs.size(); ++k) {
          EXPECT_EQ(a.top_logprobs[k].token_id, b.top_logprobs[k].token_id);
          EXPECT_EQ(a.top_logprobs[k].logprob, b.top_logprobs[k].logprob) << "token " << i;
        }
      }
    }
  }
}

// Penalties act on the logits before greedy: with presence p and frequency f, every greedy token
// maximises raw logprob - f * count - p * (count > 0) over the output so far (checked against the
// top 20 raw alternatives); the repetition penalty changes the greedy output; bad values are
// refused at submit.
TEST(Scheduler, PenaltiesApplyBeforeGreedy) {
  auto sched = make_scheduler("bf16");
  const auto prompt = sched->tokenize("def fibonacci(n):\n").value();
  Collector plain, pen, rep;
  ASSERT_TRUE(sched->submit(greedy("plain", prompt, 24), plain.callback()).ok());
  GenerationRequest r = greedy("pen", prompt, 24);
  r.logprobs = 20;
  r.sampling.presence_penalty = 1.f;
  r.sampling.frequency_penalty = 2.f;
  ASSERT_TRUE(sched->submit(r, pen.callback()).ok());
  GenerationRequest q = greedy("rep", prompt, 24);
  q.sampling.repetition_penalty = 2.f;
  ASSERT_TRUE(sched->submit(q, rep.callback()).ok());
  ASSERT_TRUE(plain.wait() && pen.wait() && rep.wait());
  EXPECT_NE(pen.ids, plain.ids);
  EXPECT_NE(rep.ids, plain.ids);
  std::map<int32_t, int> counts;
  for (const GenerationEvent& e : pen.tokens) {
    if (!e.has_logprobs) continue;  // the end-of-sequence token
    auto score = [&](int32_t id, float lp) {
      const int c = counts.count(id) ? counts[id] : 0;
      return lp - 2.f * c - 1.f * (c > 0);
    };
    const float chosen = score(e.token_id, e.chosen.logprob);
    for (const TokenLogprob& a : e.top_logprobs)
      EXPECT_LE(score(a.token_id, a.logprob), chosen + 1e-4f)
          << "token " << a.token_id << " beats the drawn " << e.token_id;
    counts[e.token_id] += 1;
  }
  for (auto [p, f, rp] : {std::tuple{2.5f, 0.f, 1.f},
                          {0.f, -2.1f, 1.f},
                          {0.f, 0.f, 0.f},
                          {0.f, 0.f, -1.f},
                          {0.f, 0.f, std::nanf("")}}) {
    GenerationRequest bad = greedy("bad", prompt, 4);
    bad.sampling.presence_penalty = p;
    bad.sampling.frequency_penalty = f;
    bad.sampling.repetition_penalty = rp;
    Collector unused;
    EXPECT_EQ(sched->submit(bad, unused.callback()).code(), StatusCode::kInvalidArgument)
        << p << " " << f << " " << rp;
  }
}

// n > 1: the second choice names the first in share_prompt_with, waits for its prefill and
// adopts its prompt pages from the prefix cache: every full page of the prompt (BF16) is stored
// once, not twice; greedy choices are equal; seeded choices with seeds s and s + 1 are the
// requests run alone with those seeds.
TEST(Scheduler, NChoicesSharePromptPages) {
  auto sched = make_scheduler("bf16", 64, 256, /*prefix_cache=*/true);
  const int64_t page = 16;
  const std::vector<int32_t> prompt =
      code_prompt(*sched, 170, "def add(a, b):\n    return a + b\n");
  const int64_t prompt_pages = (static_cast<int64_t>(prompt.size()) + page - 1) / page;  // 11
  Collector a, b;
  GenerationRequest ra = greedy("n-0", prompt, 24);
  GenerationRequest rb = greedy("n-1", prompt, 24);
  rb.share_prompt_with = "n-0";
  ASSERT_TRUE(sched->submit(ra, a.callback()).ok());
  ASSERT_TRUE(sched->submit(rb, b.callback()).ok());
  int64_t peak = 0;
  for (int i = 0; i < 6000; ++i) {
    peak = std::max(peak, used_pages(*sched));
    {
      std::lock_guard<std::mutex> la(a.mu), lb(b.mu);
      if (a.done && b.done) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(a.wait() && b.wait());
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.cached_tokens, 0);
  EXPECT_EQ(b.cached_tokens, (static_cast<int64_t>(prompt.size()) - 1) / page * page);  // 160
  // Shared: the prompt's pages once, plus each choice's own last page and 24 generated tokens.
  const int64_t own = 1 + (24 + page - 1) / page;
  EXPECT_GE(peak, prompt_pages);
  EXPECT_LE(peak, prompt_pages + 2 * own) << "duplicated would be " << 2 * (prompt_pages + own - 1);

  // Seeded: choice i uses seed + i (the server's rule); each equals the request run alone.
  auto sampled = [&](const std::string& id, uint64_t seed, const std::string& share) {
    GenerationRequest r = greedy(id, prompt, 12);
    r.sampling.config.temperature = 2.0f;
    r.sampling.has_seed = true;
    r.sampling.config.seed = seed;
    r.share_prompt_with = share;
    return r;
  };
  Collector s0, s1, alone0, alone1;
  ASSERT_TRUE(sched->submit(sampled("s-0", 7, ""), s0.callback()).ok());
  ASSERT_TRUE(sched->submit(sampled("s-1", 8, "s-0"), s1.callback()).ok());
  ASSERT_TRUE(s0.wait() && s1.wait());
  ASSERT_TRUE(sched->submit(sampled("alone-0", 7, ""), alone0.callback()).ok());
  ASSERT_TRUE(alone0.wait());
  ASSERT_TRUE(sched->submit(sampled("alone-1", 8, ""), alone1.callback()).ok());
  ASSERT_TRUE(alone1.wait());
  EXPECT_EQ(s0.ids, alone0.ids);
  EXPECT_EQ(s1.ids, alone1.ids);
  EXPECT_NE(s0.ids, s1.ids);
}

// tool_call_names: the embedded model (which knows nothing of tools) is made to write one valid
// call to one of the names, greedy and sampled, within max_tokens (it never closes its arguments
// by itself: the budget rule closes them), and the request ends with "stop" right after it.
TEST(Scheduler, ConstrainedToolCallIsValid) {
  auto sched = make_scheduler("bf16");
  const auto prompt = sched->tokenize("def fibonacci(n):\n").value();
  struct Case {
    std::vector<std::string> names;
    float temperature;
  };
  const Case cases[] = {{{"get_weather", "get_time"}, 0.f},
                        {{"get_weather", "get_time"}, 1.5f},
                        {{"get_time"}, 0.f},
                        {{"get_time"}, 2.f}};
  int i = 0;
  for (const Case& c : cases) {
    GenerationRequest r = greedy("tool" + std::to_string(i), prompt, 80);
    r.sampling.config.temperature = c.temperature;
    r.sampling.has_seed = true;
    r.sampling.config.seed = static_cast<uint64_t>(i++);
    r.tool_call_names = c.names;
    Collector col;
    ASSERT_TRUE(sched->submit(r, col.callback()).ok());
    ASSERT_TRUE(col.wait());
    EXPECT_EQ(col.finish, "stop") << col.text;
    const std::string open = "<tool_call>\n", close = "}\n</tool_call>";
    ASSERT_EQ(col.text.rfind(open, 0), 0u) << col.text;
    ASSERT_GE(col.text.size(), open.size() + close.size()) << col.text;
    ASSERT_EQ(col.text.substr(col.text.size() - close.size()), close) << col.text;
    const std::string body =
        col.text.substr(open.size(), col.text.size() - open.size() - close.size() + 1);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(body)) << body;
    ASSERT_TRUE(j["name"].is_string()) << body;
    EXPECT_NE(std::find(c.names.begin(), c.names.end(), j["name"].get<std::string>()),
              c.names.end())
        << body;
    EXPECT_TRUE(j["arguments"].is_object()) << body;
  }
  GenerationRequest bad = greedy("bad", prompt, 4);
  bad.tool_call_names = {""};
  Collector unused;
  EXPECT_EQ(sched->submit(bad, unused.callback()).code(), StatusCode::kInvalidArgument);
}

// json_object (response_format json_object): the output is one JSON object, greedy and sampled,
// closed within max_tokens by the budget rule, and the request ends with "stop" right after it.
TEST(Scheduler, JsonObjectOutputIsOneObject) {
  auto sched = make_scheduler("oscar");
  const auto prompt = sched->tokenize("Answer in JSON: the capital of France").value();
  int i = 0;
  for (float temperature : {0.f, 1.f, 2.f}) {
    for (int max_tokens : {3, 24, 80}) {
      GenerationRequest r = greedy("json" + std::to_string(i), prompt, max_tokens);
      r.sampling.config.temperature = temperature;
      r.sampling.has_seed = true;
      r.sampling.config.seed = static_cast<uint64_t>(i++);
      r.json_object = true;
      Collector col;
      ASSERT_TRUE(sched->submit(r, col.callback()).ok());
      ASSERT_TRUE(col.wait());
      SCOPED_TRACE(col.text);
      nlohmann::json j;
      if (col.finish == "length") {  // the budget was too small for even `{}` plus a key
        EXPECT_LE(max_tokens, 3);
        continue;
      }
      EXPECT_EQ(col.finish, "stop");
      ASSERT_NO_THROW(j = nlohmann::json::parse(col.text));
      EXPECT_TRUE(j.is_object());
    }
  }
  GenerationRequest both = greedy("both", prompt, 8);
  both.json_object = true;
  both.tool_call_names = {"f"};
  Collector unused;
  EXPECT_EQ(sched->submit(both, unused.callback()).code(), StatusCode::kInvalidArgument);
}

// json_schema (response_format json_schema): the tiny model's output, greedy and sampled,
// parses and validates (tests/engine/schema_validator.h), closing within max_tokens, for OpenAI's
// math reasoning schema and a schema with numbers, enums and optional fields.
TEST(Scheduler, JsonSchemaOutputValidates) {
  auto sched = make_scheduler("oscar");
  const auto prompt = sched->tokenize("Answer in JSON: the capital of France").value();
  const char* schemas[] = {
      R"({"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},"required":["explanation","output"],"additionalProperties":false}},"final_answer":{"type":"string"}},"required":["steps","final_answer"],"additionalProperties":false})",
      R"({"type":"object","properties":{"city":{"type":"string","maxLength":30},"population":{"type":"integer","minimum":0},"area":{"type":"number","minimum":0,"maximum":1000},"kind":{"enum":["capital","town"]},"rivers":{"type":"array","items":{"type":"string"},"maxItems":2}},"required":["city","population","kind"]})",
  };
  int i = 0;
  for (const char* text : schemas) {
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text);
    auto compiled = JsonSchema::compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().to_string();
    for (float temperature : {0.f, 1.f}) {
      for (int max_tokens : {40, 120}) {
        GenerationRequest r = greedy("schema" + std::to_string(i), prompt, max_tokens);
        r.sampling.config.temperature = temperature;
        r.sampling.has_seed = true;
        r.sampling.config.seed = static_cast<uint64_t>(i++);
        r.json_schema = compiled.value();
        Collector col;
        ASSERT_TRUE(sched->submit(r, col.callback()).ok());
        ASSERT_TRUE(col.wait());
        SCOPED_TRACE(col.text);
        EXPECT_EQ(col.finish, "stop");
        nlohmann::ordered_json j;
        ASSERT_NO_THROW(j = nlohmann::ordered_json::parse(col.text));
        std::string why;
        EXPECT_TRUE(test::validate(j, schema, schema, &why)) << why;
      }
    }
  }
  GenerationRequest both = greedy("both", prompt, 8);
  both.json_schema = JsonSchema::compile(nlohmann::ordered_json::parse("{}")).value();
  both.json_object = true;
  Collector unused;
  EXPECT_EQ(sched->submit(both, unused.callback()).code(), StatusCode::kInvalidArgument);
}

// A strict tool: the forced call's arguments follow the tool's parameters.
TEST(Scheduler, StrictToolCallArgumentsValidate) {
  auto sched = make_scheduler("oscar");
  const auto prompt = sched->tokenize("What is the weather in Paris?").value();
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"city":{"type":"string","minLength":1,"maxLength":20},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false})");
  for (float temperature : {0.f, 1.f}) {
    GenerationRequest r = greedy(temperature == 0.f ? "strict0" : "strict1", prompt, 60);
    r.sampling.config.temperature = temperature;
    r.sampling.has_seed = true;
    r.tool_call_names = {"get_weather"};
    r.tool_call_schemas = {JsonSchema::compile(schema).value()};
    Collector col;
    ASSERT_TRUE(sched->submit(r, col.callback()).ok());
    ASSERT_TRUE(col.wait());
    SCOPED_TRACE(col.text);
    EXPECT_EQ(col.finish, "stop");
    const std::string open = "<tool_call>\n", close = "\n</tool_call>";
    ASSERT_EQ(col.text.rfind(open, 0), 0u);
    ASSERT_GT(col.text.size(), open.size() + close.size());
    nlohmann::ordered_json j;
    ASSERT_NO_THROW(j = nlohmann::ordered_json::parse(col.text.substr(
                        open.size(), col.text.size() - open.size() - close.size())));
    std::string why;
    EXPECT_TRUE(test::validate(j["arguments"], schema, schema, &why)) << why;
  }
}

TEST(Scheduler, RefusesImpossibleRequests) {
  // 1 MiB of BF16 pages = 8 pages = 128 tokens: max_model_len defaults to that.
  auto sched = make_scheduler("bf16", 1);
  EXPECT_EQ(sched->info().max_context_tokens, 128);
  auto prompt = sched->tokenize("hello").value();
  Collector c;
  Status st = sched->submit(greedy("big", prompt, 30000), c.callback());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("maximum context length of 128"), std::string::npos) << st.message();
  // An explicit max_model_len beyond the pools: the request is refused naming the pages.
  SchedulerOptions so;
  so.max_model_len = 1024;
  auto wide = make_scheduler_with("bf16", so, {}, 1);
  EXPECT_EQ(wide->info().max_context_tokens, 1024);
  st = wide->submit(greedy("pages", prompt, 500), c.callback());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("need 32 bf16 and 0 int2 KV pages"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("hold 8 and 0 pages"), std::string::npos) << st.message();
  st = sched->submit(greedy("ctx", prompt, 40000), c.callback());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  st = sched->submit(greedy("range", {9000}, 4), c.callback());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(c.events, 0);
}

// A failure inside a step that belongs to one request fails that request alone: a token whose
// embedding is NaN (Qwen3Model::set_embedding_row) makes its request's K/V non-finite. In the
// middle of a long prompt, the page holding it cannot be demoted (the history refuses it); at the
// end of a short prompt, the logits are non-finite. Both requests get an error naming the cause,
// every page comes back, and a request running beside them keeps its greedy output.
TEST(Scheduler, NonFiniteKvFailsOnlyItsRequest) {
  int32_t poison = 0;
  SchedulerOptions so;
  so.prefill_chunk = 256;
  so.prefix_cache = false;
  auto made = make_scheduler_with("int2-hadamard", so, [&](Runtime& rt) {
    const auto& c = rt.model().config();
    poison = c.vocab_size - 3;
    EXPECT_TRUE(rt.model()
                    .set_embedding_row(poison, std::vector<float>(c.hidden_size, std::nanf("")))
                    .ok());
  });
  Scheduler& sched = *made;
  const std::vector<int32_t> good = repeated(sched, "def add(a, b):\n    return a + b\n\n", 700);
  ASSERT_EQ(std::count(good.begin(), good.end(), poison), 0);
  Collector alone;
  ASSERT_TRUE(sched.submit(greedy("alone", good, 40), alone.callback()).ok());
  ASSERT_TRUE(alone.wait());
  ASSERT_EQ(alone.finish, "length");

  std::vector<int32_t> bad_long = good;  // poisoned at 100: demoted in the second prefill chunk
  bad_long[100] = poison;
  std::vector<int32_t> bad_short(good.begin(), good.begin() + 20);
  bad_short.back() = poison;  // its logits are the first non-finite thing
  Collector c_good, c_long, c_short;
  ASSERT_TRUE(sched.submit(greedy("good", good, 40), c_good.callback()).ok());
  ASSERT_TRUE(sched.submit(greedy("long", bad_long, 40), c_long.callback()).ok());
  ASSERT_TRUE(sched.submit(greedy("short", bad_short, 40), c_short.callback()).ok());
  ASSERT_TRUE(c_good.wait() && c_long.wait() && c_short.wait());
  EXPECT_EQ(c_good.finish, "length");
  EXPECT_EQ(c_good.ids, alone.ids);
  EXPECT_FALSE(c_long.error.ok());
  EXPECT_NE(c_long.error.to_string().find("non-finite"), std::string::npos)
      << c_long.error.to_string();
  EXPECT_NE(c_long.error.to_string().find("history"), std::string::npos)
      << c_long.error.to_string();
  EXPECT_TRUE(c_long.ids.empty());
  EXPECT_FALSE(c_short.error.ok());
  EXPECT_NE(c_short.error.to_string().find("non-finite logits"), std::string::npos)
      << c_short.error.to_string();
  wait_idle(sched);
  EXPECT_EQ(used_pages(sched), 0);
  // The engine goes on serving.
  Collector after;
  ASSERT_TRUE(sched.submit(greedy("after", good, 40), after.callback()).ok());
  ASSERT_TRUE(after.wait());
  EXPECT_EQ(after.ids, alone.ids);
}

// KV-cache events through the real scheduler: a sink that rebuilds the block set from every
// batch (kv::KvBlockMirror refuses any event out of order) ends up holding exactly as many
// blocks as the prefix cache holds chunks (a chunk cached as a BF16 and an INT2 page is one
// block), after shared prefixes, a divergence and a cancellation in the middle of a prefill; the
// first batch starts with AllBlocksCleared.
TEST(Scheduler, KvEventsFollowThePrefixCache) {
  struct MirrorSink final : kv::KvEventSink {
    std::mutex mu;
    kv::KvBlockMirror mirror;
    Status status;
    int batches = 0;
    bool first_cleared = false;
    void publish(std::vector<kv::KvEvent> events) override {
      std::lock_guard<std::mutex> lock(mu);
      if (batches++ == 0) first_cleared = std::holds_alternative<kv::AllBlocksCleared>(events[0]);
      if (status.ok()) status = mirror.apply_all(events);
    }
  } sink;
  SchedulerOptions so;
  so.prefill_chunk = 64;
  so.kv_event_sink = &sink;
  auto made = make_scheduler_with("int2-hadamard", so);
  Scheduler& sched = *made;
  const std::vector<int32_t> shared =
      repeated(sched, "def add(a, b):\n    return a + b\n\n", 600);
  std::vector<int32_t> other = shared;
  other[400] = (other[400] + 1) % 8000;  // diverges inside the history
  std::vector<int32_t> longer = shared;
  longer.insert(longer.end(), shared.begin(), shared.end());
  int n = 0;
  for (auto prompt : {shared, other, shared}) {
    Collector c;
    ASSERT_TRUE(sched.submit(greedy("r" + std::to_string(n++), prompt, 8), c.callback()).ok());
    ASSERT_TRUE(c.wait());
  }
  Collector cancelled;
  ASSERT_TRUE(sched.submit(greedy("cancel", longer, 8), cancelled.callback()).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  sched.cancel("cancel");
  ASSERT_TRUE(cancelled.wait());
  wait_idle(sched);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::lock_guard<std::mutex> lock(sink.mu);
  EXPECT_TRUE(sink.status.ok()) << sink.status.to_string();
  EXPECT_TRUE(sink.first_cleared);
  EXPECT_GT(sink.mirror.size(), 0u);
  EXPECT_EQ(static_cast<int64_t>(sink.mirror.size()), sched.metrics().prefix_cache_blocks);
  EXPECT_GT(sched.metrics().prefix_cache_pages, sched.metrics().prefix_cache_blocks);
}

// An unknown --folded-weights value is refused by name, whatever the cache mode (bf16 folds
// nothing, yet must not accept it silently).
TEST(Runtime, RefusesUnknownFoldedWeights) {
  for (const char* mode : {"bf16", "oscar"}) {
    RuntimeOptions o;
    o.model_dir = kModel;
    o.cache_mode = mode;
    o.folded_weights = "fp8";
    auto rt = Runtime::create(o);
    ASSERT_FALSE(rt.ok()) << mode;
    EXPECT_NE(rt.status().to_string().find("folded weights 'fp8'"), std::string::npos)
        << rt.status().to_string();
  }
}

// oscar3 spends 3.25 bits per element by the shipped file's statistics (a mixed plan of that
// average, the 3-/4-bit rows unclipped), and every row at 3 bits with the bit plan off.
TEST(Runtime, Oscar3IsPlannedFromTheFile) {
  for (const bool planned : {true, false}) {
    RuntimeOptions o;
    o.model_dir = kModel;
    o.cache_mode = "oscar3";
    o.bit_plan = planned;
    auto rt = Runtime::create(o);
    ASSERT_TRUE(rt.ok()) << rt.status().to_string();
    const kv::KvCacheSpec& spec = rt.value()->spec();
    ASSERT_NE(spec.bit_plan, nullptr);
    const kv::BitPlan& plan = *spec.bit_plan;
    std::set<int> widths;
    for (int l = 0; l < spec.n_layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < spec.n_heads_kv; ++h) widths.insert(plan.bits(l, kv, h));
    if (planned) {
      EXPECT_GT(widths.size(), 1u) << plan.describe();
      EXPECT_LE(plan.bits_per_element(), 3.25 + 1e-9);
      EXPECT_GT(plan.bits_per_element(), 3.25 - 0.125 - 1e-9);  // within one step of 1/8 bit
    } else {
      EXPECT_EQ(widths, std::set<int>{3});
    }
    for (size_t i = 0; i < spec.k_clip.size(); ++i) {
      const int l = static_cast<int>(i) / spec.n_heads_kv, h = static_cast<int>(i) % spec.n_heads_kv;
      if (plan.bits(l, 0, h) >= 3) {
        EXPECT_EQ(spec.k_clip[i], 1.0f) << i;
      }
      if (plan.bits(l, 1, h) >= 3) {
        EXPECT_EQ(spec.v_clip[i], 1.0f) << i;
      }
    }
  }
}

// Events without the prefix cache are a configuration error, named at creation.
TEST(Scheduler, KvEventsNeedThePrefixCache) {
  struct NullSink final : kv::KvEventSink {
    void publish(std::vector<kv::KvEvent>) override {}
  } sink;
  RuntimeOptions o;
  o.model_dir = kModel;
  o.cache_mode = "bf16";
  auto rt = Runtime::create(o);
  ASSERT_TRUE(rt.ok());
  SchedulerOptions so;
  so.prefix_cache = false;
  so.kv_event_sink = &sink;
  auto made = Scheduler::create(std::move(rt).value(), so);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().to_string().find("prefix cache"), std::string::npos);
}

}  // namespace
}  // namespace oscar::engine

namespace oscar::engine {
namespace {

// Greedy (or seeded) tokens and text of `r` run with nothing else in the scheduler.
struct Alone {
  std::vector<int32_t> ids;
  std::string text, finish;
};
Alone run_alone(Scheduler& s, GenerationRequest r) {
  static int n_alone = 0;
  r.request_id = "alone-" + r.request_id;
  r.request_id += std::to_string(n_alone++);  // an id is free only after its terminal event
  Collector c;
  Status st = s.submit(std::move(r), c.callback());
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return {};
  EXPECT_TRUE(c.wait());
  EXPECT_TRUE(c.error.ok()) << c.error.to_string();
  return Alone{c.ids, c.text, c.finish};
}

// Issue #11: 64 requests without max_tokens (the server then sends max_model_len - prompt, as
// vLLM) against a pool far smaller than their peaks: all finish with the tokens each gives alone,
// and more run at once than peak reservations would have allowed (24 pages / 3 pages each = 8).
TEST(Scheduler, MemoryFollowsUseManyRequestsSmallPool) {
  SchedulerOptions so;
  so.prefix_cache = false;
  so.max_model_len = 48;                                // 3 pages of 16 tokens at the peak
  auto sched = make_scheduler_with("bf16", so, {}, 3);  // 3 MiB = 24 BF16 pages
  const char* texts[] = {"def f(x):",        "import os",   "class A:", "for i in range(",
                         "# sum of squares", "while True:", "print(",   "return x +"};
  std::vector<GenerationRequest> kinds;
  std::vector<Alone> alone;
  for (const char* t : texts) {
    auto prompt = sched->tokenize(t).value();
    kinds.push_back(greedy("alone", prompt, 48 - static_cast<int>(prompt.size())));
    alone.push_back(run_alone(*sched, kinds.back()));
  }
  wait_idle(*sched);
  const int kN = 64;
  std::vector<std::unique_ptr<Collector>> cs;
  for (int i = 0; i < kN; ++i) {
    cs.push_back(std::make_unique<Collector>());
    GenerationRequest r = kinds[i % kinds.size()];
    r.request_id = std::to_string(i);
    ASSERT_TRUE(sched->submit(std::move(r), cs.back()->callback()).ok());
  }
  int peak_running = 0;
  for (int i = 0; i < 6000; ++i) {
    const EngineMetrics m = sched->metrics();
    peak_running = std::max(peak_running, m.requests_running);
    bool all = true;
    for (auto& c : cs) {
      std::lock_guard<std::mutex> lock(c->mu);
      all = all && c->done;
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(cs[i]->wait(5)) << "request " << i << " did not finish";
    EXPECT_TRUE(cs[i]->error.ok()) << i << ": " << cs[i]->error.to_string();
    EXPECT_EQ(cs[i]->ids, alone[i % alone.size()].ids) << "request " << i;
    EXPECT_EQ(cs[i]->text, alone[i % alone.size()].text) << "request " << i;
    EXPECT_EQ(cs[i]->finish, alone[i % alone.size()].finish) << "request " << i;
  }
  const int old_limit = 24 / 3;
  EXPECT_GT(peak_running, old_limit) << "peak running " << peak_running;
  EXPECT_LE(peak_running, 24);  // each running request holds at least one of the 24 pages
  std::printf(
      "memory follows use: peak running %d (peak reservations allowed %d), "
      "preemptions %llu\n",
      peak_running, old_limit,
      static_cast<unsigned long long>(sched->metrics().num_preemptions_total));
  wait_idle(*sched);
  EXPECT_EQ(used_pages(*sched), 0);
}

// Two long generations that cannot both fit (8 pages; each ends at 110 tokens = 7 pages): the
// later one is preempted, recomputes prompt + output, and resumes with exactly the tokens it gives
// alone (greedy and seeded sampling: the draw index is the output index), streamed once.
// expect_resume_hits: the readmissions adopt cached prefixes (prefix-cache hit tokens beyond
// what the requests' first admissions report).
void check_preemption_resumes(const std::string& mode, bool prefix_cache, size_t budget_mib,
                              int prompt_tokens, int max_tokens, const std::string& model = kModel,
                              size_t budget_kib = 0, bool expect_resume_hits = false) {
  SchedulerOptions so;
  so.prefix_cache = prefix_cache;
  auto sched = make_scheduler_with(mode, so, {}, budget_mib, model, budget_kib);
  std::vector<GenerationRequest> reqs;
  reqs.push_back(greedy("a", repeated(*sched, "def add(a, b):\n    return a + b\n", prompt_tokens),
                        max_tokens));
  reqs.push_back(greedy("b", repeated(*sched, "import numpy as np\n", prompt_tokens), max_tokens));
  reqs.push_back(reqs[1]);
  reqs[2].request_id = "c";
  reqs[2].sampling.config.temperature = 0.5f;
  reqs[2].sampling.config.top_k = 20;
  reqs[2].sampling.has_seed = true;
  reqs[2].sampling.config.seed = 1234;
  for (auto& r : reqs) r.ignore_eos = true;
  std::vector<Alone> alone;
  for (const auto& r : reqs) alone.push_back(run_alone(*sched, r));
  if (!prefix_cache) wait_idle(*sched);  // (the prefix cache keeps pages: wait_idle would time out)
  // a with b (greedy), then a with c (seeded sampling): the later one is preempted.
  for (size_t j = 1; j < reqs.size(); ++j) {
    const uint64_t preempted_before = sched->metrics().num_preemptions_total;
    const uint64_t hits_before = sched->metrics().prefix_cache_hit_tokens;
    Collector ca, cb;
    ASSERT_TRUE(sched->submit(reqs[0], ca.callback()).ok());
    ASSERT_TRUE(sched->submit(reqs[j], cb.callback()).ok());
    ASSERT_TRUE(ca.wait());
    ASSERT_TRUE(cb.wait());
    const std::pair<Collector*, size_t> runs[] = {{&ca, 0}, {&cb, j}};
    for (const auto& [c, i] : runs) {
      EXPECT_TRUE(c->error.ok()) << c->error.to_string();
      size_t first = 0;
      while (first < c->ids.size() && first < alone[i].ids.size() &&
             c->ids[first] == alone[i].ids[first])
        ++first;
      EXPECT_EQ(c->ids, alone[i].ids)
          << mode << " request " << reqs[i].request_id << ": first mismatch at output " << first;
      EXPECT_EQ(c->text, alone[i].text) << mode << " request " << i;  // one continuous stream
      EXPECT_EQ(c->events, max_tokens + 1) << mode << " request " << i;
      EXPECT_EQ(c->finish, "length");
    }
    EXPECT_GE(sched->metrics().num_preemptions_total, preempted_before + 1) << mode;
    if (expect_resume_hits) {
      const uint64_t resumed = sched->metrics().prefix_cache_hit_tokens - hits_before -
                               static_cast<uint64_t>(ca.cached_tokens + cb.cached_tokens);
      EXPECT_GT(resumed, 0u) << mode << ": no readmission adopted a cached prefix";
      std::printf("preempted and resumed: %llu tokens adopted at readmissions\n",
                  static_cast<unsigned long long>(resumed));
    }
    if (!prefix_cache) {
      wait_idle(*sched);
      EXPECT_EQ(used_pages(*sched), 0);
    }
  }
}

TEST(Scheduler, PreemptionResumesExactly) {
  check_preemption_resumes("bf16", /*prefix_cache=*/false, 1, 20, 90);
}

TEST(Scheduler, PreemptionResumesExactlyWithPrefixCache) {
  check_preemption_resumes("bf16", /*prefix_cache=*/true, 1, 20, 90);
}

// The same in a 2-bit mode (110 tokens stay within the sinks and the recent window, so the cache
// is exact; 4 MiB leave 12 BF16 pages): the later request is preempted at 93 tokens, its full
// pages are cached, and its readmission adopts the sinks and the recent page [64, 80).
TEST(Scheduler, PreemptionResumesExactlyWithSharedRecentPages) {
  check_preemption_resumes("int2-hadamard", /*prefix_cache=*/true, 4, 20, 90);
}

// The hybrid Qwen3.5 (models/tiny-qwen3-5): its one KV layer has 16 KiB BF16 pages, so 128 KiB
// is the same 8 pages. A preempted sequence drops its DeltaNet state with its pages; without the
// prefix cache it recomputes both, with it (5) its readmission adopts the snapshot it stored when
// preempted (the last full page of prompt + output) and recomputes only the rest.
TEST(Scheduler, PreemptionResumesExactlyHybrid) {
  check_preemption_resumes("bf16", /*prefix_cache=*/false, 0, 20, 90, "models/tiny-qwen3-5", 128);
  check_preemption_resumes("bf16", /*prefix_cache=*/true, 0, 20, 90, "models/tiny-qwen3-5", 128,
                           /*expect_resume_hits=*/true);
}

// --- The prefix cache for hybrids (kv/radix_cache.h hybrid mode) ------------------------------
// models/tiny-qwen3-5: 3 Gated DeltaNet layers + 1 full-attention layer, pages of 16 tokens. A
// cached prefix is served only up to a DeltaNet state snapshot. The CPU path is deterministic,
// but the delta rule's chunked prefill form (64-row chunks from each step's first row) and its
// decode recurrence round differently, so a hit gives the cold result bit for bit only where both
// runs split the work alike: with prefill_chunk = 192 and a 192-token shared prefix, the cold run
// computes [0, 192) then the rest, and the hit adopts the state after [0, 192) computed the same
// way (first request) and computes the same rest. Elsewhere (a snapshot taken by decode steps,
// prefills split at other boundaries) the logits agree within kHybridLogprobTol and the greedy
// tokens are equal.
constexpr const char* kHybrid = "models/tiny-qwen3-5";
constexpr float kHybridLogprobTol = 1e-3f;

struct HybridRun {
  std::vector<int32_t> ids;
  std::vector<std::vector<TokenLogprob>> top;  // [token][5] with the chosen one first
  int cached_tokens = 0;
  uint64_t computed = 0;  // prompt tokens the scheduler computed for it
};

HybridRun run_hybrid(Scheduler& s, const std::string& id, const std::vector<int32_t>& prompt,
                     int max_tokens) {
  GenerationRequest r = greedy(id, prompt, max_tokens);
  r.ignore_eos = true;
  r.logprobs = 5;
  const uint64_t before = s.metrics().prompt_tokens_total;
  Collector c;
  EXPECT_TRUE(s.submit(r, c.callback()).ok());
  EXPECT_TRUE(c.wait());
  EXPECT_TRUE(c.error.ok()) << c.error.to_string();
  HybridRun out;
  out.ids = c.ids;
  for (const GenerationEvent& e : c.tokens) {
    std::vector<TokenLogprob> t{e.chosen};
    t.insert(t.end(), e.top_logprobs.begin(), e.top_logprobs.end());
    out.top.push_back(std::move(t));
  }
  out.cached_tokens = c.cached_tokens;
  out.computed = s.metrics().prompt_tokens_total - before;
  return out;
}

// Max |Δ logprob| over the reported alternatives (the same tokens, in the same order, asserted).
float max_logprob_diff(const HybridRun& a, const HybridRun& b) {
  EXPECT_EQ(a.ids, b.ids);
  float d = 0;
  if (a.top.size() != b.top.size()) return 1e9f;
  for (size_t i = 0; i < a.top.size(); ++i) {
    EXPECT_EQ(a.top[i].size(), b.top[i].size());
    for (size_t k = 0; k < std::min(a.top[i].size(), b.top[i].size()); ++k) {
      EXPECT_EQ(a.top[i][k].token_id, b.top[i][k].token_id) << "token " << i << " alt " << k;
      d = std::max(d, std::abs(a.top[i][k].logprob - b.top[i][k].logprob));
    }
  }
  return d;
}

std::unique_ptr<Scheduler> hybrid_scheduler(bool prefix_cache, int snapshots = 32,
                                            kv::KvEventSink* sink = nullptr) {
  SchedulerOptions so;
  so.prefill_chunk = 192;
  so.prefix_cache = prefix_cache;
  so.prefix_state_snapshots = snapshots;
  so.kv_event_sink = sink;
  return make_scheduler_with("bf16", so, {}, 0, kHybrid, 4096);
}

std::vector<int32_t> joined(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// (1) A prompt sharing a page-aligned 192-token prefix with an earlier one adopts it (the
// earlier prompt's snapshot after all but its last token's pages) and gives the cold tokens and
// log-probabilities bit for bit, computing only its own 10 tokens; an identical repeat too.
// (2) Prompts that diverge mid-page, or before any snapshot, fall back: the one diverging inside
// page [176, 192) misses (no snapshot at or before 176) and stores one where it branches off
// (176), which the next prompt with that prefix adopts.
TEST(Scheduler, HybridPrefixHitGivesTheColdResult) {
  auto cold = hybrid_scheduler(false);
  auto warm = hybrid_scheduler(true);
  const auto system = code_prompt(*warm, 192, "def add(a, b):\n    return a + b\n");
  const auto a = joined(system, code_prompt(*warm, 10, "# first question\n"));
  const auto b = joined(system, code_prompt(*warm, 10, "import numpy as np\n"));
  const HybridRun a_warm = run_hybrid(*warm, "a", a, 8);
  EXPECT_EQ(a_warm.cached_tokens, 0);
  EXPECT_EQ(max_logprob_diff(a_warm, run_hybrid(*cold, "a", a, 8)), 0.f);

  const HybridRun b_warm = run_hybrid(*warm, "b", b, 8);
  EXPECT_EQ(b_warm.cached_tokens, 192);
  EXPECT_EQ(b_warm.computed, 10u);
  const HybridRun b_cold = run_hybrid(*cold, "b", b, 8);
  EXPECT_EQ(b_cold.computed, b.size());
  EXPECT_EQ(max_logprob_diff(b_warm, b_cold), 0.f);
  const HybridRun b_again = run_hybrid(*warm, "b2", b, 8);  // B1 of b is 192 as well
  EXPECT_EQ(b_again.cached_tokens, 192);
  EXPECT_EQ(max_logprob_diff(b_again, b_cold), 0.f);
  std::printf("hybrid prefix hit: %zu-token prompt, %llu computed warm vs %llu cold\n", b.size(),
              static_cast<unsigned long long>(b_warm.computed),
              static_cast<unsigned long long>(b_cold.computed));

  // Diverges at token 185, inside page [176, 192): pages up to 176 match, no snapshot there.
  auto c = std::vector<int32_t>(system.begin(), system.begin() + 185);
  c = joined(c, code_prompt(*warm, 20, "class Model:\n"));
  const HybridRun c_warm = run_hybrid(*warm, "c", c, 8);
  EXPECT_EQ(c_warm.cached_tokens, 0);
  EXPECT_EQ(c_warm.computed, c.size());
  const HybridRun c_cold = run_hybrid(*cold, "c", c, 8);
  const float dc = max_logprob_diff(c_warm, c_cold);  // split at 176 (the branch), cold at 192
  EXPECT_LE(dc, kHybridLogprobTol);
  // The same 185 tokens, another tail: the branch snapshot at 176 serves.
  auto d = std::vector<int32_t>(system.begin(), system.begin() + 185);
  d = joined(d, code_prompt(*warm, 20, "for i in range(10):\n"));
  const HybridRun d_warm = run_hybrid(*warm, "d", d, 8);
  EXPECT_EQ(d_warm.cached_tokens, 176);
  EXPECT_EQ(d_warm.computed, d.size() - 176);
  const float dd = max_logprob_diff(d_warm, run_hybrid(*cold, "d", d, 8));
  EXPECT_LE(dd, kHybridLogprobTol);
  // Diverges at token 40: no snapshot before it (the branch one at 32 is stored now).
  auto e = std::vector<int32_t>(system.begin(), system.begin() + 40);
  e = joined(e, code_prompt(*warm, 30, "while True:\n    pass\n"));
  const HybridRun e_warm = run_hybrid(*warm, "e", e, 8);
  EXPECT_EQ(e_warm.cached_tokens, 0);
  const float de = max_logprob_diff(e_warm, run_hybrid(*cold, "e", e, 8));
  EXPECT_LE(de, kHybridLogprobTol);
  std::printf("hybrid fallbacks: max |dlogprob| %.3g (branch at 176), %.3g (hit at 176), %.3g\n",
              dc, dd, de);
}

// (3) Multi-turn: the second turn's prompt is the first turn's prompt + output + a new message;
// it adopts the snapshot the first turn stored when it ended (the last full page of prompt +
// output, reached by decode steps), and gives the cold greedy tokens (log-probabilities within
// kHybridLogprobTol: the state there came from the recurrence, the cold run's from the chunked
// form).
TEST(Scheduler, HybridPrefixMultiTurnReusesTheConversation) {
  auto cold = hybrid_scheduler(false);
  auto warm = hybrid_scheduler(true);
  const auto turn1 = code_prompt(*warm, 150, "def add(a, b):\n    return a + b\n");
  const HybridRun t1 = run_hybrid(*warm, "t1", turn1, 40);  // 189 tokens cached: snapshot at 176
  const auto turn2 = joined(joined(turn1, t1.ids), code_prompt(*warm, 12, "# and now?\n"));
  const HybridRun t2 = run_hybrid(*warm, "t2", turn2, 16);
  EXPECT_EQ(t2.cached_tokens, 176);
  EXPECT_EQ(t2.computed, turn2.size() - 176);
  const float d = max_logprob_diff(t2, run_hybrid(*cold, "t2", turn2, 16));
  EXPECT_LE(d, kHybridLogprobTol);
  std::printf("hybrid multi-turn: %zu-token turn 2, %llu computed, max |dlogprob| %.3g\n",
              turn2.size(), static_cast<unsigned long long>(t2.computed), d);
}

// (4) The snapshot budget: with one snapshot, a's end of request (the last full page of its
// prompt + output) replaces its prompt's, so b (sharing only the prompt's pages) misses and is
// computed cold, with the cold result; with two, b hits.
TEST(Scheduler, HybridPrefixSnapshotBudgetEvicts) {
  auto cold = hybrid_scheduler(false);
  for (int snapshots : {1, 2}) {
    auto warm = hybrid_scheduler(true, snapshots);
    const auto system = code_prompt(*warm, 192, "def add(a, b):\n    return a + b\n");
    const auto a = joined(system, code_prompt(*warm, 10, "# first question\n"));
    const auto b = joined(system, code_prompt(*warm, 10, "import numpy as np\n"));
    run_hybrid(*warm, "a", a, 8);  // 209 tokens: snapshots at 192 (prompt) and 208 (end)
    const HybridRun hb = run_hybrid(*warm, "b", b, 8);
    EXPECT_EQ(hb.cached_tokens, snapshots == 1 ? 0 : 192) << snapshots;
    EXPECT_EQ(max_logprob_diff(hb, run_hybrid(*cold, "b", b, 8)), 0.f) << snapshots;
  }
}

// (7) KV events with a hybrid: only blocks on a path to a snapshot are announced. After a's
// request (snapshots after 192 and 208 tokens), a router knows exactly a's first 13 blocks; a
// prompt with no page in common adds its own once it has a snapshot; every batch applies cleanly.
TEST(Scheduler, HybridKvEventsAnnounceOnlyServableBlocks) {
  struct MirrorSink final : kv::KvEventSink {
    std::mutex mu;
    kv::KvBlockMirror mirror;
    Status status;
    void publish(std::vector<kv::KvEvent> events) override {
      std::lock_guard<std::mutex> lock(mu);
      if (status.ok()) status = mirror.apply_all(events);
    }
  } sink;
  auto warm = hybrid_scheduler(true, 32, &sink);
  const auto system = code_prompt(*warm, 192, "def add(a, b):\n    return a + b\n");
  const auto a = joined(system, code_prompt(*warm, 10, "# first question\n"));
  const HybridRun ra = run_hybrid(*warm, "a", a, 8);
  auto settle = [&] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  settle();
  const auto path = joined(a, ra.ids);  // 209 tokens in the cache: 13 pages
  const auto hashes = kv::block_hashes_of_path(std::span(path).first(208), 16);
  {
    std::lock_guard<std::mutex> lock(sink.mu);
    EXPECT_TRUE(sink.status.ok()) << sink.status.to_string();
    EXPECT_EQ(sink.mirror.size(), 13u);
    for (kv::BlockHash h : hashes) EXPECT_TRUE(sink.mirror.blocks().contains(h));
  }
  run_hybrid(*warm, "f", code_prompt(*warm, 40, "while True:\n    pass\n"), 4);  // 43: at 32
  settle();
  std::lock_guard<std::mutex> lock(sink.mu);
  EXPECT_TRUE(sink.status.ok()) << sink.status.to_string();
  EXPECT_EQ(sink.mirror.size(), 15u);
  EXPECT_LE(static_cast<int64_t>(sink.mirror.size()), warm->metrics().prefix_cache_blocks);
}

// max_waiting bounds the requests that wait for admission: one more is refused with
// ResourceExhausted naming the cap (the server's 429); the admitted ones all finish.
TEST(Scheduler, QueueCapRefusesBeyondMaxWaiting) {
  SchedulerOptions so;
  so.max_running = 1;
  so.max_waiting = 2;
  so.prefix_cache = false;
  auto sched = make_scheduler_with("bf16", so, {}, 1);
  auto prompt = sched->tokenize("hello").value();
  std::vector<std::unique_ptr<Collector>> cs;
  int refused = 0;
  std::vector<int> accepted;
  for (int i = 0; i < 6; ++i) {
    cs.push_back(std::make_unique<Collector>());
    GenerationRequest r = greedy(std::to_string(i), prompt, 100);
    r.ignore_eos = true;
    Status st = sched->submit(std::move(r), cs.back()->callback());
    if (st.ok()) accepted.push_back(i);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
      EXPECT_NE(st.message().find("--max-queue 2"), std::string::npos) << st.message();
      ++refused;
    }
  }
  // One may already be running; at most two wait.
  EXPECT_GE(refused, 3);
  EXPECT_LE(refused, 4);
  // The accepted ones need not be the first: a request that starts running mid-loop frees a
  // place in the queue for a later one (waiting on a refused request's collector would hang).
  for (int i : accepted) EXPECT_TRUE(cs[i]->wait()) << i;
  wait_idle(*sched);
  EXPECT_EQ(used_pages(*sched), 0);
}

// The choices of one n > 1 request are submitted together: a request of max_running +
// max_waiting choices (info().max_live_requests, the server's cap on n) fits an idle engine and
// every choice finishes (before, a third choice found the queue of two full). More choices are
// the server's 400 (test_openai_request: ChoicesBeyondTheEngineAre400).
TEST(Scheduler, ChoicesUpToMaxLiveRequestsFitAnIdleEngine) {
  SchedulerOptions so;
  so.max_running = 2;
  so.max_waiting = 2;
  so.prefix_cache = true;
  auto sched = make_scheduler_with("bf16", so, {}, 1);
  EXPECT_EQ(sched->info().max_live_requests, 4);
  auto prompt = sched->tokenize("def fibonacci(n):\n").value();
  std::vector<std::unique_ptr<Collector>> cs;
  for (int i = 0; i < 4; ++i) {
    cs.push_back(std::make_unique<Collector>());
    // Not "c" + std::to_string(i): GCC 12 warns -Wrestrict (a false positive) on it here.
    GenerationRequest r = greedy(std::string("c").append(std::to_string(i)), prompt, 8);
    if (i > 0) r.share_prompt_with = "c0";
    Status st = sched->submit(std::move(r), cs.back()->callback());
    ASSERT_TRUE(st.ok()) << i << ": " << st.to_string();
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(cs[i]->wait()) << i;
    EXPECT_TRUE(cs[i]->error.ok()) << cs[i]->error.to_string();
    EXPECT_EQ(cs[i]->text, cs[0]->text) << i;
  }
  wait_idle(*sched);
}

// The repetition penalty's range is checked at submit too (engine_api.h: kMinRepetitionPenalty).
TEST(Scheduler, RepetitionPenaltyOutOfRangeIsRefused) {
  SchedulerOptions so;
  auto sched = make_scheduler_with("bf16", so, {}, 1);
  auto prompt = sched->tokenize("hello").value();
  for (float r : {1e-39f, 0.005f, 1e30f}) {
    GenerationRequest req = greedy("r", prompt, 4);
    req.sampling.repetition_penalty = r;
    Status st = sched->submit(std::move(req), [](const GenerationEvent&) {});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << r;
    EXPECT_NE(st.message().find("[0.01, 100]"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace oscar::engine

namespace oscar::engine {
namespace {

TEST(Scheduler, FaultInjectionSpelling) {
  auto step = FaultInjection::parse("step:3");
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step.value().where, FaultInjection::kStep);
  EXPECT_EQ(step.value().n, 3);
  EXPECT_EQ(FaultInjection::parse("sample:1").value().where, FaultInjection::kSample);
  EXPECT_EQ(FaultInjection::parse("device:2").value().where, FaultInjection::kDevice);
  EXPECT_EQ(FaultInjection::parse("").value().where, FaultInjection::kNone);
  for (const char* bad : {"step", "step:", "step:0", "step:-1", "step:1x", "forward:1", ":2"}) {
    auto r = FaultInjection::parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("step:N, sample:N or device:N"), std::string::npos);
    }
  }
  RuntimeOptions o;
  o.model_dir = kModel;
  o.cache_mode = "bf16";
  o.kv_budget_bytes = size_t{1} << 20;
  SchedulerOptions so;
  so.fault_inject = "sample";
  auto s = Scheduler::create(Runtime::create(o).value(), so);
  EXPECT_FALSE(s.ok());
}

// A step that fails (an injected error after the forward pass, or from sampling, as a CUDA error
// would) fails the request in it with that error, frees its pages, and the loop serves the next
// request exactly as if nothing had happened.
TEST(Scheduler, FailedStepFailsItsRequestAndTheLoopGoesOn) {
  auto clean = make_scheduler("int2-hadamard");
  auto prompt = clean->tokenize("def fibonacci(n):\n").value();
  Collector baseline;
  ASSERT_TRUE(clean->submit(greedy("base", prompt, 8), baseline.callback()).ok());
  ASSERT_TRUE(baseline.wait());
  ASSERT_TRUE(baseline.error.ok());
  for (const char* spec : {"step:2", "sample:2"}) {
    SCOPED_TRACE(spec);
    SchedulerOptions so;
    so.prefix_cache = false;
    so.fault_inject = spec;
    auto sched = make_scheduler_with("int2-hadamard", so);
    Collector a;
    ASSERT_TRUE(sched->submit(greedy("a", prompt, 8), a.callback()).ok());
    ASSERT_TRUE(a.wait());
    EXPECT_EQ(a.error.code(), StatusCode::kInternal) << a.error.to_string();
    EXPECT_NE(a.error.message().find("injected fault"), std::string::npos) << a.error.message();
    EXPECT_EQ(a.ids.size(), 1u);  // step 1 (the prefill) gave a token; step 2 failed
    wait_idle(*sched);
    EXPECT_EQ(used_pages(*sched), 0);
    Collector b;
    ASSERT_TRUE(sched->submit(greedy("b", prompt, 8), b.callback()).ok());
    ASSERT_TRUE(b.wait());
    EXPECT_TRUE(b.error.ok()) << b.error.to_string();
    EXPECT_EQ(b.ids, baseline.ids);
  }
}

}  // namespace
}  // namespace oscar::engine
