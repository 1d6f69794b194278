#include "quant/row_codec.h"

#include "core/check.h"
#include "quant/bit_plan_layout.h"
#include "quant/bit_plan_quant.h"
#include "quant/int2_layout.h"
#include "quant/int2_quant.h"
#include "quant/kivi.h"

namespace oscar::quant {

namespace {

const RowCodec kCodecs[] = {
    {"int2", 2, [](int d, int G) { return int2_row_bytes(d, G); },
     [](const float* x, int d, int G, float clip, uint8_t* row) {
       return quantize_rows_int2(x, 1, d, G, clip, row);
     },
     [](const uint8_t* row, int d, int G, float* out) { dequantize_rows_int2(row, 1, d, G, out); }},
    {"int2-lloyd", 2, [](int d, int G) { return int2_row_bytes(d, G); },
     [](const float* x, int d, int G, float clip, uint8_t* row) {
       return quantize_rows_lloyd(x, 1, d, G, clip, row);
     },
     [](const uint8_t* row, int d, int G, float* out) {
       dequantize_rows_lloyd(row, 1, d, G, out);
     }},
    {"int3", 3, [](int d, int G) { return int3_row_bytes(d, G); },
     [](const float* x, int d, int G, float clip, uint8_t* row) {
       return quantize_row_int3_ref(x, d, G, clip, row);
     },
     [](const uint8_t* row, int d, int G, float* out) { dequantize_row_int3_ref(row, d, G, out); }},
    // The 1-bit row takes no clip: its two levels are the group's own Lloyd-Max levels.
    {"int1", 1, [](int d, int G) { return int1_row_bytes(d, G); },
     [](const float* x, int d, int G, float, uint8_t* row) {
       return quantize_row_int1_ref(x, d, G, row);
     },
     [](const uint8_t* row, int d, int G, float* out) { dequantize_row_int1_ref(row, d, G, out); }},
    {"kivi-value", 2, [](int d, int) { return kivi_value_row_bytes(d); },
     [](const float* x, int d, int, float, uint8_t* row) {
       return quantize_kivi_value_row_ref(x, d, row);
     },
     [](const uint8_t* row, int d, int, float* out) {
       dequantize_kivi_value_row_ref(row, d, out);
     }},
    {"kivi-key-block", 2, nullptr, nullptr, nullptr},  // not a row (checked in row_codec())
    {"int4", 4, [](int d, int G) { return int4_row_bytes(d, G); },
     [](const float* x, int d, int G, float clip, uint8_t* row) {
       return quantize_row_int4_ref(x, d, G, clip, row);
     },
     [](const uint8_t* row, int d, int G, float* out) { dequantize_row_int4_ref(row, d, G, out); }},
};

}  // namespace

const RowCodec& row_codec(RowFormat format) {
  const int i = static_cast<int>(format);
  OSCAR_CHECK(i >= 0 && i < static_cast<int>(sizeof(kCodecs) / sizeof(kCodecs[0])) &&
                  format != RowFormat::kKiviKeyBlock,
              "row format %d has no row codec (KIVI keys are blocks)", i);
  return kCodecs[i];
}

RowFormat hist_row_format(HistQuantizer quantizer, int kv, int bits) {
  if (quantizer == HistQuantizer::kKivi) return kv == 0 ? RowFormat::kKiviKeyBlock : RowFormat::kKiviValue;
  if (bits == 4) return RowFormat::kInt4;
  if (bits == 3) return RowFormat::kInt3;
  if (bits == 1) return RowFormat::kInt1;
  return quantizer == HistQuantizer::kInt2Lloyd ? RowFormat::kInt2Lloyd : RowFormat::kInt2Uniform;
}

}  // namespace oscar::quant
