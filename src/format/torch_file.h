// A `.pt` file written by `torch.save` (the zip format, torch >= 1.6), read without Python and
// without executing anything: the archive (torch_zip.h), its pickle (torch_pickle.h) and its
// float32 storages, cross-checked.
//
// Goals: open a file, check the archive layout (exactly one "<prefix>/data.pkl" under a single
// top-level folder, whose name is taken from that record and never from the file name;
// "<prefix>/version" = 3; "<prefix>/byteorder" absent or "little"; every storage the pickle
// references present as "<prefix>/data/<key>" with exactly numel × 4 bytes and a good CRC), then
// hand out tensors as contiguous float32 copies, with offset + Σ (size−1)·stride checked against
// the storage before a single element is read. Non-goals: the legacy non-zip format (refused:
// the OSCAR release never writes it), other dtypes, big-endian files, writing.
// Versioning: torch's serialization version 3 is the only one accepted (every file seen);
// another is refused by number.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "core/status.h"
#include "format/torch_pickle.h"
#include "format/torch_zip.h"

namespace oscar::format {

// A tensor copied out of a torch file: row-major, contiguous.
struct FloatTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // [prod(shape)]
};

class TorchFile {
 public:
  // Maps and parses `path`.
  static Result<TorchFile> open(const std::string& path);
  // Parses bytes held in memory (fuzzer, tests). `bytes` must outlive the result; `label` names
  // the file in messages.
  static Result<TorchFile> parse(std::span<const uint8_t> bytes, const std::string& label);

  const PickleGraph& pickle() const { return pickle_; }
  const PyValue& root() const { return pickle_.at(pickle_.root); }
  const std::string& label() const { return label_; }
  const std::string& prefix() const { return prefix_; }  // archive folder, e.g. "k_rotation_qqt_r_h_pbr"
  std::span<const uint8_t> bytes() const { return bytes_; }  // the whole file

  // Copies the tensor `t` (a kTensor value of pickle()) into a contiguous float array.
  // `what` names it in errors ("layer 3 rotation").
  Result<FloatTensor> tensor(const PyValue& t, const std::string& what) const;

 private:
  std::shared_ptr<MappedFile> file_;  // set by open(); keeps bytes_ valid
  std::span<const uint8_t> bytes_;
  std::string label_;
  std::string prefix_;
  PickleGraph pickle_;
  std::map<std::string, std::span<const uint8_t>> storage_bytes_;  // key -> data/<key> bytes
};

}  // namespace oscar::format
