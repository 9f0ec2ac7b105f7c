// Measured machine bandwidths, the inputs of the predicted tokens/s (the seed interpolated
// between guessed compute times; we measure what decode is bound by).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace substrate::compiler {

// Streaming read of a `bytes` buffer, best of `repeats`, one thread: bytes/s.
Expected<double> MeasureMemoryReadBandwidth(uint64_t bytes = 256ull << 20, int repeats = 3);

struct FileReadMeasurement {
  double bytes_per_second = 0;
  uint64_t bytes_read = 0;
  bool direct_io = false;  // false: the filesystem refused O_DIRECT, the page cache may have helped
};
// Sequential 4 MiB reads of up to max_bytes of `path`, with O_DIRECT where allowed.
Expected<FileReadMeasurement> MeasureFileReadBandwidth(const std::string& path,
                                                      uint64_t max_bytes = 512ull << 20);

}  // namespace substrate::compiler

namespace substrate::compiler {

// Writes `bytes` to a scratch file in `dir`, syncs it, times direct-I/O reads of it, removes it.
Expected<FileReadMeasurement> MeasureScratchReadBandwidth(const std::string& dir,
                                                         uint64_t bytes = 256ull << 20);

}  // namespace substrate::compiler
