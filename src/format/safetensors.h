// safetensors reader: memory-mapped, single-file or sharded (model.safetensors.index.json).
//
// Goals: zero-copy access to tensors of Hugging Face checkpoints, golden files and rotation files,
// with every check the reference implementation makes (header length cap of 100 MB, valid JSON,
// offsets inside the data section, ranges that tile it without gaps or overlaps, numel x dtype
// size == byte range, computed with overflow-checked arithmetic, no negative dims). Non-goals:
// writing sharded files; dtypes other than those below (others are refused by name).
// Versioning: the format has no version field; we follow the reference's rules as of 0.4.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "core/status.h"

namespace oscar::format {

enum class DType { kBF16, kF16, kF32, kI64, kI32 };

const char* dtype_name(DType dtype);  // "BF16", "F16", ...
size_t dtype_size(DType dtype);
// "BF16" -> kBF16. Other safetensors dtypes ("F64", "U8", "F8_E4M3", ...) are Unimplemented,
// strings that are no safetensors dtype at all are InvalidArgument; both name the string.
Result<DType> dtype_from_name(const std::string& name);

// "[2, 128, 128]": a shape as error messages and tools print it.
std::string shape_string(const std::vector<int64_t>& shape);

// A view of one tensor inside a mapped file. Valid while the owning SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // little-endian, row-major, not necessarily aligned
  size_t n_bytes = 0;

  int64_t numel() const;
  // Copies into float, converting BF16/F16/F32 (and I32/I64 by value).
  std::vector<float> to_f32() const;
  std::vector<int64_t> to_i64() const;  // I32/I64 only (checked)
};

// One .safetensors file, memory-mapped.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  // Parses a header + data held in memory (used by the fuzzer and tests). `bytes` must outlive
  // the result.
  static Result<SafetensorsFile> parse(std::span<const uint8_t> bytes, const std::string& label);

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  std::shared_ptr<MappedFile> file_;  // shared so views can be copied with the file
  std::string path_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json + shards.
// Move-only: by_name_ points into shards_, so a copy would dangle.
class Checkpoint {
 public:
  Checkpoint() = default;
  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // `dir` holds model.safetensors (preferred) or model.safetensors.index.json naming the shards
  // in "weight_map". A path to a single .safetensors file is accepted too.
  static Result<Checkpoint> open(const std::string& dir);

  const TensorView* find(const std::string& name) const;
  // Every tensor of every shard, sorted by name.
  std::vector<const TensorView*> all() const;
  size_t total_bytes() const;

 private:
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, const TensorView*> by_name_;
};

// Writes a single safetensors file (rotation files, test fixtures), as the reference does: the
// JSON header is padded with spaces to a multiple of 8 bytes, then the tensors follow contiguously
// in the given order (the format forbids gaps, so tensor data is not padded). `bytes` of each
// tensor must hold exactly numel x dtype_size bytes. Writes PATH.tmp, then renames it.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata);
// An F32 tensor from values (checked: values.size() == product of shape).
TensorToWrite f32_tensor(const std::string& name, std::vector<int64_t> shape,
                         std::span<const float> values);
// An I32 tensor from values (checked likewise).
TensorToWrite i32_tensor(const std::string& name, std::vector<int64_t> shape,
                         std::span<const int32_t> values);

}  // namespace oscar::format
