// RuntimeMonitor: the adaptive runtime's watchdog (the Substrate seed's LATENCY_CRITICAL and
// SSD_BW_CRITICAL). Per decode token it gets the token's wall time and what the runtime's reads
// moved and took during it; over a sliding window of tokens it compares the measured latency
// with the predicted one and the measured disk bandwidth with the expected one. When either
// goes critical the engine demotes every escalated op and holds escalations; it recovers with
// hysteresis (a lower threshold to leave than to enter).
//
// The prediction is the run's own: the first window's mean latency, then a slow moving average
// over tokens that look normal (frozen while critical, so a slow spell cannot become the norm);
// likewise the expected bandwidth over windows that read enough to measure it. Fixed-size rings: no
// allocation per token.
#pragma once

#include <cstdint>
#include <vector>

namespace substrate {

enum class RuntimeState { kNormal, kLatencyCritical, kSsdBwCritical };
const char* RuntimeStateName(RuntimeState s);

struct RuntimeMonitorOptions {
  int window = 16;                      // tokens per sliding window
  double latency_enter = 2.0;           // measured / predicted latency that enters LATENCY_CRITICAL
  double latency_exit = 1.3;            // ... and below which it leaves
  double bw_enter = 0.5;                // measured / expected bandwidth that enters SSD_BW_CRITICAL
  double bw_exit = 0.8;                 // ... and above which it leaves
  uint64_t min_window_bytes = 1 << 20;  // a window reading less says nothing about the disk
};

struct RuntimeMonitorStats {
  uint64_t tokens = 0, transitions = 0, critical_tokens = 0;
};

class RuntimeMonitor {
 public:
  explicit RuntimeMonitor(const RuntimeMonitorOptions& o = {});
  // One decode token. Returns true when the state changed.
  bool OnToken(double seconds, uint64_t read_bytes, double read_seconds);

  RuntimeState state() const { return state_; }
  double latency_ratio() const { return latency_ratio_; }  // window mean / predicted (0: warming)
  double bw_ratio() const { return bw_ratio_; }            // window / expected (0: unmeasured)
  double predicted_seconds() const { return predicted_s_; }
  const RuntimeMonitorStats& stats() const { return stats_; }

 private:
  RuntimeMonitorOptions o_;
  std::vector<double> secs_, bytes_, read_secs_;  // rings of `window` tokens
  int next_ = 0, filled_ = 0;
  double predicted_s_ = 0, expected_bw_ = 0;
  double latency_ratio_ = 0, bw_ratio_ = 0;
  RuntimeState state_ = RuntimeState::kNormal;
  RuntimeMonitorStats stats_;
};

}  // namespace substrate
