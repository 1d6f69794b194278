// Cache mode names (see modes.h).
#include "quant/modes.h"

#include <string>

namespace oscar::quant {
namespace {
constexpr CacheMode kAllModes[] = {
    CacheMode::kBF16,         CacheMode::kF32,    CacheMode::kInt2Naive,
    CacheMode::kInt2Hadamard, CacheMode::kKivi2,  CacheMode::kOscar,
    CacheMode::kOscarLloyd,   CacheMode::kOscar4, CacheMode::kOscar3};
}  // namespace

const char* cache_mode_name(CacheMode mode) {
  switch (mode) {
    case CacheMode::kBF16: return "bf16";
    case CacheMode::kF32: return "f32";
    case CacheMode::kInt2Naive: return "int2-naive";
    case CacheMode::kInt2Hadamard: return "int2-hadamard";
    case CacheMode::kKivi2: return "kivi2";
    case CacheMode::kOscar: return "oscar";
    case CacheMode::kOscarLloyd: return "oscar-lloyd";
    case CacheMode::kOscar4:
      return "oscar4";
    case CacheMode::kOscar3:
      return "oscar3";
  }
  return "unknown";
}

Result<CacheMode> parse_cache_mode(std::string_view name) {
  std::string accepted;
  for (CacheMode m : kAllModes) {
    if (name == cache_mode_name(m)) return m;
    if (!accepted.empty()) accepted += ", ";
    accepted += cache_mode_name(m);
  }
  return invalid_argument("unknown cache mode '%.*s' (accepted: %s)",
                          static_cast<int>(name.size()), name.data(), accepted.c_str());
}

bool cache_mode_is_quantized(CacheMode mode) {
  return mode != CacheMode::kBF16 && mode != CacheMode::kF32;
}

bool cache_mode_is_oscar(CacheMode mode) {
  return mode == CacheMode::kOscar || mode == CacheMode::kOscarLloyd ||
         mode == CacheMode::kOscar4 || mode == CacheMode::kOscar3;
}

int cache_mode_fixed_bits(CacheMode mode) {
  return mode == CacheMode::kOscar4 ? 4 : mode == CacheMode::kOscar3 ? 3 : 0;
}

}  // namespace oscar::quant
