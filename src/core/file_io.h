// File access over an Env (core/env.h). Every read of model data goes through RandomAccessFile
// (positioned reads of the ranges asked for, never a whole-file load). Every file we write goes
// through AtomicFileWriter: a temporary name, fsync, rename — a crash or an error never leaves a
// half-written file under the final name, and the previous file stays as it was.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/env.h"
#include "core/status.h"

namespace substrate {

class AtomicFileWriter {
 public:
  // Creates `path + ".tmp.<pid>"` through env (nullptr: Env::Default()); Commit() fsyncs and
  // renames it to `path`. Destroying an uncommitted writer (an error, a full disk) removes the
  // temporary file and leaves `path` as it was.
  static Expected<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path,
                                                            Env* env = nullptr);
  ~AtomicFileWriter();

  Status Append(const void* data, uint64_t n);
  Status Append(std::string_view s) { return Append(s.data(), s.size()); }
  // Writes zeros up to the next multiple of `alignment`.
  Status PadTo(uint64_t alignment);
  uint64_t offset() const { return offset_; }
  // After the rename, removes the temporary files of earlier writers of the same path that were
  // killed before they could (`path.tmp.PID` whose PID is no longer alive).
  Status Commit();

 private:
  AtomicFileWriter(Env* env, std::string path, std::string tmp, std::unique_ptr<WritableFile> file)
      : env_(env), path_(std::move(path)), tmp_(std::move(tmp)), file_(std::move(file)) {}
  Status FlushBuffer();
  Env* env_;
  std::string path_, tmp_;
  std::unique_ptr<WritableFile> file_;
  uint64_t offset_ = 0;
  std::string buffer_;
  bool committed_ = false;
};

// Whole small files (configs, JSON, templates). Refuses files over max_bytes.
Expected<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes = 1ull << 30,
                                       Env* env = nullptr);
Status WriteFileAtomic(const std::string& path, std::string_view contents, Env* env = nullptr);
bool FileExists(const std::string& path);
bool IsDirectory(const std::string& path);

}  // namespace substrate
