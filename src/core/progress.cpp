#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/status.h"

namespace oscar {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = s / 3600, m = (s / 60) % 60, sec = s % 60;
  if (h > 0)
    return str_format("%lld:%02lld:%02lld", static_cast<long long>(h), static_cast<long long>(m),
                      static_cast<long long>(sec));
  return str_format("%lld:%02lld", static_cast<long long>(m), static_cast<long long>(sec));
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, std::FILE* out)
    : label_(std::move(label)), total_(total), unit_(std::move(unit)), out_(out),
      tty_(out != nullptr && isatty(fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()) {
  OSCAR_CHECK(total > 0, "ProgressBar %s: total %lld must be positive", label_.c_str(),
              static_cast<long long>(total));
}

double ProgressBar::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string ProgressBar::render(int64_t done, int64_t units_done, double elapsed_s) const {
  constexpr int kWidth = 24;
  const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total_), 0.0, 1.0);
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  const double rate = elapsed_s > 0 ? static_cast<double>(units_done) / elapsed_s : 0.0;
  const double eta = done > 0 ? elapsed_s * static_cast<double>(total_ - done) /
                                    static_cast<double>(done)
                              : -1.0;
  return str_format("%s [%s] %lld/%lld  %.0f %s/s  elapsed %s  ETA %s", label_.c_str(),
                    bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
                    rate, unit_.c_str(), format_duration(elapsed_s).c_str(),
                    format_duration(eta).c_str());
}

void ProgressBar::update(int64_t done, int64_t units_done) {
  last_done_ = done;
  last_units_ = units_done;
  if (out_ == nullptr) return;
  const std::string line = render(done, units_done, elapsed_s());
  if (tty_)
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
  else
    std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (out_ == nullptr) return;
  if (tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

ProgressBar::~ProgressBar() { finish(); }

}  // namespace oscar
