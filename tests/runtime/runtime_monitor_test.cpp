// RuntimeMonitor: the windows, the critical states and their hysteresis, on synthetic tokens.
#include "runtime/runtime_monitor.h"

#include <gtest/gtest.h>

namespace substrate {
namespace {

RuntimeMonitorOptions Options() {
  RuntimeMonitorOptions o;
  o.window = 8;
  o.min_window_bytes = 1 << 20;
  return o;
}

// n tokens of `ms` milliseconds, each reading `kb` KiB in `read_ms`; the transitions seen.
int Feed(RuntimeMonitor& m, int n, double ms, uint64_t kb = 0, double read_ms = 0) {
  int changes = 0;
  for (int i = 0; i < n; ++i) changes += m.OnToken(ms / 1e3, kb << 10, read_ms / 1e3);
  return changes;
}

TEST(RuntimeMonitor, LatencyGoesCriticalAndRecoversWithHysteresis) {
  RuntimeMonitor m(Options());
  EXPECT_EQ(Feed(m, 8, 10), 0);
  EXPECT_NEAR(m.predicted_seconds(), 0.010, 1e-9) << "the first window is the prediction";
  EXPECT_EQ(Feed(m, 20, 11), 0) << "10 % slower is normal";
  EXPECT_EQ(Feed(m, 2, 30), 0) << "two slow tokens do not move the window's mean past 2x";
  EXPECT_EQ(Feed(m, 8, 30), 1);
  EXPECT_EQ(m.state(), RuntimeState::kLatencyCritical);
  EXPECT_GT(m.latency_ratio(), 2.0);
  // Back to 16 ms: 1.5x the prediction, below the entry but above the exit: still critical.
  EXPECT_EQ(Feed(m, 8, 16), 0);
  EXPECT_EQ(m.state(), RuntimeState::kLatencyCritical);
  EXPECT_NEAR(m.predicted_seconds(), 0.0105, 0.001) << "frozen while critical";
  EXPECT_EQ(Feed(m, 8, 10), 1);
  EXPECT_EQ(m.state(), RuntimeState::kNormal);
  EXPECT_EQ(m.stats().transitions, 2u);
  EXPECT_GT(m.stats().critical_tokens, 8u);
}

TEST(RuntimeMonitor, DiskBandwidthGoesCriticalOnlyWhenMeasured) {
  RuntimeMonitor m(Options());
  // 512 KiB a token in 0.5 ms: 1 GiB/s.
  EXPECT_EQ(Feed(m, 16, 10, 512, 0.5), 0);
  // Tokens that read nothing say nothing about the disk.
  EXPECT_EQ(Feed(m, 16, 10), 0);
  EXPECT_EQ(m.state(), RuntimeState::kNormal);
  EXPECT_EQ(m.bw_ratio(), 0);
  // The same bytes in 2.5 ms: a fifth of the bandwidth (the token time unchanged: hidden).
  EXPECT_EQ(Feed(m, 16, 10, 512, 0.5), 0);
  EXPECT_EQ(Feed(m, 8, 10, 512, 2.5), 1);
  EXPECT_EQ(m.state(), RuntimeState::kSsdBwCritical);
  EXPECT_LT(m.bw_ratio(), 0.5);
  EXPECT_EQ(Feed(m, 8, 10, 512, 0.5), 1);
  EXPECT_EQ(m.state(), RuntimeState::kNormal);
}

}  // namespace
}  // namespace substrate
