// SHA-256 (FIPS 180-4) of a byte string, as 64 lowercase hex digits. Used to fingerprint
// config.json for rotation files (OSCAR.md section 7). Not constant-time and not for secrets.
#pragma once

#include <string>
#include <string_view>

namespace oscar::format {

std::string sha256_hex(std::string_view bytes);

}  // namespace oscar::format
