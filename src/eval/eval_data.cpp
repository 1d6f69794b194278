#include "eval/eval_data.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace oscar::eval {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open %s", path.c_str());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return invalid_argument("error reading %s", path.c_str());
  return ss.str();
}

Result<std::vector<NiahCase>> load_niah(const std::string& path) {
  OSCAR_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  std::vector<NiahCase> cases;
  std::istringstream lines(text);
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      NiahCase c;
      c.id = j.at("id").get<std::string>();
      c.target_len = j.at("target_len").get<int>();
      c.n_prompt_tokens = j.at("n_prompt_tokens").get<int>();
      c.prompt = j.at("prompt").get<std::string>();
      c.answer = j.at("answer").get<std::string>();
      c.key = j.value("key", std::string());
      if (c.n_prompt_tokens <= 0 || c.target_len <= c.n_prompt_tokens || c.answer.empty())
        return invalid_argument("%s:%d: bad case %s (target_len %d, n_prompt_tokens %d)",
                                path.c_str(), line_no, c.id.c_str(), c.target_len,
                                c.n_prompt_tokens);
      cases.push_back(std::move(c));
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument("%s:%d: %s", path.c_str(), line_no, e.what());
    }
  }
  if (cases.empty()) return invalid_argument("%s holds no NIAH cases", path.c_str());
  return cases;
}

Result<std::vector<NiahCase>> select_niah(const std::vector<NiahCase>& cases,
                                          std::span<const int> lengths, int per_length,
                                          int skip) {
  if (per_length < 0) return invalid_argument("NIAH cases per length %d < 0", per_length);
  if (skip < 0) return invalid_argument("NIAH cases to skip %d < 0", skip);
  std::vector<NiahCase> out;
  for (int len : lengths) {
    int taken = 0, skipped = 0;
    for (const NiahCase& c : cases) {
      if (taken == per_length) break;
      if (c.target_len != len) continue;
      if (skipped < skip) {
        ++skipped;
        continue;
      }
      out.push_back(c);
      ++taken;
    }
    if (taken < per_length)
      return invalid_argument("NIAH: %d cases of length %d asked for after skipping %d, the file has %d",
                              per_length, len, skip, skipped + taken);
  }
  return out;
}

}  // namespace oscar::eval
