// PosixEnv: Env::Default(). Files through open/pread/write/fsync/rename; range reads through
// io_uring (several chunks in flight) where the kernel allows it, else a pread loop.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/env.h"
#include "core/log.h"

#ifdef SUBSTRATE_HAVE_URING
#include <liburing.h>
#endif

namespace substrate {
namespace {

constexpr uint64_t kAlign = 4096;

std::string Errno(int err = errno) {
  return std::strerror(err);
}

class PosixRandomAccessFile : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, uint64_t size, bool direct)
      : RandomAccessFile(std::move(path), size, direct), fd_(fd) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Expected<uint64_t> ReadAt(uint64_t offset, uint64_t n, void* dst) const override {
    for (;;) {
      const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
      if (got >= 0) return static_cast<uint64_t>(got);
      if (errno != EINTR)
        return IOError("'" + path() + "': read at offset " + std::to_string(offset) + ": " +
                       Errno());
    }
  }
  int fd() const override { return fd_; }

 private:
  int fd_;
};

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : WritableFile(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(const void* data, uint64_t n) override {
    if (fd_ < 0) return Internal("'" + path() + "': write after close");
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return IOError("writing '" + path() + "': " + Errno());
      }
      p += w;
      n -= static_cast<uint64_t>(w);
    }
    return Status::Ok();
  }
  Status Sync() override {
    if (fd_ < 0) return Internal("'" + path() + "': sync after close");
    if (::fsync(fd_) != 0) return IOError("fsync '" + path() + "': " + Errno());
    return Status::Ok();
  }
  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return IOError("closing '" + path() + "': " + Errno());
    return Status::Ok();
  }

 private:
  int fd_;
};

// Per request: big enough to stream, small enough to overlap (SUBSTRATE_IO_CHUNK_KB overrides,
// for measuring a device).
uint64_t ChunkBytes() {
  static const uint64_t v = [] {
    const char* e = std::getenv("SUBSTRATE_IO_CHUNK_KB");
    const long kb = e ? std::atol(e) : 0;
    return kb >= 4 && kb <= 65536 ? static_cast<uint64_t>(kb) << 10 : uint64_t{1} << 20;
  }();
  return v;
}
constexpr unsigned kDepth = 16;  // requests in flight

uint64_t Length(const RandomAccessFile& f, uint64_t n) {
  return f.direct() ? (n + kAlign - 1) / kAlign * kAlign : n;
}

Status CheckRange(const RandomAccessFile& f, uint64_t offset, uint64_t n) {
  if (offset > f.size() || n > f.size() - offset)
    return Corruption("'" + f.path() + "': read of " + std::to_string(n) + " bytes at offset " +
                      std::to_string(offset) + " is past the end of the file (size " +
                      std::to_string(f.size()) + "): truncated store");
  return Status::Ok();
}

// One ReadAt loop; `want` may run past EOF (direct-I/O rounding): stops at EOF once n are in.
Status ReadRange(const RandomAccessFile& f, uint64_t offset, uint64_t n, uint64_t want,
                 uint8_t* dst) {
  uint64_t done = 0;
  while (done < want) {
    ASSIGN_OR_RETURN(uint64_t got, f.ReadAt(offset + done, want - done, dst + done));
    if (got == 0) break;
    done += got;
  }
  if (done < n)
    return Corruption("'" + f.path() + "': unexpected end of file at " +
                      std::to_string(offset + done) + " (file changed under the reader?)");
  return Status::Ok();
}

class PreadReader : public IoReader {
 public:
  Status Read(const RandomAccessFile& f, uint64_t offset, uint64_t n, uint8_t* dst) override {
    RETURN_IF_ERROR(CheckRange(f, offset, n));
    return ReadRange(f, offset, n, Length(f, n), dst);
  }
  bool uring() const override { return false; }
};

#ifdef SUBSTRATE_HAVE_URING
class UringReader : public IoReader {
 public:
  ~UringReader() override { io_uring_queue_exit(&ring_); }
  bool Init() { return io_uring_queue_init(kDepth, &ring_, 0) == 0; }

  Status Read(const RandomAccessFile& f, uint64_t offset, uint64_t n, uint8_t* dst) override {
    RETURN_IF_ERROR(CheckRange(f, offset, n));
    const uint64_t want = Length(f, n);
    if (f.fd() < 0) return ReadRange(f, offset, n, want, dst);  // not an OS file
    // Chunks [start, start + len) relative to offset; a short one is finished by ReadAt.
    uint64_t next = 0;
    unsigned inflight = 0;
    Status first_error;
    std::vector<uint64_t> short_starts;
    auto read_error = [&](uint64_t at, int err) {
      return IOError("'" + f.path() + "': read at offset " + std::to_string(at) + ": " +
                     Errno(err));
    };
    while (next < want || inflight > 0) {
      while (next < want && inflight < kDepth && first_error.ok()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) break;
        const uint64_t len = std::min(ChunkBytes(), want - next);
        io_uring_prep_read(sqe, f.fd(), dst + next, static_cast<unsigned>(len), offset + next);
        io_uring_sqe_set_data64(sqe, next);
        next += len;
        ++inflight;
      }
      if (inflight == 0) break;
      int r = io_uring_submit_and_wait(&ring_, 1);
      if (r < 0 && r != -EINTR) {
        // The ring refused: stop submitting, but the buffer must not be handed back while
        // requests still write into it, so wait for those already in flight.
        if (first_error.ok()) first_error = read_error(offset, -r);
        next = want;
        io_uring_cqe* c = nullptr;
        if (io_uring_wait_cqe(&ring_, &c) < 0) return first_error;
      }
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe) {
        const uint64_t start = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        --inflight;
        const uint64_t len = std::min(ChunkBytes(), want - start);
        if (res < 0) {
          if (first_error.ok()) first_error = read_error(offset + start, -res);
        } else if (static_cast<uint64_t>(res) < len) {
          short_starts.push_back(start + static_cast<uint64_t>(res));
        }
      }
    }
    RETURN_IF_ERROR(first_error);
    // Short completions (EOF in the rounded tail, or an interrupted request): finish by ReadAt.
    for (uint64_t s : short_starts) {
      const uint64_t chunk_end = std::min((s / ChunkBytes() + 1) * ChunkBytes(), want);
      const uint64_t need = s < n ? std::min(chunk_end, n) - s : 0;
      RETURN_IF_ERROR(ReadRange(f, offset + s, need, chunk_end - s, dst + s));
    }
    return Status::Ok();
  }
  bool uring() const override { return true; }

 private:
  io_uring ring_{};
};
#endif

class PosixEnv : public Env {
 public:
  Expected<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                  bool direct_io) override {
    const int flags = O_RDONLY | O_CLOEXEC;
    bool direct = false;
    int fd = -1;
    if (direct_io) {
      fd = ::open(path.c_str(), flags | O_DIRECT);
      direct = fd >= 0;
    }
    if (fd < 0) fd = ::open(path.c_str(), flags);
    if (fd < 0) {
      if (errno == ENOENT) return NotFound("cannot open '" + path + "': no such file");
      return IOError("cannot open '" + path + "': " + Errno());
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const std::string err = Errno();
      ::close(fd);
      return IOError("cannot stat '" + path + "': " + err);
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return InvalidArgument("'" + path + "' is a directory, not a file");
    }
    return std::unique_ptr<RandomAccessFile>(
        new PosixRandomAccessFile(path, fd, static_cast<uint64_t>(st.st_size), direct));
  }

  Expected<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IOError("cannot create '" + path + "': " + Errno());
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return IOError("rename '" + from + "' to '" + to + "': " + Errno());
    return Status::Ok();
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return IOError("remove '" + path + "': " + Errno());
    return Status::Ok();
  }

  bool FileExists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  Expected<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return IOError("cannot list '" + dir + "': " + Errno());
    std::vector<std::string> out;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
    return out;
  }

  std::unique_ptr<IoReader> NewIoReader(IoMode mode) override {
    if (mode == IoMode::kAuto) {
      const char* e = std::getenv("SUBSTRATE_IO");
      if (e) {
        auto m = ParseIoMode(e);
        if (m.ok()) mode = *m;
      }
    }
#ifdef SUBSTRATE_HAVE_URING
    if (mode != IoMode::kPread) {
      auto r = std::make_unique<UringReader>();
      if (r->Init()) return r;
      if (mode == IoMode::kUring) LOG_WARN("io_uring is not available here; reading with pread");
    }
#endif
    return std::make_unique<PreadReader>();
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();  // never destroyed: files may close at exit
  return env;
}

}  // namespace substrate
