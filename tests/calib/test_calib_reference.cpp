// Cross-check against the reference OSCAR rotation file of tiny-qwen3 (slow label): calibrating on
// the first 24 × 4096 tokens of data/calib.txt must reproduce the reference eigenvalues of C_Q
// (keys) and of C_S = OᵀO (values, full form) to float rounding. This pins the normalisation:
// C = (1/N) Σ xᵀx with N the number of pooled vectors (tokens × GQA ratio). Clip search is off
// (--clip fixed): it does not affect eigenvalues. Prints the worst errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "calib/calibrator.h"
#include "quant/rotation_file.h"

namespace oscar::calib {
namespace {

const std::string kModel = std::string(OSCAR_SOURCE_DIR) + "/models/tiny-qwen3";

TEST(CalibrateReference, EigenvaluesMatchTheReferenceFile) {
  auto ref = quant::load_rotation_file(kModel + "/golden/oscar_rotations_reference.safetensors", "",
                                       8, 2, 128);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  CalibrationOptions o;  // 24 × 4096, full value objective
  o.clip_mode = ClipMode::kFixed;
  auto r = calibrate_model_dir(kModel, kModel + "/data/calib.txt", o, false);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const quant::RotationSet& s = r->rotations;
  ASSERT_EQ(r->n_tokens, 24 * 4096);
  for (const char* kind : {"k", "v"}) {
    const std::vector<float>& mine = kind[0] == 'k' ? s.k_eig : s.v_eig;
    const std::vector<float>& theirs = kind[0] == 'k' ? ref->k_eig : ref->v_eig;
    double worst_top = 0, worst_all = 0, worst_trace = 0;
    for (int lh = 0; lh < 16; ++lh) {
      const float* a = mine.data() + lh * 128;
      const float* b = theirs.data() + lh * 128;
      double ta = 0, tb = 0;
      for (int j = 0; j < 128; ++j) {
        ta += a[j];
        tb += b[j];
        // Relative to the largest eigenvalue of the head: small ones carry its rounding.
        const double e = std::abs(static_cast<double>(a[j]) - b[j]) / b[0];
        worst_all = std::max(worst_all, e);
        if (b[j] >= 0.01 * b[0]) worst_top = std::max(worst_top, std::abs(a[j] - b[j]) / static_cast<double>(b[j]));
      }
      worst_trace = std::max(worst_trace, std::abs(ta - tb) / tb);
    }
    std::printf("%s eigenvalues: max rel err (>= 1%% of top) %.3g, max err / top %.3g, trace %.3g\n",
                kind, worst_top, worst_all, worst_trace);
    EXPECT_LT(worst_top, 3e-4) << kind;
    EXPECT_LT(worst_all, 1e-5) << kind;
    EXPECT_LT(worst_trace, 3e-5) << kind;
  }
}

}  // namespace
}  // namespace oscar::calib
