// sha256_hex: the hex digest of core/sha256.h's SHA-256 (the one implementation, FIPS 180-4).
#include "format/sha256.h"

#include "core/sha256.h"

namespace oscar::format {

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  const Sha256Digest d = h.finish();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    out[2 * i] = kHex[d[i] >> 4];
    out[2 * i + 1] = kHex[d[i] & 15];
  }
  return out;
}

}  // namespace oscar::format
