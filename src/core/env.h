// Env: the one door to the file system (LevelDB's idea). Opening files, positioned reads
// (buffered or O_DIRECT), range reads with several requests in flight (io_uring), writing,
// fsync, renaming and removing files all go through an Env, so that a test can put a slow,
// failing, short-reading or full disk under any part of the engine (core/fault_env.h) while
// the product runs on the real one (Env::Default(), a PosixEnv).
//
// Threading: an Env and the RandomAccessFiles it opens are safe to use from many threads; a
// WritableFile and an IoReader belong to one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace substrate {

class Env;

// A file opened for positioned reads. Every read of model data goes through one (the ranges
// asked for, never a whole-file load), so a 40 GB file opens on an 8 GB machine.
class RandomAccessFile {
 public:
  // Opens `path` through Env::Default() (see Env::NewRandomAccessFile).
  static Expected<std::unique_ptr<RandomAccessFile>> Open(const std::string& path,
                                                          bool direct_io = false);
  virtual ~RandomAccessFile() = default;
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  // Reads exactly n bytes at offset into dst, resuming after short reads; a range past the end
  // is a Corruption error naming the file, the range and the file size. Thread-safe.
  Status Read(uint64_t offset, uint64_t n, void* dst) const;
  // The primitive an Env implements: reads up to n bytes at offset (fewer on a short read or at
  // the end of the file, 0 only at or past the end) and returns how many. Thread-safe.
  virtual Expected<uint64_t> ReadAt(uint64_t offset, uint64_t n, void* dst) const = 0;
  // The OS descriptor, for readers that hand it to the kernel (io_uring); -1 when reads must go
  // through ReadAt (a test Env's files).
  virtual int fd() const { return -1; }

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Opened with O_DIRECT: offsets, lengths and buffers of reads must be 4096-aligned.
  bool direct() const { return direct_; }

 protected:
  RandomAccessFile(std::string path, uint64_t size, bool direct)
      : path_(std::move(path)), size_(size), direct_(direct) {}

 private:
  std::string path_;
  uint64_t size_;
  bool direct_;
};

// A file being written from its start, unbuffered (callers buffer).
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes without syncing
  // Writes all n bytes, or fails (a full disk is an IOError naming the file and ENOSPC).
  virtual Status Append(const void* data, uint64_t n) = 0;
  virtual Status Sync() = 0;   // fsync: the bytes are on the device when it returns
  virtual Status Close() = 0;  // further calls fail
  const std::string& path() const { return path_; }

 protected:
  explicit WritableFile(std::string path) : path_(std::move(path)) {}

 private:
  std::string path_;
};

enum class IoMode { kAuto, kUring, kPread };

// "auto", "uring", "pread" (SUBSTRATE_IO overrides kAuto).
Expected<IoMode> ParseIoMode(const std::string& s);

// Reads one contiguous range of a file into an aligned buffer as fast as the device allows:
// io_uring with several chunks in flight where the kernel has it and permits it, positioned
// reads otherwise. Files opened with O_DIRECT need 4096-aligned offsets, lengths and buffers:
// callers pass store spans and slabs (4096-aligned); the length is rounded up to 4096, and a
// short read is accepted only at the end of the file.
//
// Threading: one IoReader per reading thread (a ring is not shared).
class IoReader {
 public:
  // Env::Default()->NewIoReader(mode), or env's.
  static std::unique_ptr<IoReader> Create(IoMode mode = IoMode::kAuto, Env* env = nullptr);
  virtual ~IoReader() = default;

  // Reads n bytes at `offset` of f into dst (capacity >= n rounded up to 4096 when f is direct).
  virtual Status Read(const RandomAccessFile& f, uint64_t offset, uint64_t n, uint8_t* dst) = 0;
  virtual bool uring() const = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  // The real file system (a PosixEnv), never destroyed.
  static Env* Default();

  // Opens `path` for positioned reads. direct_io asks for O_DIRECT; it falls back to buffered
  // reads where the file system refuses it (see RandomAccessFile::direct()). NotFound for a
  // missing file, InvalidArgument for a directory.
  virtual Expected<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                          bool direct_io) = 0;
  // Creates `path` (or truncates it) for writing.
  virtual Expected<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)).
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status RemoveFile(const std::string& path) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  // The names (not paths) of the entries of a directory, without "." and "..".
  virtual Expected<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  // kAuto: io_uring when it initializes (it is refused under some seccomp policies and with
  // kernel.io_uring_disabled), else pread; kUring that cannot initialize falls back too, with a
  // log line.
  virtual std::unique_ptr<IoReader> NewIoReader(IoMode mode) = 0;
};

}  // namespace substrate
