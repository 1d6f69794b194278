// A minimal progress bar on stderr for long evaluation loops (perplexity windows, NIAH prompts).
//
// Local to src/eval until a shared core/progress.h exists. On a terminal it redraws one line
// with '\r'; otherwise (logs, CI) it prints a plain line at every 10% step. Not thread-safe: one
// loop owns one bar. Nothing is printed when `enabled` is false (tests).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace oscar::eval {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled = true);
  ~ProgressBar();  // finish() if not done yet
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Sets the count of finished items (0 <= done <= total) and an optional short status text.
  void update(int64_t done, const std::string& status = "");
  // Prints the final line (elapsed time) once.
  void finish(const std::string& status = "");

 private:
  void draw(bool final_line);

  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  int last_decile_ = -1;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  std::string status_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace oscar::eval
