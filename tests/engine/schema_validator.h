// An independent JSON Schema validator for the tests, written from the spec for the keywords
// engine/json_schema.h supports (not from the machine): validate(v, schema, root, &why).
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
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
