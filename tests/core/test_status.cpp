#include <gtest/gtest.h>

#include "core/status.h"

namespace oscar {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument("value %d is not positive", x);
  return x;
}

Status use(int x, int* out) {
  OSCAR_ASSIGN_OR_RETURN(int v, parse_positive(x));
  *out = v * 2;
  return Status();
}

TEST(Status, PropagatesMessageAndCode) {
  int out = 0;
  Status st = use(-3, &out);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "value -3 is not positive");
  EXPECT_EQ(st.with_context("loading").message(), "loading: value -3 is not positive");
  EXPECT_TRUE(use(4, &out).ok());
  EXPECT_EQ(out, 8);
}

}  // namespace
}  // namespace oscar
