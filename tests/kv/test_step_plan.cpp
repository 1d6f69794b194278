// kv::StepPlan: decode sequences first and contiguous, rows and positions in order, each new
// token's write slot where its cache says, logit rows (last row, or all rows when asked), CSR
// tables per group equal to each cache's own page lists, demotions listed with their sequence,
// and commit() committing exactly the sequences whose demotions succeeded.
#include <gtest/gtest.h>

#include <vector>

#include "kv/step_plan.h"

namespace oscar::kv {
namespace {

KvCacheSpec spec() {
  KvCacheSpec s;
  s.n_layers = 1;
  s.n_heads_kv = 1;
  s.head_dim = 128;
  s.mode = quant::CacheMode::kInt2Naive;
  s.regions.page_size = 16;
  s.regions.n_sink = 16;
  s.regions.n_recent = 32;
  return s;
}

TEST(StepPlan, OrdersRowsTablesSlotsAndDemotions) {
  const KvCacheSpec sp = spec();
  const auto L = sp.layout();
  PagePool exact("bf16", 64, L.exact_page_bytes()), hist("int2", 64, L.int2_page_bytes());
  SequenceCache a(&sp, &exact, &hist), b(&sp, &exact, &hist), c(&sp, &exact, &hist);
  // b holds 79 committed tokens (history [16, 32)); its next token makes the recent window
  // overflow by a page: history_end(80) = 16 + 16 · floor((80 − 16 − 32) / 16) = 48.
  ASSERT_TRUE(b.reserve(79).ok());
  b.commit_demoted(79);
  const std::vector<int32_t> prompt_a = {5, 6, 7}, tok_b = {9}, prompt_c = {1, 2, 3, 4, 5};
  ASSERT_TRUE(a.reserve(3).ok());
  ASSERT_TRUE(b.reserve(1).ok());
  ASSERT_TRUE(c.reserve(5).ok());
  const std::vector<StepChunk> chunks = {
      {&a, prompt_a, false}, {&b, tok_b, false}, {&c, prompt_c, true}};
  const StepPlan p = StepPlan::make(chunks, AttendMode::kPrefill);

  ASSERT_EQ(p.n_seqs(), 3);
  EXPECT_EQ(p.n_decode, 1);
  EXPECT_EQ(p.chunk, (std::vector<int32_t>{1, 0, 2}));  // the decode chunk first
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 1, 4, 9}));
  EXPECT_EQ(p.token_ids, (std::vector<int32_t>{9, 5, 6, 7, 1, 2, 3, 4, 5}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{79, 0, 1, 2, 0, 1, 2, 3, 4}));
  EXPECT_EQ(p.pos0, (std::vector<int64_t>{79, 0, 0}));
  EXPECT_EQ(p.write_slots[0], b.exact_slot(79));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.write_slots[1 + i], a.exact_slot(i));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p.write_slots[4 + i], c.exact_slot(i));
  // Logits: b's row, a's last row, every row of c.
  EXPECT_EQ(p.logit_rows, (std::vector<int32_t>{0, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(p.cu_logits, (std::vector<int32_t>{0, 1, 2, 7}));
  // Decode tables: b alone, 80 keys = 16 sinks + 16 history + 48 recent (79 committed + 1 staged).
  const PageTableView ds = p.dec_sinks.view(), dh = p.dec_hist.view(), dr = p.dec_recent.view();
  ASSERT_EQ(ds.n_seqs, 1);
  EXPECT_EQ(ds.seq_len(0, 16), 16);
  EXPECT_EQ(dh.seq_len(0, 16), 16);
  EXPECT_EQ(dr.seq_len(0, 16), 48);
  // Prefill tables: a and c (rows cu_seqlens[1..3] = 1, 4, 9).
  EXPECT_EQ(p.pre_sinks.view().seq_len(0, 16), 3);
  EXPECT_EQ(p.pre_sinks.view().seq_len(1, 16), 5);
  // b's step demotes one page: its oldest recent page.
  ASSERT_EQ(p.demote_src.size(), 1u);
  EXPECT_EQ(p.demote_src[0] * 16, b.exact_slot(32));
  EXPECT_EQ(p.demote_seq, (std::vector<int32_t>{0}));

  // A failed demotion leaves b staged and reports it under b's chunk index; a and c commit.
  std::vector<Status> per_chunk;
  p.commit(std::vector<int32_t>{1}, &per_chunk);
  ASSERT_EQ(per_chunk.size(), 3u);
  EXPECT_TRUE(per_chunk[0].ok());
  EXPECT_FALSE(per_chunk[1].ok());
  EXPECT_TRUE(per_chunk[2].ok());
  EXPECT_EQ(a.n_tokens(), 3);
  EXPECT_EQ(c.n_tokens(), 5);
  EXPECT_EQ(b.n_tokens(), 79);
  EXPECT_EQ(b.n_staged(), 1);
}

// A page size that puts history planes off 16-byte boundaries is refused by name.
TEST(StepPlan, SpecRefusesMisalignedHistoryPlanes) {
  KvCacheSpec s = spec();
  s.regions.page_size = 2;
  s.regions.n_sink = 16;
  s.regions.n_recent = 32;
  const Status st = s.validate();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("16-byte"), std::string::npos) << st.to_string();
  EXPECT_TRUE(spec().validate().ok());
}

}  // namespace
}  // namespace oscar::kv
