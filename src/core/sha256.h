// SHA-256 (FIPS 180-4): a small, dependency-free implementation for identifiers that must not
// collide, such as the chained block hashes of the KV-cache events (kv/kv_events.h). Not
// constant-time and not meant for secrets; there is no HMAC and no key handling here.
// Tested against the FIPS 180-4 example vectors (tests/core/test_sha256.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace oscar {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hasher: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> bytes);
  void update(const void* data, size_t n_bytes) {
    update(std::span<const uint8_t>(static_cast<const uint8_t*>(data), n_bytes));
  }
  Sha256Digest finish();  // the hasher must not be used afterwards

 private:
  void compress(const uint8_t* block);  // one 64-byte block

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffer_bytes_ = 0;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

Sha256Digest sha256(std::span<const uint8_t> bytes);

}  // namespace oscar
