// libFuzzer target: the restricted torch .pt reader (format/torch_file.h: zip, pickle subset,
// storages) and the RotationZoo validation on top of it (quant/rotation_zoo.h), on arbitrary
// bytes. Any input must either be accepted or return a Status: no crash, no out-of-bounds read,
// no leak, no unbounded allocation; an accepted file's tensors must be fully readable.
#include <cstddef>
#include <cstdint>

#include "format/torch_file.h"
#include "quant/rotation_zoo.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oscar;
  auto f = format::TorchFile::parse({data, size}, "fuzz");
  if (f.ok()) {
    volatile double sink = 0;
    int n = 0;
    for (const format::PyValue& v : f->pickle().values) {
      if (v.kind != format::PyKind::kTensor || ++n > 32) continue;
      auto t = f->tensor(v, "t");
      if (t.ok())
        for (float x : t->data) sink = sink + x;
    }
  }
  // The importer's checks, for the shapes of the small seeds (head_dim 4) and the tiny model.
  (void)quant::parse_zoo_file({data, size}, "fuzz", quant::ZooKind::kKey, {0, 1}, 1, 4);
  (void)quant::parse_zoo_file({data, size}, "fuzz", quant::ZooKind::kValue, {0}, 2, 4);
  return 0;
}
