// The machine's memory read bandwidth, measured the way a decode step reads weights: threads
// streaming through a buffer much larger than the last-level cache. This is the physical limit
// benchmarks compare decode speed with (bytes of weights per token x tokens/s).
#pragma once

#include <cstdint>

#include "core/aligned_buffer.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace substrate {

struct BandwidthMeasurement {
  double bytes_per_second = 0;  // best of the repeats
  uint64_t buffer_bytes = 0;
  int threads = 0;
  int repeats = 0;
};

// A buffer read again and again: allocated and touched once (each page from the thread that will
// read it), so that a bench can take many short readings, say between decode steps, without
// paying for the allocation each time. Charged to the global ledger as scratch.
class MemoryReadProbe {
 public:
  static Expected<MemoryReadProbe> Create(ThreadPool& pool, uint64_t buffer_bytes);

  // Reads the buffer with every thread of the pool, each thread its own contiguous slice, with
  // the widest vector loads the CPU has (AVX-512, AVX2, else 64-bit words): once plain, once
  // with the decode kernels' software prefetch on this core and (where they differ) once with
  // the other vendor's distances; each of them with the slice read as one stream and (vector
  // loops) as four streams side by side. Returns the best pass's bytes per second: the most a
  // streaming read reaches.
  double Read();

  uint64_t buffer_bytes() const { return buffer_.size(); }
  int threads() const { return pool_->size(); }

 private:
  MemoryReadProbe(ThreadPool& pool, AlignedBuffer buffer)
      : pool_(&pool), buffer_(std::move(buffer)) {}
  ThreadPool* pool_;
  AlignedBuffer buffer_;
  uint64_t sink_ = 0;  // keeps the loads
};

// A buffer size that no cache holds: 16 times the last-level cache, from 512 MiB to 2 GiB (2 GiB
// where the cache's size is not known). Larger only raises the peak memory of what measures.
uint64_t DefaultProbeBytes();

// A MemoryReadProbe of `buffer_bytes`, read `repeats` times; the best pass.
Expected<BandwidthMeasurement> MeasureReadBandwidth(ThreadPool& pool, uint64_t buffer_bytes,
                                                    int repeats = 3);

}  // namespace substrate
