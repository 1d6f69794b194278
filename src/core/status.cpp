#include "core/status.h"

#include <cstdio>
#include <vector>

namespace oscar {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnavailable: return "Unavailable";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

std::string str_vformat(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  return out;
}

std::string str_format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = str_vformat(fmt, args);
  va_end(args);
  return s;
}

#define OSCAR_DEFINE_STATUS_CTOR(fn, code)     \
  Status fn(const char* fmt, ...) {            \
    va_list args;                              \
    va_start(args, fmt);                       \
    std::string s = str_vformat(fmt, args);        \
    va_end(args);                              \
    return Status(code, std::move(s));         \
  }

OSCAR_DEFINE_STATUS_CTOR(invalid_argument, StatusCode::kInvalidArgument)
OSCAR_DEFINE_STATUS_CTOR(not_found, StatusCode::kNotFound)
OSCAR_DEFINE_STATUS_CTOR(out_of_range, StatusCode::kOutOfRange)
OSCAR_DEFINE_STATUS_CTOR(resource_exhausted, StatusCode::kResourceExhausted)
OSCAR_DEFINE_STATUS_CTOR(unimplemented, StatusCode::kUnimplemented)
OSCAR_DEFINE_STATUS_CTOR(internal_error, StatusCode::kInternal)
OSCAR_DEFINE_STATUS_CTOR(unavailable, StatusCode::kUnavailable)

}  // namespace oscar
