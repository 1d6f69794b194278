// Internal to oscar_tokenizer: the GPT-2 "ByteLevel" byte <-> printable-character mapping and the
// White_Space test of the pre-tokenizer. UTF-8 itself is core/utf8.h; nothing here knows about
// vocabularies or merges.
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

// Byte-level token text ("Ġhello") -> raw bytes (" hello"). If some character is not in the
// mapping, the token's own UTF-8 bytes are returned unchanged (what HF's ByteLevel decoder does).
std::string token_to_bytes(std::string_view token);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(uint32_t cp);

}  // namespace oscar::tok::byte_level
