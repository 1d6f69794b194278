// A read-only view of the zip archive that `torch.save` writes (PyTorchStreamWriter, miniz):
// the central directory, and the bytes of stored records.
//
// Goals: everything a torch `.pt` file needs and nothing more, with every size and offset checked
// (overflow-checked arithmetic, every range inside the buffer, the central directory before the
// end record, each record's data before the central directory, the local header's name equal to
// the central one) and each record's CRC-32 verified when it is read. Sizes and CRCs come from the
// central directory, because torch's local headers carry zeros (flag bit 3, data descriptors).
// ZIP64 end records and ZIP64 size/offset extras are understood (torch writes a ZIP64 end record
// even for small files). Non-goals: compressed or encrypted records (torch stores every record
// uncompressed; anything else is refused by name), multi-disk archives, writing.
// Versioning: the zip format is frozen; this follows APPNOTE 6.3 for the fields above.
// The format of what the records hold is torch_pickle.h / torch_file.h's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::format {

// CRC-32 (IEEE 802.3, the zip polynomial) of bytes.
uint32_t crc32(std::span<const uint8_t> bytes);

struct ZipRecord {
  std::string name;        // as stored (torch: "<prefix>/data.pkl", "<prefix>/data/0", ...)
  size_t data_offset = 0;  // first byte of the record's data in the archive
  size_t size = 0;         // bytes (stored: compressed size == uncompressed size)
  uint32_t crc = 0;        // CRC-32 from the central directory
};

class ZipArchive {
 public:
  // Parses the end record and the central directory of `bytes` (which must outlive the result).
  // `label` (usually the path) prefixes every error message. Refuses, by name: no end record
  // ("truncated or not a zip"), multi-disk archives, compressed or encrypted records, duplicate
  // names, and any offset or size outside the buffer.
  static Result<ZipArchive> parse(std::span<const uint8_t> bytes, const std::string& label);

  const std::vector<ZipRecord>& records() const { return records_; }
  const ZipRecord* find(const std::string& name) const;  // nullptr if absent
  // The record's bytes, after checking its CRC-32 (a mismatch is InvalidArgument).
  Result<std::span<const uint8_t>> read(const ZipRecord& record) const;
  const std::string& label() const { return label_; }

 private:
  std::span<const uint8_t> bytes_;
  std::string label_;
  std::vector<ZipRecord> records_;  // central-directory order
};

}  // namespace oscar::format
