// File access. Every read of model data goes through RandomAccessFile (positioned reads of the
// ranges asked for, never a whole-file load), so a 40 GB file opens on an 8 GB machine.
// Every file we write goes through AtomicFileWriter: a temporary name, fsync, rename — a crash
// or an error never leaves a half-written file under the final name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace substrate {

class RandomAccessFile {
 public:
  // Opens `path` for positioned reads. direct_io asks for O_DIRECT (then offsets, sizes and
  // buffers must be 4096-aligned); it falls back to buffered reads where the filesystem refuses.
  static Expected<std::unique_ptr<RandomAccessFile>> Open(const std::string& path,
                                                          bool direct_io = false);
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  // Reads exactly n bytes at offset into dst; a range past the end is a Corruption error
  // naming the file, the range and the file size. Thread-safe (pread).
  Status Read(uint64_t offset, uint64_t n, void* dst) const;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  bool direct() const { return direct_; }

 private:
  RandomAccessFile(std::string path, int fd, uint64_t size, bool direct)
      : path_(std::move(path)), fd_(fd), size_(size), direct_(direct) {}
  std::string path_;
  int fd_;
  uint64_t size_;
  bool direct_;
};

class AtomicFileWriter {
 public:
  // Creates `path + ".tmp.<pid>"`; Commit() fsyncs and renames it to `path`. Destroying an
  // uncommitted writer removes the temporary file.
  static Expected<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path);
  ~AtomicFileWriter();

  Status Append(const void* data, uint64_t n);
  Status Append(std::string_view s) { return Append(s.data(), s.size()); }
  // Writes zeros up to the next multiple of `alignment`.
  Status PadTo(uint64_t alignment);
  uint64_t offset() const { return offset_; }
  Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  Status FlushBuffer();
  std::string path_, tmp_;
  int fd_;
  uint64_t offset_ = 0;
  std::string buffer_;
  bool committed_ = false;
};

// Whole small files (configs, JSON, templates). Refuses files over max_bytes.
Expected<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes = 1ull << 30);
Status WriteFileAtomic(const std::string& path, std::string_view contents);
bool FileExists(const std::string& path);
bool IsDirectory(const std::string& path);

}  // namespace substrate
