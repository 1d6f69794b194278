// UTF-8 for the tokenizer and the Jinja interpreter: one decoder (decode_at), with validation,
// repair, codepoint strings and the split of a stream at an incomplete character built on it, and
// the encoder. Not here: Unicode properties and normalization (utf8proc, where a library needs
// them), or the byte-at-a-time validator of the tool-call constraint (engine/tool_constraint.h).
// Tested in tests/core/test_utf8.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace oscar::utf8 {

inline constexpr char32_t kReplacement = U'\uFFFD';

// Which byte sequences decode_at accepts.
enum class Decoding {
  // Well-formed UTF-8 only (Unicode table 3-7: no overlong forms, surrogates or codepoints above
  // U+10FFFF). An ill-formed sequence is rejected as its maximal invalid subpart, the Unicode
  // "best practice" that Python's errors="replace" and Rust's from_utf8_lossy follow.
  kStrict,
  // A lead byte C0..F7 and its continuation bytes, whatever they encode (overlong forms,
  // surrogates, up to 0x1FFFFF); anything else is rejected one byte at a time. The Jinja
  // interpreter reads its strings this way, so that a lone surrogate written by "\ud800" stays
  // one character, as in a Python str.
  kLoose,
};

struct Decoded {
  char32_t cp = 0;         // the codepoint; kReplacement when !ok
  size_t len = 0;          // bytes consumed, >= 1
  bool ok = false;         // false: s[i, i + len) is ill-formed
  bool truncated = false;  // !ok and s[i, end) is a valid prefix of a longer sequence (kStrict)
};

// Decodes the sequence that starts at s[i]. Precondition: i < s.size().
Decoded decode_at(std::string_view s, size_t i, Decoding mode = Decoding::kStrict);

// decode_at(s, i, mode).cp, advancing i past the sequence.
inline char32_t next_codepoint(std::string_view s, size_t& i, Decoding mode = Decoding::kStrict) {
  const auto c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  const Decoded d = decode_at(s, i, mode);
  i += d.len;
  return d.cp;
}

// Appends the encoding of `cp` (1 to 4 bytes; surrogates are encoded like any other codepoint).
// Precondition: cp <= 0x1FFFFF (all that kLoose decodes).
void append(std::string& out, char32_t cp);
std::string encode(std::u32string_view s);

// Each ill-formed sequence becomes one kReplacement.
std::u32string decode(std::string_view s, Decoding mode = Decoding::kStrict);
// decode(s, mode).size(), without building the string.
size_t length(std::string_view s, Decoding mode = Decoding::kStrict);

// Well-formed (kStrict) throughout.
bool valid(std::string_view s);
// Each maximal invalid subpart becomes U+FFFD (kStrict); valid text comes back unchanged.
std::string repair(std::string_view s);
// Length (0..3) of a trailing incomplete but still completable sequence of `s`: the bytes a
// stream decoder holds back until the next chunk.
size_t incomplete_suffix(std::string_view s);

}  // namespace oscar::utf8
