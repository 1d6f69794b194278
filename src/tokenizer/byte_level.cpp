// GPT-2 byte-level mapping (see byte_level.h).
#include "tokenizer/byte_level.h"

#include "core/utf8.h"

namespace oscar::tok::byte_level {
namespace {

struct Tables {
  std::array<uint32_t, 256> b2c{};
  std::array<int16_t, kMaxMappedCodepoint> c2b{};
  Tables() {
    c2b.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      b2c[b] = printable ? static_cast<uint32_t>(b) : next++;
      c2b[b2c[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_codepoint() { return tables().b2c; }
const std::array<int16_t, kMaxMappedCodepoint>& codepoint_to_byte() { return tables().c2b; }

std::string token_to_bytes(std::string_view token) {
  const auto& c2b = codepoint_to_byte();
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const uint32_t cp = utf8::next_codepoint(token, i);
    if (cp >= static_cast<uint32_t>(kMaxMappedCodepoint) || c2b[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(c2b[cp]));
  }
  return out;
}

bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace oscar::tok::byte_level
