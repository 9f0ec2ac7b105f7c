#include "kernels/membw.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/aligned_buffer.h"
#include "kernels/cpu_features.h"

namespace substrate {
namespace membw_detail {
// `ahead`: the software prefetch's distances, or none.
// `streams`: the slice read as that many equal parts side by side, a few lines of each in turn.
uint64_t ReadSliceAvx512(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead,
                         int streams);
uint64_t ReadSliceAvx2(const uint8_t* p, size_t bytes, const PrefetchDistances* ahead, int streams);
}  // namespace membw_detail
namespace {

// Portable fallback: sums 64-bit words four streams at a time (the sum keeps the loads).
uint64_t ReadSliceScalar(const uint8_t* bytes_p, size_t bytes, const PrefetchDistances*, int) {
  const auto* p = reinterpret_cast<const uint64_t*>(bytes_p);
  const size_t n = bytes / 8;
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

using ReadFn = uint64_t (*)(const uint8_t*, size_t, const PrefetchDistances*, int);

ReadFn BestReadLoop() {
  Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return membw_detail::ReadSliceAvx512;
  if (isa >= Isa::kAvx2) return membw_detail::ReadSliceAvx2;
  return ReadSliceScalar;
}

}  // namespace

Expected<MemoryReadProbe> MemoryReadProbe::Create(ThreadPool& pool, uint64_t buffer_bytes) {
  buffer_bytes = std::max<uint64_t>(buffer_bytes / 4096 * 4096, 1 << 20);
  ASSIGN_OR_RETURN(auto buf, AlignedBuffer::Allocate(buffer_bytes, &MemoryLedger::Global(),
                                                     "scratch"));
  const int threads = pool.size();
  const size_t words = buffer_bytes / 8;
  auto* data = buf.as<uint64_t>();
  // Touch every page from the thread that will read it (first-touch placement).
  pool.ParallelFor(threads, 1, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      size_t b = words * t / threads, e = words * (t + 1) / threads;
      for (size_t i = b; i < e; ++i) data[i] = i;
    }
  });
  return MemoryReadProbe(pool, std::move(buf));
}

double MemoryReadProbe::Read() {
  const int threads = pool_->size();
  const size_t words = buffer_.size() / 8;
  std::vector<uint64_t> sink(static_cast<size_t>(threads) * 8);
  // Plain vector loads, the software prefetch the decode kernels use on this core, and the other
  // vendor's distances, each thread's slice read as one stream and as four side by side: which
  // is fastest depends on the machine (a Zen 5 core streams 1.5x faster from four places at once
  // than from one), and the limit is the best any reaches.
  const ReadFn read = BestReadLoop();
  const auto* bytes = buffer_.as<uint8_t>();
  const PrefetchDistances decode = DecodePrefetch(), intel;
  std::vector<const PrefetchDistances*> settings = {nullptr, &decode};
  if (decode.l1 != intel.l1 || decode.l2 != intel.l2) settings.push_back(&intel);
  const std::vector<int> stream_counts =
      read == ReadSliceScalar ? std::vector<int>{1} : std::vector<int>{1, 4};
  double best = 0;
  for (int streams : stream_counts) {
    for (const PrefetchDistances* prefetch : settings) {
      auto start = std::chrono::steady_clock::now();
      pool_->ParallelFor(threads, 1, [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; ++t) {
          // Slices of whole 4 KiB pages, so the vector loops' aligned loads stay aligned.
          size_t b = words / 512 * t / threads * 4096, e = words / 512 * (t + 1) / threads * 4096;
          sink[t * 8] += read(bytes + b, e - b, prefetch, streams);
        }
      });
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::max(best, static_cast<double>(buffer_.size()) / s);
    }
  }
  for (uint64_t v : sink) sink_ += v;
  return best;
}

uint64_t DefaultProbeBytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 <= 0) return 2ull << 30;
  return std::clamp<uint64_t>(16 * static_cast<uint64_t>(l3), 512ull << 20, 2ull << 30);
}

Expected<BandwidthMeasurement> MeasureReadBandwidth(ThreadPool& pool, uint64_t buffer_bytes,
                                                    int repeats) {
  ASSIGN_OR_RETURN(MemoryReadProbe probe, MemoryReadProbe::Create(pool, buffer_bytes));
  BandwidthMeasurement m;
  m.buffer_bytes = probe.buffer_bytes();
  m.threads = probe.threads();
  m.repeats = std::max(1, repeats);
  for (int r = 0; r < m.repeats; ++r)
    m.bytes_per_second = std::max(m.bytes_per_second, probe.Read());
  return m;
}

}  // namespace substrate
