#include "runtime/io_reader.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/log.h"

#ifdef SUBSTRATE_HAVE_URING
#include <liburing.h>
#endif

namespace substrate {
namespace {

constexpr uint64_t kAlign = 4096;
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

Status ReadError(const RandomAccessFile& f, uint64_t offset, int err) {
  return IOError("'" + f.path() + "': read at offset " + std::to_string(offset) + ": " +
                 std::strerror(err));
}

// One pread loop; `want` may run past EOF (direct-I/O rounding): stops at EOF once n are in.
Status PreadRange(const RandomAccessFile& f, uint64_t offset, uint64_t n, uint64_t want,
                  uint8_t* dst) {
  uint64_t done = 0;
  while (done < want) {
    ssize_t got = ::pread(f.fd(), dst + done, want - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ReadError(f, offset + done, errno);
    }
    if (got == 0) break;
    done += static_cast<uint64_t>(got);
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
    return PreadRange(f, offset, n, Length(f, n), dst);
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
    // Chunks [start, start + len) relative to offset; a short one is finished by pread.
    uint64_t next = 0;
    unsigned inflight = 0;
    Status first_error;
    std::vector<uint64_t> short_starts;
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
        if (first_error.ok()) first_error = ReadError(f, offset, -r);
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
          if (first_error.ok()) first_error = ReadError(f, offset + start, -res);
        } else if (static_cast<uint64_t>(res) < len) {
          short_starts.push_back(start + static_cast<uint64_t>(res));
        }
      }
    }
    RETURN_IF_ERROR(first_error);
    // Short completions (EOF in the rounded tail, or an interrupted request): finish with pread.
    for (uint64_t s : short_starts) {
      const uint64_t chunk_end = std::min((s / ChunkBytes() + 1) * ChunkBytes(), want);
      const uint64_t need = s < n ? std::min(chunk_end, n) - s : 0;
      RETURN_IF_ERROR(PreadRange(f, offset + s, need, chunk_end - s, dst + s));
    }
    return Status::Ok();
  }
  bool uring() const override { return true; }

 private:
  io_uring ring_{};
};
#endif

}  // namespace

Expected<IoMode> ParseIoMode(const std::string& s) {
  if (s == "auto") return IoMode::kAuto;
  if (s == "uring") return IoMode::kUring;
  if (s == "pread") return IoMode::kPread;
  return InvalidArgument("io mode '" + s + "': expected auto, uring or pread");
}

std::unique_ptr<IoReader> IoReader::Create(IoMode mode) {
  if (mode == IoMode::kAuto) {
    const char* env = std::getenv("SUBSTRATE_IO");
    if (env) {
      auto m = ParseIoMode(env);
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

}  // namespace substrate
