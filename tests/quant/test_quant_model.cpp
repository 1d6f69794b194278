// Quantization quality on real K/V of the embedded tiny-qwen3 (golden cache_keys/cache_values of
// the prompts p0..p2): relative reconstruction error of INT2 without rotation, with H·P_br and
// with the reference OSCAR rotations (+ their clip ratios), uniform and Lloyd-Max. This is a
// quality check ("INT2 is close to the original"), printed and tracked, with loose assertions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "quant/hadamard.h"
#include "quant/int2_quant.h"
#include "quant/rotation.h"
#include "quant/rotation_file.h"

namespace oscar::quant {
namespace {

const std::string kGolden = std::string(OSCAR_SOURCE_DIR) + "/models/tiny-qwen3/golden/";
constexpr int kLayers = 8, kHeads = 2, kDim = 128;

enum class Rot { kNone, kHadamard, kOscar };

// Σ‖x − x̂‖² / Σ‖x‖² over all rows, error measured in the original (unrotated) space.
double relative_error(const std::vector<float>& x, int n, const float* R, float rho, bool lloyd) {
  std::vector<float> xr(x.size()), xhat_r(x.size()), xhat(x.size());
  const float* src = x.data();
  if (R != nullptr) {
    rotate_rows(x.data(), n, R, kDim, xr.data());
    src = xr.data();
  }
  std::vector<uint8_t> rows(static_cast<size_t>(n) * int2_row_bytes(kDim, 128));
  Status st = lloyd ? quantize_rows_lloyd(src, n, kDim, 128, rho, rows.data())
                    : quantize_rows_int2(src, n, kDim, 128, rho, rows.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (lloyd) {
    dequantize_rows_lloyd(rows.data(), n, kDim, 128, xhat_r.data());
  } else {
    dequantize_rows_int2(rows.data(), n, kDim, 128, xhat_r.data());
  }
  if (R != nullptr) {
    unrotate_rows(xhat_r.data(), n, R, kDim, xhat.data());
  } else {
    xhat = xhat_r;
  }
  double err = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (x[i] - xhat[i]) * static_cast<double>(x[i] - xhat[i]);
    norm += x[i] * static_cast<double>(x[i]);
  }
  return err / norm;
}

TEST(QuantOnModel, RotationReducesReconstructionErrorOfGoldenKV) {
  Result<format::SafetensorsFile> logits = format::SafetensorsFile::open(kGolden + "logits.safetensors");
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  Result<RotationSet> rot =
      load_rotation_file(kGolden + "oscar_rotations_reference.safetensors", "", kLayers, kHeads, kDim);
  ASSERT_TRUE(rot.ok()) << rot.status().to_string();
  const std::vector<float> hp = hadamard_bitrev_rotation(kDim);

  for (const char* kind : {"keys", "values"}) {
    const bool is_k = kind[0] == 'k';
    double e[3][2] = {};  // [rotation][lloyd], summed over (prompt, layer, head)
    int count = 0;
    for (const char* prompt : {"p0_short_code", "p1_class", "p2_chatml_specials"}) {
      const format::TensorView* t = logits->find(std::string(prompt) + ".cache_" + kind);
      ASSERT_NE(t, nullptr) << prompt;
      ASSERT_EQ(t->shape.size(), 4u);
      const int T = static_cast<int>(t->shape[2]);
      const std::vector<float> all = t->to_f32();  // [layer, head, T, d]
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kHeads; ++h) {
          const float* base = all.data() + (static_cast<size_t>(l) * kHeads + h) * T * kDim;
          const std::vector<float> x(base, base + static_cast<size_t>(T) * kDim);
          const float* R = is_k ? rot->k_rotation(l, h) : rot->v_rotation(l, h);
          const float rho = is_k ? rot->k_clip_ratio(l, h) : rot->v_clip_ratio(l, h);
          for (int lloyd = 0; lloyd < 2; ++lloyd) {
            e[0][lloyd] += relative_error(x, T, nullptr, 1.0f, lloyd);
            e[1][lloyd] += relative_error(x, T, hp.data(), 1.0f, lloyd);
            e[2][lloyd] += relative_error(x, T, R, rho, lloyd);
          }
          ++count;
        }
      }
    }
    const char* names[3] = {"naive", "hadamard", "oscar(ref rot+clip)"};
    for (int r = 0; r < 3; ++r) {
      std::printf("%-6s %-20s rel. MSE uniform %.4f  lloyd %.4f\n", kind, names[r],
                  e[r][0] / count, e[r][1] / count);
    }
    EXPECT_LT(e[1][0], e[0][0]) << kind << ": H·P_br should beat no rotation";
    EXPECT_LT(e[2][0], 0.5 * count) << kind;
  }
}

}  // namespace
}  // namespace oscar::quant
