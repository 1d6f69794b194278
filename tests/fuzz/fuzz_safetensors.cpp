// libFuzzer target: SafetensorsFile::parse on arbitrary bytes. Any input must either parse or
// return a Status; an accepted file's tensors must be fully readable (every byte in bounds).
#include <cstddef>
#include <cstdint>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oscar::format;
  oscar::Result<SafetensorsFile> file = SafetensorsFile::parse({data, size}, "fuzz");
  if (!file.ok()) return 0;
  volatile double sink = 0;
  for (const TensorView& t : file->tensors()) {
    if (file->find(t.name) == nullptr) __builtin_trap();
    if (t.dtype == DType::kI64 || t.dtype == DType::kI32) {
      for (int64_t v : t.to_i64()) sink = sink + static_cast<double>(v);
    } else {
      for (float v : t.to_f32()) sink = sink + v;
    }
  }
  return 0;
}
