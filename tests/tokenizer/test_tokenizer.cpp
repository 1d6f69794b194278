// Tokenizer unit tests: the tiny-qwen3 and real Qwen3 goldens (ids, tokens, decode exact),
// streaming decode, both merge storage formats, added-token flags, tokenizer_config.json, and
// clear errors for malformed files. Goldens come from HF `tokenizers` (see the READMEs next to
// them); every comparison is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include <unistd.h>

#include "core/mmap_file.h"
#include "core/utf8.h"
#include "tokenizer/tokenizer.h"

namespace oscar::tok {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* kTinyDir = OSCAR_SOURCE_DIR "/models/tiny-qwen3";
const char* kTinyCases = OSCAR_SOURCE_DIR "/models/tiny-qwen3/golden/tokenizer_cases.json";
const char* kQwenFile = OSCAR_QWEN3_TOKENIZER_DIR "/tokenizer.json";  // unpacked by configure
const char* kQwenCases = OSCAR_SOURCE_DIR "/tests/data/qwen3_tokenizer/golden_cases.json";

json read_json(const std::string& path) {
  auto text = read_text_file(path);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  return json::parse(text.value());
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string hex(std::string_view s) {
  std::string out;
  char buf[4];
  for (char c : s) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<uint8_t>(c));
    out += buf;
  }
  return out;
}

// Loaded once per test binary: the Qwen3 file takes a noticeable fraction of a second.
const Tokenizer& tiny() {
  static Tokenizer* t = [] {
    auto r = Tokenizer::load(kTinyDir);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return new Tokenizer(std::move(r).value());
  }();
  return *t;
}

const Tokenizer& qwen3() {
  static Tokenizer* t = [] {
    // Informational only (the machine may be shared): wall and CPU time of the 7 MB load.
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    auto r = Tokenizer::load(kQwenFile);
    const double cpu_ms = 1e3 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    std::printf("[ info ] Qwen3 tokenizer.json load: wall %.1f ms, cpu %.1f ms (vocab_size %d)\n",
                ms, cpu_ms, r.ok() ? r->vocab_size() : -1);
    return new Tokenizer(std::move(r).value());
  }();
  return *t;
}

std::vector<int32_t> ids_of(const json& c) { return c.at("ids").get<std::vector<int32_t>>(); }

// Streams `ids` one at a time; every chunk must be valid UTF-8 and the whole must equal decode().
void check_stream(const Tokenizer& t, const std::vector<int32_t>& ids, const std::string& label) {
  StreamDecoder sd(t);
  std::string all;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = sd.push(ids[i]);
    EXPECT_TRUE(utf8::valid(chunk)) << label << ": chunk " << i << " = " << hex(chunk);
    EXPECT_LE(sd.pending_bytes(), 3u) << label;
    all += chunk;
  }
  const std::string tail = sd.flush();
  EXPECT_TRUE(utf8::valid(tail)) << label;
  all += tail;
  EXPECT_EQ(all, t.decode(ids)) << label;
}

// ---------------------------------------------------------------------------------------------

TEST(TokenizerTiny, GoldenCases) {
  const Tokenizer& t = tiny();
  const json cases = read_json(kTinyCases).at("cases");
  ASSERT_EQ(cases.size(), 47u);
  for (const json& c : cases) {
    const std::string text = from_hex(c.at("text_utf8_hex").get<std::string>());
    const std::string label = "text hex " + hex(text);
    ASSERT_EQ(text, c.at("text").get<std::string>()) << label;
    const std::vector<int32_t> ids = t.encode(text);
    EXPECT_EQ(ids, ids_of(c)) << label;
    std::vector<std::string> tokens;
    for (int32_t id : ids) tokens.push_back(t.id_to_token(id));
    EXPECT_EQ(tokens, c.at("tokens").get<std::vector<std::string>>()) << label;
    EXPECT_EQ(t.decode(ids_of(c)), c.at("decoded").get<std::string>()) << label;
    EXPECT_EQ(t.normalize(text), c.at("nfc_text").get<std::string>()) << label;
  }
}

TEST(TokenizerTiny, VocabAndConfig) {
  const Tokenizer& t = tiny();
  EXPECT_EQ(t.vocab_size(), 8192);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 8189);
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 8190);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 8191);
  EXPECT_EQ(t.token_to_id("Ġ"), 220);
  EXPECT_FALSE(t.token_to_id("<|notspecial|>").has_value());
  EXPECT_TRUE(t.is_special(8189));
  EXPECT_FALSE(t.is_special(220));
  EXPECT_EQ(t.id_to_token(8190), "<|im_start|>");
  EXPECT_EQ(t.id_to_token(-1), "");
  EXPECT_EQ(t.id_to_token(8192), "");
  EXPECT_EQ(t.eos_token(), "<|endoftext|>");
  EXPECT_EQ(t.eos_token_id(), 8189);
  EXPECT_EQ(t.bos_token(), "");
  EXPECT_FALSE(t.bos_token_id().has_value());
  EXPECT_NE(t.chat_template().find("<|im_start|>"), std::string::npos);
}

TEST(TokenizerTiny, DecodeSkipSpecialAndBadIds) {
  const Tokenizer& t = tiny();
  const std::vector<int32_t> ids = t.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(t.decode(ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\nhi");
  EXPECT_TRUE(t.validate_ids(ids).ok());

  std::vector<int32_t> bad = ids;
  bad.insert(bad.begin() + 1, 8192);
  const Status st = t.validate_ids(bad);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("8192"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("index 1"), std::string::npos) << st.message();
  EXPECT_EQ(t.decode(bad), t.decode(ids));  // bad ids are skipped, as HF does
  EXPECT_FALSE(t.validate_ids(std::vector<int32_t>{-5}).ok());
}

TEST(TokenizerTiny, NormalizationStopsAtAddedTokens) {
  // Added tokens are split out before NFC, so U+0338 after "<|im_end|>" does not compose with
  // its '>' (whole-text NFC would give U+226F); decode(encode(x)) == normalize(x) still holds.
  const Tokenizer& t = tiny();
  const std::string text = "a<|im_end|>\xCC\xB8 e\xCC\x81";
  EXPECT_EQ(t.normalize(text), "a<|im_end|>\xCC\xB8 \xC3\xA9");
  EXPECT_EQ(t.decode(t.encode(text)), t.normalize(text));
  EXPECT_EQ(t.encode(text)[1], 8191);
}

TEST(TokenizerTiny, InvalidUtf8InputIsRepaired) {
  const Tokenizer& t = tiny();
  const std::string bad = "ab\xff" "cd\xe4\xb8";  // stray byte, truncated 3-byte sequence
  EXPECT_EQ(t.encode(bad), t.encode("ab\xEF\xBF\xBD" "cd\xEF\xBF\xBD"));
}

TEST(TokenizerTiny, StreamDecodeEveryGoldenCase) {
  const json cases = read_json(kTinyCases).at("cases");
  for (const json& c : cases) check_stream(tiny(), ids_of(c), c.at("text_utf8_hex"));
}

TEST(TokenizerTiny, StreamDecodeHoldsBackSplitCharacters) {
  const Tokenizer& t = tiny();
  const std::vector<int32_t> ids = t.encode("中");  // three single-byte tokens
  ASSERT_EQ(ids.size(), 3u);
  StreamDecoder sd(t);
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]), "中");
  EXPECT_EQ(sd.flush(), "");

  // An incomplete character at the end becomes one U+FFFD on flush.
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  // A lead byte followed by text: the lead byte can never complete, so it is emitted at once.
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(t.encode("a")[0]), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(sd.pending_bytes(), 0u);
  // A lone continuation byte is emitted as U+FFFD immediately.
  EXPECT_EQ(sd.push(ids[2]), "\xEF\xBF\xBD");

  StreamDecoder skip(t, /*skip_special=*/true);
  EXPECT_EQ(skip.push(8190), "");
  EXPECT_EQ(skip.push(t.encode("x")[0]), "x");
}

TEST(TokenizerTiny, ConcurrentEncodeMatchesSerial) {
  const Tokenizer& t = tiny();
  const json cases = read_json(kTinyCases).at("cases");
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 20; ++rep) {
        for (const json& c : cases) {
          if (t.encode(c.at("text").get<std::string>()) != ids_of(c)) ++failures[w];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(failures[w], 0) << "worker " << w;
}

// ---------------------------------------------------------------------------------------------

TEST(TokenizerQwen3, GoldenCases) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(t.encode(" Hello world"), (std::vector<int32_t>{21927, 1879}));
  const json cases = read_json(kQwenCases).at("cases");
  ASSERT_EQ(cases.size(), 54u);
  for (const json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const std::string label = "text hex " + hex(text);
    EXPECT_EQ(t.encode(text), ids_of(c)) << label;
    EXPECT_EQ(t.decode(ids_of(c)), c.at("decoded").get<std::string>()) << label;
    check_stream(t, ids_of(c), label);
  }
}

TEST(TokenizerQwen3, AddedTokenFlags) {
  const Tokenizer& t = qwen3();
  const auto think = t.token_to_id("<think>");
  ASSERT_TRUE(think.has_value());
  EXPECT_EQ(*think, 151667);
  EXPECT_TRUE(t.is_added(*think));
  EXPECT_FALSE(t.is_special(*think));  // added but not special: kept by skip_special
  EXPECT_TRUE(t.is_special(151645));   // <|im_end|>
  const std::vector<int32_t> ids = t.encode("<|im_start|><think>x</think><|im_end|>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "<think>x</think>");
  EXPECT_EQ(t.chat_template(), "");  // no tokenizer_config.json next to this file
}

// ---------------------------------------------------------------------------------------------
// Synthetic tokenizer.json files.

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("oscar_tok_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// GPT-2 bytes_to_unicode(), written out independently of the library: the symbol of byte `b`.
std::string byte_symbol(int b) {
  int cp = b, extra = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    if (x == b) {
      cp = printable ? b : 256 + extra;
      break;
    }
    if (!printable) ++extra;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A byte-level BPE over the 256 byte symbols (ids 0..255 in byte order) plus `merges`, each
// adding the merged token at the next id.
json synthetic(const std::vector<std::pair<std::string, std::string>>& merges, bool as_strings) {
  json j = read_json(kTinyDir + std::string("/tokenizer.json"));
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  json jm = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    if (as_strings) {
      jm.push_back(a + " " + b);
    } else {
      jm.push_back(json::array({a, b}));
    }
  }
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = jm;
  j["added_tokens"] = json::array();
  return j;
}

TEST(TokenizerSynthetic, TinyMergesAsStringsGiveSameIds) {
  // Rewrite the tiny tokenizer's ["a","b"] merges as "a b" strings; every golden must still hold.
  json j = read_json(kTinyDir + std::string("/tokenizer.json"));
  ASSERT_TRUE(j["model"]["merges"][0].is_array());
  json strings = json::array();
  for (const json& m : j["model"]["merges"]) {
    strings.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  j["model"]["merges"] = strings;
  TempDir dir;
  auto r = Tokenizer::load(dir.write("tokenizer.json", j.dump()));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const json cases = read_json(kTinyCases).at("cases");  // a copy: the parsed file is a temporary
  for (const json& c : cases) {
    EXPECT_EQ(r->encode(from_hex(c.at("text_utf8_hex"))), ids_of(c)) << c.at("text_utf8_hex");
  }
  EXPECT_EQ(r->chat_template(), "");  // no tokenizer_config.json in the temp dir
}

TEST(TokenizerSynthetic, MergeRankOrder) {
  // "abc": merges (b,c) rank 0, (a,b) rank 1, (a,bc) rank 2 -> a+bc -> one token.
  for (bool as_strings : {false, true}) {
    TempDir dir;
    const json j = synthetic({{"b", "c"}, {"a", "b"}, {"a", "bc"}}, as_strings);
    auto r = Tokenizer::load(dir.write("tokenizer.json", j.dump()));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->encode("abc"), (std::vector<int32_t>{258})) << as_strings;
    EXPECT_EQ(r->encode("ab"), (std::vector<int32_t>{257})) << as_strings;
    EXPECT_EQ(r->encode("abab"), (std::vector<int32_t>{257, 257})) << as_strings;
    EXPECT_EQ(r->encode("aaa"), (std::vector<int32_t>{'a', 'a', 'a'})) << as_strings;
    EXPECT_EQ(r->decode(r->encode("abc abc")), "abc abc");
  }
  // Equal pairs merge leftmost first: "aaa" with (a,a) -> [aa, a].
  TempDir dir;
  auto r = Tokenizer::load(dir.write("tokenizer.json", synthetic({{"a", "a"}}, false).dump()));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->encode("aaa"), (std::vector<int32_t>{256, 'a'}));
}

TEST(TokenizerSynthetic, AddedTokenStripAndNormalizedFlags) {
  json j = synthetic({}, false);
  j["added_tokens"] = json::array({
      {{"id", 300}, {"content", "<m>"}, {"special", true}, {"normalized", false},
       {"lstrip", true}, {"rstrip", true}, {"single_word", false}},
      {{"id", 301}, {"content", "w"}, {"special", false}, {"normalized", false},
       {"lstrip", false}, {"rstrip", false}, {"single_word", true}},
      // normalized: matched after NFC, so a decomposed "é" (e + U+0301) also matches.
      {{"id", 302}, {"content", "\xC3\xA9"}, {"special", false}, {"normalized", true},
       {"lstrip", false}, {"rstrip", false}, {"single_word", false}},
  });
  TempDir dir;
  auto r = Tokenizer::load(dir.write("tokenizer.json", j.dump()));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->vocab_size(), 303);
  EXPECT_EQ(r->encode("a  <m>  b"), (std::vector<int32_t>{'a', 300, 'b'}));
  // single_word: "w" alone is the added token; inside a word it is not.
  EXPECT_EQ(r->encode("w"), (std::vector<int32_t>{301}));
  const std::vector<int32_t> spaced = r->encode("x w y");
  EXPECT_EQ(std::count(spaced.begin(), spaced.end(), 301), 1);
  const std::vector<int32_t> inside = r->encode("awb");
  EXPECT_EQ(std::count(inside.begin(), inside.end(), 301), 0);
  EXPECT_EQ(r->encode("e\xCC\x81"), (std::vector<int32_t>{302}));
  EXPECT_EQ(r->encode("\xC3\xA9"), (std::vector<int32_t>{302}));
  EXPECT_EQ(r->decode(r->encode("e\xCC\x81 w")), "\xC3\xA9 w");
}

TEST(TokenizerSynthetic, ByteLevelWithGpt2Regex) {
  // ByteLevel(use_regex=true) alone: GPT-2 splitting (" 123" stays one pre-token, unlike Qwen).
  json j = synthetic({{"1", "2"}, {"\xC4\xA0", "12"}}, false);  // "Ġ" + "12"
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                        {"trim_offsets", true}, {"use_regex", true}};
  j["normalizer"] = nullptr;
  TempDir dir;
  auto r = Tokenizer::load(dir.write("tokenizer.json", j.dump()));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->encode(" 12"), (std::vector<int32_t>{257}));
  EXPECT_EQ(r->encode("x 12"), (std::vector<int32_t>{'x', 257}));
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto r2 = Tokenizer::load(dir.write("tokenizer.json", j.dump()));
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(r2->encode("12"), (std::vector<int32_t>{257}));
}

TEST(TokenizerSynthetic, MalformedFilesGiveClearErrors) {
  TempDir dir;
  auto expect_error = [&](const std::string& text, StatusCode code, const std::string& needle) {
    auto r = Tokenizer::load(dir.write("tokenizer.json", text));
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("tokenizer.json"), std::string::npos)
        << r.status().to_string();
  };
  expect_error("{not json", StatusCode::kInvalidArgument, "not valid JSON");
  expect_error("[1, 2]", StatusCode::kInvalidArgument, "not a JSON object");
  expect_error("{\"version\": \"1.0\"}", StatusCode::kInvalidArgument, "missing 'model'");

  json j = synthetic({{"a", "b"}}, false);
  json k = j;
  k["normalizer"] = {{"type", "Lowercase"}};
  expect_error(k.dump(), StatusCode::kUnimplemented, "normalizer type 'Lowercase'");
  k = j;
  k["model"]["type"] = "WordPiece";
  expect_error(k.dump(), StatusCode::kUnimplemented, "model type 'WordPiece'");
  k = j;
  k["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(k.dump(), StatusCode::kUnimplemented, "pre_tokenizer type 'Whitespace'");
  k = j;
  k["decoder"] = {{"type", "WordPiece"}};
  expect_error(k.dump(), StatusCode::kUnimplemented, "decoder type 'WordPiece'");
  k = j;
  k["model"]["merges"].push_back("a zz");
  expect_error(k.dump(), StatusCode::kInvalidArgument, "merge 1 ('a' 'zz')");
  k = j;
  k["model"]["merges"].push_back("abc");
  expect_error(k.dump(), StatusCode::kInvalidArgument, "merge 1 'abc'");
  k = j;
  k["model"]["vocab"] = json::array();
  expect_error(k.dump(), StatusCode::kInvalidArgument, "model.vocab");
  k = j;
  k["model"]["vocab"]["a"] = "x";
  expect_error(k.dump(), StatusCode::kInvalidArgument, "vocab token 'a' has a string");
  k = j;
  k["model"].erase("merges");
  expect_error(k.dump(), StatusCode::kInvalidArgument, "model.merges is missing");
  k = j;
  k["model"]["merges"].push_back(json::array({"a", "b", "c"}));
  expect_error(k.dump(), StatusCode::kInvalidArgument, "merge 1 has more than two parts");
  k = j;
  k["model"]["type"] = 3;
  expect_error(k.dump(), StatusCode::kInvalidArgument, "unexpected structure");
  k = j;
  k["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(k.dump(), StatusCode::kInvalidArgument, "regex '(unclosed'");

  auto missing = Tokenizer::load((dir.path() / "nope").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().to_string();
}

}  // namespace
}  // namespace oscar::tok
