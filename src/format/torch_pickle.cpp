// Restricted torch pickle reader (see torch_pickle.h).
#include "format/torch_pickle.h"

#include <cstring>
#include <unordered_map>

namespace oscar::format {
namespace {

// Every pickle opcode (protocols 0-5), so that a refusal names the one it met.
const char* opcode_name(uint8_t op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// A name from the file, safe to print (non-printable bytes become '?', long names are cut).
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 80) out += "...";
  return out;
}

constexpr int kMaxTensorDims = 8;

class Parser {
 public:
  Parser(std::span<const uint8_t> bytes, const std::string& label, size_t max_values)
      : p_(bytes.data()), n_(bytes.size()), label_(label), max_values_(max_values) {}

  Result<PickleGraph> run() {
    while (true) {
      if (pos_ >= n_) return fail("the pickle ends without STOP (truncated?)");
      op_pos_ = pos_;
      op_ = p_[pos_++];
      if (op_ == '.') {  // STOP
        if (!marks_.empty()) return fail("STOP with an open MARK");
        if (stack_.size() != 1)
          return fail(str_format("STOP with %zu values on the stack, expected 1", stack_.size()));
        if (pos_ != n_)
          return fail(str_format("%zu trailing bytes after STOP", n_ - pos_));
        g_.root = stack_[0];
        return std::move(g_);
      }
      Status st = step();
      if (!st.ok()) return st;
    }
  }

 private:
  Status fail(const std::string& what) const {
    return invalid_argument("%s byte %zu: %s", label_.c_str(), op_pos_, what.c_str());
  }
  Status refuse_opcode() const {
    const char* name = opcode_name(op_);
    if (name == nullptr)
      return invalid_argument("%s byte %zu: 0x%02x is not a pickle opcode", label_.c_str(), op_pos_,
                              op_);
    return unimplemented("%s byte %zu: opcode %s (0x%02x) is outside the torch subset this reader "
                         "accepts; refused", label_.c_str(), op_pos_, name, op_);
  }
  const char* op_name() const { return opcode_name(op_); }

  // Argument bytes.
  Status need(size_t k) const {
    if (k > n_ - pos_)
      return fail(str_format("%s needs %zu argument bytes, %zu remain (truncated?)", op_name(), k,
                             n_ - pos_));
    return Status();
  }
  uint64_t le(size_t k) {  // precondition: need(k)
    uint64_t v = 0;
    for (size_t b = 0; b < k; ++b) v |= static_cast<uint64_t>(p_[pos_ + b]) << (8 * b);
    pos_ += k;
    return v;
  }

  // Values.
  Result<uint32_t> make(PyValue v) {
    if (g_.values.size() >= max_values_)
      return fail(str_format("more than %zu values", max_values_));
    g_.values.push_back(std::move(v));
    return static_cast<uint32_t>(g_.values.size() - 1);
  }
  Status push_new(PyValue v) {
    OSCAR_ASSIGN_OR_RETURN(uint32_t idx, make(std::move(v)));
    stack_.push_back(idx);
    return Status();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // Pops one value above the current mark.
  Result<uint32_t> pop() {
    if (stack_.size() <= floor()) return fail(str_format("%s: stack underflow", op_name()));
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  // Pops everything above the innermost mark and the mark itself.
  Result<std::vector<uint32_t>> pop_to_mark() {
    if (marks_.empty()) return fail(str_format("%s without MARK", op_name()));
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  PyValue& val(uint32_t i) { return g_.values[i]; }

  Status push_tuple(std::vector<uint32_t> items) {
    PyValue t;
    t.kind = PyKind::kTuple;
    t.items = std::move(items);
    return push_new(std::move(t));
  }
  Status push_tuple_n(int k) {
    std::vector<uint32_t> items(static_cast<size_t>(k));
    for (int j = k - 1; j >= 0; --j) {
      OSCAR_ASSIGN_OR_RETURN(items[static_cast<size_t>(j)], pop());
    }
    return push_tuple(std::move(items));
  }

  Status set_item(uint32_t dict, uint32_t key, uint32_t value) {
    if (val(dict).kind != PyKind::kDict)
      return fail(str_format("%s into a %s, expected a dict", op_name(),
                             py_kind_name(val(dict).kind)));
    const PyValue& k = val(key);
    std::string hkey;
    if (k.kind == PyKind::kStr) hkey.append("s").append(k.s);
    else if (k.kind == PyKind::kInt) hkey.append("i").append(std::to_string(k.i));
    else
      return fail(str_format("%s: dict key of type %s; only str and int keys are accepted",
                             op_name(), py_kind_name(k.kind)));
    auto& index = dict_index_[dict];
    auto [it, fresh] = index.emplace(hkey, val(dict).items.size());
    if (fresh) {
      val(dict).items.push_back(key);
      val(dict).items.push_back(value);
    } else {
      val(dict).items[it->second + 1] = value;  // Python semantics: the last value wins
    }
    return Status();
  }

  Status append(uint32_t list, uint32_t value) {
    if (val(list).kind != PyKind::kList)
      return fail(str_format("%s into a %s, expected a list", op_name(),
                             py_kind_name(val(list).kind)));
    val(list).items.push_back(value);
    return Status();
  }

  Status memo_put(uint64_t id) {
    if (stack_.size() <= floor()) return fail(str_format("%s with an empty stack", op_name()));
    if (memo_.size() >= max_values_) return fail(str_format("more than %zu memo entries", max_values_));
    memo_[id] = stack_.back();
    return Status();
  }
  Status memo_get(uint64_t id) {
    auto it = memo_.find(id);
    if (it == memo_.end())
      return fail(str_format("%s %llu: no such memo entry", op_name(),
                             static_cast<unsigned long long>(id)));
    stack_.push_back(it->second);
    return Status();
  }

  Status push_global(const std::string& module, const std::string& name) {
    PyValue v;
    v.kind = PyKind::kGlobal;
    if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      v.global = TorchGlobal::kRebuildTensorV2;
    } else if (module == "collections" && name == "OrderedDict") {
      v.global = TorchGlobal::kOrderedDict;
    } else if (module == "torch" && name == "FloatStorage") {
      v.global = TorchGlobal::kFloatStorage;
    } else {
      return invalid_argument(
          "%s byte %zu: disallowed global %s.%s (%s opcode); only torch._utils._rebuild_tensor_v2, "
          "collections.OrderedDict and torch.FloatStorage are allowed, and nothing is executed",
          label_.c_str(), op_pos_, printable(module).c_str(), printable(name).c_str(), op_name());
    }
    return push_new(std::move(v));
  }

  Result<std::string> line() {  // GLOBAL's newline-terminated arguments
    for (size_t k = 0; k < 256 && pos_ + k < n_; ++k) {
      if (p_[pos_ + k] == '\n') {
        std::string s(reinterpret_cast<const char*>(p_ + pos_), k);
        pos_ += k + 1;
        return s;
      }
    }
    return fail("GLOBAL argument without a newline within 256 bytes");
  }

  Status persistent_id() {
    OSCAR_ASSIGN_OR_RETURN(uint32_t pid, pop());
    const PyValue& t = val(pid);
    auto is = [&](size_t j, PyKind k) { return val(t.items[j]).kind == k; };
    if (t.kind != PyKind::kTuple || t.items.size() != 5 || !is(0, PyKind::kStr) ||
        val(t.items[0]).s != "storage" || !is(1, PyKind::kGlobal) || !is(2, PyKind::kStr) ||
        !is(3, PyKind::kStr) || !is(4, PyKind::kInt))
      return fail("BINPERSID: the persistent id is not ('storage', <storage class>, key, "
                  "location, numel)");
    if (val(t.items[1]).global != TorchGlobal::kFloatStorage)
      return fail("BINPERSID: the storage class is not torch.FloatStorage");
    StorageRef ref;
    ref.key = val(t.items[2]).s;
    ref.location = val(t.items[3]).s;
    ref.numel = val(t.items[4]).i;
    if (ref.key.empty() || ref.key.size() > 64)
      return fail("BINPERSID: storage key of " + std::to_string(ref.key.size()) + " bytes");
    for (char c : ref.key)
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'))
        return fail("BINPERSID: storage key '" + printable(ref.key) + "' has a character other "
                    "than [A-Za-z0-9_]");
    if (ref.numel < 0 || ref.numel > (int64_t{1} << 40))
      return fail(str_format("BINPERSID: storage %s numel %lld out of range", ref.key.c_str(),
                             static_cast<long long>(ref.numel)));
    auto [it, fresh] = g_.storages.emplace(ref.key, ref);
    if (!fresh && it->second.numel != ref.numel)
      return fail(str_format("BINPERSID: storage %s is declared with numel %lld and %lld",
                             ref.key.c_str(), static_cast<long long>(it->second.numel),
                             static_cast<long long>(ref.numel)));
    PyValue v;
    v.kind = PyKind::kStorage;
    v.s = ref.key;
    v.i = ref.numel;
    return push_new(std::move(v));
  }

  Result<std::vector<int64_t>> int_tuple(uint32_t idx, const char* what) {
    const PyValue& t = val(idx);
    if (t.kind != PyKind::kTuple)
      return fail(str_format("_rebuild_tensor_v2: %s is a %s, expected a tuple of ints", what,
                             py_kind_name(t.kind)));
    if (t.items.size() > kMaxTensorDims)
      return fail(str_format("_rebuild_tensor_v2: %zu dimensions (at most %d)", t.items.size(),
                             kMaxTensorDims));
    std::vector<int64_t> out;
    for (uint32_t e : t.items) {
      if (val(e).kind != PyKind::kInt || val(e).i < 0)
        return fail(str_format("_rebuild_tensor_v2: %s holds a %s%s", what,
                               py_kind_name(val(e).kind),
                               val(e).kind == PyKind::kInt ? " < 0" : ", expected ints >= 0"));
      out.push_back(val(e).i);
    }
    return out;
  }

  Status reduce() {
    OSCAR_ASSIGN_OR_RETURN(uint32_t args_idx, pop());
    OSCAR_ASSIGN_OR_RETURN(uint32_t fn_idx, pop());
    const PyValue& fn = val(fn_idx);
    if (fn.kind != PyKind::kGlobal)
      return fail(str_format("REDUCE calls a %s; only the allowed globals can be called",
                             py_kind_name(fn.kind)));
    if (val(args_idx).kind != PyKind::kTuple)
      return fail(str_format("REDUCE arguments are a %s, expected a tuple",
                             py_kind_name(val(args_idx).kind)));
    const std::vector<uint32_t> args = val(args_idx).items;
    switch (fn.global) {
      case TorchGlobal::kOrderedDict: {
        if (!args.empty()) return fail("collections.OrderedDict called with arguments");
        PyValue d;
        d.kind = PyKind::kDict;
        return push_new(std::move(d));
      }
      case TorchGlobal::kFloatStorage:
        return fail("torch.FloatStorage cannot be called; it only names a storage class");
      case TorchGlobal::kRebuildTensorV2: break;
    }
    if (args.size() == 7)
      return fail("_rebuild_tensor_v2 with a 7th (metadata) argument is not supported");
    if (args.size() != 6)
      return fail(str_format("_rebuild_tensor_v2 with %zu arguments, expected 6", args.size()));
    if (val(args[0]).kind != PyKind::kStorage)
      return fail(str_format("_rebuild_tensor_v2: argument 0 is a %s, expected a storage",
                             py_kind_name(val(args[0]).kind)));
    if (val(args[1]).kind != PyKind::kInt || val(args[1]).i < 0)
      return fail("_rebuild_tensor_v2: storage_offset is not an int >= 0");
    PyValue t;
    t.kind = PyKind::kTensor;
    t.storage = args[0];
    t.storage_offset = val(args[1]).i;
    OSCAR_ASSIGN_OR_RETURN(t.sizes, int_tuple(args[2], "size"));
    OSCAR_ASSIGN_OR_RETURN(t.strides, int_tuple(args[3], "stride"));
    if (t.sizes.size() != t.strides.size())
      return fail(str_format("_rebuild_tensor_v2: %zu sizes but %zu strides", t.sizes.size(),
                             t.strides.size()));
    if (val(args[4]).kind != PyKind::kBool)
      return fail("_rebuild_tensor_v2: requires_grad is not a bool");
    if (val(args[5]).kind != PyKind::kDict || !val(args[5]).items.empty())
      return fail("_rebuild_tensor_v2: backward_hooks is not an empty OrderedDict");
    return push_new(std::move(t));
  }

  Status step() {
    switch (op_) {
      case 0x80: {  // PROTO
        OSCAR_RETURN_IF_ERROR(need(1));
        const uint64_t v = le(1);
        if (v < 2 || v > 5) return fail(str_format("PROTO %llu (torch writes 2)",
                                                   static_cast<unsigned long long>(v)));
        return Status();
      }
      case 0x95: {  // FRAME: a read-ahead hint; the length must fit
        OSCAR_RETURN_IF_ERROR(need(8));
        const uint64_t len = le(8);
        if (len > n_ - pos_) return fail("FRAME longer than the rest of the pickle");
        return Status();
      }
      case '(':
        marks_.push_back(stack_.size());
        return Status();
      case '}': {
        PyValue d;
        d.kind = PyKind::kDict;
        return push_new(std::move(d));
      }
      case ']': {
        PyValue l;
        l.kind = PyKind::kList;
        return push_new(std::move(l));
      }
      case ')': return push_tuple({});
      case 0x85: return push_tuple_n(1);
      case 0x86: return push_tuple_n(2);
      case 0x87: return push_tuple_n(3);
      case 't': {
        OSCAR_ASSIGN_OR_RETURN(std::vector<uint32_t> items, pop_to_mark());
        return push_tuple(std::move(items));
      }
      case 's': {
        OSCAR_ASSIGN_OR_RETURN(uint32_t value, pop());
        OSCAR_ASSIGN_OR_RETURN(uint32_t key, pop());
        if (stack_.size() <= floor()) return fail("SETITEM without a dict");
        return set_item(stack_.back(), key, value);
      }
      case 'u': {
        OSCAR_ASSIGN_OR_RETURN(std::vector<uint32_t> items, pop_to_mark());
        if (items.size() % 2 != 0) return fail("SETITEMS with an odd number of values");
        if (stack_.size() <= floor()) return fail("SETITEMS without a dict");
        for (size_t j = 0; j < items.size(); j += 2)
          OSCAR_RETURN_IF_ERROR(set_item(stack_.back(), items[j], items[j + 1]));
        return Status();
      }
      case 'a': {
        OSCAR_ASSIGN_OR_RETURN(uint32_t value, pop());
        if (stack_.size() <= floor()) return fail("APPEND without a list");
        return append(stack_.back(), value);
      }
      case 'e': {
        OSCAR_ASSIGN_OR_RETURN(std::vector<uint32_t> items, pop_to_mark());
        if (stack_.size() <= floor()) return fail("APPENDS without a list");
        for (uint32_t v : items) OSCAR_RETURN_IF_ERROR(append(stack_.back(), v));
        return Status();
      }
      case 'X':
      case 0x8c: {  // BINUNICODE (u32 length), SHORT_BINUNICODE (u8 length)
        const size_t lb = op_ == 'X' ? 4 : 1;
        OSCAR_RETURN_IF_ERROR(need(lb));
        const uint64_t len = le(lb);
        OSCAR_RETURN_IF_ERROR(need(len));
        PyValue s;
        s.kind = PyKind::kStr;
        s.s.assign(reinterpret_cast<const char*>(p_ + pos_), len);
        pos_ += len;
        return push_new(std::move(s));
      }
      case 'K':
      case 'M':
      case 'J': {  // BININT1 (u8), BININT2 (u16), BININT (i32)
        const size_t k = op_ == 'K' ? 1 : op_ == 'M' ? 2 : 4;
        OSCAR_RETURN_IF_ERROR(need(k));
        uint64_t raw = le(k);
        PyValue v;
        v.kind = PyKind::kInt;
        v.i = k == 4 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(raw)))
                     : static_cast<int64_t>(raw);
        return push_new(std::move(v));
      }
      case 0x8a: {  // LONG1: u8 length, little-endian two's complement
        OSCAR_RETURN_IF_ERROR(need(1));
        const uint64_t len = le(1);
        if (len > 8) return fail(str_format("LONG1 of %llu bytes exceeds int64",
                                            static_cast<unsigned long long>(len)));
        OSCAR_RETURN_IF_ERROR(need(len));
        uint64_t raw = le(len);
        if (len > 0 && len < 8 && (raw >> (8 * len - 1)) & 1) raw |= ~uint64_t{0} << (8 * len);
        PyValue v;
        v.kind = PyKind::kInt;
        v.i = static_cast<int64_t>(raw);
        return push_new(std::move(v));
      }
      case 0x88:
      case 0x89: {
        PyValue v;
        v.kind = PyKind::kBool;
        v.i = op_ == 0x88 ? 1 : 0;
        return push_new(std::move(v));
      }
      case 'N': return push_new(PyValue{});
      case 'G': {  // BINFLOAT: big-endian IEEE double
        OSCAR_RETURN_IF_ERROR(need(8));
        uint64_t raw = 0;
        for (int b = 0; b < 8; ++b) raw = (raw << 8) | p_[pos_ + b];
        pos_ += 8;
        PyValue v;
        v.kind = PyKind::kFloat;
        std::memcpy(&v.f, &raw, sizeof raw);
        return push_new(std::move(v));
      }
      case 'q':
      case 'r': {
        const size_t k = op_ == 'q' ? 1 : 4;
        OSCAR_RETURN_IF_ERROR(need(k));
        return memo_put(le(k));
      }
      case 0x94: return memo_put(memo_.size());  // MEMOIZE
      case 'h':
      case 'j': {
        const size_t k = op_ == 'h' ? 1 : 4;
        OSCAR_RETURN_IF_ERROR(need(k));
        return memo_get(le(k));
      }
      case 'c': {
        OSCAR_ASSIGN_OR_RETURN(std::string module, line());
        OSCAR_ASSIGN_OR_RETURN(std::string name, line());
        return push_global(module, name);
      }
      case 0x93: {  // STACK_GLOBAL: module, name from the stack
        OSCAR_ASSIGN_OR_RETURN(uint32_t name, pop());
        OSCAR_ASSIGN_OR_RETURN(uint32_t module, pop());
        if (val(name).kind != PyKind::kStr || val(module).kind != PyKind::kStr)
          return fail("STACK_GLOBAL needs two strings");
        return push_global(val(module).s, val(name).s);
      }
      case 'Q': return persistent_id();
      case 'R': return reduce();
      default: return refuse_opcode();
    }
  }

  const uint8_t* p_;
  size_t n_;
  std::string label_;
  size_t max_values_;
  size_t pos_ = 0, op_pos_ = 0;
  uint8_t op_ = 0;
  PickleGraph g_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;  // stack sizes at each open MARK
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::unordered_map<uint32_t, std::unordered_map<std::string, size_t>> dict_index_;
};

}  // namespace

const char* py_kind_name(PyKind kind) {
  switch (kind) {
    case PyKind::kNone: return "None";
    case PyKind::kBool: return "bool";
    case PyKind::kInt: return "int";
    case PyKind::kFloat: return "float";
    case PyKind::kStr: return "str";
    case PyKind::kTuple: return "tuple";
    case PyKind::kList: return "list";
    case PyKind::kDict: return "dict";
    case PyKind::kGlobal: return "global";
    case PyKind::kStorage: return "storage";
    case PyKind::kTensor: return "tensor";
  }
  return "?";
}

const PyValue* PickleGraph::dict_get(const PyValue& dict, const std::string& key) const {
  for (size_t j = 0; j + 1 < dict.items.size(); j += 2) {
    const PyValue& k = values.at(dict.items[j]);
    if (k.kind == PyKind::kStr && k.s == key) return &values.at(dict.items[j + 1]);
  }
  return nullptr;
}

Result<PickleGraph> parse_torch_pickle(std::span<const uint8_t> bytes, const std::string& label,
                                       size_t max_values) {
  return Parser(bytes, label, max_values).run();
}

}  // namespace oscar::format
