// A small text progress bar for long command-line jobs (calibration, evaluation): items done of a
// total, a throughput in caller-chosen units (tokens/s) and an ETA, redrawn in place on a
// terminal ('\r') and printed as one line per update otherwise (logs, CI). It never touches
// stdout. Not thread-safe: call it from one thread. Time comes from std::chrono::steady_clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace oscar {

class ProgressBar {
 public:
  // label: printed before the bar ("calibrate"); total: number of items (> 0, checked);
  // unit: name of the throughput unit ("tok"); out: stream, stderr by default (not owned).
  ProgressBar(std::string label, int64_t total, std::string unit = "it",
              std::FILE* out = stderr);
  // Items done so far (0..total) and the throughput units processed so far (e.g. tokens).
  void update(int64_t done, int64_t units_done);
  // Ends the line (and prints the elapsed time). Called by the destructor if not called.
  void finish();
  ~ProgressBar();

  double elapsed_s() const;
  // The line update() would draw, without the leading '\r' (for tests).
  std::string render(int64_t done, int64_t units_done, double elapsed_s) const;

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  std::string label_;
  int64_t total_;
  std::string unit_;
  std::FILE* out_;
  bool tty_;
  bool finished_ = false;
  int64_t last_done_ = 0, last_units_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// "1:02:03" or "2:03" for a duration in seconds ("?" when negative or not finite).
std::string format_duration(double seconds);

}  // namespace oscar
