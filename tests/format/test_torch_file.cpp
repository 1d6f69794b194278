// The restricted torch .pt reader (format/torch_zip.h, torch_pickle.h, torch_file.h): the
// reader-level fixtures of tests/data/rotationzoo/ (copied from the specification; manifest.json
// says what each must produce), and hand-built archives and pickles for every refusal the
// fixtures do not reach. Rotation-file semantics (shapes, NaN, orthogonality, layers) are
// tests/quant/test_rotation_zoo.cpp's business.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "format/safetensors.h"
#include "format/sha256.h"
#include "format/torch_file.h"
#include "torch_test_files.h"

namespace oscar::format {
namespace {

const std::string kZoo = std::string(OSCAR_SOURCE_DIR) + "/tests/data/rotationzoo/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// The value of str key `key` in dict `d`; fails the test when absent.
const PyValue& get(const TorchFile& f, const PyValue& d, const std::string& key) {
  const PyValue* v = f.pickle().dict_get(d, key);
  EXPECT_NE(v, nullptr) << key;
  static const PyValue none;
  return v ? *v : none;
}
// The value of int key `key` in dict `d`.
const PyValue* get_int(const TorchFile& f, const PyValue& d, int64_t key) {
  for (size_t j = 0; j + 1 < d.items.size(); j += 2) {
    const PyValue& k = f.pickle().at(d.items[j]);
    if (k.kind == PyKind::kInt && k.i == key) return &f.pickle().at(d.items[j + 1]);
  }
  return nullptr;
}

Result<TorchFile> parse_bytes(const std::vector<uint8_t>& b) { return TorchFile::parse(b, "mem.pt"); }

void expect_error(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

// ---- Fixtures ------------------------------------------------------------------------------

TEST(TorchFile, ManifestShaAndSizesMatchTheCopies) {
  // The copies in tests/data are the specification's bytes.
  auto text = read_text_file(kZoo + "manifest.json");
  ASSERT_TRUE(text.ok());
  for (const char* name : {"valid/v1/tiny-qwen3/hadamard/k_rotation_hadamard.pt",
                           "reader/release_qwen3.5-4B_hadamard_k_rotation.pt",
                           "invalid/global_os_system.pt"}) {
    const std::vector<uint8_t> b = read_bytes(kZoo + name);
    const std::string sha = sha256_hex({reinterpret_cast<const char*>(b.data()), b.size()});
    EXPECT_NE(text.value().find(sha), std::string::npos) << name;
  }
}

TEST(TorchFile, ReleaseFileSparseLayersSharedTensor) {
  auto f = TorchFile::open(kZoo + "reader/release_qwen3.5-4B_hadamard_k_rotation.pt");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->prefix(), "k_rotation_hadamard");  // not the file's name
  EXPECT_EQ(f->pickle().storages.size(), 2u);
  const PyValue& root = f->root();
  EXPECT_EQ(get(*f, root, "format_version").i, 1);
  EXPECT_EQ(get(*f, root, "objective").s, "hadamard");
  const PyValue& layers = get(*f, root, "layers");
  ASSERT_EQ(layers.kind, PyKind::kDict);
  EXPECT_EQ(layers.items.size(), 16u);
  for (int l = 3; l < 32; l += 4) {
    const PyValue* layer = get_int(*f, layers, l);
    ASSERT_NE(layer, nullptr) << l;
    auto r = f->tensor(get(*f, *layer, "rotation"), "rotation");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->shape, (std::vector<int64_t>{256, 256}));
    for (float x : r->data) ASSERT_EQ(std::fabs(x), 1.0f / 16);
    auto e = f->tensor(get(*f, *layer, "eigenvalues"), "eigenvalues");
    ASSERT_TRUE(e.ok());
    for (float x : e->data) ASSERT_EQ(x, 1.0f);
  }
}

TEST(TorchFile, TransposedViewsOfOneStorageAreBitExact) {
  auto f = TorchFile::open(kZoo + "reader/v1_calibration_views_2layer.pt");
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto src = SafetensorsFile::open(std::string(OSCAR_SOURCE_DIR) +
                                   "/models/tiny-qwen3/oscar_rotations.safetensors");
  ASSERT_TRUE(src.ok());
  const PyValue& root = f->root();
  const PyValue& cal = get(*f, root, "calibration");
  ASSERT_EQ(cal.kind, PyKind::kDict);
  EXPECT_EQ(get(*f, cal, "model_revision").kind, PyKind::kNone);
  EXPECT_EQ(get(*f, cal, "post_rope").kind, PyKind::kBool);
  EXPECT_EQ(get(*f, cal, "created_at_unix").f, 1764547200.5);
  const PyValue& layers = get(*f, root, "layers");
  for (int l = 0; l < 2; ++l) {
    const PyValue* layer = get_int(*f, layers, l);
    ASSERT_NE(layer, nullptr);
    const PyValue& rv = get(*f, *layer, "rotation");
    EXPECT_EQ(rv.storage_offset, l == 0 ? 0 : 16384);
    auto r = f->tensor(rv, "rotation");
    ASSERT_TRUE(r.ok()) << r.status().message();
    const std::vector<float> want =
        src->find("layers." + std::to_string(l) + ".k.rotation")->to_f32();  // [2, 128, 128]
    ASSERT_EQ(r->data.size(), 128u * 128u);
    EXPECT_EQ(std::memcmp(r->data.data(), want.data(), r->data.size() * 4), 0) << "layer " << l;
  }
}

TEST(TorchFile, LongMemoOpcodes300Layers) {
  auto f = TorchFile::open(kZoo + "reader/v1_300layers_hd4.pt");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const PyValue& layers = get(*f, f->root(), "layers");
  EXPECT_EQ(layers.items.size(), 600u);
  for (int l : {0, 255, 256, 279, 280, 299}) {
    const PyValue* layer = get_int(*f, layers, l);
    ASSERT_NE(layer, nullptr) << l;
    auto e = f->tensor(get(*f, *layer, "eigenvalues"), "eigenvalues");
    ASSERT_TRUE(e.ok());
    for (float x : e->data) EXPECT_EQ(x, l < 280 ? 1.0f : 2.0f) << l;
    auto r = f->tensor(get(*f, *layer, "rotation"), "rotation");
    ASSERT_TRUE(r.ok());
    for (float x : r->data) EXPECT_EQ(std::fabs(x), 0.5f);
  }
}

TEST(TorchFile, EveryValidFixtureOpens) {
  for (const char* name : {"valid/v1/tiny-qwen3/seq98304_prompt24_group128/k_rotation_qqt_r_h_pbr.pt",
                           "valid/v1/tiny-qwen3/seq98304_prompt24_group128/v_rotation_sst_r_h_pbr.pt",
                           "valid/v1/tiny-qwen3/hadamard/k_rotation_hadamard.pt",
                           "valid/v2/tiny-qwen3-2layer/k_rotation_perhead.pt",
                           "valid/v2/tiny-qwen3-2layer/v_rotation_perhead.pt",
                           "valid/v3/tiny-qwen3-1layer/outaware/k_rotation_oscar2_outaware.pt",
                           "valid/v3/tiny-qwen3-1layer/outaware/v_rotation_oscar2_outaware.pt"}) {
    auto f = TorchFile::open(kZoo + name);
    EXPECT_TRUE(f.ok()) << name << ": " << f.status().message();
  }
}

// Reader-level refusals among the fixtures: each with the cause manifest.json names.
TEST(TorchFile, InvalidFixturesAreRefusedWithTheirCause) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"invalid/truncated.pt", {"truncated", "end-of-central-directory"}},
      {"invalid/global_os_system.pt", {"disallowed global os.system (GLOBAL opcode)", "byte 41"}},
      {"invalid/stack_global_posix_system.pt",
       {"disallowed global posix.system (STACK_GLOBAL opcode)"}},
      {"invalid/missing_storage_record.pt", {"storage record data/0 referenced", "absent"}},
      {"invalid/short_storage_record.pt",
       {"storage data/0 has 40 bytes, the pickle needs 16 float32 (64 bytes)"}},
      {"reader/legacy_nonzip.pt", {"legacy (non-zip) torch serialization"}},
  };
  for (const auto& [name, needles] : cases) {
    auto f = TorchFile::open(kZoo + name);
    ASSERT_FALSE(f.ok()) << name;
    for (const std::string& n : needles) expect_error(f.status(), n);
    expect_error(f.status(), kZoo + name);  // names the file
  }
}

// ---- Hand-built archives -------------------------------------------------------------------

TEST(TorchZip, CrcMismatchAndCompressedRecordsAreRefused) {
  const std::string pkl = kProto + "}.";
  std::vector<uint8_t> z = torch_zip(pkl);
  ASSERT_TRUE(parse_bytes(z).ok());
  z[30 + 10] ^= 0xFF;  // first record's data ("t/data.pkl" is 10 bytes): flip a pickle byte
  expect_error(parse_bytes(z).status(), "CRC-32");
  z = torch_zip(pkl);
  const size_t cd = z.size() - 22 - (46 + 10) - (46 + 9);  // central directory start
  z[cd + 10] = 8;  // method deflate
  expect_error(parse_bytes(z).status(), "compressed (method 8)");
}

TEST(TorchZip, EveryTruncationIsRefusedWithoutACrash) {
  const std::vector<uint8_t> z =
      torch_zip(kProto + "}" + str("a") + tensor_pkl("0", 4, 0, i1(4) + "\x85", i1(1) + "\x85") + "s.",
                {{"0", floats({1, 2, 3, 4})}});
  ASSERT_TRUE(parse_bytes(z).ok()) << parse_bytes(z).status().message();
  for (size_t n = 0; n < z.size(); ++n) {
    std::vector<uint8_t> cut(z.begin(), z.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(parse_bytes(cut).ok()) << n;
  }
}

TEST(TorchFile, MissingVersionBadVersionAndBigEndianAreRefused) {
  const std::string pkl = kProto + "}.";
  expect_error(TorchFile::parse(make_zip({{"t/data.pkl", pkl}}), "m").status(), "version' is missing");
  expect_error(TorchFile::parse(make_zip({{"t/data.pkl", pkl}, {"t/version", "2\n"}}), "m").status(),
               "version '2");
  expect_error(TorchFile::parse(make_zip({{"t/data.pkl", pkl}, {"t/version", "3\n"},
                                          {"t/byteorder", "big"}}), "m").status(),
               "byteorder 'big'");
  expect_error(TorchFile::parse(make_zip({{"t/data.pkl", pkl}, {"u/data.pkl", pkl},
                                          {"t/version", "3\n"}}), "m").status(),
               "two pickles");
  expect_error(TorchFile::parse(make_zip({{"t/x", pkl}}), "m").status(), "not a torch.save file");
}

TEST(TorchFile, TensorViewsAreBoundsChecked) {
  const std::string store = floats({0, 1, 2, 3, 4, 5});
  auto build = [&](int offset, const std::string& size, const std::string& stride) {
    return torch_zip(kProto + "}" + str("t") + tensor_pkl("0", 6, offset, size, stride) + "s.",
                     {{"0", store}});
  };
  auto view = [&](const std::vector<uint8_t>& z) -> Result<FloatTensor> {
    OSCAR_ASSIGN_OR_RETURN(TorchFile f, TorchFile::parse(z, "m"));
    return f.tensor(*f.pickle().dict_get(f.root(), "t"), "t");
  };
  // [2, 3] transposed view (stride (1, 2)) of storage 0..5 at offset 0: rows (0 2 4), (1 3 5).
  auto ok = view(build(0, i1(2) + i1(3) + "\x86", i1(1) + i1(2) + "\x86"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->data, (std::vector<float>{0, 2, 4, 1, 3, 5}));
  // Offset 1 with the same view reaches element 6 of 6.
  expect_error(view(build(1, i1(2) + i1(3) + "\x86", i1(1) + i1(2) + "\x86")).status(),
               "reaches element 6");
  // Huge sizes: refused before any allocation.
  expect_error(view(build(0, i2(60000) + i2(60000) + "\x86", i1(0) + i1(0) + "\x86")).status(),
               "more than");
  // A storage shorter than its numel.
  expect_error(parse_bytes(torch_zip(kProto + "}" + str("t") + tensor_pkl("0", 6, 0, i1(6) + "\x85",
                                                                          i1(1) + "\x85") + "s.",
                                     {{"0", floats({1, 2})}})).status(),
               "has 8 bytes, the pickle needs 6 float32 (24 bytes)");
}

// ---- Pickles ---------------------------------------------------------------------------------

Status parse_pkl(const std::string& pkl) {
  return parse_torch_pickle({reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()}, "p")
      .status();
}

TEST(TorchPickle, OpcodesOutsideTheSubsetAreRefusedByName) {
  expect_error(parse_pkl(kProto + "}b."), "opcode BUILD (0x62)");
  expect_error(parse_pkl(kProto + "c__builtin__\nobject\n)\x81."), "disallowed global __builtin__.object");
  expect_error(parse_pkl(kProto + "(cos\nsystem\nS'x'\ntR."), "disallowed global os.system");
  expect_error(parse_pkl(kProto + "(i os\nsystem\n."), "opcode INST");
  expect_error(parse_pkl(kProto + "\xff."), "0xff is not a pickle opcode");
  expect_error(parse_pkl(kProto + "N0."), "opcode POP");
  expect_error(parse_pkl("\x80\x01}."), "PROTO 1");
  // Allowed globals used the wrong way.
  expect_error(parse_pkl(kProto + "ctorch\nFloatStorage\n)R."), "cannot be called");
  expect_error(parse_pkl(kProto + "ccollections\nOrderedDict\n" + i1(1) + "\x85R."), "with arguments");
  expect_error(parse_pkl(kProto + "ctorch._utils\n_rebuild_tensor_v2\n)R."), "0 arguments, expected 6");
  expect_error(parse_pkl(kProto + "N)R."), "REDUCE calls a None");
}

TEST(TorchPickle, StructuralErrors) {
  expect_error(parse_pkl(kProto + "}"), "without STOP");
  expect_error(parse_pkl(kProto + "}}."), "2 values on the stack");
  expect_error(parse_pkl(kProto + "}.x"), "trailing bytes");
  expect_error(parse_pkl(kProto + "h\x05."), "no such memo entry");
  expect_error(parse_pkl(kProto + "\x85."), "stack underflow");
  expect_error(parse_pkl(kProto + "(N\x85."), "open MARK");  // TUPLE1 stays above the mark
  expect_error(parse_pkl(kProto + "t."), "TUPLE without MARK");
  expect_error(parse_pkl(kProto + "}(Nu."), "odd number");
  expect_error(parse_pkl(kProto + "}(NNu."), "dict key of type None");
  expect_error(parse_pkl(kProto + "X\xff\xff\xff\xff"), "truncated");
  expect_error(parse_pkl(kProto + "\x8a\x09" + std::string(9, '\x01') + "."), "LONG1 of 9 bytes");
  expect_error(parse_pkl(kProto + "NN}s."), "SETITEM into a None");
  // The arena is bounded whatever the input.
  const std::string many = kProto + "(" + std::string(100, 'N') + "t.";
  EXPECT_TRUE(parse_torch_pickle({reinterpret_cast<const uint8_t*>(many.data()), many.size()}, "p", 101).ok());
  expect_error(parse_torch_pickle({reinterpret_cast<const uint8_t*>(many.data()), many.size()}, "p", 100)
                   .status(), "more than 100 values");
  EXPECT_TRUE(parse_pkl(kProto + "(N\x85t.").ok());  // balanced marks
}

TEST(TorchPickle, ValuesMemoAndSelfReference) {
  // {'a': -2 (LONG1), 'b': [1, 2], 'c': 2.5, 'd': 'x' (SHORT_BINUNICODE), 1: True}; 'self': itself.
  const std::string pkl = kProto + B("}q\x00(") + str("a") + "\x8a\x01\xfe" + str("b") + "](" +
                          i1(1) + i1(2) + "e" + str("c") + B("G\x40\x04\x00\x00\x00\x00\x00\x00") +
                          str("d") + "\x8c\x01x" + i1(1) + "\x88" + str("self") + B("h\x00u.");
  auto g = parse_torch_pickle({reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()}, "p");
  ASSERT_TRUE(g.ok()) << g.status().message();
  const PyValue& root = g->at(g->root);
  EXPECT_EQ(g->dict_get(root, "a")->i, -2);
  EXPECT_EQ(g->dict_get(root, "b")->items.size(), 2u);
  EXPECT_EQ(g->dict_get(root, "c")->f, 2.5);
  EXPECT_EQ(g->dict_get(root, "d")->s, "x");
  EXPECT_EQ(g->dict_get(root, "self"), &root);  // a cycle, held by index: nothing leaks
  EXPECT_EQ(root.items.size(), 12u);
}

TEST(TorchPickle, PersistentIdsAreChecked) {
  auto pid = [](const std::string& tag, const std::string& cls, const std::string& key) {
    return kProto + "(" + str(tag) + cls + str(key) + str("cpu") + i1(4) + "tQ.";
  };
  EXPECT_TRUE(parse_pkl(pid("storage", "ctorch\nFloatStorage\n", "0")).ok());
  expect_error(parse_pkl(pid("x", "ctorch\nFloatStorage\n", "0")), "persistent id");
  expect_error(parse_pkl(pid("storage", "ctorch\nHalfStorage\n", "0")), "disallowed global torch.HalfStorage");
  expect_error(parse_pkl(pid("storage", "ctorch\nFloatStorage\n", "../x")), "character other");
  // One key, two sizes.
  const std::string two = kProto + "(" + str("storage") + "ctorch\nFloatStorage\n" + str("0") +
                          str("cpu") + i1(4) + "tQ(" + str("storage") + "ctorch\nFloatStorage\n" +
                          str("0") + str("cpu") + i1(5) + "tQ\x86.";
  expect_error(parse_pkl(two), "declared with numel 4 and 5");
}

}  // namespace
}  // namespace oscar::format
