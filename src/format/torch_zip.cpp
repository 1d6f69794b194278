// Zip central-directory reader for torch archives (see torch_zip.h).
#include "format/torch_zip.h"

#include <array>
#include <set>

namespace oscar::format {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50;        // end of central directory
constexpr uint32_t kZip64EocdSig = 0x06064b50;   // ZIP64 end of central directory
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr size_t kEocdBytes = 22;
constexpr size_t kZip64LocatorBytes = 20;
constexpr size_t kZip64EocdBytes = 56;
constexpr size_t kCentralBytes = 46;
constexpr size_t kLocalBytes = 30;
constexpr size_t kMaxRecords = size_t{1} << 20;

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t u64(const uint8_t* p) { return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32); }

// a + b <= limit without overflow.
bool fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

}  // namespace

uint32_t crc32(std::span<const uint8_t> bytes) {
  const auto& t = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t b : bytes) c = t[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

Result<ZipArchive> ZipArchive::parse(std::span<const uint8_t> bytes, const std::string& label) {
  const uint8_t* d = bytes.data();
  const uint64_t n = bytes.size();
  // 1. The end record: the last signature whose comment ends exactly at the end of the file.
  //    A truncated archive (a cut download) has none.
  int64_t eocd = -1;
  if (n >= kEocdBytes) {
    const uint64_t lowest = n - kEocdBytes > 0xFFFF ? n - kEocdBytes - 0xFFFF : 0;
    for (uint64_t at = n - kEocdBytes + 1; at-- > lowest;) {
      if (u32(d + at) == kEocdSig && at + kEocdBytes + u16(d + at + 20) == n) {
        eocd = static_cast<int64_t>(at);
        break;
      }
    }
  }
  if (eocd < 0)
    return invalid_argument("%s: truncated or not a zip archive: no end-of-central-directory "
                            "record", label.c_str());
  const uint8_t* e = d + eocd;
  uint64_t n_records = u16(e + 10), cd_size = u32(e + 12), cd_offset = u32(e + 16);
  if (u16(e + 4) != 0 || u16(e + 6) != 0 || u16(e + 8) != u16(e + 10))
    return unimplemented("%s: multi-disk zip archives are not supported", label.c_str());
  uint64_t cd_limit = static_cast<uint64_t>(eocd);  // the central directory ends before this
  // 2. ZIP64: the locator sits right before the end record; its values replace the sentinels.
  if (static_cast<uint64_t>(eocd) >= kZip64LocatorBytes &&
      u32(d + eocd - kZip64LocatorBytes) == kZip64LocatorSig) {
    const uint8_t* loc = d + eocd - kZip64LocatorBytes;
    const uint64_t z = u64(loc + 8);
    if (u32(loc + 4) != 0 || u32(loc + 16) > 1)
      return unimplemented("%s: multi-disk zip archives are not supported", label.c_str());
    if (!fits(z, kZip64EocdBytes, static_cast<uint64_t>(eocd) - kZip64LocatorBytes) ||
        u32(d + z) != kZip64EocdSig)
      return invalid_argument("%s: ZIP64 locator points at offset %llu, where no ZIP64 end "
                              "record is", label.c_str(), static_cast<unsigned long long>(z));
    const uint8_t* e64 = d + z;
    if (u32(e64 + 16) != 0 || u32(e64 + 20) != 0 || u64(e64 + 24) != u64(e64 + 32))
      return unimplemented("%s: multi-disk zip archives are not supported", label.c_str());
    n_records = u64(e64 + 32);
    cd_size = u64(e64 + 40);
    cd_offset = u64(e64 + 48);
    cd_limit = z;
  } else if (n_records == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    return invalid_argument("%s: the end record asks for ZIP64 values but no ZIP64 locator "
                            "precedes it", label.c_str());
  }
  if (!fits(cd_offset, cd_size, cd_limit))
    return invalid_argument("%s: central directory [%llu, +%llu) runs past its end record at %llu",
                            label.c_str(), static_cast<unsigned long long>(cd_offset),
                            static_cast<unsigned long long>(cd_size),
                            static_cast<unsigned long long>(cd_limit));
  if (n_records > kMaxRecords || n_records > cd_size / kCentralBytes)
    return invalid_argument("%s: %llu records cannot fit a central directory of %llu bytes",
                            label.c_str(), static_cast<unsigned long long>(n_records),
                            static_cast<unsigned long long>(cd_size));

  // 3. Central directory entries.
  ZipArchive zip;
  zip.bytes_ = bytes;
  zip.label_ = label;
  std::set<std::string> names;
  uint64_t at = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < n_records; ++i) {
    if (!fits(at, kCentralBytes, cd_end) || u32(d + at) != kCentralSig)
      return invalid_argument("%s: central directory entry %llu at offset %llu is damaged",
                              label.c_str(), static_cast<unsigned long long>(i),
                              static_cast<unsigned long long>(at));
    const uint8_t* c = d + at;
    const uint16_t flags = u16(c + 8), method = u16(c + 10);
    const uint32_t crc = u32(c + 16);
    uint64_t csize = u32(c + 20), usize = u32(c + 24), local = u32(c + 42);
    const uint16_t name_len = u16(c + 28), extra_len = u16(c + 30), comment_len = u16(c + 32);
    const uint64_t var = uint64_t{name_len} + extra_len + comment_len;
    if (!fits(at + kCentralBytes, var, cd_end))
      return invalid_argument("%s: central directory entry %llu runs past the directory",
                              label.c_str(), static_cast<unsigned long long>(i));
    std::string name(reinterpret_cast<const char*>(c + kCentralBytes), name_len);
    // ZIP64 extra (id 1): the 64-bit values of the fields that hold the sentinel, in this order.
    const uint8_t* x = c + kCentralBytes + name_len;
    for (uint32_t xo = 0; xo + 4 <= extra_len;) {
      const uint16_t id = u16(x + xo), len = u16(x + xo + 2);
      if (xo + 4u + len > extra_len) break;
      if (id == 1) {
        uint32_t p = xo + 4;
        for (uint64_t* field : {&usize, &csize, &local}) {
          if (*field != 0xFFFFFFFF) continue;
          if (p + 8 > xo + 4u + len)
            return invalid_argument("%s: record '%s': ZIP64 extra field too short", label.c_str(),
                                    name.c_str());
          *field = u64(x + p);
          p += 8;
        }
      }
      xo += 4u + len;
    }
    if (usize == 0xFFFFFFFF || csize == 0xFFFFFFFF || local == 0xFFFFFFFF)
      return invalid_argument("%s: record '%s' needs a ZIP64 extra field it lacks", label.c_str(),
                              name.c_str());
    if (flags & 0x0001)
      return unimplemented("%s: record '%s' is encrypted", label.c_str(), name.c_str());
    if (method != 0)
      return unimplemented("%s: record '%s' is compressed (method %u); torch stores every record "
                           "uncompressed and only stored records are read", label.c_str(),
                           name.c_str(), method);
    if (csize != usize)
      return invalid_argument("%s: stored record '%s' has compressed size %llu != size %llu",
                              label.c_str(), name.c_str(), static_cast<unsigned long long>(csize),
                              static_cast<unsigned long long>(usize));
    // The local header: its own name and extra lengths place the data.
    if (!fits(local, kLocalBytes, cd_offset) || u32(d + local) != kLocalSig)
      return invalid_argument("%s: record '%s': no local header at offset %llu", label.c_str(),
                              name.c_str(), static_cast<unsigned long long>(local));
    const uint16_t lname = u16(d + local + 26), lextra = u16(d + local + 28);
    if (!fits(local + kLocalBytes, uint64_t{lname} + lextra, cd_offset) || lname != name_len ||
        std::string(reinterpret_cast<const char*>(d + local + kLocalBytes), lname) != name)
      return invalid_argument("%s: record '%s': the local header names another record",
                              label.c_str(), name.c_str());
    const uint64_t data = local + kLocalBytes + lname + lextra;
    if (!fits(data, usize, cd_offset))
      return invalid_argument("%s: record '%s' ([%llu, +%llu)) runs into the central directory "
                              "at %llu (truncated?)", label.c_str(), name.c_str(),
                              static_cast<unsigned long long>(data),
                              static_cast<unsigned long long>(usize),
                              static_cast<unsigned long long>(cd_offset));
    if (!names.insert(name).second)
      return invalid_argument("%s: record '%s' appears twice", label.c_str(), name.c_str());
    zip.records_.push_back(
        ZipRecord{std::move(name), static_cast<size_t>(data), static_cast<size_t>(usize), crc});
    at += kCentralBytes + var;
  }
  return zip;
}

const ZipRecord* ZipArchive::find(const std::string& name) const {
  for (const ZipRecord& r : records_)
    if (r.name == name) return &r;
  return nullptr;
}

Result<std::span<const uint8_t>> ZipArchive::read(const ZipRecord& record) const {
  // Offsets were checked against the buffer at parse time.
  std::span<const uint8_t> s = bytes_.subspan(record.data_offset, record.size);
  const uint32_t got = crc32(s);
  if (got != record.crc)
    return invalid_argument("%s: record '%s' is damaged: CRC-32 %08x, central directory says %08x",
                            label_.c_str(), record.name.c_str(), got, record.crc);
  return s;
}

}  // namespace oscar::format
