// The CPU backend's weight buffer (Qwen3Model::pack_cpu_weights, at set_backend): the edits that
// stay allowed after it, and the one that is refused with a clear error instead of writing into
// freed host vectors. That packing keeps the logits is what test_golden checks (its runtimes pack).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/backend.h"
#include "model/qwen3.h"

namespace oscar::model {
namespace {

constexpr const char* kModel = "models/tiny-qwen3";

std::vector<float> identity_rotations(const format::ModelConfig& c) {
  const int d = c.head_dim;
  std::vector<float> r(static_cast<size_t>(c.n_layers) * c.n_heads_kv * d * d, 0.f);
  for (size_t m = 0; m < r.size(); m += static_cast<size_t>(d) * d)
    for (int i = 0; i < d; ++i) r[m + static_cast<size_t>(i) * d + i] = 1.f;
  return r;
}

TEST(CpuWeights, FoldAfterPackingIsRefused) {
  auto loaded = Qwen3Model::load(kModel);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Qwen3Model& m = *loaded.value();
  ASSERT_TRUE(m.set_backend(&kernels::cpu_backend()).ok());
  ASSERT_TRUE(m.set_backend(&kernels::cpu_backend()).ok());  // packing twice is a no-op
  const std::vector<float> r = identity_rotations(m.config());
  const Status st = m.fold_value_rotation(r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("before set_backend"), std::string::npos) << st.message();
}

TEST(CpuWeights, FoldThenPackAndEditAfterPacking) {
  auto loaded = Qwen3Model::load(kModel);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Qwen3Model& m = *loaded.value();
  ASSERT_TRUE(m.fold_value_rotation(identity_rotations(m.config())).ok());
  ASSERT_TRUE(m.set_backend(&kernels::cpu_backend()).ok());
  // The embedding is edited in the packed buffer (the poison-token tests of the scheduler and
  // the server check the effect through a runtime); bad arguments still get their errors.
  const std::vector<float> row(static_cast<size_t>(m.config().hidden_size), 0.5f);
  EXPECT_TRUE(m.set_embedding_row(3, row).ok());
  EXPECT_EQ(m.set_embedding_row(m.config().vocab_size, row).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace oscar::model
