// Logging: one line per event, printf-style and format-checked, `key=value` fields by convention,
// to a replaceable sink (stderr by default). Never log from kernels or per-token loops.
#pragma once

#include <functional>
#include <string>

namespace oscar {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Replace the sink (tests capture lines; the server may add timestamps). Thread-safe.
void set_log_sink(std::function<void(LogLevel, const std::string&)> sink);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace oscar

#define OSCAR_LOG_DEBUG(...) ::oscar::log_message(::oscar::LogLevel::kDebug, __VA_ARGS__)
#define OSCAR_LOG_INFO(...) ::oscar::log_message(::oscar::LogLevel::kInfo, __VA_ARGS__)
#define OSCAR_LOG_WARN(...) ::oscar::log_message(::oscar::LogLevel::kWarn, __VA_ARGS__)
#define OSCAR_LOG_ERROR(...) ::oscar::log_message(::oscar::LogLevel::kError, __VA_ARGS__)
