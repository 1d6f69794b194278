// safetensors reading and writing. The checks follow the reference implementation (safetensors
// 0.4, `Metadata::validate`): the header length fits the file and the 100 MB cap, the header is a
// JSON object, every tensor's dtype/shape/data_offsets are well formed, and the byte ranges,
// sorted by offset, tile the data section exactly. nlohmann::json exceptions are caught here.
#include "format/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/check.h"

namespace oscar::format {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // the reference's MAX_HEADER_SIZE

// Parsed tensor entry before the data section is attached: offsets are relative to its start.
struct Entry {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

std::string json_type(const nlohmann::json& j) { return j.type_name(); }

// Reads a JSON number that must be a non-negative integer fitting int64.
Status read_nonneg_int(const nlohmann::json& j, const std::string& label, const std::string& name,
                       const char* what, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    if (*out > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return invalid_argument("%s: tensor '%s': %s %llu exceeds int64", label.c_str(),
                              name.c_str(), what, static_cast<unsigned long long>(*out));
    return Status();
  }
  if (j.is_number_integer())
    return invalid_argument("%s: tensor '%s': negative %s %lld", label.c_str(), name.c_str(), what,
                            static_cast<long long>(j.get<int64_t>()));
  return invalid_argument("%s: tensor '%s': %s must be a non-negative integer, got %s '%s'",
                          label.c_str(), name.c_str(), what, json_type(j).c_str(),
                          j.dump().substr(0, 40).c_str());
}

Result<Entry> parse_entry(const std::string& label, const std::string& name,
                          const nlohmann::json& info) {
  if (!info.is_object())
    return invalid_argument("%s: tensor '%s': entry must be a JSON object, got %s", label.c_str(),
                            name.c_str(), json_type(info).c_str());
  Entry e;
  e.view.name = name;

  auto dt = info.find("dtype");
  if (dt == info.end() || !dt->is_string())
    return invalid_argument("%s: tensor '%s': missing or non-string \"dtype\"", label.c_str(),
                            name.c_str());
  Result<DType> dtype = dtype_from_name(dt->get<std::string>());
  if (!dtype.ok()) return dtype.status().with_context(label + ": tensor '" + name + "'");
  e.view.dtype = dtype.value();

  auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array())
    return invalid_argument("%s: tensor '%s': missing or non-array \"shape\"", label.c_str(),
                            name.c_str());
  uint64_t numel = 1;
  for (const auto& d : *shape) {
    uint64_t dim = 0;
    OSCAR_RETURN_IF_ERROR(read_nonneg_int(d, label, name, "dim", &dim));
    if (__builtin_mul_overflow(numel, dim, &numel))
      return invalid_argument("%s: tensor '%s': shape %s overflows the element count",
                              label.c_str(), name.c_str(), shape->dump().c_str());
    e.view.shape.push_back(static_cast<int64_t>(dim));
  }
  if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return invalid_argument("%s: tensor '%s': shape %s overflows the element count",
                            label.c_str(), name.c_str(), shape->dump().c_str());
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.view.dtype)), &n_bytes))
    return invalid_argument("%s: tensor '%s': shape %s x %zu bytes overflows", label.c_str(),
                            name.c_str(), shape->dump().c_str(), dtype_size(e.view.dtype));

  auto offs = info.find("data_offsets");
  if (offs == info.end() || !offs->is_array() || offs->size() != 2)
    return invalid_argument("%s: tensor '%s': \"data_offsets\" must be an array [begin, end]",
                            label.c_str(), name.c_str());
  OSCAR_RETURN_IF_ERROR(read_nonneg_int((*offs)[0], label, name, "data offset", &e.begin));
  OSCAR_RETURN_IF_ERROR(read_nonneg_int((*offs)[1], label, name, "data offset", &e.end));
  if (e.begin > e.end)
    return invalid_argument("%s: tensor '%s': data_offsets [%llu, %llu] begin > end",
                            label.c_str(), name.c_str(), static_cast<unsigned long long>(e.begin),
                            static_cast<unsigned long long>(e.end));
  if (e.end - e.begin != n_bytes)
    return invalid_argument(
        "%s: tensor '%s': %s shape %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
        label.c_str(), name.c_str(), dtype_name(e.view.dtype), shape->dump().c_str(),
        static_cast<unsigned long long>(n_bytes), static_cast<unsigned long long>(e.begin),
        static_cast<unsigned long long>(e.end), static_cast<unsigned long long>(e.end - e.begin));
  e.view.n_bytes = static_cast<size_t>(n_bytes);
  return e;
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF32: return "F32";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
  }
  OSCAR_CHECK(false, "bad DType %d", static_cast<int>(dtype));
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF32: return 4;
    case DType::kI64: return 8;
    case DType::kI32: return 4;
  }
  OSCAR_CHECK(false, "bad DType %d", static_cast<int>(dtype));
}

Result<DType> dtype_from_name(const std::string& name) {
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F32") return DType::kF32;
  if (name == "I64") return DType::kI64;
  if (name == "I32") return DType::kI32;
  static const char* const kKnown[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16",
                                       "U16",  "U32", "F64", "U64",     "F4",      "F6_E2M3",
                                       "F6_E3M2", "F8_E8M0", "E8M0"};
  for (const char* k : kKnown) {
    if (name == k)
      return unimplemented("dtype %s is not supported (supported: BF16, F16, F32, I64, I32)",
                           name.c_str());
  }
  return invalid_argument("unknown dtype '%s'", name.substr(0, 40).c_str());
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated against overflow when the header was parsed
  return n;
}

std::vector<float> TensorView::to_f32() const {
  const size_t n = static_cast<size_t>(numel());
  OSCAR_CHECK(n * dtype_size(dtype) == n_bytes, "tensor %s: %zu elements vs %zu bytes",
              name.c_str(), n, n_bytes);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = data + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = bf16_to_f32(h);
        break;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = fp16_to_f32(h);
        break;
      }
      case DType::kF32: std::memcpy(&out[i], p, 4); break;
      case DType::kI32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        out[i] = static_cast<float>(v);
        break;
      }
      case DType::kI64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        out[i] = static_cast<float>(v);
        break;
      }
    }
  }
  return out;
}

std::vector<int64_t> TensorView::to_i64() const {
  OSCAR_CHECK(dtype == DType::kI64 || dtype == DType::kI32, "tensor %s: to_i64 on %s",
              name.c_str(), dtype_name(dtype));
  const size_t n = static_cast<size_t>(numel());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kI64) {
      std::memcpy(&out[i], data + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      out[i] = v;
    }
  }
  return out;
}

Result<SafetensorsFile> SafetensorsFile::parse(std::span<const uint8_t> bytes,
                                               const std::string& label) {
  const char* lb = label.c_str();
  if (bytes.size() < 8)
    return invalid_argument("%s: %zu bytes is too small for a safetensors file (needs an 8-byte "
                            "header length)", lb, bytes.size());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[static_cast<size_t>(i)];
  if (header_len > kMaxHeaderBytes)
    return out_of_range("%s: header length %llu exceeds the 100 MB cap (%llu)", lb,
                        static_cast<unsigned long long>(header_len),
                        static_cast<unsigned long long>(kMaxHeaderBytes));
  if (header_len > bytes.size() - 8)
    return invalid_argument("%s: header length %llu runs past the end of the file (%zu bytes)", lb,
                            static_cast<unsigned long long>(header_len), bytes.size());
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  const char* header_end = header_begin + header_len;
  if (header_len == 0 || header_begin[0] != '{')
    return invalid_argument("%s: header does not start with '{' (not a JSON object)", lb);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_end);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("%s: header is not valid JSON: %s", lb, e.what());
  }
  if (!header.is_object())
    return invalid_argument("%s: header must be a JSON object, got %s", lb,
                            json_type(header).c_str());

  SafetensorsFile file;
  file.path_ = label;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object())
        return invalid_argument("%s: __metadata__ must be an object of strings, got %s", lb,
                                json_type(*it).c_str());
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return invalid_argument("%s: __metadata__ value of '%s' must be a string, got %s", lb,
                                  m.key().c_str(), json_type(*m).c_str());
        file.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    OSCAR_ASSIGN_OR_RETURN(Entry e, parse_entry(label, it.key(), *it));
    entries.push_back(std::move(e));
  }

  // The ranges, sorted by offset, must tile [0, data_bytes) exactly (the reference's rule).
  const uint64_t data_bytes = bytes.size() - 8 - header_len;
  const uint8_t* data = bytes.data() + 8 + header_len;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t expected = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.end > data_bytes)
      return invalid_argument("%s: tensor '%s': data_offsets [%llu, %llu] run past the data "
                              "section (%llu bytes)", lb, e.view.name.c_str(),
                              static_cast<unsigned long long>(e.begin),
                              static_cast<unsigned long long>(e.end),
                              static_cast<unsigned long long>(data_bytes));
    if (e.begin < expected)
      return invalid_argument("%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' "
                              "(ends at %llu)", lb, e.view.name.c_str(),
                              static_cast<unsigned long long>(e.begin),
                              static_cast<unsigned long long>(e.end),
                              prev ? prev->view.name.c_str() : "?",
                              static_cast<unsigned long long>(expected));
    if (e.begin > expected)
      return invalid_argument("%s: tensor '%s': gap of %llu bytes in the data section before it "
                              "(data_offsets [%llu, %llu], previous tensor ends at %llu)", lb,
                              e.view.name.c_str(),
                              static_cast<unsigned long long>(e.begin - expected),
                              static_cast<unsigned long long>(e.begin),
                              static_cast<unsigned long long>(e.end),
                              static_cast<unsigned long long>(expected));
    expected = e.end;
    prev = &e;
  }
  if (expected != data_bytes)
    return invalid_argument("%s: tensors cover %llu of the %llu data bytes (trailing bytes are not "
                            "allowed)", lb, static_cast<unsigned long long>(expected),
                            static_cast<unsigned long long>(data_bytes));

  file.tensors_.reserve(entries.size());
  for (Entry& e : entries) {
    e.view.data = data + e.begin;
    file.tensors_.push_back(std::move(e.view));
  }
  return file;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  OSCAR_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  auto shared = std::make_shared<MappedFile>(std::move(mapped));
  OSCAR_ASSIGN_OR_RETURN(SafetensorsFile file, parse(shared->bytes(), path));
  file.file_ = std::move(shared);
  return file;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  for (const TensorView& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint ckpt;
  const bool single_file = dir.size() > 12 && dir.ends_with(".safetensors") && is_regular_file(dir);
  const std::string single = single_file ? dir : dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (single_file || is_regular_file(single)) {
    OSCAR_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single));
    ckpt.shards_.push_back(std::move(f));
  } else {
    Result<std::string> text = read_text_file(index_path);
    if (!text.ok())
      return not_found("%s: no model.safetensors or model.safetensors.index.json", dir.c_str());
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(text.value());
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument("%s: not valid JSON: %s", index_path.c_str(), e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return invalid_argument("%s: expected an object with a \"weight_map\" object",
                              index_path.c_str());
    const nlohmann::json& weight_map = index["weight_map"];
    std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensor names
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!it->is_string())
        return invalid_argument("%s: weight_map entry '%s' must be a file name string",
                                index_path.c_str(), it.key().c_str());
      std::string shard = it->get<std::string>();
      if (shard.empty() || shard[0] == '/' || shard.find("..") != std::string::npos)
        return invalid_argument("%s: weight_map entry '%s' names an invalid shard '%s'",
                                index_path.c_str(), it.key().c_str(), shard.c_str());
      by_shard[shard].push_back(it.key());
    }
    for (const auto& [shard, names] : by_shard) {
      const std::string shard_path = dir + "/" + shard;
      Result<SafetensorsFile> f = SafetensorsFile::open(shard_path);
      if (!f.ok()) {
        if (f.status().code() == StatusCode::kNotFound)
          return not_found("%s: shard '%s' named in model.safetensors.index.json is missing "
                           "(%zu tensors, e.g. '%s')", dir.c_str(), shard.c_str(), names.size(),
                           names.front().c_str());
        return f.status();
      }
      for (const std::string& name : names) {
        if (f->find(name) == nullptr)
          return not_found("%s: tensor '%s' is mapped to shard '%s' by the index but is not in it",
                           dir.c_str(), name.c_str(), shard.c_str());
      }
      ckpt.shards_.push_back(std::move(f).value());
    }
  }
  // Index every tensor only after shards_ stops growing: the views must not move afterwards.
  for (const SafetensorsFile& f : ckpt.shards_) {
    for (const TensorView& t : f.tensors()) {
      auto [it, inserted] = ckpt.by_name_.emplace(t.name, &t);
      if (!inserted)
        return invalid_argument("%s: tensor '%s' appears in both %s and another shard",
                                dir.c_str(), t.name.c_str(), f.path().c_str());
    }
  }
  return ckpt;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const TensorView*> Checkpoint::all() const {
  std::vector<const TensorView*> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(t);
  return out;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : by_name_) n += t->n_bytes;
  return n;
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name == "__metadata__" || t.name.empty() || !names.insert(t.name).second)
      return invalid_argument("%s: invalid or duplicate tensor name '%s'", path.c_str(),
                              t.name.c_str());
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
        return invalid_argument("%s: tensor '%s': bad shape", path.c_str(), t.name.c_str());
    }
    uint64_t n_bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &n_bytes) ||
        n_bytes != t.bytes.size())
      return invalid_argument("%s: tensor '%s': %zu bytes given, %s shape needs %llu",
                              path.c_str(), t.name.c_str(), t.bytes.size(), dtype_name(t.dtype),
                              static_cast<unsigned long long>(n_bytes));
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n_bytes}}};
    offset += n_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return not_found("%s: cannot open for writing", tmp.c_str());
    out.write(reinterpret_cast<const char*>(len_le), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const TensorToWrite& t : tensors)
      out.write(reinterpret_cast<const char*>(t.bytes.data()),
                static_cast<std::streamsize>(t.bytes.size()));
    out.flush();
    if (!out) return internal_error("%s: write failed", tmp.c_str());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return internal_error("%s: cannot rename %s into place", path.c_str(), tmp.c_str());
  return Status();
}

namespace {

// A 4-byte-element tensor (F32 or I32) from raw values; the shape must hold exactly n of them.
TensorToWrite four_byte_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                               const void* values, size_t n) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    OSCAR_CHECK(d >= 0, "tensor %s: negative dim %lld", name.c_str(), static_cast<long long>(d));
    numel *= d;
  }
  OSCAR_CHECK(static_cast<size_t>(numel) == n, "tensor %s: %lld elements vs %zu", name.c_str(),
              static_cast<long long>(numel), n);
  TensorToWrite t{name, dtype, std::move(shape), std::vector<uint8_t>(n * 4)};
  if (n > 0) std::memcpy(t.bytes.data(), values, t.bytes.size());
  return t;
}

}  // namespace

TensorToWrite f32_tensor(const std::string& name, std::vector<int64_t> shape,
                         std::span<const float> values) {
  return four_byte_tensor(name, DType::kF32, std::move(shape), values.data(), values.size());
}

TensorToWrite i32_tensor(const std::string& name, std::vector<int64_t> shape,
                         std::span<const int32_t> values) {
  return four_byte_tensor(name, DType::kI32, std::move(shape), values.data(), values.size());
}

}  // namespace oscar::format
