// Test helpers: hand-built torch archives and pickle fragments (protocol 2), for the reader's
// tests (tests/format/test_torch_file.cpp) and the importer's (tests/quant/test_rotation_zoo.cpp).
// A minimal stored-zip writer, not torch's layout (no ZIP64 end record, no 64-byte alignment).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "format/torch_zip.h"

namespace oscar::format {

// A stored zip of `records` (name, bytes), the way a minimal writer lays it out.
inline std::vector<uint8_t> make_zip(const std::vector<std::pair<std::string, std::string>>& records) {
  std::vector<uint8_t> out, cd;
  auto put16 = [](std::vector<uint8_t>& v, uint32_t x) {
    v.push_back(x & 0xFF);
    v.push_back((x >> 8) & 0xFF);
  };
  auto put32 = [&](std::vector<uint8_t>& v, uint32_t x) {
    put16(v, x & 0xFFFF);
    put16(v, x >> 16);
  };
  for (const auto& [name, data] : records) {
    const uint32_t crc = crc32({reinterpret_cast<const uint8_t*>(data.data()), data.size()});
    const uint32_t local = static_cast<uint32_t>(out.size());
    put32(out, 0x04034b50);
    put16(out, 20); put16(out, 0); put16(out, 0); put16(out, 0); put16(out, 0);
    put32(out, crc); put32(out, static_cast<uint32_t>(data.size()));
    put32(out, static_cast<uint32_t>(data.size()));
    put16(out, static_cast<uint32_t>(name.size())); put16(out, 0);
    out.insert(out.end(), name.begin(), name.end());
    out.insert(out.end(), data.begin(), data.end());
    put32(cd, 0x02014b50);
    put16(cd, 20); put16(cd, 20); put16(cd, 0); put16(cd, 0); put16(cd, 0); put16(cd, 0);
    put32(cd, crc); put32(cd, static_cast<uint32_t>(data.size()));
    put32(cd, static_cast<uint32_t>(data.size()));
    put16(cd, static_cast<uint32_t>(name.size())); put16(cd, 0); put16(cd, 0); put16(cd, 0);
    put16(cd, 0); put32(cd, 0); put32(cd, local);
    cd.insert(cd.end(), name.begin(), name.end());
  }
  const uint32_t cd_offset = static_cast<uint32_t>(out.size());
  out.insert(out.end(), cd.begin(), cd.end());
  put32(out, 0x06054b50);
  put16(out, 0); put16(out, 0);
  put16(out, static_cast<uint32_t>(records.size())); put16(out, static_cast<uint32_t>(records.size()));
  put32(out, static_cast<uint32_t>(cd.size())); put32(out, cd_offset); put16(out, 0);
  return out;
}

// Pickle fragments (protocol 2).
inline std::string str(const std::string& s) {
  std::string o = "X";
  const uint32_t n = static_cast<uint32_t>(s.size());
  o += std::string(reinterpret_cast<const char*>(&n), 4) + s;
  return o;
}
inline std::string i1(int v) { return std::string("K") + static_cast<char>(v); }
inline std::string i2(int v) { return std::string("M") + static_cast<char>(v & 0xFF) + static_cast<char>(v >> 8); }
inline const std::string kProto = "\x80\x02";
// A string literal with its embedded NULs.
template <size_t N>
inline std::string B(const char (&a)[N]) {
  return std::string(a, N - 1);
}
// A _rebuild_tensor_v2 call over storage `key` of `numel` floats.
inline std::string tensor_pkl(const std::string& key, int numel, int offset, const std::string& size,
                       const std::string& stride) {
  return "ctorch._utils\n_rebuild_tensor_v2\n((" + str("storage") + "ctorch\nFloatStorage\n" +
         str(key) + str("cpu") + i2(numel) + "tQ" + i2(offset) + size + stride +
         "\x89" "ccollections\nOrderedDict\n)RtR";
}
// A torch file whose pickle is `pkl`, with storage records `data` (key -> bytes).
inline std::vector<uint8_t> torch_zip(const std::string& pkl,
                               const std::vector<std::pair<std::string, std::string>>& data = {}) {
  std::vector<std::pair<std::string, std::string>> recs = {{"t/data.pkl", pkl}};
  for (const auto& [k, v] : data) recs.push_back({"t/data/" + k, v});
  recs.push_back({"t/version", "3\n"});
  return make_zip(recs);
}
inline std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

}  // namespace oscar::format
