// Field readers shared by the request parsers (json_fields.h).
#include "server/json_fields.h"

#include <limits>

#include "core/status.h"

namespace oscar::server::json_fields {

using json = nlohmann::ordered_json;

const char* type_name(const json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

ApiError wrong_type(const std::string& field, const char* expected, const json& got) {
  return invalid_request(
      str_format("'%s' must be %s, got %s", field.c_str(), expected, type_name(got)), field);
}

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> int_in(const json& v, const char* key, int64_t lo, int64_t hi,
                               int64_t* out) {
  if (!v.is_number_integer()) return wrong_type(key, "an integer", v);
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
            ? std::numeric_limits<int64_t>::max()
            : static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) {
    return invalid_request(
        str_format("'%s' must be in [%lld, %lld], got %lld", key, static_cast<long long>(lo),
                   static_cast<long long>(hi), static_cast<long long>(x)),
        key);
  }
  *out = x;
  return std::nullopt;
}

}  // namespace oscar::server::json_fields
