#include "runtime/runtime_monitor.h"

#include <algorithm>

namespace substrate {

const char* RuntimeStateName(RuntimeState s) {
  switch (s) {
    case RuntimeState::kNormal:
      return "normal";
    case RuntimeState::kLatencyCritical:
      return "latency_critical";
    case RuntimeState::kSsdBwCritical:
      return "ssd_bw_critical";
  }
  return "?";
}

RuntimeMonitor::RuntimeMonitor(const RuntimeMonitorOptions& o) : o_(o) {
  o_.window = std::max(o_.window, 1);
  secs_.assign(static_cast<size_t>(o_.window), 0);
  bytes_.assign(static_cast<size_t>(o_.window), 0);
  read_secs_.assign(static_cast<size_t>(o_.window), 0);
}

bool RuntimeMonitor::OnToken(double seconds, uint64_t read_bytes, double read_seconds) {
  ++stats_.tokens;
  secs_[next_] = seconds;
  bytes_[next_] = static_cast<double>(read_bytes);
  read_secs_[next_] = read_seconds;
  next_ = (next_ + 1) % o_.window;
  filled_ = std::min(filled_ + 1, o_.window);
  if (filled_ < o_.window) return false;  // the first window: the run's own prediction

  double s = 0, b = 0, rs = 0;
  for (int i = 0; i < o_.window; ++i) s += secs_[i], b += bytes_[i], rs += read_secs_[i];
  const double mean_s = s / o_.window;
  const double bw = b >= static_cast<double>(o_.min_window_bytes) && rs > 0 ? b / rs : 0;
  if (predicted_s_ == 0) predicted_s_ = mean_s;
  if (expected_bw_ == 0 && bw > 0) expected_bw_ = bw;
  latency_ratio_ = predicted_s_ > 0 ? mean_s / predicted_s_ : 0;
  bw_ratio_ = expected_bw_ > 0 && bw > 0 ? bw / expected_bw_ : 0;

  const RuntimeState before = state_;
  const bool bw_measured = bw_ratio_ > 0;
  switch (state_) {
    case RuntimeState::kNormal:
      if (latency_ratio_ > o_.latency_enter) {
        state_ = RuntimeState::kLatencyCritical;
      } else if (bw_measured && bw_ratio_ < o_.bw_enter) {
        state_ = RuntimeState::kSsdBwCritical;
      } else {  // learn slowly, only from tokens that look normal themselves
        if (seconds < o_.latency_exit * predicted_s_)
          predicted_s_ = 0.98 * predicted_s_ + 0.02 * seconds;
        if (bw_measured && bw_ratio_ > o_.bw_exit) expected_bw_ = 0.95 * expected_bw_ + 0.05 * bw;
      }
      break;
    case RuntimeState::kLatencyCritical:
      if (latency_ratio_ < o_.latency_exit) state_ = RuntimeState::kNormal;
      break;
    case RuntimeState::kSsdBwCritical:
      if (!bw_measured || bw_ratio_ > o_.bw_exit) state_ = RuntimeState::kNormal;
      break;
  }
  if (state_ != RuntimeState::kNormal) ++stats_.critical_tokens;
  if (state_ == before) return false;
  ++stats_.transitions;
  return true;
}

}  // namespace substrate
