// Status and Result<T>: how failures at a boundary (files, JSON, requests, pools) are reported.
// Exceptions never cross module boundaries; convert them to Status at the call site.
// Broken internal invariants are not Status: they abort through OSCAR_CHECK (core/check.h).
#pragma once

#include <cstdarg>
#include <optional>
#include <string>
#include <utility>

namespace oscar {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input from a user or a file
  kNotFound,         // a file, tensor or model that is not there
  kOutOfRange,       // a size or index beyond a limit (context length, header cap)
  kResourceExhausted,// out of KV pages, out of memory budget
  kUnimplemented,    // valid but unsupported (unknown architecture, dtype)
  kInternal,         // a bug surfaced as an error at a boundary
  kCancelled,
  kUnavailable,      // cannot run work now (the device failed): retry elsewhere
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: message"
  std::string to_string() const;

  // Prefix the message with context: "loading model: " + message.
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// printf-style constructors for the common codes.
Status invalid_argument(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Status not_found(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Status out_of_range(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Status resource_exhausted(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Status unimplemented(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Status internal_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
Status unavailable(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

std::string str_vformat(const char* fmt, va_list args);
std::string str_format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}             // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}     // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace oscar

#define OSCAR_CONCAT_INNER(a, b) a##b
#define OSCAR_CONCAT(a, b) OSCAR_CONCAT_INNER(a, b)

// Return the Status of `expr` from the enclosing function if it is not OK.
#define OSCAR_RETURN_IF_ERROR(expr)             \
  do {                                          \
    ::oscar::Status _oscar_st = (expr);         \
    if (!_oscar_st.ok()) return _oscar_st;      \
  } while (0)

// `OSCAR_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result<T> or returns its Status.
#define OSCAR_ASSIGN_OR_RETURN(lhs, expr) \
  OSCAR_ASSIGN_OR_RETURN_IMPL(OSCAR_CONCAT(_oscar_res_, __LINE__), lhs, expr)
#define OSCAR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
