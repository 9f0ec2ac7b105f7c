// IoReader: reads one contiguous range of a file into an aligned buffer as fast as the device
// allows — io_uring with several chunks in flight where the kernel has it and permits it,
// positioned reads (pread) otherwise. Files opened with O_DIRECT need 4096-aligned offsets,
// lengths and buffers: callers pass store spans (4096-aligned) and slabs (4096-aligned); the
// length is rounded up to 4096, and a short read is accepted only at the end of the file.
//
// Threading: one IoReader per reading thread (the ring is not shared).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/file_io.h"
#include "core/status.h"

namespace substrate {

enum class IoMode { kAuto, kUring, kPread };

// "auto", "uring", "pread" (SUBSTRATE_IO overrides kAuto).
Expected<IoMode> ParseIoMode(const std::string& s);

class IoReader {
 public:
  // kAuto: io_uring when it initializes (it is refused under some seccomp policies and with
  // kernel.io_uring_disabled), else pread. kUring that cannot initialize falls back too, with a
  // log line.
  static std::unique_ptr<IoReader> Create(IoMode mode = IoMode::kAuto);
  virtual ~IoReader() = default;

  // Reads n bytes at `offset` of f into dst (capacity >= n rounded up to 4096 when f is direct).
  virtual Status Read(const RandomAccessFile& f, uint64_t offset, uint64_t n, uint8_t* dst) = 0;
  virtual bool uring() const = 0;
};

}  // namespace substrate
