// Admission arithmetic (admission.h): region page counts for short prompts (inside the sinks),
// exactly at the region boundaries and long ones, checked both by hand and against a token-by-token
// simulation of sink filling and recent-window demotion; the reusable radix prefix; pool checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kv/admission.h"

namespace oscar::kv {
namespace {

RegionConfig default_cfg() { return RegionConfig{16, 64, 256}; }

void expect_need(const PageNeed& got, int64_t sink, int64_t recent, int64_t hist, int64_t len) {
  EXPECT_EQ(got.sink_pages, sink) << "len " << len;
  EXPECT_EQ(got.recent_pages, recent) << "len " << len;
  EXPECT_EQ(got.hist_pages, hist) << "len " << len;
}

TEST(Admission, ValidateConfig) {
  EXPECT_TRUE(default_cfg().validate().ok());
  EXPECT_TRUE((RegionConfig{16, 0, 0}).validate().ok());
  EXPECT_FALSE((RegionConfig{12, 0, 0}).validate().ok());  // not a power of two
  EXPECT_FALSE((RegionConfig{0, 0, 0}).validate().ok());
  EXPECT_FALSE((RegionConfig{16, 60, 256}).validate().ok());  // n_sink not page-aligned
  Status st = (RegionConfig{16, 64, 250}).validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("n_recent 250"), std::string::npos) << st.message();
}

TEST(Admission, PagesForLengthByHand) {
  const RegionConfig cfg = default_cfg();
  expect_need(pages_for_length(cfg, 0), 0, 0, 0, 0);
  expect_need(pages_for_length(cfg, 1), 1, 0, 0, 1);
  expect_need(pages_for_length(cfg, 40), 3, 0, 0, 40);     // shorter than n_sink
  expect_need(pages_for_length(cfg, 64), 4, 0, 0, 64);     // exactly the sinks
  expect_need(pages_for_length(cfg, 65), 4, 1, 0, 65);     // first recent token
  expect_need(pages_for_length(cfg, 320), 4, 16, 0, 320);  // sinks + full window
  expect_need(pages_for_length(cfg, 335), 4, 17, 0, 335);  // window at n_recent + P - 1
  expect_need(pages_for_length(cfg, 336), 4, 16, 1, 336);  // first demotion
  expect_need(pages_for_length(cfg, 337), 4, 17, 1, 337);
  expect_need(pages_for_length(cfg, 10000), 4, 16, 605, 10000);
  // Plain INT2 everywhere: only the page being filled is BF16.
  const RegionConfig plain{16, 0, 0};
  expect_need(pages_for_length(plain, 32), 0, 0, 2, 32);
  expect_need(pages_for_length(plain, 33), 0, 1, 2, 33);
}

// Token-by-token model of the cache: sinks fill first, then the recent window; when the window
// reaches n_recent + P tokens, a new INT2 page is allocated (while the BF16 page is still held)
// and the oldest recent page is freed. pages_for_length must equal the model's state after every
// token, and peak_pages_for_length must equal the model's peak up to that length.
TEST(Admission, MatchesTokenByTokenSimulation) {
  for (const RegionConfig& cfg : {default_cfg(), RegionConfig{16, 0, 0}, RegionConfig{32, 32, 64},
                                  RegionConfig{64, 64, 0}, RegionConfig{16, 0, 128}}) {
    ASSERT_TRUE(cfg.validate().ok());
    const int64_t p = cfg.page_size;
    int64_t sink_tokens = 0, recent_tokens = 0, hist_pages = 0;
    int64_t peak_bf16 = 0, peak_int2 = 0;
    auto bf16_pages = [&] { return (sink_tokens + p - 1) / p + (recent_tokens + p - 1) / p; };
    for (int64_t len = 1; len <= 3000; ++len) {
      if (sink_tokens < cfg.n_sink) {
        ++sink_tokens;
      } else {
        ++recent_tokens;
      }
      peak_bf16 = std::max(peak_bf16, bf16_pages());
      if (recent_tokens == cfg.n_recent + p) {
        ++hist_pages;  // demotion: INT2 page first, then the BF16 page goes
        peak_int2 = std::max(peak_int2, hist_pages);
        peak_bf16 = std::max(peak_bf16, bf16_pages());
        recent_tokens -= p;
      }
      const PageNeed need = pages_for_length(cfg, len);
      ASSERT_EQ(need.sink_pages, (sink_tokens + p - 1) / p) << "len " << len;
      ASSERT_EQ(need.recent_pages, (recent_tokens + p - 1) / p) << "len " << len;
      ASSERT_EQ(need.hist_pages, hist_pages) << "len " << len;
      const PageNeed peak = peak_pages_for_length(cfg, len);
      ASSERT_EQ(peak.bf16_pages(), peak_bf16) << "len " << len;
      ASSERT_EQ(peak.int2_pages(), peak_int2) << "len " << len;
      ASSERT_LE(peak.recent_pages, (cfg.n_recent + p + p - 1) / p) << "len " << len;
    }
  }
}

TEST(Admission, ReusablePrefix) {
  const RegionConfig cfg = default_cfg();
  EXPECT_EQ(reusable_prefix_tokens(cfg, 0), 0);
  EXPECT_EQ(reusable_prefix_tokens(cfg, 1), 0);
  EXPECT_EQ(reusable_prefix_tokens(cfg, 16), 0);  // one token must stay to compute
  EXPECT_EQ(reusable_prefix_tokens(cfg, 17), 16);
  EXPECT_EQ(reusable_prefix_tokens(cfg, 40), 32);  // full sink pages only
  EXPECT_EQ(reusable_prefix_tokens(cfg, 64), 48);
  EXPECT_EQ(reusable_prefix_tokens(cfg, 65), 64);
  EXPECT_EQ(reusable_prefix_tokens(cfg, 320), 64);  // the rest is the recent window
  EXPECT_EQ(reusable_prefix_tokens(cfg, 336), 80);
  EXPECT_EQ(reusable_prefix_tokens(cfg, 337), 80);
  EXPECT_EQ(reusable_prefix_tokens(cfg, 10000), 64 + 605 * 16);
  EXPECT_EQ(reusable_prefix_tokens(RegionConfig{16, 0, 0}, 32), 16);
  EXPECT_EQ(reusable_prefix_tokens(RegionConfig{16, 0, 0}, 33), 32);
}

// Chunks [0, n) held in the given forms: BF16 where bf16(i), INT2 where int2(i); page id = 1000 *
// pool + chunk index, so that the chosen form of each chunk shows in the page id.
std::vector<CachedChunk> chunks_with(int n, const std::function<bool(int)>& bf16,
                                     const std::function<bool(int)>& int2) {
  std::vector<CachedChunk> c(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (bf16(i)) c[i].pages[kPoolBf16] = i;
    if (int2(i)) c[i].pages[kPoolInt2] = 1000 + i;
  }
  return c;
}

// The forms chosen, as a string: 'b' for a BF16 page, 'i' for an INT2 page, one per chunk.
std::string forms(const std::vector<CachedPage>& pages) {
  std::string s;
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(pages[i].page, static_cast<PageId>(1000 * pages[i].pool + i)) << "chunk " << i;
    s += pages[i].pool == kPoolBf16 ? 'b' : 'i';
  }
  return s;
}

std::string run(char c, int n) { return std::string(static_cast<size_t>(n), c); }

// choose_prefix_forms for each combination of forms, with page_size 16, 4 sink pages, a recent
// window of 256 tokens. A prompt of 1000 tokens holds after its prefill sinks [0, 64), history
// [64, 736) (chunks 4..45) and a recent window [736, 1000) (chunks 46..61 full, 62 partial).
TEST(Admission, ChoosePrefixForms) {
  const RegionConfig cfg = default_cfg();
  auto all = [](int) { return true; };
  auto none = [](int) { return false; };
  auto sink = [](int i) { return i < 4; };
  // A request of 1000 tokens published at the end of its prefill: sinks, history to 736, its
  // full recent pages.
  auto published_bf16 = [](int i) { return i < 4 || i >= 46; };
  auto published_int2 = [](int i) { return i >= 4 && i < 46; };
  // Another request of 1000 tokens over the same 992-token prefix: everything is reused, in the
  // form a cold sequence of 992 tokens holds (history_end(992) = 736).
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 1000, chunks_with(62, published_bf16,
                                                                   published_int2))),
            run('b', 4) + run('i', 42) + run('b', 16));
  // Over a 960-token prefix: a cold sequence of 960 tokens holds history to 704 (chunk 44), but
  // chunks 44-45 are INT2 only: the history ends at 736 instead (still <= history_end(1000)).
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 1000, chunks_with(60, published_bf16,
                                                                   published_int2))),
            run('b', 4) + run('i', 42) + run('b', 14));
  // INT2 only past the sinks (a cache of before): the match stops where BF16 would be needed,
  // at the history end of the 1000-token prompt (what the recent window recomputes).
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 1000, chunks_with(62, sink, [](int i) {
              return i >= 4;
            }))),
            run('b', 4) + run('i', 42));
  // BF16 only where INT2 is needed: reused as BF16 (the sequence's next commit demotes the
  // pages below its history end into its own INT2 pages).
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 1000, chunks_with(62, all, none))),
            run('b', 62));
  // Both forms everywhere: the cold form of the 992-token prefix.
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 1000, chunks_with(62, all, all))),
            run('b', 4) + run('i', 42) + run('b', 16));
  // ... for a prompt of 800 tokens too: 49 chunks, history_end(784) = 528 (chunk 33).
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 800, chunks_with(62, all, all))),
            run('b', 4) + run('i', 29) + run('b', 16));
  // A gap in the BF16 run ends the match (at chunk 50: history_end(800) = 544, chunk 34); a sink
  // without its BF16 page ends it at the sinks.
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 1000, chunks_with(62, [](int i) {
              return i != 50;
            }, published_int2))),
            run('b', 4) + run('i', 30) + run('b', 16));
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 1000, chunks_with(62, [](int i) {
              return i != 2;
            }, all))),
            run('b', 2));
  // At least one token is computed; short prompts reuse sink pages only.
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 16, chunks_with(4, all, none))), "");
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 40, chunks_with(4, all, none))), "bb");
  EXPECT_EQ(forms(choose_prefix_forms(cfg, true, 0, chunks_with(4, all, none))), "");
  // Unquantized caches: every BF16 page up to a chunk without one.
  EXPECT_EQ(forms(choose_prefix_forms(cfg, false, 1000, chunks_with(62, all, none))),
            run('b', 62));
  EXPECT_EQ(forms(choose_prefix_forms(cfg, false, 1000, chunks_with(62, [](int i) {
              return i != 7;
            }, all))),
            run('b', 7));
}

// A random prefix-cache path for the brute-force tests: up to 39 chunks, each held as BF16, INT2
// or both, and a context below 48 pages; limit = the chunks a match may use, sinks = the leading
// BF16 chunks among the sink chunks.
struct RandomPath {
  std::vector<CachedChunk> chunks;
  int64_t context = 0, limit = 0, sinks = 0;
};
RandomPath random_path(std::mt19937& rng, const RegionConfig& cfg) {
  const int64_t p = cfg.page_size;
  RandomPath r;
  const int n_chunks = static_cast<int>(rng() % 40);
  r.context = rng() % (48 * p);
  r.chunks.resize(static_cast<size_t>(n_chunks));
  for (int i = 0; i < n_chunks; ++i) {
    const unsigned f = 1 + rng() % 3;  // 1: BF16, 2: INT2, 3: both
    if (f & 1) r.chunks[i].pages[kPoolBf16] = i;
    if (f & 2) r.chunks[i].pages[kPoolInt2] = 1000 + i;
  }
  r.limit = std::min<int64_t>(n_chunks, std::max<int64_t>(0, r.context - 1) / p);
  while (r.sinks < std::min(r.limit, cfg.n_sink / p) && r.chunks[r.sinks].has(kPoolBf16))
    ++r.sinks;
  return r;
}

// History end, in chunks, of a cold sequence of `tokens` tokens.
int64_t cold_hist_chunks(const RegionConfig& cfg, int64_t tokens) {
  return (cfg.n_sink + pages_for_length(cfg, tokens).hist_pages * cfg.page_size) / cfg.page_size;
}

// got is m chunks: BF16 sinks, INT2 [n_sink, h), BF16 [h, m), each the chunk's own page.
void expect_split(const RegionConfig& cfg, const std::vector<CachedPage>& got,
                  const RandomPath& r, int64_t m, int64_t h, int trial) {
  const int64_t s = cfg.n_sink / cfg.page_size;
  ASSERT_EQ(static_cast<int64_t>(got.size()), m) << "trial " << trial;
  for (int64_t i = 0; i < m; ++i) {
    const bool int2 = i >= s && i < h;
    ASSERT_EQ(got[i].pool, int2 ? kPoolInt2 : kPoolBf16) << "trial " << trial << " chunk " << i;
    ASSERT_EQ(got[i], r.chunks[i].form(got[i].pool));
  }
}

// choose_prefix_forms against a brute force over every (h, m) on random form patterns: the result
// is sinks, then INT2 [n_sink, h), then BF16 [h, m), each page a form its chunk holds; m is the
// longest such prefix with h <= history_end(context) and m <= (context - 1) / page; h is the
// smallest >= history_end(m) among those reaching m, else the largest below it.
TEST(Admission, ChoosePrefixFormsIsTheBestFeasibleSplit) {
  std::mt19937 rng(26);
  for (const RegionConfig cfg : {default_cfg(), RegionConfig{16, 0, 32}, RegionConfig{32, 64, 0}}) {
    const int64_t p = cfg.page_size, s = cfg.n_sink / p;
    for (int trial = 0; trial < 2000; ++trial) {
      const RandomPath r = random_path(rng, cfg);
      const std::vector<CachedChunk>& chunks = r.chunks;
      // Every feasible (h, m); sinks first.
      int64_t best_m = r.sinks, best_h = -1;
      if (r.sinks == s) {
        for (int64_t h = s; h <= std::min(r.limit, cold_hist_chunks(cfg, r.context)); ++h) {
          bool ok = true;
          for (int64_t i = s; i < h; ++i) ok = ok && chunks[i].has(kPoolInt2);
          if (!ok) break;
          int64_t m = h;
          while (m < r.limit && chunks[m].has(kPoolBf16)) ++m;
          if (m > best_m || best_h < 0) best_m = m, best_h = -1;
          if (m != best_m) continue;
          const int64_t cold = cold_hist_chunks(cfg, m * p);
          if (best_h < 0 || (h >= cold && (best_h < cold || h < best_h)) ||
              (h < cold && best_h < cold && h > best_h))
            best_h = h;
        }
      }
      expect_split(cfg, choose_prefix_forms(cfg, true, r.context, chunks), r, best_m, best_h,
                   trial);
    }
  }
}

// exact_history (--enable-deterministic-inference) against a brute force on random form
// patterns: the result is sinks, then INT2 [n_sink, h), then BF16 [h, m) with h exactly the
// history end of a cold sequence of m chunks, each page a form its chunk holds, h <=
// history_end(context), m <= (context - 1) / page and the longest such; sinks alone otherwise.
TEST(Admission, ChoosePrefixFormsExactHistory) {
  std::mt19937 rng(27);
  int64_t longer = 0;  // trials where the default choice matched more chunks
  for (const RegionConfig cfg : {default_cfg(), RegionConfig{16, 0, 32}, RegionConfig{32, 64, 0}}) {
    const int64_t p = cfg.page_size, s = cfg.n_sink / p;
    for (int trial = 0; trial < 2000; ++trial) {
      const RandomPath r = random_path(rng, cfg);
      int64_t best_m = r.sinks, best_h = s;
      if (r.sinks == s)
        for (int64_t m = r.limit; m > s; --m) {
          const int64_t h = cold_hist_chunks(cfg, m * p);
          bool ok = h <= cold_hist_chunks(cfg, r.context);
          for (int64_t i = s; i < m; ++i)
            ok = ok && r.chunks[i].has(i < h ? kPoolInt2 : kPoolBf16);
          if (!ok) continue;
          best_m = m;
          best_h = h;
          break;
        }
      const std::vector<CachedPage> got = choose_prefix_forms(cfg, true, r.context, r.chunks, true);
      expect_split(cfg, got, r, best_m, best_h, trial);
      longer += choose_prefix_forms(cfg, true, r.context, r.chunks).size() > got.size();
    }
  }
  EXPECT_GT(longer, 0);  // the constraint bites on some patterns
}

TEST(Admission, PagesNeededWithAndWithoutCache) {
  const RegionConfig cfg = default_cfg();
  // Short prompt that stays inside the sinks even after generation.
  expect_need(pages_needed(cfg, 10, 20), 2, 0, 0, 30);
  // Prompt of 300 plus 100 tokens: 400 tokens = 64 sink + 5 history pages + 256 recent at the
  // end, but the window peaked at 17 pages before a demotion.
  expect_need(pages_needed(cfg, 300, 100), 4, 17, 5, 400);
  expect_need(pages_needed(cfg, 300, 100, 64), 0, 17, 5, 400);  // sinks cached
  expect_need(pages_needed(cfg, 300, 100, 32), 2, 17, 5, 400);  // half the sinks cached
  // Exactly at the first demotion, and one token short of it.
  expect_need(pages_needed(cfg, 300, 36), 4, 17, 1, 336);
  expect_need(pages_needed(cfg, 300, 35), 4, 17, 0, 335);
  expect_need(pages_needed(cfg, 64, 0), 4, 0, 0, 64);
  // Long prompt with its whole reusable prefix cached: only the tail and the window are fresh.
  expect_need(pages_needed(cfg, 10000, 100, 9744), 0, 17, 6, 10100);
  expect_need(pages_needed(cfg, 0, 0), 0, 0, 0, 0);
}

TEST(Admission, CanAdmitAndFits) {
  PagePool bf16("bf16", 21, 0);
  PagePool int2("int2", 10, 0);
  const PageNeed need = pages_needed(default_cfg(), 300, 100);  // 21 BF16, 5 INT2
  EXPECT_TRUE(can_admit(bf16, int2, need));
  EXPECT_TRUE(check_fits_pools(bf16, int2, need).ok());
  auto one = bf16.alloc();
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(can_admit(bf16, int2, need));
  EXPECT_TRUE(check_fits_pools(bf16, int2, need).ok());  // fits once the page comes back
  bf16.release(*one);
  const PageNeed huge = pages_needed(default_cfg(), 1000, 0);  // 21 BF16, 42 INT2 pages
  EXPECT_FALSE(can_admit(bf16, int2, huge));
  Status st = check_fits_pools(bf16, int2, huge);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("int2"), std::string::npos) << st.message();
}

TEST(AdmissionDeathTest, CachedBeyondReusableAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH((void)pages_needed(default_cfg(), 320, 10, 80), "cached_tokens");
  EXPECT_DEATH((void)pages_needed(default_cfg(), 320, 10, 8), "cached_tokens");
}

}  // namespace
}  // namespace oscar::kv
