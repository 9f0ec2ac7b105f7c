// Minimal leveled logging to stderr. The level comes from SUBSTRATE_LOG (error|warn|info|debug),
// default warn, so that command output on stdout stays clean.
#pragma once

#include <cstdarg>

namespace substrate {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel CurrentLogLevel();
void SetLogLevel(LogLevel level);
void LogF(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace substrate

#define LOG_ERROR(...) ::substrate::LogF(::substrate::LogLevel::kError, __VA_ARGS__)
#define LOG_WARN(...) ::substrate::LogF(::substrate::LogLevel::kWarn, __VA_ARGS__)
#define LOG_INFO(...) ::substrate::LogF(::substrate::LogLevel::kInfo, __VA_ARGS__)
#define LOG_DEBUG(...) ::substrate::LogF(::substrate::LogLevel::kDebug, __VA_ARGS__)
