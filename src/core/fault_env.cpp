#include "core/fault_env.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace substrate {
namespace {

bool Matches(const FaultEnv::Fault& f, const std::string& path) {
  return f.path_part.empty() || path.find(f.path_part) != std::string::npos;
}

class FaultRandomAccessFile : public RandomAccessFile {
 public:
  FaultRandomAccessFile(FaultEnv* env, std::unique_ptr<RandomAccessFile> base)
      : RandomAccessFile(base->path(), base->size(), base->direct()),
        env_(env),
        base_(std::move(base)) {}

  Expected<uint64_t> ReadAt(uint64_t offset, uint64_t n, void* dst) const override {
    FaultEnv::Fault f;
    if (env_->Take(FaultEnv::Kind::kSlowRead, path(), &f))
      std::this_thread::sleep_for(std::chrono::milliseconds(f.delay_ms));
    if (env_->Take(FaultEnv::Kind::kReadError, path(), &f)) {
      // Part of the range first (when asked), so the error comes in the middle of a read.
      if (f.bytes > 0) return base_->ReadAt(offset, std::min(n, f.bytes), dst);
      return IOError("'" + path() + "': read at offset " + std::to_string(offset) + ": " +
                     std::strerror(EIO));
    }
    if (env_->Take(FaultEnv::Kind::kShortRead, path(), &f)) {
      uint64_t part = std::max<uint64_t>(1, std::min(n, f.bytes));
      if (direct()) part = std::max<uint64_t>(4096, part / 4096 * 4096);
      return base_->ReadAt(offset, std::min(n, part), dst);
    }
    return base_->ReadAt(offset, n, dst);
  }
  // The real descriptor only while no read fault could apply: an io_uring reader then reads it
  // itself; otherwise every read comes through ReadAt.
  int fd() const override { return env_->HasReadFault(path()) ? -1 : base_->fd(); }

 private:
  FaultEnv* env_;
  std::unique_ptr<RandomAccessFile> base_;
};

class FaultWritableFile : public WritableFile {
 public:
  FaultWritableFile(FaultEnv* env, std::unique_ptr<WritableFile> base)
      : WritableFile(base->path()), env_(env), base_(std::move(base)) {}

  Status Append(const void* data, uint64_t n) override {
    const uint64_t fits = env_->Reserve(path(), n);
    if (fits > 0) RETURN_IF_ERROR(base_->Append(data, fits));
    if (fits < n) return IOError("writing '" + path() + "': " + std::strerror(ENOSPC));
    return Status::Ok();
  }
  Status Sync() override {
    FaultEnv::Fault f;
    if (env_->Take(FaultEnv::Kind::kSyncError, path(), &f))
      return IOError("fsync '" + path() + "': " + std::strerror(EIO));
    return base_->Sync();
  }
  Status Close() override { return base_->Close(); }

 private:
  FaultEnv* env_;
  std::unique_ptr<WritableFile> base_;
};

}  // namespace

void FaultEnv::Add(const Fault& f) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back({f, 0, 0, 0});
}

void FaultEnv::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
}

bool FaultEnv::HasReadFault(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Rule& r : rules_)
    if ((r.fault.kind == Kind::kReadError || r.fault.kind == Kind::kShortRead ||
         r.fault.kind == Kind::kSlowRead) &&
        Matches(r.fault, path))
      return true;
  return false;
}

bool FaultEnv::Take(Kind kind, const std::string& path, Fault* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Rule& r : rules_) {
    if (r.fault.kind != kind || !Matches(r.fault, path)) continue;
    if (kind == Kind::kReadError && r.fault.bytes > 0 && !r.part_given) {
      // EIO mid-read: this read returns part of its range, the next one (its rest) fails.
      r.part_given = true;
      *out = r.fault;
      return true;
    }
    r.part_given = false;
    if (r.seen++ < r.fault.skip) continue;
    if (r.fault.times >= 0 && r.injected >= r.fault.times) continue;
    ++r.injected;
    ++injected_[static_cast<int>(kind)];
    *out = r.fault;
    if (kind == Kind::kReadError) out->bytes = 0;
    return true;
  }
  return false;
}

uint64_t FaultEnv::Reserve(const std::string& path, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t fits = n;
  for (Rule& r : rules_) {
    if (r.fault.kind != Kind::kNoSpace || !Matches(r.fault, path)) continue;
    const uint64_t left = r.fault.bytes > r.used ? r.fault.bytes - r.used : 0;
    fits = std::min(fits, left);
  }
  for (Rule& r : rules_)
    if (r.fault.kind == Kind::kNoSpace && Matches(r.fault, path)) r.used += fits;
  if (fits < n) ++injected_[static_cast<int>(Kind::kNoSpace)];
  return fits;
}

Expected<std::unique_ptr<RandomAccessFile>> FaultEnv::NewRandomAccessFile(const std::string& path,
                                                                          bool direct_io) {
  ASSIGN_OR_RETURN(auto base, base_->NewRandomAccessFile(path, direct_io));
  return std::unique_ptr<RandomAccessFile>(new FaultRandomAccessFile(this, std::move(base)));
}

Expected<std::unique_ptr<WritableFile>> FaultEnv::NewWritableFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto base, base_->NewWritableFile(path));
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, std::move(base)));
}

Status FaultEnv::RenameFile(const std::string& from, const std::string& to) {
  Fault f;
  if (Take(Kind::kRenameError, to, &f))
    return IOError("rename '" + from + "' to '" + to + "': " + std::strerror(EIO));
  return base_->RenameFile(from, to);
}

}  // namespace substrate
