// An independent JSON Schema validator for the tests, written from the spec for the keywords
// engine/json_schema.h supports (not from the machine): validate(v, schema, root, &why). Patterns
// go to std::wregex (ECMAScript, regex_search) over the code points; formats to checks written
// from their RFCs (inet_pton for the IP addresses, a calendar for dates).
#pragma once

#include <arpa/inet.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace oscar::engine::test {

using json = nlohmann::ordered_json;

inline bool validate(const json& v, const json& s, const json& root, std::string* why);

inline bool validate_type(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline std::wstring code_point_string(const std::string& s) {  // UTF-8 in, valid
  std::wstring out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = n == 1 ? c : c & (0x3F >> (n - 1));
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(static_cast<wchar_t>(cp));
    i += static_cast<size_t>(n);
  }
  return out;
}

// regex_search, or true where std::wregex and ECMA-262 disagree (its C locale leaves the
// non-ASCII white space out of \s).
inline bool pattern_matches(const std::string& pattern, const std::string& text) {
  const std::wstring t = code_point_string(text);
  for (wchar_t c : t)
    if (c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
        c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF)
      return true;
  return std::regex_search(t, std::wregex(code_point_string(pattern), std::regex::ECMAScript));
}

inline bool valid_date(const std::string& s) {  // RFC 3339 full-date
  if (!std::regex_match(s, std::regex(R"(\d{4}-\d{2}-\d{2})"))) return false;
  const int y = std::stoi(s.substr(0, 4)), m = std::stoi(s.substr(5, 2)),
            d = std::stoi(s.substr(8));
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m >= 1 && m <= 12 && d >= 1 && d <= days[m - 1];
}

inline bool valid_time(const std::string& s) {  // RFC 3339 full-time
  std::smatch m;
  if (!std::regex_match(s, m,
                        std::regex(R"((\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d)))")))
    return false;
  if (std::stoi(m[1]) > 23 || std::stoi(m[2]) > 59 || std::stoi(m[3]) > 60) return false;
  return !m[6].matched || (std::stoi(m[6]) <= 23 && std::stoi(m[7]) <= 59);
}

inline bool valid_hostname(const std::string& s) {  // RFC 1123 labels
  size_t start = 0;
  for (;;) {
    const size_t dot = s.find('.', start);
    const std::string label = s.substr(start, dot == std::string::npos ? dot : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
      return false;
    for (char c : label)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

inline bool valid_format(const std::string& format, const std::string& s) {
  unsigned char addr[16];
  if (format == "date") return valid_date(s);
  if (format == "time") return valid_time(s);
  if (format == "date-time") {
    const size_t t = s.find_first_of("Tt");
    return t != std::string::npos && valid_date(s.substr(0, t)) && valid_time(s.substr(t + 1));
  }
  if (format == "uuid")
    return std::regex_match(s, std::regex("[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"));
  if (format == "email") {
    const size_t at = s.find('@');
    return at > 0 && at != std::string::npos && s.find('@', at + 1) == std::string::npos &&
           s.find('.', at) != std::string::npos && valid_hostname(s.substr(at + 1)) &&
           s.find_first_of(" \"(),:;<>[\\]") == std::string::npos;
  }
  if (format == "ipv4") return inet_pton(AF_INET, s.c_str(), addr) == 1;
  if (format == "ipv6") return inet_pton(AF_INET6, s.c_str(), addr) == 1;
  if (format == "hostname") return valid_hostname(s);
  if (format == "uri")
    return std::regex_match(s, std::regex(R"([A-Za-z][A-Za-z0-9+.-]*:[^\s"<>\\^`{|}]*)"));
  return true;  // an annotation
}

inline bool validate(const json& v, const json& s, const json& root, std::string* why) {
  auto no = [&](const std::string& w) {
    *why = w + " at " + v.dump() + " for " + s.dump();
    return false;
  };
  if (s.is_boolean()) return s.get<bool>() || no("false schema");
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validate(v, root.at(json::json_pointer(ref.substr(1))), root, why);
  }
  if (s.contains("anyOf")) {
    for (const json& o : s["anyOf"])
      if (validate(v, o, root, why)) return true;
    return no("anyOf");
  }
  if (s.contains("type")) {
    const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool ok = false;
    for (const json& t : types) ok = ok || validate_type(v, t);
    if (!ok) return no("type");
  }
  if (s.contains("enum")) {
    bool ok = false;
    for (const json& e : s["enum"]) ok = ok || e == v;
    if (!ok) return no("enum");
  }
  if (s.contains("const") && s["const"] != v) return no("const");
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return no("required " + r.get<std::string>());
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!validate(it.value(), props[it.key()], root, why)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!validate(it.value(), s["additionalProperties"], root, why)) return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return no("minItems");
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return no("maxItems");
    if (s.contains("items"))
      for (const json& e : v)
        if (!validate(e, s["items"], root, why)) return false;
  }
  if (v.is_string()) {
    const size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return no("minLength");
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return no("maxLength");
    if (s.contains("pattern") && !pattern_matches(s["pattern"], v.get<std::string>()))
      return no("pattern");
    if (s.contains("format") && !valid_format(s["format"], v.get<std::string>()))
      return no("format");
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return no("minimum");
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return no("maximum");
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>())
      return no("exclusiveMinimum");
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>())
      return no("exclusiveMaximum");
  }
  return true;
}

}  // namespace oscar::engine::test
