// Reading a JSON request body field by field, each failure the 400 that names the field. Shared by
// the OpenAI parser (openai_request.cpp) and the token-level one (generate_endpoint.cpp); the
// rules each field must follow stay with its parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"

namespace oscar::server::json_fields {

// The type as error messages name it: "string", "boolean", "integer", "number", "array",
// "object" or "null".
const char* type_name(const nlohmann::ordered_json& v);
// The 400 "'<field>' must be <expected>, got <type>", with param `field`.
ApiError wrong_type(const std::string& field, const char* expected,
                    const nlohmann::ordered_json& got);
// The value of `key` in `obj`, or nullptr when it is absent or null (null means "not given").
const nlohmann::ordered_json* field(const nlohmann::ordered_json& obj, const char* key);
// An integer in [lo, hi] into *out (unsigned values beyond int64 saturate, then fail the range);
// else the 400 naming `key`.
std::optional<ApiError> int_in(const nlohmann::ordered_json& v, const char* key, int64_t lo,
                               int64_t hi, int64_t* out);

}  // namespace oscar::server::json_fields
