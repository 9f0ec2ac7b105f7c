#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace substrate {

ProgressBar::ProgressBar(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total ? total : 1) {
  enabled_ = isatty(STDERR_FILENO) || std::getenv("SUBSTRATE_PROGRESS") != nullptr;
  start_ = last_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done, const std::string& detail) {
  if (!enabled_ || finished_) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  double frac = static_cast<double>(done) / static_cast<double>(total_);
  if (frac > 1) frac = 1;
  const int width = 30;
  int fill = static_cast<int>(frac * width);
  double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %6.1fs %s", label_.c_str(), fill,
               "##############################", width - fill, "", frac * 100, secs,
               detail.substr(0, 40).c_str());
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (!enabled_ || finished_) return;
  Update(total_);
  finished_ = true;
  std::fputc('\n', stderr);
}

}  // namespace substrate
