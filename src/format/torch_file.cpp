// torch `.pt` zip files: archive layout, storages and tensor views (see torch_file.h).
#include "format/torch_file.h"

#include <cstring>

#include "format/safetensors.h"

namespace oscar::format {
namespace {

// Largest tensor handed out, in elements (64 MiB of float32): far above any rotation tensor
// ([n_kv_heads, d, d]), and a bound on what a stride-0 view could make us allocate.
constexpr int64_t kMaxTensorElements = int64_t{1} << 24;

}  // namespace

Result<TorchFile> TorchFile::open(const std::string& path) {
  OSCAR_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  auto file = std::make_shared<MappedFile>(std::move(mapped));
  OSCAR_ASSIGN_OR_RETURN(TorchFile t, parse(file->bytes(), path));
  t.file_ = std::move(file);
  return t;
}

Result<TorchFile> TorchFile::parse(std::span<const uint8_t> bytes, const std::string& label) {
  // The legacy format is a bare pickle stream (PROTO first, then the magic number as LONG1).
  if (!bytes.empty() && bytes[0] == 0x80)
    return unimplemented("%s: legacy (non-zip) torch serialization is not supported; the OSCAR "
                         "release writes only the zip format (torch.save's default since 1.6)",
                         label.c_str());
  OSCAR_ASSIGN_OR_RETURN(ZipArchive zip, ZipArchive::parse(bytes, label));
  TorchFile t;
  t.bytes_ = bytes;
  t.label_ = label;

  // The archive's folder, from its one "<prefix>/data.pkl".
  const ZipRecord* pkl = nullptr;
  for (const ZipRecord& r : zip.records()) {
    const size_t slash = r.name.find('/');
    if (r.name.size() > 9 && r.name.compare(r.name.size() - 9, 9, "/data.pkl") == 0) {
      if (slash != r.name.size() - 9)
        return invalid_argument("%s: record '%s': data.pkl is not directly under the archive's "
                                "folder", label.c_str(), r.name.c_str());
      if (pkl != nullptr)
        return invalid_argument("%s: two pickles, '%s' and '%s'", label.c_str(), pkl->name.c_str(),
                                r.name.c_str());
      pkl = &r;
    }
  }
  if (pkl == nullptr)
    return invalid_argument("%s: no '<folder>/data.pkl' record: a zip, but not a torch.save file",
                            label.c_str());
  t.prefix_ = pkl->name.substr(0, pkl->name.size() - 9);
  const std::string p = t.prefix_ + "/";

  const ZipRecord* version = zip.find(p + "version");
  if (version == nullptr)
    return invalid_argument("%s: record '%sversion' is missing", label.c_str(), p.c_str());
  OSCAR_ASSIGN_OR_RETURN(std::span<const uint8_t> vbytes, zip.read(*version));
  std::string v(reinterpret_cast<const char*>(vbytes.data()), vbytes.size());
  if (v != "3" && v != "3\n")
    return unimplemented("%s: torch serialization version '%s' is not supported (only 3)",
                         label.c_str(), v.substr(0, 16).c_str());
  if (const ZipRecord* bo = zip.find(p + "byteorder")) {
    OSCAR_ASSIGN_OR_RETURN(std::span<const uint8_t> b, zip.read(*bo));
    std::string order(reinterpret_cast<const char*>(b.data()), b.size());
    if (order != "little" && order != "little\n")
      return unimplemented("%s: byteorder '%s' is not supported (only little)", label.c_str(),
                           order.substr(0, 16).c_str());
  }

  OSCAR_ASSIGN_OR_RETURN(std::span<const uint8_t> pbytes, zip.read(*pkl));
  OSCAR_ASSIGN_OR_RETURN(t.pickle_, parse_torch_pickle(pbytes, label + ": data.pkl"));

  for (const auto& [key, ref] : t.pickle_.storages) {
    const ZipRecord* r = zip.find(p + "data/" + key);
    if (r == nullptr)
      return invalid_argument("%s: storage record data/%s referenced by the pickle but absent "
                              "from the archive", label.c_str(), key.c_str());
    const uint64_t need = static_cast<uint64_t>(ref.numel) * 4;
    if (r->size != need)
      return invalid_argument("%s: storage data/%s has %zu bytes, the pickle needs %lld float32 "
                              "(%llu bytes)", label.c_str(), key.c_str(), r->size,
                              static_cast<long long>(ref.numel),
                              static_cast<unsigned long long>(need));
    OSCAR_ASSIGN_OR_RETURN(t.storage_bytes_[key], zip.read(*r));
  }
  return t;
}

Result<FloatTensor> TorchFile::tensor(const PyValue& t, const std::string& what) const {
  if (t.kind != PyKind::kTensor)
    return invalid_argument("%s: %s is a %s, expected a tensor", label_.c_str(), what.c_str(),
                            py_kind_name(t.kind));
  const PyValue& st = pickle_.at(t.storage);
  auto it = storage_bytes_.find(st.s);
  if (st.kind != PyKind::kStorage || it == storage_bytes_.end())
    return internal_error("%s: %s: storage not resolved", label_.c_str(), what.c_str());
  const int64_t storage_numel = st.i;
  // numel and the last element's index, overflow-checked.
  int64_t numel = 1, last = t.storage_offset;
  for (size_t k = 0; k < t.sizes.size(); ++k) {
    if (__builtin_mul_overflow(numel, t.sizes[k], &numel) || numel > kMaxTensorElements)
      return invalid_argument("%s: %s of shape %s has more than %lld elements", label_.c_str(),
                              what.c_str(), shape_string(t.sizes).c_str(),
                              static_cast<long long>(kMaxTensorElements));
  }
  FloatTensor out;
  out.shape = t.sizes;
  if (numel == 0) return out;
  for (size_t k = 0; k < t.sizes.size(); ++k) {
    int64_t span = 0;
    if (__builtin_mul_overflow(t.sizes[k] - 1, t.strides[k], &span) ||
        __builtin_add_overflow(last, span, &last))
      return invalid_argument("%s: %s: offset/stride arithmetic overflows", label_.c_str(),
                              what.c_str());
  }
  if (last >= storage_numel)
    return invalid_argument("%s: %s (shape %s, stride %s, offset %lld) reaches element %lld of "
                            "storage %s, which has %lld", label_.c_str(), what.c_str(),
                            shape_string(t.sizes).c_str(), shape_string(t.strides).c_str(),
                            static_cast<long long>(t.storage_offset),
                            static_cast<long long>(last), st.s.c_str(),
                            static_cast<long long>(storage_numel));
  const uint8_t* base = it->second.data();
  out.data.resize(static_cast<size_t>(numel));
  const size_t nd = t.sizes.size();
  std::vector<int64_t> idx(nd, 0);
  for (int64_t e = 0; e < numel; ++e) {
    int64_t at = t.storage_offset;
    for (size_t k = 0; k < nd; ++k) at += idx[k] * t.strides[k];
    const uint8_t* b = base + static_cast<size_t>(at) * 4;
    const uint32_t bits = static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
                          (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
    std::memcpy(&out.data[static_cast<size_t>(e)], &bits, 4);
    for (size_t k = nd; k-- > 0;) {  // row-major increment
      if (++idx[k] < t.sizes[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

}  // namespace oscar::format
