// Internal to oscar_tokenizer: the GPT-2 "ByteLevel" byte <-> printable-character mapping and the
// small UTF-8 routines the tokenizer needs (validation, repair, codepoint iteration, holding back an
// incomplete trailing character). Public UTF-8 helpers are re-exported from tokenizer.h; nothing
// here knows about vocabularies or merges.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace oscar::tok::byte_level {

// GPT-2 bytes_to_unicode(): bytes 33..126, 161..172 and 174..255 map to the same codepoint; the
// other 68 bytes map, in byte order, to 256, 257, ... 323. Every codepoint is < 324.
inline constexpr int kMaxMappedCodepoint = 324;

// [256] codepoint of each byte.
const std::array<uint32_t, 256>& byte_to_codepoint();
// [kMaxMappedCodepoint] byte of each mapped codepoint, -1 where none.
const std::array<int16_t, kMaxMappedCodepoint>& codepoint_to_byte();

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value).
void append_utf8(std::string& out, uint32_t cp);

// Decodes one codepoint at s[i] of VALID UTF-8, advancing i.
uint32_t next_codepoint(std::string_view s, size_t& i);

// Byte-level token text ("Ġhello") -> raw bytes (" hello"). If some character is not in the
// mapping, the token's own UTF-8 bytes are returned unchanged (what HF's ByteLevel decoder does).
std::string token_to_bytes(std::string_view token);

bool utf8_valid(std::string_view s);
// Each maximal invalid subpart -> U+FFFD (Unicode best practice; Rust from_utf8_lossy).
std::string utf8_repair(std::string_view s);
// Length (0..3) of a trailing incomplete-but-still-completable UTF-8 sequence of `s`.
size_t utf8_incomplete_suffix(std::string_view s);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(uint32_t cp);

}  // namespace oscar::tok::byte_level
