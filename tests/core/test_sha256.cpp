// SHA-256 against the FIPS 180-4 / NIST example vectors: the empty message, "abc", the 448-bit
// two-block message, one million 'a' fed in uneven pieces (exercises the buffering), and every
// split point of a 130-byte message equal to the one-shot digest.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/sha256.h"

namespace oscar {
namespace {

std::string hex(const Sha256Digest& d) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

Sha256Digest sha_of(const std::string& s) {
  return sha256(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(hex(sha_of("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha_of("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, MillionAInUnevenPieces) {
  Sha256 h;
  const std::string a(1000, 'a');
  size_t fed = 0;
  for (size_t piece = 1; fed < 1000000; piece = piece % 97 + 1) {
    const size_t n = std::min({piece, size_t{1000000} - fed, a.size()});
    h.update(a.data(), n);
    fed += n;
  }
  EXPECT_EQ(hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, EverySplitPointEqualsOneShot) {
  std::vector<uint8_t> msg(130);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 37 + 11);
  const Sha256Digest whole = sha256(msg);
  for (size_t cut = 0; cut <= msg.size(); ++cut) {
    Sha256 h;
    h.update(msg.data(), cut);
    h.update(msg.data() + cut, msg.size() - cut);
    EXPECT_EQ(h.finish(), whole) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace oscar
