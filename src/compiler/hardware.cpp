// Bandwidth measurements for the profile's hardware section.
#include "compiler/hardware.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>

#include "core/aligned_buffer.h"
#include "core/file_io.h"

namespace substrate::compiler {

Expected<double> MeasureMemoryReadBandwidth(uint64_t bytes, int repeats) {
  bytes = std::max<uint64_t>(bytes / 64 * 64, 1 << 20);
  ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(bytes));
  std::memset(buf.data(), 1, bytes);  // touch every page before timing
  const uint64_t* p = buf.as<uint64_t>();
  const uint64_t n = bytes / 8;
  double best = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (uint64_t i = 0; i < n; i += 4) a += p[i], b ^= p[i + 1], c += p[i + 2], d ^= p[i + 3];
    sink = sink + a + b + c + d;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(bytes) / s);
  }
  return best;
}

Expected<FileReadMeasurement> MeasureFileReadBandwidth(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(auto file, RandomAccessFile::Open(path, /*direct_io=*/true));
  constexpr uint64_t kChunk = 4ull << 20;
  uint64_t total = std::min<uint64_t>(file->size(), max_bytes) / 4096 * 4096;
  if (total < kChunk)
    return InvalidArgument("measure: '" + path + "' is too small to time reads (" +
                           std::to_string(file->size()) + " bytes; need at least 4 MiB)");
  ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(kChunk));
  auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  while (done < total) {
    uint64_t n = std::min(kChunk, total - done);
    RETURN_IF_ERROR(file->Read(done, n, buf.data()));
    done += n;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FileReadMeasurement m;
  m.bytes_read = done;
  m.direct_io = file->direct();
  m.bytes_per_second = s > 0 ? static_cast<double>(done) / s : 0;
  return m;
}

}  // namespace substrate::compiler

#include <fcntl.h>
#include <unistd.h>

namespace substrate::compiler {

Expected<FileReadMeasurement> MeasureScratchReadBandwidth(const std::string& dir, uint64_t bytes) {
  std::string path = (dir.empty() ? std::string(".") : dir) + "/.substrate-bw-" + std::to_string(getpid());
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return IOError("measure: cannot create scratch file '" + path + "': " + std::strerror(errno));
  std::string chunk(1 << 20, '\x5a');
  Status st;
  for (uint64_t done = 0; done < bytes && st.ok(); done += chunk.size())
    if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size()))
      st = IOError("measure: writing scratch file '" + path + "' failed: " + std::strerror(errno));
  if (st.ok() && ::fsync(fd) != 0) st = IOError("measure: fsync of '" + path + "' failed");
  // Ask the kernel to drop the cached pages so a buffered fallback still reads the device.
  if (st.ok()) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  Expected<FileReadMeasurement> m = st.ok() ? MeasureFileReadBandwidth(path, bytes) : Expected<FileReadMeasurement>(st);
  ::unlink(path.c_str());
  return m;
}

}  // namespace substrate::compiler
