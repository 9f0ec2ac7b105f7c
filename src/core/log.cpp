#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace substrate {
namespace {

LogLevel LevelFromEnv() {
  const char* v = std::getenv("SUBSTRATE_LOG");
  if (!v) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  if (!std::strcmp(v, "info")) return LogLevel::kInfo;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  return LogLevel::kWarn;
}

std::atomic<int>& LevelStorage() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

}  // namespace

LogLevel CurrentLogLevel() { return static_cast<LogLevel>(LevelStorage().load()); }
void SetLogLevel(LogLevel level) { LevelStorage().store(static_cast<int>(level)); }

void LogF(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) > LevelStorage().load()) return;
  static const char* kNames[] = {"error", "warn", "info", "debug"};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[%s] ", kNames[static_cast<int>(level)]);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
}

}  // namespace substrate
