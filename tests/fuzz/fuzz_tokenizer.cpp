// libFuzzer target for the tokenizer: loads models/tiny-qwen3's tokenizer once, then for any input
// bytes checks that decode(encode(x)) reproduces the normalized text (NFC outside added tokens;
// invalid UTF-8 first repaired to U+FFFD), that every id is valid, and that streaming decode,
// token by token, emits only valid UTF-8 and concatenates to the full decode. Aborts on mismatch.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.h"
#include "tokenizer/tokenizer.h"

namespace {

// models/tiny-qwen3 of the source tree this file was compiled from (CMake passes an absolute
// __FILE__); falls back to the working directory (scripts/fuzz.sh runs from the repository root).
std::string default_tokenizer_dir() {
  std::string file = __FILE__;
  const std::string suffix = "tests/fuzz/fuzz_tokenizer.cpp";
  if (file.size() >= suffix.size() && file.compare(file.size() - suffix.size(), suffix.size(),
                                                   suffix) == 0) {
    return file.substr(0, file.size() - suffix.size()) + "models/tiny-qwen3";
  }
  return "models/tiny-qwen3";
}

const oscar::tok::Tokenizer& tokenizer() {
  static const oscar::tok::Tokenizer* tok = [] {
    const char* env = std::getenv("OSCAR_FUZZ_TOKENIZER");  // debugging knob: another tokenizer
    auto r = oscar::tok::Tokenizer::load(env ? std::string(env) : default_tokenizer_dir());
    if (!r.ok()) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", r.status().to_string().c_str());
      std::abort();
    }
    return new oscar::tok::Tokenizer(std::move(r).value());
  }();
  return *tok;
}

void fail(const char* what, std::string_view input) {
  std::fprintf(stderr, "fuzz_tokenizer: %s (input %zu bytes)\n", what, input.size());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const oscar::tok::Tokenizer& tok = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok.encode(text);
  if (!tok.validate_ids(ids).ok()) fail("encode produced an invalid id", text);
  const std::string decoded = tok.decode(ids);
  // For valid UTF-8 without added tokens, normalize(x) is exactly NFC(x).
  if (decoded != tok.normalize(text)) fail("decode(encode(x)) != normalize(x)", text);

  oscar::tok::StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string chunk = stream.push(id);
    if (!oscar::utf8::valid(chunk)) fail("stream emitted invalid UTF-8", text);
    streamed += chunk;
  }
  streamed += stream.flush();
  if (streamed != decoded) fail("streamed decode != decode", text);
  return 0;
}
