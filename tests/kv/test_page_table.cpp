// PageTableBuilder / PageTableView: CSR layout, last-page lengths at and around page boundaries,
// empty sequences, clear(), validate_page_table on good and corrupted views, and the distinct
// pages of a table whose sequences share pages (kernels/distinct_pages.h).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/distinct_pages.h"
#include "kv/page_table.h"

namespace oscar::kv {
namespace {

TEST(PageTable, BuildsCsr) {
  PageTableBuilder b(16);
  const std::vector<PageId> s0 = {7, 3, 9};  // 40 tokens: 16 + 16 + 8
  const std::vector<PageId> s1 = {};         // empty
  const std::vector<PageId> s2 = {1};        // 16 tokens: exactly one full page
  const std::vector<PageId> s3 = {4, 5};     // 17 tokens: one token in the last page
  EXPECT_EQ(b.add_sequence(s0, 40), 0);
  EXPECT_EQ(b.add_sequence(s1, 0), 1);
  EXPECT_EQ(b.add_sequence(s2, 16), 2);
  EXPECT_EQ(b.add_sequence(s3, 17), 3);
  PageTableView v = b.view();
  ASSERT_EQ(v.n_seqs, 4);
  const std::vector<int32_t> indptr(v.indptr, v.indptr + 5);
  EXPECT_EQ(indptr, (std::vector<int32_t>{0, 3, 3, 4, 6}));
  const std::vector<int32_t> ids(v.page_ids, v.page_ids + 6);
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 3, 9, 1, 4, 5}));
  const std::vector<int32_t> last(v.last_page_len, v.last_page_len + 4);
  EXPECT_EQ(last, (std::vector<int32_t>{8, 0, 16, 1}));
  EXPECT_EQ(v.seq_len(0, 16), 40);
  EXPECT_EQ(v.seq_len(1, 16), 0);
  EXPECT_EQ(v.seq_len(2, 16), 16);
  EXPECT_EQ(v.seq_len(3, 16), 17);
  EXPECT_EQ(b.total_pages(), 6);
  EXPECT_TRUE(validate_page_table(v, 10, 16).ok());

  b.clear();
  EXPECT_EQ(b.n_seqs(), 0);
  EXPECT_EQ(b.view().indptr[0], 0);
  EXPECT_TRUE(validate_page_table(b.view(), 10, 16).ok());
}

TEST(PageTable, ValidateCatchesCorruption) {
  PageTableBuilder b(16);
  const std::vector<PageId> s0 = {2, 3};
  b.add_sequence(s0, 20);
  PageTableView v = b.view();
  // Page id beyond the pool.
  Status st = validate_page_table(v, 3, 16);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("id 3"), std::string::npos) << st.message();
  // last_page_len out of range.
  std::vector<int32_t> bad_last = {17};
  PageTableView v2 = v;
  v2.last_page_len = bad_last.data();
  EXPECT_FALSE(validate_page_table(v2, 8, 16).ok());
  // Decreasing indptr.
  std::vector<int32_t> bad_indptr = {0, 2, 1};
  std::vector<int32_t> last2 = {16, 0};
  PageTableView v3{bad_indptr.data(), v.page_ids, last2.data(), 2};
  EXPECT_FALSE(validate_page_table(v3, 8, 16).ok());
}

TEST(PageTableDeathTest, PageCountMismatchAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  PageTableBuilder b(16);
  const std::vector<PageId> two = {1, 2};
  EXPECT_DEATH(b.add_sequence(two, 16), "pages given");
  EXPECT_DEATH(b.add_sequence(two, 33), "pages given");
}

// Two sequences over one cached prefix (pages 7, 3) and their own pages: each page listed once,
// in order of first appearance, and every entry indexes its own page.
TEST(PageTable, DistinctPagesOfSharedPrefixes) {
  PageTableBuilder b(16);
  const std::vector<PageId> s0 = {7, 3, 9}, s1 = {7, 3, 2, 9};
  b.add_sequence(s0, 48);
  b.add_sequence(s1, 64);
  const kernels::DistinctPages d = kernels::distinct_pages(b.page_ids());
  EXPECT_EQ(d.pages, (std::vector<int32_t>{7, 3, 9, 2}));
  EXPECT_EQ(d.index, (std::vector<int32_t>{0, 1, 2, 0, 1, 3, 2}));
  for (size_t i = 0; i < d.index.size(); ++i) EXPECT_EQ(d.pages[d.index[i]], b.page_ids()[i]);
  EXPECT_TRUE(kernels::distinct_pages({}).pages.empty());
}

}  // namespace
}  // namespace oscar::kv
