#include "eval/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace oscar::eval {

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {
  if (enabled_ && tty_) draw(false);
}

ProgressBar::~ProgressBar() { finish(status_); }

void ProgressBar::update(int64_t done, const std::string& status) {
  done_ = std::clamp<int64_t>(done, 0, total_);
  status_ = status;
  if (!enabled_ || finished_) return;
  if (tty_) {
    draw(false);
    return;
  }
  const int decile = static_cast<int>(done_ * 10 / total_);
  if (decile != last_decile_) {
    last_decile_ = decile;
    draw(false);
  }
}

void ProgressBar::finish(const std::string& status) {
  if (finished_) return;
  status_ = status;
  if (enabled_) draw(true);
  finished_ = true;
}

void ProgressBar::draw(bool final_line) {
  constexpr int kWidth = 30;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = static_cast<double>(done_) / static_cast<double>(total_);
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  char eta[32] = "";
  if (!final_line && done_ > 0 && done_ < total_)
    std::snprintf(eta, sizeof(eta), " eta %.0fs", elapsed / frac - elapsed);
  std::fprintf(stderr, "%s%-22s [%s] %lld/%lld %.0fs%s %s%s", tty_ ? "\r" : "", label_.c_str(),
               bar.c_str(), static_cast<long long>(done_), static_cast<long long>(total_), elapsed,
               eta, status_.c_str(), (final_line || !tty_) ? "\n" : "\033[K");
  std::fflush(stderr);
}

}  // namespace oscar::eval
