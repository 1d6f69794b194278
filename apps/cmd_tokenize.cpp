// `oscar tokenize`: text -> ids, or ids -> text with --decode. DIR may hold only tokenizer.json.
#include <cstdio>
#include <sstream>

#include "apps/commands.h"
#include "tokenizer/tokenizer.h"

namespace oscar::apps {

Command add_tokenize(CLI::App& app) {
  auto dir = std::make_shared<std::string>("models/tiny-qwen3");
  auto text = std::make_shared<std::string>();
  auto decode = std::make_shared<bool>(false);
  auto show_tokens = std::make_shared<bool>(false);
  app.add_option("-m,--model", *dir, "Model or tokenizer directory, or a tokenizer.json")
      ->capture_default_str();
  app.add_option("text", *text, "Text to encode, or space/comma separated ids with --decode")
      ->required();
  app.add_flag("-d,--decode", *decode, "Decode ids back to text");
  app.add_flag("--tokens", *show_tokens, "Also print each token's byte-level string");
  return [=]() -> int {
    auto tok = tok::Tokenizer::load(*dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "error: %s\n", tok.status().message().c_str());
      return 1;
    }
    if (*decode) {
      std::vector<int32_t> ids;
      std::string s = *text;
      for (char& c : s)
        if (c == ',' || c == '[' || c == ']') c = ' ';
      std::istringstream in(s);
      std::string word;
      while (in >> word) {
        char* end = nullptr;
        long v = std::strtol(word.c_str(), &end, 10);
        if (end == word.c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
          std::fprintf(stderr, "error: '%s' is not a token id\n", word.c_str());
          return 2;
        }
        ids.push_back(static_cast<int32_t>(v));
      }
      Status st = tok->validate_ids(ids);
      if (!st.ok()) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 2;
      }
      std::string out = tok->decode(ids);
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fputc('\n', stdout);
      return 0;
    }
    std::vector<int32_t> ids = tok->encode(*text);
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
    std::printf("\n");
    if (*show_tokens)
      for (int32_t id : ids) std::printf("%d\t%s\n", id, tok->id_to_token(id).c_str());
    std::fprintf(stderr, "%zu tokens\n", ids.size());
    return 0;
  };
}

}  // namespace oscar::apps
