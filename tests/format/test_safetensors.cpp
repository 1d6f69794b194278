// safetensors reader/writer: round trips, dtype conversion, and every malformed-file rejection.
// Malformed files are built from bytes in the test (no binary fixtures); each must fail with a
// message that names the file, the tensor and the offending values, and never crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "format/safetensors.h"

namespace oscar::format {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("oscar_format_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// 8-byte little-endian length + header text + `data_bytes` bytes of data.
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes, uint64_t len_field) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(len_field >> (8 * i)));
  for (char c : header) out.push_back(static_cast<uint8_t>(c));
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  return out;
}
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  return make_file(header, data_bytes, header.size());
}

// Parses bytes that must be rejected; returns the error.
Status reject(const std::vector<uint8_t>& bytes) {
  Result<SafetensorsFile> r = SafetensorsFile::parse(bytes, "bad.safetensors");
  EXPECT_FALSE(r.ok()) << "accepted a malformed file";
  return r.ok() ? Status() : r.status();
}

#define EXPECT_MSG_HAS(status, text) \
  EXPECT_NE((status).message().find(text), std::string::npos) << (status).to_string()

TEST(Safetensors, DtypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::kBF16), "BF16");
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_from_name("F16").value(), DType::kF16);
  EXPECT_EQ(dtype_from_name("F64").status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(dtype_from_name("bogus").status().code(), StatusCode::kInvalidArgument);
}

TEST(Safetensors, WriteReadRoundTrip) {
  TempDir dir;
  const std::vector<float> f32 = {1.5f, -2.0f, 0.0f, 3.25f, 1e-3f, -7.0f};
  std::vector<uint8_t> bf16_bytes, f16_bytes, i32_bytes, i64_bytes;
  const std::vector<float> halfs = {1.0f, -2.0f, 0.5f};  // exact in bf16 and fp16
  for (float v : halfs) {
    uint16_t b = f32_to_bf16(v), h = f32_to_fp16(v);
    bf16_bytes.insert(bf16_bytes.end(), {static_cast<uint8_t>(b), static_cast<uint8_t>(b >> 8)});
    f16_bytes.insert(f16_bytes.end(), {static_cast<uint8_t>(h), static_cast<uint8_t>(h >> 8)});
  }
  const std::vector<int32_t> i32 = {-5, 7};
  const std::vector<int64_t> i64 = {int64_t{1} << 40, -3, 8189};
  i32_bytes.resize(8);
  std::memcpy(i32_bytes.data(), i32.data(), 8);
  i64_bytes.resize(24);
  std::memcpy(i64_bytes.data(), i64.data(), 24);

  std::vector<TensorToWrite> tensors = {
      f32_tensor("a.f32", {2, 3}, f32),
      {"b.bf16", DType::kBF16, {3}, bf16_bytes},  // 6 bytes: later offsets are not 8-aligned
      {"c.f16", DType::kF16, {1, 3}, f16_bytes},
      {"d.i32", DType::kI32, {2}, i32_bytes},
      {"e.i64", DType::kI64, {3}, i64_bytes},
      {"f.empty", DType::kF32, {0, 4}, {}},
      {"g.scalar", DType::kF32, {}, std::vector<uint8_t>(4, 0)},
  };
  const std::string path = dir.file("rt.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "test"}, {"version", "1"}}).ok());

  // Header length is padded to a multiple of 8 (the reference's alignment rule).
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);

  Result<SafetensorsFile> r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const SafetensorsFile& f = r.value();
  EXPECT_EQ(f.tensors().size(), tensors.size());
  EXPECT_EQ(f.metadata().at("format"), "test");
  EXPECT_EQ(f.metadata().at("version"), "1");
  for (const TensorToWrite& t : tensors) {
    const TensorView* v = f.find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    ASSERT_EQ(v->n_bytes, t.bytes.size());
    EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), t.bytes.size()), 0) << t.name;
  }
  EXPECT_EQ(f.find("a.f32")->to_f32(), f32);  // exact: F32 is copied bit for bit
  EXPECT_EQ(f.find("b.bf16")->to_f32(), halfs);
  EXPECT_EQ(f.find("c.f16")->to_f32(), halfs);
  EXPECT_EQ(f.find("d.i32")->to_f32(), (std::vector<float>{-5.0f, 7.0f}));
  EXPECT_EQ(f.find("d.i32")->to_i64(), (std::vector<int64_t>{-5, 7}));
  EXPECT_EQ(f.find("e.i64")->to_i64(), i64);
  EXPECT_EQ(f.find("f.empty")->numel(), 0);
  EXPECT_EQ(f.find("g.scalar")->numel(), 1);
  EXPECT_EQ(f.find("missing"), nullptr);

  // Checkpoint accepts a path to a single file too.
  Result<Checkpoint> ck = Checkpoint::open(path);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->all().size(), tensors.size());
  EXPECT_EQ(ck->total_bytes(), 24u + 6 + 6 + 8 + 24 + 0 + 4);
}

TEST(Safetensors, WriteRefusesInconsistentTensor) {
  TempDir dir;
  TensorToWrite bad{"x", DType::kF32, {3}, std::vector<uint8_t>(8)};
  Status st = write_safetensors(dir.file("x.safetensors"), {bad}, {});
  EXPECT_FALSE(st.ok());
  EXPECT_MSG_HAS(st, "'x'");
  TensorToWrite a{"y", DType::kF32, {1}, std::vector<uint8_t>(4)};
  EXPECT_FALSE(write_safetensors(dir.file("y.safetensors"), {a, a}, {}).ok());  // duplicate
}

TEST(Safetensors, EmptyHeaderIsValid) {
  std::vector<uint8_t> bytes = make_file("{}      ", 0);
  Result<SafetensorsFile> r = SafetensorsFile::parse(bytes, "empty");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->tensors().empty());
}

TEST(SafetensorsMalformed, TruncatedFile) {
  Status st = reject({1, 2, 3});
  EXPECT_MSG_HAS(st, "bad.safetensors");
  EXPECT_MSG_HAS(st, "3 bytes");
  EXPECT_FALSE(reject({}).ok());
}

TEST(SafetensorsMalformed, TruncatedFileOnDisk) {
  TempDir dir;
  std::vector<uint8_t> full = make_file(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16);
  full.resize(full.size() - 5);  // cut into the data section
  write_bytes(dir.file("cut.safetensors"), full);
  Result<SafetensorsFile> r = SafetensorsFile::open(dir.file("cut.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_MSG_HAS(r.status(), "cut.safetensors");
  EXPECT_MSG_HAS(r.status(), "'t'");
  EXPECT_MSG_HAS(r.status(), "[0, 16]");
  EXPECT_MSG_HAS(r.status(), "11 bytes");
}

TEST(SafetensorsMalformed, TruncatedHeader) {
  std::string header = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::vector<uint8_t> bytes = make_file(header.substr(0, 20), 0, header.size());
  Status st = reject(bytes);
  EXPECT_MSG_HAS(st, "header length " + std::to_string(header.size()));
  EXPECT_MSG_HAS(st, "past the end");
}

TEST(SafetensorsMalformed, BadHeaderJson) {
  Status st = reject(make_file(R"({"t": {"dtype": "F32", )", 0));
  EXPECT_MSG_HAS(st, "not valid JSON");
  EXPECT_FALSE(reject(make_file(R"({"a":1} trailing)", 0)).ok());
  EXPECT_FALSE(reject(make_file("{\"\xff\xfe\": 1}", 0)).ok());  // invalid UTF-8
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  EXPECT_MSG_HAS(reject(make_file("[1, 2, 3]", 0)), "JSON object");
  EXPECT_MSG_HAS(reject(make_file("\"text\"", 0)), "JSON object");
  EXPECT_MSG_HAS(reject(make_file("", 0)), "JSON object");
  // Entry that is not an object.
  EXPECT_MSG_HAS(reject(make_file(R"({"t": 5})", 0)), "'t'");
}

TEST(SafetensorsMalformed, MissingFields) {
  EXPECT_MSG_HAS(reject(make_file(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4)), "dtype");
  EXPECT_MSG_HAS(reject(make_file(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4)), "shape");
  EXPECT_MSG_HAS(reject(make_file(R"({"t":{"dtype":"F32","shape":[1]}})", 4)), "data_offsets");
  EXPECT_MSG_HAS(reject(make_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)),
                 "data_offsets");
  EXPECT_MSG_HAS(reject(make_file(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4)),
                 "non-negative integer");
}

TEST(SafetensorsMalformed, BadMetadata) {
  Status st = reject(make_file(R"({"__metadata__":{"k":1}})", 0));
  EXPECT_MSG_HAS(st, "__metadata__");
  EXPECT_MSG_HAS(st, "'k'");
  EXPECT_MSG_HAS(reject(make_file(R"({"__metadata__":[1]})", 0)), "__metadata__");
}

TEST(SafetensorsMalformed, OverlappingOffsets) {
  Status st = reject(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  EXPECT_MSG_HAS(st, "overlap");
  EXPECT_MSG_HAS(st, "'b'");
  EXPECT_MSG_HAS(st, "'a'");
  EXPECT_MSG_HAS(st, "[4, 12]");
}

TEST(SafetensorsMalformed, OutOfRangeOffsets) {
  Status st = reject(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4));
  EXPECT_MSG_HAS(st, "'a'");
  EXPECT_MSG_HAS(st, "[0, 8]");
  EXPECT_MSG_HAS(st, "4 bytes");
  // Offsets near 2^64 must not wrap.
  EXPECT_FALSE(reject(make_file(R"({"a":{"dtype":"F32","shape":[0],)"
                                R"("data_offsets":[18446744073709551615,18446744073709551615]}})",
                                0)).ok());
}

TEST(SafetensorsMalformed, BeginAfterEnd) {
  Status st = reject(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8));
  EXPECT_MSG_HAS(st, "begin > end");
}

TEST(SafetensorsMalformed, GapInDataSection) {
  Status st = reject(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12));
  EXPECT_MSG_HAS(st, "gap of 4 bytes");
  EXPECT_MSG_HAS(st, "'b'");
  // Uncovered trailing bytes are a gap at the end.
  Status tail = reject(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6));
  EXPECT_MSG_HAS(tail, "cover 4 of the 6");
}

TEST(SafetensorsMalformed, SizeMismatch) {
  Status st = reject(make_file(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_MSG_HAS(st, "'w'");
  EXPECT_MSG_HAS(st, "needs 6 bytes");
  EXPECT_MSG_HAS(st, "[0, 8]");
}

TEST(SafetensorsMalformed, UnknownDtype) {
  for (const char* dt : {"F64", "U8", "F8_E4M3", "BOOL"}) {
    Status st = reject(make_file(std::string(R"({"w":{"dtype":")") + dt +
                                 R"(","shape":[1],"data_offsets":[0,8]}})", 8));
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << dt;
    EXPECT_MSG_HAS(st, dt);
    EXPECT_MSG_HAS(st, "'w'");
  }
  Status st = reject(make_file(R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_MSG_HAS(st, "Q4_K");
}

TEST(SafetensorsMalformed, NegativeDim) {
  Status st = reject(make_file(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]}})", 0));
  EXPECT_MSG_HAS(st, "negative dim -1");
  EXPECT_MSG_HAS(st, "'w'");
  EXPECT_FALSE(reject(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 0))
                   .ok());
}

TEST(SafetensorsMalformed, HugeDimsOverflow) {
  // numel overflows 64 bits.
  Status st = reject(make_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                               R"("data_offsets":[0,0]}})", 0));
  EXPECT_MSG_HAS(st, "overflow");
  EXPECT_MSG_HAS(st, "'w'");
  // numel fits, numel x 4 bytes does not.
  EXPECT_MSG_HAS(reject(make_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904],)"
                                  R"("data_offsets":[0,0]}})", 0)),
                 "overflow");
  // A zero dim makes the product zero whatever the others are (no false overflow).
  std::vector<uint8_t> zero = make_file(R"({"w":{"dtype":"F32","shape":[0,9223372036854775807],)"
                                        R"("data_offsets":[0,0]}})", 0);
  EXPECT_TRUE(SafetensorsFile::parse(zero, "zero").ok());
  // Dims beyond uint64 arrive as floats from the JSON parser and are refused.
  EXPECT_FALSE(reject(make_file(R"({"w":{"dtype":"F32","shape":[1e30],"data_offsets":[0,0]}})", 0))
                   .ok());
}

TEST(SafetensorsMalformed, OversizedHeaderLength) {
  Status st = reject(make_file("{}", 0, 100ull * 1000 * 1000 + 1));
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_MSG_HAS(st, "100000001");
  EXPECT_MSG_HAS(st, "100 MB");
  EXPECT_FALSE(reject(make_file("{}", 0, ~uint64_t{0})).ok());
}

TEST(SafetensorsMalformed, MissingShardInIndex) {
  TempDir dir;
  ASSERT_TRUE(write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                                {f32_tensor("a", {1}, std::vector<float>{1.0f})}, {})
                  .ok());
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",)"
      << R"( "b": "model-00002-of-00002.safetensors"}})";
  Result<Checkpoint> r = Checkpoint::open(dir.str());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_MSG_HAS(r.status(), "model-00002-of-00002.safetensors");
  EXPECT_MSG_HAS(r.status(), "'b'");
}

TEST(SafetensorsMalformed, ShardLacksIndexedTensor) {
  TempDir dir;
  ASSERT_TRUE(write_safetensors(dir.file("s1.safetensors"),
                                {f32_tensor("a", {1}, std::vector<float>{1.0f})}, {})
                  .ok());
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"weight_map": {"a": "s1.safetensors", "z": "s1.safetensors"}})";
  Result<Checkpoint> r = Checkpoint::open(dir.str());
  ASSERT_FALSE(r.ok());
  EXPECT_MSG_HAS(r.status(), "'z'");
  EXPECT_MSG_HAS(r.status(), "s1.safetensors");
}

TEST(SafetensorsMalformed, IndexNotJson) {
  TempDir dir;
  std::ofstream(dir.file("model.safetensors.index.json")) << "{ weight_map: nope";
  Result<Checkpoint> r = Checkpoint::open(dir.str());
  ASSERT_FALSE(r.ok());
  EXPECT_MSG_HAS(r.status(), "model.safetensors.index.json");
  EXPECT_MSG_HAS(r.status(), "not valid JSON");

  std::ofstream(dir.file("model.safetensors.index.json"), std::ios::trunc) << R"({"a": 1})";
  Result<Checkpoint> r2 = Checkpoint::open(dir.str());
  ASSERT_FALSE(r2.ok());
  EXPECT_MSG_HAS(r2.status(), "weight_map");
}

TEST(SafetensorsMalformed, NoCheckpointInDirectory) {
  TempDir dir;
  Result<Checkpoint> r = Checkpoint::open(dir.str());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_MSG_HAS(r.status(), "model.safetensors");
}

// Seeded random corruption of a valid file: every variant must parse or fail cleanly.
TEST(SafetensorsMalformed, RandomCorruptionNeverCrashes) {
  TempDir dir;
  const std::string path = dir.file("seed.safetensors");
  std::vector<float> vals(10, 0.5f);
  ASSERT_TRUE(write_safetensors(path, {f32_tensor("a", {2, 5}, vals), f32_tensor("b", {3}, {vals.data(), 3})},
                                {{"k", "v"}})
                  .ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 rng(1234);
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b = seed;
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      switch (rng() % 3) {
        case 0: b[rng() % b.size()] = static_cast<uint8_t>(rng()); break;
        case 1: b.resize(rng() % (b.size() + 1)); break;
        default: b.insert(b.begin() + static_cast<long>(rng() % (b.size() + 1)), static_cast<uint8_t>(rng()));
      }
      if (b.empty()) break;
    }
    Result<SafetensorsFile> r = SafetensorsFile::parse(b, "fuzz");
    if (r.ok()) {
      ++accepted;
      for (const TensorView& t : r->tensors()) {
        if (t.dtype != DType::kI64 && t.dtype != DType::kI32) (void)t.to_f32();
      }
    } else {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
  EXPECT_LT(accepted, 3000);  // most corruptions are caught
}

}  // namespace
}  // namespace oscar::format
