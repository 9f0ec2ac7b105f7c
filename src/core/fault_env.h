// FaultEnv: an Env for tests that passes everything to another Env (the real one by default)
// and injects the faults it is told to, in the files whose path contains a given text: slow
// reads, failing reads (EIO, possibly after part of the range), short reads, a full disk
// (ENOSPC after a number of bytes), failing fsyncs and failing renames. Faults can be added
// and cleared while files are open; the counters say how many were injected.
//
// Reads of a file with a read fault go through RandomAccessFile::ReadAt (its fd() is -1, so an
// io_uring reader falls back to positioned reads, where the fault applies); files without one
// keep the real descriptor and the real reader.
//
// Threading: as any Env; Add/Clear may be called while other threads read and write.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "core/env.h"

namespace substrate {

class FaultEnv : public Env {
 public:
  enum class Kind {
    kSlowRead,     // each matching read sleeps delay_ms first
    kReadError,    // a matching read fails with EIO; with `bytes`, it first returns that many
                   // of its range (a short read) and the read of the rest fails
    kShortRead,    // a matching read returns at most `bytes` (>= 1) bytes
    kNoSpace,      // the disk holds `bytes` more bytes (over all matching files written from
                   // now), then writes fail with ENOSPC (skip and times do not apply)
    kSyncError,    // fsync of a matching file fails (EIO)
    kRenameError,  // renaming onto a matching path fails (EIO)
  };
  struct Fault {
    Kind kind = Kind::kReadError;
    std::string path_part;  // files whose path contains this; "" = every file
    int skip = 0;           // matching operations let through before the first fault
    int times = -1;         // faults to inject after that; -1: every one
    int delay_ms = 0;       // kSlowRead
    uint64_t bytes = 0;     // kReadError, kShortRead, kNoSpace (see Kind)
  };

  explicit FaultEnv(Env* base = Env::Default()) : base_(base) {}

  void Add(const Fault& f);
  void Clear();
  // Faults of this kind injected so far.
  int injected(Kind k) const { return injected_[static_cast<int>(k)].load(); }

  Expected<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                  bool direct_io) override;
  Expected<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  Expected<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return base_->GetChildren(dir);
  }
  std::unique_ptr<IoReader> NewIoReader(IoMode mode) override { return base_->NewIoReader(mode); }

  // Used by the files it opens. Whether a read fault of kinds other than slow could apply to
  // `path` (then its reads go through ReadAt).
  bool HasReadFault(const std::string& path) const;
  // Counts this operation of `kind` on `path`; true, with the fault in *out, when one is due.
  bool Take(Kind kind, const std::string& path, Fault* out);
  // kNoSpace: how many of n bytes written to `path` fit (n when no such fault applies).
  uint64_t Reserve(const std::string& path, uint64_t n);

 private:
  struct Rule {
    Fault fault;
    int seen = 0;             // matching operations so far
    int injected = 0;         // faults injected so far
    uint64_t used = 0;        // kNoSpace: bytes written since the rule was added
    bool part_given = false;  // kReadError with bytes: the next read is the one that fails
  };
  Env* base_;
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  std::atomic<int> injected_[6] = {};
};

}  // namespace substrate
