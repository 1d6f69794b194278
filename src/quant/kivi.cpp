// KIVI-style baseline quantizers (see kivi.h), built on the uniform INT2 reference.
#include "quant/kivi.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "quant/int2_quant.h"

namespace oscar::quant {
namespace {
constexpr int kT = kKiviKeyBlockTokens;
constexpr int kCodeBytes = kT / kInt2CodesPerByte;           // 8 code bytes per channel
constexpr int kGroupRowBytes = kCodeBytes + sizeof(Int2GroupMeta);  // one channel as an INT2 row
}  // namespace

Status quantize_kivi_key_block_ref(const float* k, int head_dim, uint8_t* block) {
  OSCAR_CHECK(k != nullptr && block != nullptr && head_dim > 0, "head_dim %d", head_dim);
  const int block_bytes = kivi_key_block_bytes(head_dim);
  float column[kT];
  uint8_t group_row[kGroupRowBytes];
  for (int c = 0; c < head_dim; ++c) {
    for (int t = 0; t < kT; ++t) column[t] = k[static_cast<size_t>(t) * head_dim + c];
    // One channel over 32 tokens is exactly an INT2 row of head_dim 32, G 32, no clipping.
    Status st = quantize_row_int2_ref(column, kT, kT, 1.0f, group_row);
    if (!st.ok()) {
      std::fill(block, block + block_bytes, uint8_t{0});
      return st.with_context(str_format("kivi key block channel %d (element = token)", c));
    }
    std::memcpy(block + c * kCodeBytes, group_row, kCodeBytes);
    std::memcpy(block + head_dim * kCodeBytes + c * sizeof(Int2GroupMeta), group_row + kCodeBytes,
                sizeof(Int2GroupMeta));
  }
  return Status();
}

void dequantize_kivi_key_block_ref(const uint8_t* block, int head_dim, float* k) {
  OSCAR_CHECK(k != nullptr && block != nullptr && head_dim > 0, "head_dim %d", head_dim);
  float column[kT];
  uint8_t group_row[kGroupRowBytes];
  for (int c = 0; c < head_dim; ++c) {
    std::memcpy(group_row, block + c * kCodeBytes, kCodeBytes);
    std::memcpy(group_row + kCodeBytes, block + head_dim * kCodeBytes + c * sizeof(Int2GroupMeta),
                sizeof(Int2GroupMeta));
    dequantize_row_int2_ref(group_row, kT, kT, column);
    for (int t = 0; t < kT; ++t) k[static_cast<size_t>(t) * head_dim + c] = column[t];
  }
}

void dequantize_kivi_key_token(const uint8_t* block, int head_dim, int t, float* k_t) {
  OSCAR_CHECK(k_t != nullptr && block != nullptr && head_dim > 0 && t >= 0 && t < kT,
              "head_dim %d, token %d", head_dim, t);
  const uint8_t* meta = block + head_dim * kCodeBytes;
  for (int c = 0; c < head_dim; ++c) {
    Int2GroupMeta m;
    std::memcpy(&m, meta + c * sizeof(Int2GroupMeta), sizeof(m));
    const float scale = fp16_to_f32(m.slot0);
    const float min = fp16_to_f32(m.slot1);
    k_t[c] = min + static_cast<float>(int2_get_code(block + c * kCodeBytes, t, kT)) * scale;
  }
}

Status quantize_kivi_value_row_ref(const float* v, int head_dim, uint8_t* row) {
  return quantize_row_int2_ref(v, head_dim, kKiviValueGroup, 1.0f, row);
}

void dequantize_kivi_value_row_ref(const uint8_t* row, int head_dim, float* v) {
  dequantize_row_int2_ref(row, head_dim, kKiviValueGroup, v);
}

}  // namespace oscar::quant
