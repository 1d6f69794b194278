// A restricted reader for the pickle (`data.pkl`) inside a torch zip archive: the subset of
// pickle protocols 2-4 that `torch.save` of plain dicts of float32 tensors produces, decoded into
// an inert value graph. Nothing is ever executed or imported.
//
// Goals: read exactly what the OSCAR release's RotationZoo files use (the opcode table and the
// three globals of docs/formats/rotationzoo.md) and refuse everything else at the opcode that
// introduces it, with a message naming the opcode (or the global) and its byte offset. Every
// length, memo index and stack access is bounds-checked; the values are held in one arena and
// refer to each other by index, so memo sharing (the release's hadamard files reuse one tensor
// object for every layer) costs nothing and even a self-referencing container cannot leak.
// Non-goals: general unpickling (no BUILD, NEWOBJ, INST, OBJ, EXT*, lists of bytes, sets, ...),
// other storage dtypes than float32, the legacy non-zip torch format.
// Versioning: pickle protocols are frozen; PROTO 2..5 headers are accepted (torch writes 2),
// and the opcodes below are the whole allow-list. A new torch that writes another opcode or
// global is refused by name rather than misread.
//
// Allowed opcodes: PROTO FRAME STOP MARK EMPTY_DICT EMPTY_LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2
// TUPLE3 SETITEM SETITEMS APPEND APPENDS BINUNICODE SHORT_BINUNICODE BININT BININT1 BININT2
// LONG1 NEWTRUE NEWFALSE NONE BINFLOAT BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET GLOBAL
// STACK_GLOBAL BINPERSID REDUCE.
// Allowed globals: torch._utils._rebuild_tensor_v2, collections.OrderedDict, torch.FloatStorage;
// the only calls are OrderedDict() (an empty dict) and _rebuild_tensor_v2(storage, offset, size,
// stride, requires_grad, OrderedDict()) (a tensor view of a storage); the only persistent id is
// ('storage', torch.FloatStorage, key, location, numel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace oscar::format {

enum class PyKind { kNone, kBool, kInt, kFloat, kStr, kTuple, kList, kDict, kGlobal, kStorage,
                    kTensor };
const char* py_kind_name(PyKind kind);  // "None", "bool", "int", ..., "tensor"

// The three callables/classes a torch pickle may name.
enum class TorchGlobal { kRebuildTensorV2, kOrderedDict, kFloatStorage };

// One value of the graph. Containers hold indices into PickleGraph::values.
struct PyValue {
  PyKind kind = PyKind::kNone;
  int64_t i = 0;                // kBool (0/1), kInt; kStorage: numel (elements)
  double f = 0.0;               // kFloat
  std::string s;                // kStr; kStorage: the key ("0", "1", ...)
  std::vector<uint32_t> items;  // kTuple, kList: elements; kDict: key0, value0, key1, value1, ...
  TorchGlobal global = TorchGlobal::kOrderedDict;  // kGlobal
  // kTensor: a float32 view of storage `storage` (index of a kStorage value), in elements.
  uint32_t storage = 0;
  int64_t storage_offset = 0;
  std::vector<int64_t> sizes, strides;
};

// A storage the pickle references: ('storage', FloatStorage, key, location, numel).
struct StorageRef {
  std::string key;       // the record is "<prefix>/data/<key>"
  int64_t numel = 0;     // float32 elements
  std::string location;  // "cpu", "cuda:0", ... (informational)
};

struct PickleGraph {
  std::vector<PyValue> values;                 // the arena
  uint32_t root = 0;                           // the value STOP returned
  std::map<std::string, StorageRef> storages;  // by key, every storage referenced

  const PyValue& at(uint32_t index) const { return values.at(index); }
  // Dict lookup by str key; nullptr when absent (precondition: `dict` is a kDict).
  const PyValue* dict_get(const PyValue& dict, const std::string& key) const;
};

// Parses `bytes` (a data.pkl). `label` names it in every message ("FILE: data.pkl byte 41: ...").
// Limits: at most `max_values` values and memo entries (each opcode creates at most one; a
// 36-layer release file has about 1,500 and the 300-layer fixture about 5,000), which bounds the
// arena at about 40 MB whatever the input.
Result<PickleGraph> parse_torch_pickle(std::span<const uint8_t> bytes, const std::string& label,
                                       size_t max_values = size_t{1} << 18);

}  // namespace oscar::format
