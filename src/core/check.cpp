#include "core/check.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace oscar {

void check_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
  std::fprintf(stderr, "OSCAR_CHECK failed at %s:%d: %s", file, line, cond);
  if (fmt != nullptr && fmt[0] != '\0') {
    std::fprintf(stderr, ": ");
    va_list args;
    va_start(args, fmt);
    std::vfprintf(stderr, fmt, args);
    va_end(args);
  }
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::abort();
}

}  // namespace oscar
