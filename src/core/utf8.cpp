// UTF-8 decoding and encoding (see utf8.h).
#include "core/utf8.h"

#include "core/check.h"

namespace oscar::utf8 {
namespace {

// Sequence length (2..4) of lead byte `c` and the range [lo, hi] its second byte must fall in,
// or 0 when `c` does not start a sequence. Every later byte is a continuation byte 80..BF.
int lead_info(uint8_t c, Decoding mode, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (mode == Decoding::kLoose) {
    if ((c >> 5) == 0x6) return 2;
    if ((c >> 4) == 0xE) return 3;
    if ((c >> 3) == 0x1E) return 4;
    return 0;
  }
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c == 0xE0) {
    lo = 0xA0;
    return 3;
  }
  if (c >= 0xE1 && c <= 0xEC) return 3;
  if (c == 0xED) {
    hi = 0x9F;
    return 3;
  }
  if (c >= 0xEE && c <= 0xEF) return 3;
  if (c == 0xF0) {
    lo = 0x90;
    return 4;
  }
  if (c >= 0xF1 && c <= 0xF3) return 4;
  if (c == 0xF4) {
    hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

Decoded decode_at(std::string_view s, size_t i, Decoding mode) {
  OSCAR_DCHECK(i < s.size(), "utf8::decode_at: offset %zu past the end (%zu bytes)", i, s.size());
  const auto c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) return {c, 1, true, false};
  // The loose decoder gives up one byte at a time, the strict one on the maximal invalid subpart.
  const auto reject = [&](size_t bad, bool truncated) {
    return Decoded{kReplacement, mode == Decoding::kLoose ? size_t{1} : bad, false, truncated};
  };
  uint8_t lo, hi;
  const int n = lead_info(c, mode, lo, hi);
  if (n == 0) return reject(1, false);
  char32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return reject(s.size() - i, mode == Decoding::kStrict);
    const auto d = static_cast<uint8_t>(s[i + k]);
    if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF))
      return reject(static_cast<size_t>(k), false);
    cp = (cp << 6) | (d & 0x3F);
  }
  return {cp, static_cast<size_t>(n), true, false};
}

void append(std::string& out, char32_t cp) {
  OSCAR_DCHECK(cp <= 0x1FFFFF, "utf8::append: codepoint 0x%x needs more than 4 bytes",
               static_cast<unsigned>(cp));
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

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) append(out, cp);
  return out;
}

std::u32string decode(std::string_view s, Decoding mode) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(next_codepoint(s, i, mode));
  return out;
}

size_t length(std::string_view s, Decoding mode) {
  size_t n = 0;
  size_t i = 0;
  for (; i < s.size(); ++n) next_codepoint(s, i, mode);
  return n;
}

bool valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Decoded d = decode_at(s, i);
    if (!d.ok) return false;
    i += d.len;
  }
  return true;
}

std::string repair(std::string_view s) {
  static constexpr char kReplacementBytes[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Decoded d = decode_at(s, i);
    if (d.ok) {
      out.append(s.data() + i, d.len);
    } else {
      out.append(kReplacementBytes, 3);
    }
    i += d.len;
  }
  return out;
}

size_t incomplete_suffix(std::string_view s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const auto c = static_cast<uint8_t>(s[n - k]);
    if (c >= 0x80 && c <= 0xBF) continue;  // continuation byte: look further left
    return decode_at(s, n - k).truncated ? k : 0;
  }
  return 0;
}

}  // namespace oscar::utf8
