// A progress bar on stderr for long commands (quantize, convert, calibrate, synth). Silent when
// stderr is not a terminal unless forced, so logs and tests stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace substrate {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total);
  ~ProgressBar();
  void Update(uint64_t done, const std::string& detail = "");
  void Finish();

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace substrate
