// GPT-2 byte-level mapping and UTF-8 helpers (see byte_level.h).
#include "tokenizer/byte_level.h"

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

// Expected range of the second byte after lead byte `c` (UTF-8 well-formed table, Unicode 3.9).
// Returns the sequence length (2..4), or 0 when `c` is not a lead byte.
int lead_info(uint8_t c, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c == 0xE0) { lo = 0xA0; return 3; }
  if (c >= 0xE1 && c <= 0xEC) return 3;
  if (c == 0xED) { hi = 0x9F; return 3; }
  if (c >= 0xEE && c <= 0xEF) return 3;
  if (c == 0xF0) { lo = 0x90; return 4; }
  if (c >= 0xF1 && c <= 0xF3) return 4;
  if (c == 0xF4) { hi = 0x8F; return 4; }
  return 0;
}

// Length of the well-formed sequence at s[i], or 0 with `bad` = length of the maximal invalid
// subpart (>= 1), or 0 with `bad` = 0 and `truncated` when a valid prefix runs to the end.
size_t sequence_at(std::string_view s, size_t i, size_t& bad, bool& truncated) {
  bad = 0;
  truncated = false;
  const auto c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) return 1;
  uint8_t lo, hi;
  const int n = lead_info(c, lo, hi);
  if (n == 0) {
    bad = 1;
    return 0;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      truncated = true;
      bad = s.size() - i;
      return 0;
    }
    const auto d = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (d < l || d > h) {
      bad = static_cast<size_t>(k);
      return 0;
    }
  }
  return static_cast<size_t>(n);
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_codepoint() { return tables().b2c; }
const std::array<int16_t, kMaxMappedCodepoint>& codepoint_to_byte() { return tables().c2b; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t next_codepoint(std::string_view s, size_t& i) {
  const auto c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += static_cast<size_t>(n);
  return cp;
}

std::string token_to_bytes(std::string_view token) {
  const auto& c2b = codepoint_to_byte();
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const uint32_t cp = next_codepoint(token, i);
    if (cp >= static_cast<uint32_t>(kMaxMappedCodepoint) || c2b[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(c2b[cp]));
  }
  return out;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t bad;
    bool truncated;
    const size_t n = sequence_at(s, i, bad, truncated);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_repair(std::string_view s) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t bad;
    bool truncated;
    const size_t n = sequence_at(s, i, bad, truncated);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out.append(kReplacement, 3);
      i += bad;
    }
  }
  return out;
}

size_t utf8_incomplete_suffix(std::string_view s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const auto c = static_cast<uint8_t>(s[n - k]);
    if (c >= 0x80 && c <= 0xBF) continue;  // continuation byte: look further left
    size_t bad;
    bool truncated;
    sequence_at(s, n - k, bad, truncated);
    return truncated ? k : 0;
  }
  return 0;
}

bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace oscar::tok::byte_level
