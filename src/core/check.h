// Always-on invariant checks. A failed OSCAR_CHECK is a bug in oscar, never bad user input
// (bad input returns a Status): it prints file, line and message, then aborts.
// OSCAR_DCHECK guards hot loops and is active only in Debug and sanitizer builds.
#pragma once

namespace oscar {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
}  // namespace oscar

#define OSCAR_CHECK(cond, ...)                                                   \
  do {                                                                           \
    if (__builtin_expect(!(cond), 0))                                            \
      ::oscar::check_failed(__FILE__, __LINE__, #cond, "" __VA_ARGS__);          \
  } while (0)

#if defined(NDEBUG) && !defined(OSCAR_ENABLE_DCHECK)
#define OSCAR_DCHECK(cond, ...) \
  do {                          \
  } while (0)
#else
#define OSCAR_DCHECK(cond, ...) OSCAR_CHECK(cond, __VA_ARGS__)
#endif
