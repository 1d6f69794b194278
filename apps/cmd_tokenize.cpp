// `oscar tokenize`: text -> ids, or ids -> text with --decode. DIR may hold only tokenizer.json.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "apps/commands.h"
#include "tokenizer/tokenizer.h"

namespace oscar::apps {

Command add_tokenize(CLI::App& app) {
  auto dir = std::make_shared<std::string>("models/tiny-qwen3");
  auto text = std::make_shared<std::string>();
  auto decode = std::make_shared<bool>(false);
  auto show_tokens = std::make_shared<bool>(false);
  auto file = std::make_shared<std::string>();
  app.add_option("-m,--model", *dir, "Model or tokenizer directory, or a tokenizer.json")
      ->capture_default_str();
  auto* text_opt =
      app.add_option("text", *text, "Text to encode, or space/comma separated ids with --decode");
  auto* file_opt = app.add_option("-f,--file", *file,
                                  "Read the text (or the ids) from this file instead; - = stdin");
  text_opt->excludes(file_opt);
  app.add_flag("-d,--decode", *decode, "Decode ids back to text");
  app.add_flag("--tokens", *show_tokens, "Also print each token's byte-level string");
  return [=]() -> int {
    if (!file->empty()) {
      std::ostringstream all;
      if (*file == "-") {
        all << std::cin.rdbuf();
      } else {
        std::ifstream in(*file, std::ios::binary);
        if (!in) {
          std::fprintf(stderr, "error: cannot open %s\n", file->c_str());
          return 2;
        }
        all << in.rdbuf();
      }
      *text = all.str();
    } else if (text->empty()) {
      std::fprintf(stderr, "error: give the text, or --file PATH\n");
      return 2;
    }
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
      if (file->empty()) std::fputc('\n', stdout);  // --file: the exact bytes, for scripts
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
