// The machine's memory read bandwidth, measured the way a decode step reads weights: threads
// streaming through a buffer much larger than the last-level cache. This is the physical limit
// benchmarks compare decode speed with (bytes of weights per token x tokens/s).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/thread_pool.h"

namespace substrate {

struct BandwidthMeasurement {
  double bytes_per_second = 0;  // best of the repeats
  uint64_t buffer_bytes = 0;
  int threads = 0;
  int repeats = 0;
};

// Reads a `buffer_bytes` buffer (touched first, so pages exist) `repeats` times with every
// thread of `pool`, each thread its own contiguous slice, with the widest vector loads the CPU
// has (AVX-512, AVX2, else 64-bit words), each repeat once plain, once with the decode
// kernels' software prefetch on this core and (where they differ) once with the other vendor's
// distances, and reports the best pass: the most a streaming read reaches.
Expected<BandwidthMeasurement> MeasureReadBandwidth(ThreadPool& pool, uint64_t buffer_bytes,
                                                    int repeats = 3);

}  // namespace substrate
